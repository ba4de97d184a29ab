"""The import hook in a fresh interpreter: ``import adopter.auto`` and ``adopter run``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adopter.cli import app

from .models import BLOCKS

REPOSITORY = Path(__file__).resolve().parents[2]

PROBE = """
import dis, sys
import rt_auto.blocks as blocks
loads = {i.argval for i in dis.get_instructions(blocks.Output.forward) if i.opname == "LOAD_GLOBAL"}
print("fused" if "dropout_add_layer_norm" in loads else "original")
print("argv", sys.argv[1:])
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def _environment(tmp_path: Path, package_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(package_root), str(REPOSITORY)])
    env["ADOPTER_CACHE_DIR"] = str(tmp_path / "cache")
    env["ADOPTER_PACKAGES"] = "rt_auto"
    env["ADOPTER_RULES"] = "paper"
    for name in (
        "ADOPTER_SELECT",
        "ADOPTER_EXCLUDE",
        "ADOPTER_VERIFY",
        "ADOPTER_LOG",
        "ADOPTER_RUNTIME_DISABLED",
    ):
        env.pop(name, None)
    return env


def _package(make_package, tmp_path) -> tuple[Path, Path]:
    package = make_package("rt_auto", {"blocks.py": BLOCKS})
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PROBE))
    return package.parent, script


@pytest.mark.slow  # a fresh interpreter per run
def test_import_adopter_auto_patches_the_packages_it_is_told(make_package, tmp_path):
    root, script = _package(make_package, tmp_path)
    env = _environment(tmp_path, root) | {"ADOPTER_LOG": "DEBUG"}  # every module's line
    code = f"import adopter.auto; exec(open({str(script)!r}).read())"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "fused"
    assert "adopter: patched rt_auto.blocks: paper.5 Output.forward line 14" in done.stderr
    unhooked = env | {"ADOPTER_PACKAGES": "somewhere_else"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=unhooked, capture_output=True, text=True, timeout=300
    )
    assert done.stdout.splitlines()[0] == "original"  # user code only when asked


@pytest.mark.slow  # a fresh interpreter per run
def test_adopter_run_keeps_argv_and_exit_code(make_package, tmp_path):
    root, script = _package(make_package, tmp_path)
    env = _environment(tmp_path, root)
    command = [sys.executable, "-m", "adopter", "run", "--rule-set", "paper", "--packages"]
    done = subprocess.run(
        [*command, "rt_auto", "--", "python", str(script), "3", "--flag", "x y"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["fused", "argv ['3', '--flag', 'x y']"]
    # By default one line per package, not one per module; -v gives the module lines.
    assert "adopter: rt_auto: patched 2 site(s) in 1 module(s)" in done.stderr
    assert "adopter: patched rt_auto.blocks" not in done.stderr
    verbose = subprocess.run(
        [*command, "rt_auto", "-v", "--", "python", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert verbose.returncode == 0, verbose.stderr
    assert (
        "adopter: patched rt_auto.blocks (cached): paper.5 Output.forward line 14" in verbose.stderr
    )


@pytest.mark.slow  # a fresh interpreter per run
def test_adopter_run_quiet_and_a_missing_command(make_package, tmp_path):
    root, script = _package(make_package, tmp_path)
    env = _environment(tmp_path, root)
    command = [sys.executable, "-m", "adopter", "run", "--quiet", "--packages", "rt_auto", "--"]
    done = subprocess.run(
        [*command, "python", str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.startswith("fused")
    assert "adopter:" not in done.stderr
    missing = subprocess.run(
        [*command, "no-such-command-here"], env=env, capture_output=True, text=True, timeout=300
    )
    assert missing.returncode == 127
    assert "command not found" in missing.stderr


@pytest.mark.slow  # a fresh interpreter per run
def test_the_bootstrap_runs_the_sitecustomize_it_shadows(make_package, tmp_path):
    root, script = _package(make_package, tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = 'yes'\n")
    env = _environment(tmp_path, root)
    env["PYTHONPATH"] += os.pathsep + str(other)
    code = "import os; print(os.environ.get('SHADOWED_RAN'))"
    done = subprocess.run(
        [sys.executable, "-m", "adopter", "run", "--quiet", "--", "python", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "yes"


def test_importing_adopter_loads_neither_torch_nor_the_runtime():
    code = (
        "import sys, adopter; "
        "print('torch' in sys.modules, 'adopter.runtime' in sys.modules, callable(adopter.patch))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPOSITORY
    )
    assert done.stdout.split() == ["False", "False", "True"]


def test_cache_clear_command(private_cache):
    private_cache.mkdir(mode=0o700)
    (private_cache / "entry.json").write_text("{}")
    result = CliRunner().invoke(app, ["cache", "clear"])
    assert result.exit_code == 0, result.output
    assert f"removed 1 entries from {private_cache}" in result.output
    assert not (private_cache / "entry.json").exists()
    os.chmod(private_cache, 0o777)
    refused = CliRunner().invoke(app, ["cache", "clear"])
    assert refused.exit_code == 2
    os.chmod(private_cache, 0o700)
