"""``faster_variants``: the conservative keep/drop decision behind ``apply --only-faster``."""

from __future__ import annotations

import pytest

from adopter.bench import decide, faster_variants
from tests.bench.synthetic import make_result

BOTH_FAST = {"inference": (1.30, 1.10, 1.50), "train": (1.20, 1.05, 1.35)}


def test_keeps_only_variants_whose_ci_clears_one_in_every_mode():
    result = make_result(
        {
            "fast": BOTH_FAST,
            "noisy": {"inference": (1.10, 0.95, 1.30), "train": (1.20, 1.05, 1.35)},
            "slow": {"inference": (0.80, 0.70, 0.90), "train": (0.90, 0.85, 0.95)},
            "mixed": {"inference": (1.50, 1.30, 1.70), "train": (0.90, 0.85, 0.95)},
        }
    )
    assert faster_variants(result) == {"fast"}


def test_point_estimate_mode_is_less_strict():
    result = make_result({"noisy": {"inference": (1.10, 0.95, 1.30), "train": (1.02, 0.9, 1.1)}})
    assert faster_variants(result) == set()
    assert faster_variants(result, confidence=False) == {"noisy"}


def test_threshold_is_inclusive_on_the_lower_bound():
    result = make_result({"edge": {"inference": (1.2, 1.0, 1.4), "train": (1.2, 1.0, 1.4)}})
    assert faster_variants(result) == {"edge"}
    assert faster_variants(result, threshold=1.05) == set()
    assert faster_variants(result, threshold=1.1, confidence=False) == {"edge"}


def test_modes_can_be_chosen():
    result = make_result({"mixed": {"inference": (1.5, 1.3, 1.7), "train": (0.9, 0.85, 0.95)}})
    assert faster_variants(result) == set()
    assert faster_variants(result, modes="inference") == {"mixed"}
    assert faster_variants(result, modes=["train"]) == set()


def test_errors_and_missing_modes_drop_the_variant():
    result = make_result(
        {
            "crashes": {"inference": (1.5, 1.3, 1.7), "train": "torch.compile failed: boom"},
            "half": {"inference": (1.5, 1.3, 1.7)},
        }
    )
    decisions = decide(result)
    assert (
        not decisions["crashes"].keep
        and "torch.compile failed: boom" in decisions["crashes"].reason
    )
    assert not decisions["half"].keep and "train: no timing" in decisions["half"].reason
    assert faster_variants(result, modes="inference") == {"crashes", "half"}


def test_memory_bound_is_optional_and_conservative():
    memory = {"lean": {"inference": 0.8, "train": 0.9}, "fat": {"inference": 1.5, "train": 1.5}}
    result = make_result(
        {"lean": BOTH_FAST, "fat": BOTH_FAST, "unmeasured": BOTH_FAST}, memory=memory
    )
    assert faster_variants(result) == {"lean", "fat", "unmeasured"}
    assert faster_variants(result, max_memory_ratio=1.0) == {"lean"}
    reasons = decide(result, max_memory_ratio=1.0)
    assert "memory x1.500 > x1" in reasons["fat"].reason
    assert "memory not measured" in reasons["unmeasured"].reason


def test_baseline_is_never_selected_and_reasons_read_well():
    result = make_result({"fast": BOTH_FAST})
    decisions = decide(result)
    assert set(decisions) == {"fast"}
    assert decisions["fast"].keep
    assert (
        decisions["fast"].reason == "kept (inference: CI low 1.100 >= 1; train: CI low 1.050 >= 1)"
    )


def test_no_modes_is_an_error():
    with pytest.raises(ValueError, match="no mode"):
        decide(make_result({"fast": BOTH_FAST}), modes=[])
