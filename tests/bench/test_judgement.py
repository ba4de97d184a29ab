"""``apply --only-faster``'s judgement of one rule: typed outcome, printed reason, and back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adopter.bench.report import SpeedupVerdict, speedup_verdict
from adopter.bench.selection import Judgement, Outcome, judge_variant
from tests.bench.synthetic import make_result


@pytest.mark.parametrize(
    ("entries", "outcome", "reason"),
    [
        (
            {"inference": (1.3, 1.1, 1.5), "train": (1.0, 0.95, 1.05)},
            Outcome.KEPT,
            "kept: faster in inference (inference 1.30x [1.10, 1.50]; train 1.00x [0.95, 1.05])",
        ),
        (
            {"inference": (1.3, 1.1, 1.5), "train": (0.9, 0.85, 0.95)},
            Outcome.SLOWER,
            "dropped: slower in train (inference 1.30x [1.10, 1.50]; train 0.90x [0.85, 0.95])",
        ),
        (
            {"inference": (1.05, 0.9, 1.2), "train": (1.0, 0.9, 1.1)},
            Outcome.NOT_RELIABLY_FASTER,
            "dropped: not reliably faster (inference 1.05x [0.90, 1.20]; train 1.00x [0.90, 1.10])",
        ),
        (
            {"inference": "step failed: boom", "train": (1.2, 1.1, 1.3)},
            Outcome.FAILED,
            "dropped: inference: step failed: boom",
        ),
        ({"inference": (1.2, 1.1, 1.3)}, Outcome.NO_TIMING, "dropped: no timing in train"),
    ],
)
def test_judge_variant_outcome_and_reason(entries, outcome: Outcome, reason: str) -> None:
    judgement = judge_variant(make_result({"paper.5 only": entries}), "paper.5 only")
    assert judgement.outcome is outcome
    assert judgement.reason == reason
    assert judgement.keep is (outcome is Outcome.KEPT)
    assert tuple(judgement) == (judgement.keep, reason)  # unpacks as (keep, reason)
    assert Judgement.from_reason(reason) == judgement


def test_no_site_is_neither_kept_nor_dropped() -> None:
    judgement = Judgement(Outcome.NO_SITE)
    assert judgement.reason == "no site"
    assert not judgement.keep and not judgement.dropped
    assert Judgement.from_reason("no site") == judgement


@given(
    outcome=st.sampled_from([o for o in Outcome if o not in (Outcome.NO_SITE, Outcome.FAILED)]),
    detail=st.text(),
)
def test_saved_reasons_read_back(outcome: Outcome, detail: str) -> None:
    judgement = Judgement(outcome, detail)
    assert Judgement.from_reason(judgement.reason) == judgement


@given(mode=st.sampled_from(["inference", "train"]), error=st.text())
def test_failures_read_back(mode: str, error: str) -> None:
    judgement = Judgement(Outcome.FAILED, f"{mode}: {error}")
    assert Judgement.from_reason(judgement.reason) == judgement


@pytest.mark.parametrize("reason", ["", "kept", "kept: slower in train", "maybe: faster"])
def test_other_text_is_not_a_reason(reason: str) -> None:
    with pytest.raises(ValueError, match="not an --only-faster reason"):
        Judgement.from_reason(reason)


@pytest.mark.parametrize(
    ("entry", "verdict"),
    [
        ((1.2, 1.05, 1.3), SpeedupVerdict.FASTER),
        ((0.9, 0.8, 0.95), SpeedupVerdict.SLOWER),
        ((1.02, 0.95, 1.1), SpeedupVerdict.NOISE),
        ("boom", SpeedupVerdict.NOT_MEASURED),
    ],
)
def test_speedup_verdict_is_typed(entry, verdict: SpeedupVerdict) -> None:
    result = make_result({"v": {"train": entry}}, modes=("train",))
    assert speedup_verdict(result.get("v", "train")) is verdict
