"""Verdict types: aggregate status, JSON round trip, and a torch-free parent side."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from adopter.verify import ClassVerification, FileVerification


def test_file_status_never_reads_empty_as_verified() -> None:
    assert FileVerification(Path("m.py")).status == "not checkable"
    ok = ClassVerification("A", "verified", "agrees", 0.0)
    assert FileVerification(Path("m.py"), [ok]).status == "verified"
    assert FileVerification(Path("m.py"), [ok], error="timed out").status == "not checkable"
    blocked = ClassVerification("B", "not checkable", "why")
    assert FileVerification(Path("m.py"), [ok, blocked]).status == "not checkable"
    refuted = ClassVerification("C", "refuted", "differs", 0.5, "grad w")
    assert FileVerification(Path("m.py"), [blocked, refuted]).status == "refuted"


def test_class_verdict_json_round_trip() -> None:
    verdict = ClassVerification("A", "refuted", "r", float("inf"), "state_dict", {"eval": "x"})
    assert ClassVerification.from_json(verdict.to_json()) == verdict
    summary = FileVerification(Path("m.py"), [verdict], seconds=1.5).summary()
    assert "A: refuted" in summary and "(1.5 s)" in summary


def test_importing_the_api_imports_no_torch_and_no_model_code() -> None:
    code = (
        "import sys, adopter.verify\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
