"""A VerifyJob carries all a machine needs: verified where the caller's file is absent, with the
same verdict; and a worker over its memory limit is stopped and named."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set
from adopter.verify import NOT_CHECKABLE, PatchedFile, VerifyOptions, verify_factory
from adopter.verify.runner import file_job, run_verify_jobs

GUARDED = Path(__file__).with_name("guarded") / "modeling_guarded.py"
FACTORIES = Path(__file__).with_name("factories.py")


def _job(original: Path):
    text = original.read_text(encoding="utf-8")
    patched = rewrite_text(text, str(original), Matcher(load_rule_set("paper"))).patched
    options = VerifyOptions(modes=("eval",), max_heads=1, timeout=120.0)
    return file_job(PatchedFile(original, patched), options)


def test_a_machine_without_the_file_verifies_from_the_shipped_text() -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers")
    job = _job(GUARDED)
    elsewhere = dataclasses.replace(
        job,
        worker_job=dataclasses.replace(
            job.worker_job, original_path="/nonexistent/modeling_guarded.py"
        ),
    )
    here, there = list(run_verify_jobs([job, elsewhere]))
    assert there.status == here.status
    assert [(c.label, c.status, c.reason) for c in there.classes] == [
        (c.label, c.status, c.reason) for c in here.classes
    ]
    assert [s.status for s in there.sites] == [s.status for s in here.sites]
    assert str(there.path) == str(GUARDED)  # the verdict names the caller's file
    assert any("same text as the given file" in note for note in there.notes)


def test_a_worker_over_its_memory_limit_is_stopped() -> None:
    factory = f"{FACTORIES}:make_original"
    verdict = verify_factory(
        factory, factory, VerifyOptions(timeout=120, memory_limit=32 * 1024**2)
    )
    assert verdict.status == NOT_CHECKABLE
    assert "exceeded the memory limit of 0.03 GiB" in verdict.reason
