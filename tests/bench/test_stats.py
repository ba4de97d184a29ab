"""Order statistics and the bootstrap interval of the speedup."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adopter.bench.stats import bootstrap_ratio_ci, median, quantile

samples = st.lists(st.floats(min_value=1e-6, max_value=1.0), min_size=2, max_size=12)


@given(samples)
def test_median_matches_statistics(values):
    assert median(values) == pytest.approx(statistics.median(values))


def test_quantile_interpolates():
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.25) == pytest.approx(1.75)
    assert quantile([5.0], 0.9) == 5.0
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        quantile([1.0], 1.5)


@settings(max_examples=25, deadline=None)
@given(samples, samples)
def test_interval_is_ordered_and_within_the_possible_ratios(base, other):
    low, high = bootstrap_ratio_ci(base, other, paired=False, resamples=300)
    assert low <= high
    # Every resampled median lies between the sample's extremes.
    assert min(base) / max(other) <= low * (1 + 1e-12)
    assert high <= max(base) / min(other) * (1 + 1e-12)


def test_interval_brackets_a_clear_difference():
    base = [2.0, 2.1, 1.9, 2.2, 2.0, 1.95, 2.05, 2.3]
    other = [1.0, 1.05, 0.95, 1.1, 1.0, 0.98, 1.02, 1.2]
    low, high = bootstrap_ratio_ci(base, other, paired=True)
    assert 1.5 < low <= median(base) / median(other) <= high < 2.5


def test_identical_paired_samples_give_a_zero_width_interval():
    times = [1.0, 1.2, 0.9, 1.5, 1.1]
    assert bootstrap_ratio_ci(times, times, paired=True) == (1.0, 1.0)


def test_paired_resampling_cancels_shared_round_noise():
    # Each round's machine noise hits both sides; the other variant is always exactly 2x faster.
    base = [1.0, 3.0, 1.5, 5.0, 2.0, 1.2]
    other = [t / 2 for t in base]
    low, high = bootstrap_ratio_ci(base, other, paired=True)
    assert low == pytest.approx(2.0) and high == pytest.approx(2.0)
    low_i, high_i = bootstrap_ratio_ci(base, other, paired=False)
    assert low_i < 2.0 < high_i


def test_seeded_and_validated():
    base, other = [1.0, 1.1, 1.3, 0.9], [0.8, 0.9, 1.0, 0.7]
    assert bootstrap_ratio_ci(base, other, paired=True, seed=3) == bootstrap_ratio_ci(
        base, other, paired=True, seed=3
    )
    assert bootstrap_ratio_ci([2.0], [1.0], paired=True) == (2.0, 2.0)
    with pytest.raises(ValueError, match="equal length"):
        bootstrap_ratio_ci([1.0, 2.0], [1.0], paired=True)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ratio_ci(base, other, paired=True, confidence=1.0)
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_ratio_ci([], other, paired=False)
