"""The pre-commit hooks shipped in .pre-commit-hooks.yaml run real ``adopter`` commands."""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adopter.cli import app

yaml = pytest.importorskip("yaml")
HOOKS = Path(__file__).resolve().parents[2] / ".pre-commit-hooks.yaml"
MODEL = textwrap.dedent(
    """
    import torch.nn.functional as F
    from torch import nn

    class Attn(nn.Module):
        def forward(self, scores):
            return F.softmax(scores, dim=-1)
    """
)


def _hooks() -> dict[str, dict]:
    return {hook["id"]: hook for hook in yaml.safe_load(HOOKS.read_text())}


def _run(hook: dict, *files: Path):
    command = shlex.split(hook["entry"])
    assert command[0] == "adopter"
    return CliRunner().invoke(app, [*command[1:], *hook.get("args", []), *map(str, files)])


def test_hooks_are_python_hooks_on_python_files():
    for hook in _hooks().values():
        assert hook["language"] == "python" and hook["types"] == ["python"]


def test_check_hook_fails_on_a_file_with_a_site_and_passes_once_patched(tmp_path):
    hooks = _hooks()
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    assert _run(hooks["adopter-check"], model).exit_code == 1
    assert model.read_text() == MODEL  # the check hook never writes
    assert _run(hooks["adopter-apply"], model).exit_code == 1  # changed the file: commit blocked
    assert "adopter.kernels" in model.read_text()
    assert _run(hooks["adopter-check"], model).exit_code == 0
    assert _run(hooks["adopter-apply"], model).exit_code == 0
