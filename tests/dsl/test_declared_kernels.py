"""A rule calls only its declared kernel: checked at load time, in scan, apply, run and patch."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import adopter
from adopter.dsl import DslError, load_rule_file, parse_rules
from adopter.dsl.declared import registered_kernels
from adopter.rules import load_rule_set

MODEL = """\
import torch
from torch import nn
import torch.nn.functional as F


class Attention(nn.Module):
    def forward(self, scores):
        return F.softmax(scores, dim=-1)
"""


def rule_text(kernel: str, callee: str, args: str = "$x, dim=-1") -> str:
    # The `kernel:` value is at 3:13, the replacement's callee at 7:9.
    return (
        "rule mine.1 {\n"
        '    name: "mine"\n'
        f'    kernel: "{kernel}"\n'
        "    forward {\n"
        "        torch.nn.functional.softmax($x, dim=-1) -> $y\n"
        "    } => {\n"
        f"        {callee}({args}) -> $y\n"
        "    }\n"
        "}\n"
    )


def write_rule(tmp_path: Path, kernel: str, callee: str, args: str = "$x, dim=-1") -> Path:
    path = tmp_path / "mine.adopt"
    path.write_text(rule_text(kernel, callee, args))
    return path


def run_cli(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "adopter", *args], capture_output=True, text=True, env=env
    )


def make_third_party(tmp_path: Path) -> Path:
    """A package ``fastpkg`` under ``tmp_path/site`` whose import would leave a marker file."""
    package = tmp_path / "site" / "fastpkg"
    package.mkdir(parents=True)
    marker = tmp_path / "imported"
    (package / "__init__.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n"
        "def fast_softmax(x, dim):\n    return x.softmax(dim)\n"
    )
    return marker


def test_a_typo_kernel_is_a_located_error_in_scan_and_apply_and_nothing_is_written(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    rule = write_rule(tmp_path, "adopter.kernels.softmx", "adopter.kernels.softmx")
    expected = (
        f"{rule}:3:13: rule mine.1: kernel 'adopter.kernels.softmx' is not a registered kernel "
        "of adopter.kernels; did you mean adopter.kernels.softmax?"
    )
    scan = run_cli("scan", str(model), "--rules", str(rule))
    assert scan.returncode == 2
    assert expected in scan.stderr
    assert "Traceback" not in scan.stderr
    apply = run_cli("apply", str(model), "--rules", str(rule), "--write")
    assert apply.returncode == 2
    assert expected in apply.stderr
    assert model.read_text() == MODEL


@pytest.mark.parametrize(
    "callee",
    [
        "os.system",
        "eval",
        "__import__",
        "os.path.join",  # an attribute chain on a module name
        "adopter.kernels.rms_norm",  # a registered kernel, but not the declared one
        "torch.nn.functional.softmax",
        "$x.__class__",  # a private attribute of a bound value
    ],
)
def test_a_replacement_may_call_only_the_declared_kernel(tmp_path, callee):
    rule = write_rule(tmp_path, "adopter.kernels.softmax", callee)
    with pytest.raises(DslError) as error:
        load_rule_file(rule)
    assert str(error.value).startswith(f"{rule}:7:9: rule mine.1: the replacement calls `")
    assert "it may call only its declared kernel `adopter.kernels.softmax`" in str(error.value)


def test_a_replacement_calling_os_system_fails_scan_and_apply(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    rule = write_rule(tmp_path, "adopter.kernels.softmax", "os.system", '"touch pwned"')
    for command in (["scan"], ["apply", "--write"]):
        result = run_cli(command[0], str(model), "--rules", str(rule), *command[1:])
        assert result.returncode == 2
        assert f"{rule}:7:9: rule mine.1: the replacement calls `os.system`" in result.stderr
    assert model.read_text() == MODEL


@pytest.mark.parametrize(
    ("kernel", "message"),
    [
        ("adopter.kernels.clear_caches", "is a helper of adopter.kernels, not a kernel"),
        ("os.system", "is in the standard library (os), not a kernel"),
        ("builtins.eval", "is in the standard library (builtins), not a kernel"),
        ("adopter.runtime.patch", "Adopter's kernels are adopter.kernels.<name>"),
        ("softmax", "is not a dotted name module.function"),
        ("no_such_package_here.fast", "package 'no_such_package_here' is not on the import path"),
    ],
)
def test_a_kernel_that_is_no_kernel_is_a_located_error(tmp_path, kernel, message):
    rule = write_rule(tmp_path, kernel, kernel)
    with pytest.raises(DslError, match=r"mine\.adopt:3:13: rule mine\.1: ") as error:
        load_rule_file(rule)
    assert message in str(error.value)


def test_arguments_cannot_call_or_name_what_the_pattern_does_not(tmp_path):
    for args in ("os.environ, dim=-1", "$x, dim=os.getcwd()"):
        rule = write_rule(tmp_path, "adopter.kernels.softmax", "adopter.kernels.softmax", args)
        with pytest.raises(DslError, match=r":7:9: rule mine\.1: the replacement passes `os\."):
            load_rule_file(rule)


def test_a_replacement_without_a_declared_kernel_is_an_error():
    text = rule_text("", "adopter.kernels.softmax").replace('    kernel: ""\n', "")
    (rule,) = parse_rules(text, "nokernel.adopt")  # parsing is syntax; loading checks
    with pytest.raises(DslError, match=r"nokernel\.adopt:6:9: .* the rule declares no kernel"):
        adopter.dsl.check_declared_kernels([rule])


def bias_activation_rule(linear: str) -> str:
    # The construction of $linear is at 5:9 (its class at 5:10).
    return (
        "rule mine.2 {\n"
        '    name: "mine"\n'
        '    kernel: "adopter.kernels.linear_bias_activation"\n'
        "    init {\n"
        f"        @{linear} -> $linear;\n"
        "        @activation(...) -> $act\n"
        "    }\n"
        "    forward { $linear($x) -> $h; $act($h) -> $y } => {\n"
        "        adopter.kernels.linear_bias_activation($x, $linear, $act) -> $y\n"
        "    }\n"
        "}\n"
    )


@pytest.mark.parametrize(
    "linear", ["torch.nn.Linear(...)", "nn.Linear(..., bias=False)", "nn.Linear(..., bias=$b)"]
)
def test_a_rule_must_ask_what_its_kernel_declares_of_a_construction(linear):
    """The registry declares linear_bias_activation's Linear with ``bias=True``: a rule that
    hands the kernel a Linear built with anything looser fails to load, at the construction."""
    (rule,) = parse_rules(bias_activation_rule(linear), "bias.adopt")
    with pytest.raises(DslError, match=r"bias\.adopt:5:10: rule mine\.2: .*must ask `bias=True`"):
        adopter.dsl.check_declared_kernels([rule])


@pytest.mark.parametrize("other", ["nn.Linear(..., bias=True)", "Conv1D(...)", "linear(...)"])
def test_a_construction_that_asks_it_or_is_another_class_loads(other):
    (rule,) = parse_rules(bias_activation_rule(other), "bias.adopt")
    adopter.dsl.check_declared_kernels([rule])


def test_a_third_party_kernel_on_the_path_is_allowed_reported_and_never_imported(tmp_path):
    marker = make_third_party(tmp_path)
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    rule = write_rule(tmp_path, "fastpkg.fast_softmax", "fastpkg.fast_softmax")
    site = tmp_path / "site"

    scan = run_cli("scan", str(model), "--rules", str(rule), "-f", "json", pythonpath=site)
    assert scan.returncode == 0, scan.stderr
    (record,) = json.loads(scan.stdout)
    assert record["kernel"] == "fastpkg.fast_softmax" and record["third_party"] is True
    table = run_cli("scan", str(model), "--rules", str(rule), pythonpath=site)
    assert table.returncode == 0, table.stderr
    assert "mine.1 (third-party kernel fastpkg.fast_softmax)" in table.stdout
    apply = run_cli("apply", str(model), "--rules", str(rule), pythonpath=site)
    assert apply.returncode == 0, apply.stderr
    assert "rule mine.1 calls the third-party kernel fastpkg.fast_softmax" in apply.stderr
    applied = run_cli("apply", str(model), "--rules", str(rule), "-f", "json", pythonpath=site)
    (record,) = json.loads(applied.stdout)
    assert record["third_party"] is True
    assert not marker.exists()


def test_a_third_party_kernel_is_found_without_importing_it(tmp_path, monkeypatch):
    marker = make_third_party(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    rule = write_rule(tmp_path, "fastpkg.fast_softmax", "fastpkg.fast_softmax")
    (loaded,) = load_rule_file(rule, use_cache=False)
    assert loaded.third_party_kernel
    assert "fastpkg" not in sys.modules and not marker.exists()


def test_a_built_in_kernel_is_not_reported_as_third_party(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    scan = run_cli("scan", str(model), "-f", "json")
    (record,) = json.loads(scan.stdout)
    assert record["kernel"] == "adopter.kernels.softmax" and "third_party" not in record


def test_every_built_in_rule_passes_the_check():
    rules = load_rule_set("all")
    assert len(rules) == 21
    adopter.dsl.check_declared_kernels(rules)


def test_the_registry_is_read_without_torch_and_names_every_kernel():
    code = (
        "import sys\n"
        "from adopter.dsl.declared import registered_kernels\n"
        "print(sorted(registered_kernels()))\n"
        "assert 'torch' not in sys.modules and 'adopter.kernels' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    from adopter.kernels.registry import names

    assert result.stdout.strip() == str(names())
    assert sorted(registered_kernels()) == names()


def test_patch_with_a_bad_rule_raises_and_patches_nothing(tmp_path, monkeypatch):
    package = tmp_path / "declared_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "modeling.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("declared_pkg.modeling")
    original = module.Attention.forward.__code__
    bad = write_rule(tmp_path, "adopter.kernels.softmax", "os.system", '"touch pwned"')
    with pytest.raises(DslError, match=r"mine\.adopt:7:9: rule mine\.1: the replacement calls"):
        adopter.patch(module, rules=[bad], cache=False)
    with pytest.raises(DslError, match=r"<rule>:7:9: rule mine\.1: the replacement calls"):
        adopter.patch(module, rules=parse_rules(bad.read_text(), "<rule>"), cache=False)
    assert module.Attention.forward.__code__ is original
    assert not (Path.cwd() / "pwned").exists()


def test_run_with_a_bad_rule_exits_2_with_the_located_message(tmp_path):
    bad = write_rule(tmp_path, "adopter.kernels.softmax", "os.system", '"touch pwned"')
    result = run_cli("run", "--rules", str(bad), "--", sys.executable, "-c", "pass")
    assert result.returncode == 2
    assert f"{bad}:7:9: rule mine.1: the replacement calls `os.system`" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_cached_parse_is_checked_again_on_every_load(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    make_third_party(tmp_path)
    rule = write_rule(tmp_path, "fastpkg.fast_softmax", "fastpkg.fast_softmax")
    with monkeypatch.context() as patched:
        patched.syspath_prepend(str(tmp_path / "site"))
        load_rule_file(rule)  # parsed, checked and cached
    importlib.invalidate_caches()
    assert any((tmp_path / "xdg-cache").rglob("*.pickle"))
    # The package is gone from the path: the cached parse must not skip the check.
    with pytest.raises(DslError, match=r"mine\.adopt:3:13: .* 'fastpkg' is not on the import"):
        load_rule_file(rule)
