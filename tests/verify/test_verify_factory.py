"""``verify_factory``: plain ``nn.Module`` code built by user factories (tests/verify/factories.py).

The cases share one batch (one worker process, torch imported once) except the timeout, which
needs its own short limit. A crashing factory is in the batch on purpose: the batch must go on
in a fresh worker after it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from adopter.verify import ClassVerification, VerifyOptions, verify_factories, verify_factory
from tests.helpers import process_alive

pytestmark = pytest.mark.slow  # see pyproject.toml's markers

FACTORIES = Path(__file__).with_name("factories.py")
ORIGINAL = f"{FACTORIES}:make_original"


def factory(name: str) -> str:
    return f"{FACTORIES}:{name}"


CASES = {
    "identical": factory("make_original"),
    "patched": factory("make_patched"),
    "crashing": factory("make_crashing"),
    "wrong": factory("make_wrong"),
    "renamed": factory("make_renamed"),
    "rarely-patched": factory("make_rarely_patched"),
    "missing-function": factory("no_such_factory"),
    "missing-file": f"{FACTORIES.with_name('no_such_file.py')}:make_patched",
}


@pytest.fixture(scope="module")
def verdicts() -> dict[str, ClassVerification]:
    results = verify_factories(
        [(ORIGINAL, patched) for patched in CASES.values()], VerifyOptions(timeout=120)
    )
    return dict(zip(CASES, results))


def test_an_unpatched_factory_agrees_bit_for_bit_but_is_not_verified(
    verdicts: dict[str, ClassVerification],
) -> None:
    # The original against itself agrees exactly, but no patched site ran: "verified" would be
    # a check that cannot fail (a harness comparing the patched model with itself passed so).
    verdict = verdicts["identical"]
    assert verdict.status == "not exercised", verdict
    assert "calls no adopter.kernels function" in verdict.reason
    assert verdict.cls == "Block"
    assert set(verdict.modes) == {"eval", "train", "train-dropout"}
    assert all(outcome.startswith("verified") for outcome in verdict.modes.values())
    assert verdict.max_abs_diff == 0.0


def test_kernel_patch_verifies_in_every_mode(verdicts: dict[str, ClassVerification]) -> None:
    verdict = verdicts["patched"]
    assert verdict.status == "verified", verdict
    for mode in ("eval", "train", "train-dropout"):
        assert verdict.modes[mode].startswith("verified"), verdict.modes
    # Folding batch norm into the conv reorders float operations: close, not identical.
    assert verdict.max_abs_diff is not None and verdict.max_abs_diff < 1e-3


def test_lost_residual_is_refuted_with_location(verdicts: dict[str, ClassVerification]) -> None:
    verdict = verdicts["wrong"]
    assert verdict.status == "refuted", verdict
    assert verdict.max_abs_diff is not None and verdict.max_abs_diff > 0.1
    assert verdict.where is not None and verdict.where.startswith(("output", "grad"))
    assert "output output[1]" in verdict.reason  # the normed branch, not the conv branch
    assert all(v.startswith("refuted") for v in verdict.modes.values()), verdict.modes


def test_a_kernel_that_never_runs_is_not_exercised(
    verdicts: dict[str, ClassVerification],
) -> None:
    """Outputs agree, but the only patched site never ran: not verified, and the site named."""
    verdict = verdicts["rarely-patched"]
    assert verdict.status == "not exercised", verdict
    assert "conv_batch_norm" in verdict.reason and "image.shape[0] > 100" in verdict.reason
    assert "RarelyPatchedBlock.forward" in verdict.reason


def test_every_patched_site_of_the_kernel_patch_ran(
    verdicts: dict[str, ClassVerification],
) -> None:
    runs = verdicts["patched"].runs
    assert set(runs) == {"eval", "train", "train-dropout"}
    # conv_batch_norm, linear_bias_activation and dropout_add_layer_norm of PatchedBlock
    assert all(len(counts) == 3 for counts in runs.values()), runs


def test_renamed_module_fails_strict_load(verdicts: dict[str, ClassVerification]) -> None:
    verdict = verdicts["renamed"]
    assert verdict.status == "refuted"
    assert verdict.where == "state_dict"
    assert "missing keys ['layer_norm.bias', 'layer_norm.weight']" in verdict.reason
    assert "unexpected keys ['norm.bias', 'norm.weight']" in verdict.reason


def test_crash_is_not_checkable_and_the_batch_goes_on(
    verdicts: dict[str, ClassVerification],
) -> None:
    verdict = verdicts["crashing"]
    assert verdict.status == "not checkable"
    assert "exited with code 3" in verdict.reason
    assert verdicts["wrong"].status == "refuted"  # checked by a fresh worker after the crash


@pytest.mark.parametrize("case", ["missing-function", "missing-file"])
def test_unimportable_factory_is_not_checkable(
    verdicts: dict[str, ClassVerification], case: str
) -> None:
    verdict = verdicts[case]
    assert verdict.status == "not checkable"
    assert "importing a factory failed" in verdict.reason


def test_timeout_is_not_checkable() -> None:
    verdict = verify_factory(ORIGINAL, factory("make_slowly"), VerifyOptions(timeout=3))
    assert verdict.status == "not checkable"
    assert "timed out after 3 s" in verdict.reason


def test_float64_runs_in_double_with_tighter_tolerance() -> None:
    verdict = verify_factory(
        ORIGINAL, factory("make_patched"), VerifyOptions(dtype="float64", modes=("eval",))
    )
    assert verdict.status == "verified", verdict
    # Batch-norm folding in double precision: differences near float64 rounding, not float32's.
    assert verdict.max_abs_diff is not None and verdict.max_abs_diff < 1e-12


def test_bad_options_are_rejected_before_any_work() -> None:
    with pytest.raises(ValueError, match="modes"):
        verify_factory(ORIGINAL, ORIGINAL, VerifyOptions(modes=("inference",)))
    with pytest.raises(ValueError, match="dtype"):
        verify_factory(ORIGINAL, ORIGINAL, VerifyOptions(dtype="int8"))


def _survivors(pid_file: Path) -> list[int]:
    pids = [int(line) for line in pid_file.read_text().split()]
    assert pids, "the factory did not get to start its process"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(process_alive(pid) for pid in pids):
        time.sleep(0.1)
    return [pid for pid in pids if process_alive(pid)]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
# The hanging case's limit covers the worker's start (importing torch) before the factory runs:
# at 10 s a loaded CI machine timed out before the factory forked, and the test found nothing
# to check. The wait is a sleep, not CPU, so a longer limit costs the suite little.
@pytest.mark.parametrize(
    ("patched", "timeout"), [("make_escaping_then_hanging", 40), ("make_escaping_daemon", 120)]
)
def test_processes_that_leave_the_session_do_not_survive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, patched: str, timeout: float
) -> None:
    """Model code whose child calls ``setsid()`` (and, for the daemon, double-forks away from
    the worker): after verify returns - timed out or done - none of it is still running."""
    pid_file = tmp_path / "pids"
    pid_file.touch()
    monkeypatch.setenv("ADOPTER_TEST_PIDFILE", str(pid_file))
    verdict = verify_factory(
        ORIGINAL, factory(patched), VerifyOptions(timeout=timeout, modes=("eval",))
    )
    if patched == "make_escaping_then_hanging":
        assert "timed out" in verdict.reason, verdict
    else:
        assert verdict.status == "verified", verdict
    assert pid_file.read_text().split(), "no process left the session: nothing was checked"
    assert _survivors(pid_file) == []


def test_strict_fails_a_file_that_is_not_verified() -> None:
    from typer.testing import CliRunner

    from adopter.cli import app

    def exit_code(patched: str, *extra: str) -> int:
        command = ["verify", "--factory", ORIGINAL, "--patched-factory", factory(patched)]
        return CliRunner().invoke(app, [*command, "--modes", "eval", *extra]).exit_code

    assert exit_code("make_original") == 0  # not exercised: reported, not a failure
    assert exit_code("make_original", "--strict") == 1
    assert exit_code("make_patched", "--strict") == 0
