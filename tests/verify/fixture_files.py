"""Our own fixture modeling files (``guarded/``, ``parts/``) patched by one rule, and verify's
verdicts on variants of the patched text (a correct patch, one made wrong on purpose...)."""

from __future__ import annotations

from pathlib import Path

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rewrite.apply import FileRewrite
from adopter.rules import load_rule_set
from adopter.verify import FileVerification, PatchedFile, VerifyOptions, verify_patched_files


def rewritten_by(fixture: Path, rule_id: str) -> FileRewrite:
    """``fixture`` rewritten by the paper rule ``rule_id`` alone."""
    rules = [r for r in load_rule_set("paper") if r.id == rule_id]
    return rewrite_text(fixture.read_text(encoding="utf-8"), str(fixture), Matcher(rules))


def verdicts_of(
    fixture: Path, cases: dict[str, str], options: VerifyOptions
) -> dict[str, FileVerification]:
    """Each case's verdict: its text verified as the patched ``fixture``."""
    files = [PatchedFile(fixture, text) for text in cases.values()]
    return dict(zip(cases, verify_patched_files(files, options), strict=True))
