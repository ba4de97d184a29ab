"""``verify=True``: a module's rewrite is used only when ``adopter verify`` proves it."""

from __future__ import annotations

import importlib
import logging
import sys

import pytest

import adopter

from .models import VERIFIABLE, WRONG_RULE

pytest.importorskip("transformers")


def _forbid_verify(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("verified again although the verdict is cached")

    monkeypatch.setattr("adopter.runtime.proof.prove", refuse)


def test_a_refuted_rewrite_falls_back_to_the_original_and_the_verdict_is_cached(
    make_package, tmp_path, monkeypatch, caplog
):
    make_package("rt_refuted", {"modeling_tiny.py": VERIFIABLE})
    rule = tmp_path / "wrong.adopt"
    rule.write_text(WRONG_RULE)
    module = importlib.import_module("rt_refuted.modeling_tiny")
    original = module.TinyScores.forward.__code__
    caplog.set_level(logging.INFO, logger="adopter")

    report = adopter.patch(module, rules=[rule], verify=True, verify_timeout=240)

    assert report.patched == {}
    reason = report.skipped["rt_refuted.modeling_tiny"]
    assert reason.startswith("verify found it refuted")
    assert module.TinyScores.forward.__code__ is original
    assert "left rt_refuted.modeling_tiny unpatched: verify found it refuted" in caplog.text

    # Without verify the same rule is applied: the verdict above is what kept it out.
    unverified = adopter.patch(module, rules=[rule])
    assert list(unverified.patched) == ["rt_refuted.modeling_tiny"]
    adopter.unpatch()

    del sys.modules["rt_refuted.modeling_tiny"]
    module = importlib.import_module("rt_refuted.modeling_tiny")
    _forbid_verify(monkeypatch)
    again = adopter.patch(module, rules=[rule], verify=True)
    assert again.skipped == {"rt_refuted.modeling_tiny": reason}


def test_a_verified_rewrite_is_used(make_package, caplog):
    make_package("rt_verified", {"modeling_tiny.py": VERIFIABLE})
    module = importlib.import_module("rt_verified.modeling_tiny")
    caplog.set_level(logging.INFO, logger="adopter")

    report = adopter.patch(module, rules="paper", verify=True, verify_timeout=240)

    assert report.patched == {"rt_verified.modeling_tiny": ["paper.4 TinyScores.forward line 17"]}
    assert "patched rt_verified.modeling_tiny (verified)" in caplog.text
    assert "softmax" in vars(module)
