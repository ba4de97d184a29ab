"""The example training scripts give the same losses plainly and under ``adopter run``.

The Llama example also runs on the transformers 4.34 of the test environment. All three run
in ``.venv5`` (transformers 5.x, diffusers, timm) when that environment exists next to the
repository and the library imports there; otherwise those cases are skipped.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
SIDE_PYTHON = REPOSITORY / ".venv5" / "bin" / "python"
EXAMPLES = {
    "train_tiny_llama.py": "transformers",
    "train_tiny_diffusers.py": "diffusers",
    "train_tiny_timm.py": "timm",
}


def _imports(python: Path | str, module: str) -> bool:
    probe = subprocess.run(
        [str(python), "-c", f"import {module}"], capture_output=True, timeout=300
    )
    return probe.returncode == 0


def _run(command: list[str], tmp_path: Path, name: str) -> tuple[dict, str]:
    out = tmp_path / f"{name}.json"
    env = dict(os.environ, ADOPTER_CACHE_DIR=str(tmp_path / "cache"), PYTHONWARNINGS="ignore")
    done = subprocess.run(
        [*command, "--steps", "2", "--json", str(out)],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stderr


def _compare(python: Path | str, example: str, tmp_path: Path) -> str:
    script = str(REPOSITORY / "examples" / example)
    plain, _ = _run([str(python), script], tmp_path, "plain")
    adopted, log = _run(
        [str(python), "-m", "adopter", "run", "--", "python", script], tmp_path, "adopted"
    )
    assert len(plain["losses"]) == len(adopted["losses"]) == 2
    for a, b in zip(plain["losses"], adopted["losses"]):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), (plain, adopted)
    return log


def test_the_llama_example_on_the_test_environment(tmp_path):
    pytest.importorskip("transformers")
    log = _compare(sys.executable, "train_tiny_llama.py", tmp_path)
    assert "adopter: patched transformers.models.llama.modeling_llama" in log


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_examples_in_the_side_environment(example, tmp_path):
    if not SIDE_PYTHON.exists():
        pytest.skip(".venv5 (transformers 5.x, diffusers, timm) is not set up")
    if not _imports(SIDE_PYTHON, EXAMPLES[example]):
        pytest.skip(f"{EXAMPLES[example]} does not import in .venv5")
    log = _compare(SIDE_PYTHON, example, tmp_path)
    assert "adopter: patched " in log
