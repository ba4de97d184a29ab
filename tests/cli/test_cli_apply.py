"""``adopter apply``: diff, --write (atomic, idempotent), --check, json, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adopter.cli import app
from adopter.rewrite import FileRewrite, WriteStatus, write_rewrite

MODEL = """\
from torch import nn
import torch.nn.functional as F


class Attention(nn.Module):
    def forward(self, scores):
        # the probabilities
        return F.softmax(scores, dim=-1)
"""

UNTOUCHED = """\
from torch import nn


class Nothing(nn.Module):
    def forward(self, x):
        return x * 2
"""

try:  # keep stderr (progress, summaries) out of the parsed stdout on every click version
    runner = CliRunner(mix_stderr=False)
except TypeError:  # click >= 8.2 always keeps them apart
    runner = CliRunner()


def project(tmp_path: Path) -> tuple[Path, Path]:
    model, other = tmp_path / "model.py", tmp_path / "other.py"
    model.write_text(MODEL)
    other.write_text(UNTOUCHED)
    return model, other


def test_default_prints_a_diff_and_writes_nothing(tmp_path):
    model, _ = project(tmp_path)
    result = runner.invoke(app, ["apply", str(tmp_path)])
    assert result.exit_code == 0
    assert f"--- a{model}" in result.stdout and f"+++ b{model}" in result.stdout  # no a//
    assert "-        return F.softmax(scores, dim=-1)" in result.stdout
    assert "+        return softmax(scores, dim=-1)" in result.stdout
    assert "+from adopter.kernels import softmax" in result.stdout
    assert model.read_text() == MODEL


def test_write_is_idempotent_and_leaves_other_files_alone(tmp_path):
    model, other = project(tmp_path)
    before = other.stat().st_mtime_ns
    result = runner.invoke(app, ["apply", str(tmp_path), "--write"])
    assert result.exit_code == 0
    patched = model.read_text()
    assert "return softmax(scores, dim=-1)" in patched and "# the probabilities" in patched
    compile(patched, str(model), "exec")
    assert other.read_text() == UNTOUCHED and other.stat().st_mtime_ns == before
    again = runner.invoke(app, ["apply", str(tmp_path), "--write"])
    assert again.exit_code == 0 and model.read_text() == patched
    check = runner.invoke(app, ["apply", str(tmp_path), "--check"])
    assert check.exit_code == 0
    assert not list(tmp_path.glob(".*.adopter"))


def test_check_exits_one_when_something_would_change(tmp_path):
    model, _ = project(tmp_path)
    result = runner.invoke(app, ["apply", str(model), "--check"])
    assert result.exit_code == 1
    assert model.read_text() == MODEL


def test_json_lists_the_edits(tmp_path):
    project(tmp_path)
    result = runner.invoke(app, ["apply", str(tmp_path), "--format", "json"])
    assert result.exit_code == 0
    (record,) = json.loads(result.stdout)
    assert record["rule"] == "paper.4" and record["status"] == "patched"
    assert record["edit"] == "F.softmax(scores, dim=-1) -> softmax(scores, dim=-1)"


def test_broken_file_is_reported_and_not_written(tmp_path):
    model, _ = project(tmp_path)
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    result = subprocess.run(
        [sys.executable, "-m", "adopter", "apply", str(tmp_path), "--write"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert f"{broken}:1:7: invalid Python" in result.stderr
    assert broken.read_text() == "def f(:\n"
    assert "return softmax(scores, dim=-1)" in model.read_text()  # the good file still applies


def test_atomic_write_leaves_the_file_whole_when_replacing_fails(tmp_path, monkeypatch):
    target = tmp_path / "model.py"
    target.write_text(MODEL)

    def failing_replace(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    outcome = write_rewrite(FileRewrite(str(target), MODEL, "something_else = 1\n"))
    assert outcome.status is WriteStatus.FAILED and "No space left" in outcome.reason
    assert target.read_text() == MODEL
    assert [p.name for p in tmp_path.iterdir()] == ["model.py"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only folders")
def test_unwritable_file_is_an_error(tmp_path):
    model, _ = project(tmp_path)
    tmp_path.chmod(0o555)
    try:
        result = runner.invoke(app, ["apply", str(model), "--write"])
    finally:
        tmp_path.chmod(0o755)
    assert result.exit_code == 2
    assert model.read_text() == MODEL


def test_modular_option_chooses_which_transformers_file_is_patched(tmp_path):
    header = "# This file was automatically generated from models/toy/modular_toy.py.\n"
    (tmp_path / "modeling_toy.py").write_text(header + MODEL, encoding="utf-8")
    (tmp_path / "modular_toy.py").write_text(MODEL, encoding="utf-8")
    default = runner.invoke(app, ["apply", str(tmp_path), "--format", "json"])
    statuses = {Path(r["path"]).name: r["status"] for r in json.loads(default.stdout)}
    assert statuses == {"modeling_toy.py": "patched", "modular_toy.py": "skipped"}
    modular = runner.invoke(app, ["apply", str(tmp_path), "--format", "json", "--modular"])
    statuses = {Path(r["path"]).name: r["status"] for r in json.loads(modular.stdout)}
    assert statuses == {"modeling_toy.py": "skipped", "modular_toy.py": "patched"}
