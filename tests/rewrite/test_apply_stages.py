"""The work behind ``adopter apply``, in the stages it belongs to (the CLI only handles
arguments): the summary and skip lines, writing, ``--only-faster`` and ``--verify``."""

from __future__ import annotations

import os
import time

from typer.testing import CliRunner

from adopter import gate
from adopter.bench import command
from adopter.bench.command import BenchTargetError, keep_faster_rules
from adopter.cli import app
from adopter.gate import GatedFile, keep_verified
from adopter.rewrite import WriteOptions, rewrite_paths, write_changed
from adopter.rules import load_rule_set

MODEL = """from torch import nn
import torch.nn.functional as F


class SelfOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(4)
        self.dropout = nn.Dropout(0.1)
        self.e = nn.Linear(4, 4)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
        return F.gelu(self.e(hidden_states), approximate="tanh")
"""


def project(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(MODEL, encoding="utf-8")
    (tmp_path / "empty.py").write_text("x = 1\n", encoding="utf-8")
    return model, rewrite_paths([tmp_path], load_rule_set("paper"))


def test_summary_and_skip_lines(tmp_path):
    model, result = project(tmp_path)
    assert result.skip_lines() == [
        f"skipped paper.6 at {model}:15:23: line 15: "
        '`F.gelu(self.e(hidden_states), approximate="tanh")` passes arguments the replacement '
        "would drop"
    ]
    line = result.summary(result.changed, written=False, not_written=0)
    assert line.startswith(
        "1 site(s) to patch in 1 file(s), 0 covered by an enclosing rewrite, 1 skipped, 0 error(s), "
    )
    assert "2 file(s) not written" in result.summary([], written=True, not_written=2)


def test_write_changed_removes_stale_temporaries_and_writes(tmp_path):
    model, result = project(tmp_path)
    stale = tmp_path / ".model.py.abcd1234.adopter"
    stale.write_text("left by a killed run", encoding="utf-8")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    said: list[str] = []
    done, not_written = write_changed(result, WriteOptions(), said.append)
    assert said == [f"removed {stale}: a temporary file left by an interrupted apply"]
    assert [r.path for r in done] == [str(model)] and not_written == 0
    assert "dropout_add_layer_norm" in model.read_text(encoding="utf-8")


def test_only_faster_keeps_the_faster_rules_and_says_why(tmp_path, monkeypatch):
    model, result = project(tmp_path)
    monkeypatch.setattr(
        command, "only_faster_rules", lambda path, rules: ([], {"paper.5": "slower here"})
    )
    said: list[str] = []
    kept = keep_faster_rules(result, load_rule_set("paper"), said.append)
    assert said == [f"{model}: paper.5: slower here"] and kept.changed == []

    def unbenchmarkable(path, rules):
        raise BenchTargetError("no model class")

    _, result = project(tmp_path)
    monkeypatch.setattr(command, "only_faster_rules", unbenchmarkable)
    said.clear()
    assert keep_faster_rules(result, load_rule_set("paper"), said.append).changed == []
    assert said == [f"{model}: not benchmarked (no model class); left unpatched"]


def test_verify_keeps_only_proven_files(tmp_path, monkeypatch):
    model, result = project(tmp_path)
    (changed,) = result.changed

    def refute(rewrites, rules, timeout):
        return [GatedFile(changed, "refuted", "outputs differ", None)]

    monkeypatch.setattr(gate, "gate_rewrites", refute)
    said: list[str] = []
    keep_verified(result, load_rule_set("paper"), timeout=5, say=said.append)
    assert said == [f"{model}: refuted - outputs differ"]
    assert result.changed == [] and len(result.files) == 1  # the unchanged file stays
    assert result.held_back == 1
    assert "1 file(s) held back unproven" in result.summary([], written=True, not_written=0)


def test_apply_verify_write_fails_when_nothing_could_be_checked(tmp_path, monkeypatch):
    model, _ = project(tmp_path)
    before = model.read_bytes()

    def not_checkable(rewrites, rules, timeout):
        return [GatedFile(r, "not checkable", "attempted relative import", None) for r in rewrites]

    monkeypatch.setattr(gate, "gate_rewrites", not_checkable)
    result = CliRunner().invoke(app, ["apply", "--verify", "--write", str(model)])
    assert result.exit_code == 2, result.output
    assert "not checkable - attempted relative import" in result.output
    assert "held back unproven" in result.output
    assert model.read_bytes() == before


def test_apply_verify_write_succeeds_when_every_file_is_proven(tmp_path, monkeypatch):
    model, _ = project(tmp_path)

    def proven(rewrites, rules, timeout):
        return [GatedFile(r, "verified", "all sites ran", r.patched) for r in rewrites]

    monkeypatch.setattr(gate, "gate_rewrites", proven)
    result = CliRunner().invoke(app, ["apply", "--verify", "--write", str(model)])
    assert result.exit_code == 0, result.output
    assert "held back" not in result.output
    assert "dropout_add_layer_norm" in model.read_text(encoding="utf-8")
