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


def test_a_changed_text_without_located_kernel_calls_is_not_verified() -> None:
    """Agreeing checks of a patch whose kernel calls verify could not locate prove nothing:
    the patched code may never have run. Only an unchanged text is verified that way."""
    ok = ClassVerification("A", "verified", "agrees", 0.0)
    unlocated = FileVerification(Path("m.py"), [ok], kernel_calls_expected=True)
    assert unlocated.status == "not exercised"
    assert "no adopter.kernels call was located" in unlocated.reason()
    assert unlocated.to_json()["status"] == "not exercised"
    blocked = ClassVerification("B", "not checkable", "why")
    assert FileVerification(Path("m.py"), [blocked], kernel_calls_expected=True).status == (
        "not checkable"
    )


def test_verify_expects_kernel_calls_exactly_when_the_text_changed(tmp_path: Path) -> None:
    from adopter.verify.runner import PatchedFile, VerifyOptions, file_job

    def _options() -> VerifyOptions:
        return VerifyOptions(timeout=60.0)

    model = tmp_path / "modeling_x.py"
    model.write_text("x = 1\n", encoding="utf-8")
    same = file_job(PatchedFile(model, "x = 1\n"), _options())
    changed = file_job(PatchedFile(model, "x = 2\n"), _options())
    assert same.worker_job.kernel_calls_expected is False
    assert changed.worker_job.kernel_calls_expected is True


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


def test_a_file_is_verified_only_when_every_site_ran_and_matched() -> None:
    from adopter.verify import PatchedSite
    from adopter.verify.results import site_coverage

    sites = [
        PatchedSite("softmax", 10, 8, 10, 30, "A.forward", "A"),
        PatchedSite("softmax", 20, 8, 20, 30, "A.forward", "A", guards=["self.config.flag"]),
    ]
    ran_first = ClassVerification(
        "A", "verified", "agrees", 0.0, modes={"eval": "verified: ok"}, runs={"eval": {"10:8": 3}}
    )
    flipped = ClassVerification(
        "A",
        "verified",
        "agrees",
        0.0,
        modes={"eval": "verified: ok", "train": "not checkable: unstable"},
        setting="flag=True",
        runs={"train": {"20:8": 1}},
    )
    assert ClassVerification.from_json(flipped.to_json()) == flipped
    assert flipped.label == "A [flag=True]"
    partial = FileVerification(Path("m.py"), [ran_first], sites=site_coverage(sites, [ran_first]))
    assert partial.status == "not exercised"
    (missing,) = partial.not_exercised
    assert missing.site.line == 20 and "never ran" in missing.reason
    assert "`self.config.flag`" in missing.reason and "line 20" in partial.reason()
    # ran, but only in a mode that could not be judged: still not exercised
    both = [ran_first, flipped]
    judged = FileVerification(Path("m.py"), both, sites=site_coverage(sites, both))
    assert judged.status == "not exercised"
    assert judged.not_exercised[0].ran_in == {"A [flag=True]: train": 1}
    flipped.modes["train"] = "verified: ok"
    done = FileVerification(Path("m.py"), both, sites=site_coverage(sites, both))
    assert done.status == "verified" and "all 2 patched site(s) ran and matched" in done.reason()
    # a class that could not be built does not count against it; a refuted one decides
    blocked = ClassVerification("B", "not checkable", "no inputs")
    assert FileVerification(Path("m.py"), [*both, blocked], sites=done.sites).status == "verified"
    refuted = ClassVerification("C", "refuted", "differs", 0.5, "grad w")
    assert FileVerification(Path("m.py"), [*both, refuted], sites=done.sites).status == "refuted"
    assert FileVerification(Path("m.py"), [blocked], sites=done.sites).status == "not checkable"
