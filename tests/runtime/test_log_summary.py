"""``adopter run`` folds the per-module lines into one line per package at INFO."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from adopter.runtime import log


def _record(outcome: str, module: str, sites: int = 0) -> logging.LogRecord:
    record = logging.LogRecord("adopter", logging.INFO, __file__, 1, "a line", None, None)
    record.__dict__.update({log.OUTCOME: outcome, "adopter_module": module, "adopter_sites": sites})
    return record


def test_outcome_lines_are_counted_per_package_and_other_lines_pass(monkeypatch):
    monkeypatch.setattr(log.LOGGER, "level", logging.INFO)
    summary = log._Summary()
    assert not summary.filter(_record("patched", "timm.layers.mlp", sites=3))
    assert not summary.filter(_record("patched", "timm.models.resnet", sites=2))
    assert not summary.filter(_record("unpatched", "timm.layers.norm"))
    assert not summary.filter(_record("partial", "diffusers.models.resnet"))
    plain = logging.LogRecord("adopter", logging.INFO, __file__, 1, "a notice", None, None)
    assert summary.filter(plain)  # notices and warnings are never folded
    counts = summary.take()
    assert log.summary_line("timm", counts["timm"]) == (
        "timm: patched 5 site(s) in 2 module(s), 1 module(s) left unpatched "
        "(adopter run -v says which and why)"
    )
    assert log.summary_line("diffusers", counts["diffusers"]) == (
        "diffusers: patched 0 site(s) in 0 module(s), 1 module(s) with sites not patched "
        "(adopter run -v says which and why)"
    )
    assert summary.take() == {}  # each summary covers what happened since the last one


def test_at_debug_every_line_is_printed(monkeypatch):
    monkeypatch.setattr(log.LOGGER, "level", logging.DEBUG)
    summary = log._Summary()
    assert summary.filter(_record("patched", "timm.layers.mlp", sites=3))
    assert summary.take() == {}


@pytest.mark.parametrize(
    ("counts", "line"),
    [
        (Counter(patched=1, sites=4), "transformers: patched 4 site(s) in 1 module(s)"),
        (Counter(), "transformers: patched 0 site(s) in 0 module(s)"),
    ],
)
def test_a_clean_package_has_no_pointer_to_details(counts, line):
    assert log.summary_line("transformers", counts) == line
