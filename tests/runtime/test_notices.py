"""modern.7 makes a causal LM return ``logits=None`` in training with labels: ``adopter.patch``
and ``adopter run`` say so once per process, at patch time, with how to keep the logits; the
rule can be left out (``exclude=`` / ``--exclude``)."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import adopter
from adopter.runtime import log

HEAD = """
from torch import nn


class TinyForCausalLM(nn.Module):
    def __init__(self, hidden, vocab):
        super().__init__()
        self.vocab = vocab
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, hidden_states, labels=None):
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.vocab)
        return loss, logits
"""

NOTICE = "returns logits=None"
REPOSITORY = Path(__file__).resolve().parents[2]


def test_the_logits_notice_is_logged_once_at_patch_time(make_package, caplog, monkeypatch):
    monkeypatch.setattr(log, "_SEEN", set())  # as in a fresh process, whatever ran before
    make_package("rt_notice", {"first.py": HEAD, "second.py": HEAD})
    caplog.set_level(logging.INFO, logger="adopter")
    first = adopter.patch("rt_notice.first", rules="modern")
    second = adopter.patch("rt_notice.second", rules="modern")
    adopter.patch("rt_notice.first", rules="modern")  # already patched

    assert first.patched["rt_notice.first"] == ["modern.7 TinyForCausalLM.forward line 11"]
    assert list(second.patched) == ["rt_notice.second"]
    notices = [r for r in caplog.records if NOTICE in r.getMessage()]
    assert len(notices) == 1
    message = notices[0].getMessage()
    assert notices[0].levelno == logging.WARNING
    assert message.startswith("modern.7 patched in")
    assert "return_logits=True" in message and 'exclude="modern.7"' in message
    assert "--exclude modern.7" in message


def test_exclude_leaves_the_rule_out_and_says_nothing(make_package, caplog):
    make_package("rt_notice_excluded", {"head.py": HEAD})
    caplog.set_level(logging.INFO, logger="adopter")
    report = adopter.patch("rt_notice_excluded.head", rules="modern", exclude="modern.7")
    assert report.patched == {}
    assert NOTICE not in caplog.text
    head = importlib.import_module("rt_notice_excluded.head")
    assert "causal_lm_loss" not in vars(head)


def _run(root: Path, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text("import rt_notice_run.first, rt_notice_run.second\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(REPOSITORY)])
    env["ADOPTER_CACHE_DIR"] = str(tmp_path / "cache")
    command = [sys.executable, "-m", "adopter", "run", "--rule-set", "modern", *options]
    command += ["--packages", "rt_notice_run", "--", "python", str(script)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a fresh interpreter per run
def test_adopter_run_prints_the_notice_once_and_exclude_drops_it(make_package, tmp_path):
    package = make_package("rt_notice_run", {"first.py": HEAD, "second.py": HEAD})
    done = _run(package.parent, tmp_path, "-v")  # -v: the line of each patched module
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("patched rt_notice_run.") == 2
    assert done.stderr.count(NOTICE) == 1
    excluded = _run(package.parent, tmp_path, "--exclude", "modern.7")
    assert excluded.returncode == 0, excluded.stderr
    assert NOTICE not in excluded.stderr and "modern.7" not in excluded.stderr
    unknown = _run(package.parent, tmp_path, "--exclude", "modern.99")
    assert unknown.returncode == 2 and "--exclude names unknown rule(s): modern.99" in (
        unknown.stdout + unknown.stderr
    )
