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


@pytest.fixture(autouse=True)
def _fresh_progress(monkeypatch):
    """Each test starts with no rewriting under way: the progress clock is per process, and
    an earlier test's rewrites (in any order) would make a progress line due here."""
    monkeypatch.setattr(log, "_PROGRESS", {})


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


def test_at_debug_every_line_is_printed_and_still_counted(monkeypatch):
    # `adopter run -v` printed every module's line, then "patched 0 site(s) in 0 module(s)"
    # at exit: the lines it let through were not counted.
    monkeypatch.setattr(log.LOGGER, "level", logging.DEBUG)
    summary = log._Summary()
    assert summary.filter(_record("patched", "timm.layers.mlp", sites=3))
    assert summary.filter(_record("partial", "timm.layers.norm"))
    # ... and with no pointer to -v: its lines were just printed
    assert log.summary_line("timm", summary.take()["timm"]) == (
        "timm: patched 3 site(s) in 1 module(s), 1 module(s) with sites not patched"
    )


@pytest.mark.parametrize(
    ("counts", "line"),
    [
        (Counter(patched=1, sites=4), "transformers: patched 4 site(s) in 1 module(s)"),
        (Counter(), "transformers: patched 0 site(s) in 0 module(s)"),
    ],
)
def test_a_clean_package_has_no_pointer_to_details(counts, line):
    assert log.summary_line("transformers", counts) == line


def test_a_first_run_says_it_rewrites_and_the_summary_counts_what_it_rewrote(monkeypatch, caplog):
    monkeypatch.setattr(log.LOGGER, "level", logging.INFO)
    monkeypatch.setattr(log, "_SEEN", set())
    summary = log._Summary()
    monkeypatch.setattr(log, "_SUMMARY", summary)
    with caplog.at_level(logging.INFO, logger="adopter"):
        log.rewriting("timm.layers.mlp")
        log.rewriting("timm.models.resnet")  # one line per package, before its first rewrite
    assert [r.getMessage() for r in caplog.records] == [
        "timm: rewriting its imported modules (first run with these rules and this version; "
        "later runs read the cache) ..."
    ]
    log.rewritten("timm.layers.mlp", 1.25)
    log.rewritten("timm.models.resnet", 0.5)
    assert not summary.filter(_record("patched", "timm.layers.mlp", sites=3))
    assert log.summary_line("timm", summary.take()["timm"]) == (
        "timm: patched 3 site(s) in 1 module(s), rewrote 2 module(s) in 1.8 s "
        "(cached for later runs)"
    )


def test_a_long_rewrite_says_how_far_it_has_gone(monkeypatch, caplog):
    clock = iter([0.0, 4.0, 11.0, 12.0])
    monkeypatch.setattr(log.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(log, "_PROGRESS", {})
    monkeypatch.setattr(log, "_SUMMARY", log._Summary())
    with caplog.at_level(logging.INFO, logger="adopter"):
        for name in ("a", "b", "c", "d"):
            log.rewritten(f"diffusers.models.{name}", 0.1)
    assert [r.getMessage() for r in caplog.records] == [
        "diffusers: 3 module(s) rewritten so far ..."
    ]


def test_imports_that_only_rewrote_say_it_in_the_next_line_or_at_exit(monkeypatch, caplog):
    """A script's first imports of a package rewrite modules with nothing to patch; they print
    no "patched 0 site(s)" line of their own: the counts go into the package's next line, and
    what is left is said once at exit."""
    monkeypatch.setattr(log.LOGGER, "level", logging.INFO)
    summary = log._Summary()
    monkeypatch.setattr(log, "_SUMMARY", summary)
    monkeypatch.setattr(log.time, "monotonic", lambda: 100.0)  # no progress line falls due
    with caplog.at_level(logging.INFO, logger="adopter"):
        log.rewritten("transformers.utils.generic", 2.0)
        log.summarise()  # the first outermost import finished: nothing to say yet
        assert not caplog.records
        log.rewritten("transformers.models.llama.modeling_llama", 1.0)
        assert not summary.filter(_record("patched", "transformers.models.llama", sites=9))
        log.summarise()
        log.rewritten("transformers.models.auto.modeling_auto", 0.5)
        log.summarise()
        log.summarise(everything=True)  # at exit
    assert [r.getMessage() for r in caplog.records] == [
        "transformers: patched 9 site(s) in 1 module(s), rewrote 2 module(s) in 3.0 s "
        "(cached for later runs)",
        "transformers: patched 0 site(s) in 0 module(s), rewrote 1 module(s) in 0.5 s "
        "(cached for later runs)",
    ]
