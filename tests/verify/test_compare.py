"""Tolerances and element-wise comparison (in process: no model code involved)."""

from __future__ import annotations

import math

import torch

from adopter.verify.compare import compare_values, tolerance_for

F32 = tolerance_for(torch.float32)


def test_rounding_level_noise_passes_and_real_changes_fail() -> None:
    ref = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    noisy = ref * (1 + 1e-6 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)))
    assert compare_values("x", ref, noisy, F32).ok
    changed = ref.clone()
    changed[3, 4] += 1e-2
    diff = compare_values("x", ref, changed, F32)
    assert not diff.ok and math.isclose(diff.max_abs_diff, 1e-2, rel_tol=1e-3)


def test_absolute_part_scales_with_the_tensor_magnitude() -> None:
    # An element near zero in a tensor of large values carries the large values' rounding.
    ref = torch.tensor([1000.0, 1e-6])
    got = torch.tensor([1000.0, 1e-6 + 5e-3])
    assert compare_values("x", ref, got, F32).ok
    assert not compare_values("x", ref / 1000, got / 1000 + 1e-3, F32).ok


def test_float64_is_tighter_than_float32() -> None:
    ref = torch.ones(4, dtype=torch.float64)
    got = ref + 1e-7
    assert compare_values("x", ref.float(), got.float(), F32).ok
    assert not compare_values("x", ref, got, tolerance_for(torch.float64)).ok


def test_structural_mismatches_are_infinite() -> None:
    a = torch.zeros(2, 3)
    for other, words in [
        (torch.zeros(3, 2), "shape differs"),
        (torch.zeros(2, 3, dtype=torch.float64), "dtype differs"),
        (None, "present only in the original"),
        ((1, 2), "type differs"),
    ]:
        diff = compare_values("x", a, other, F32)
        assert not diff.ok and diff.max_abs_diff == math.inf and words in diff.note


def test_integers_must_match_exactly_and_nans_must_coincide() -> None:
    assert not compare_values("i", torch.tensor([1, 2]), torch.tensor([1, 3]), F32).ok
    assert compare_values("i", torch.tensor([1, 2]), torch.tensor([1, 2]), F32).ok
    nan = torch.tensor([float("nan"), 1.0])
    assert compare_values("n", nan, nan.clone(), F32).ok
    assert not compare_values("n", nan, torch.tensor([0.0, 1.0]), F32).ok
    assert compare_values("s", "same", "same", F32).ok
    assert not compare_values("s", 1, 2, F32).ok
