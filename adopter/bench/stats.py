"""Small, dependency-free statistics for benchmark samples.

Timing samples are skewed (a floor set by the hardware plus occasional long outliers from the
OS, the allocator or another process), so everything here is order-statistics based: medians,
quartiles and a percentile bootstrap of the *ratio of medians*. Means and t-intervals would be
dragged around by the outliers that a shared machine produces.

The bootstrap is vectorised with ``torch`` (already a dependency of the benchmark) instead of
numpy, and seeded, so the same samples always give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["bootstrap_ratio_ci", "median", "quantile"]


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile with linear interpolation between order statistics.

    This is the "type 7" definition used by numpy's default and ``torch.quantile``, so the
    point estimates agree with the bootstrap below (which uses ``torch.quantile``).
    """
    if not values:
        raise ValueError("quantile of an empty sample")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    frac = pos - lo
    return ordered[lo] + (ordered[hi] - ordered[lo]) * frac


def median(values: Sequence[float]) -> float:
    """The sample median (mean of the two middle values for an even count)."""
    return quantile(values, 0.5)


def bootstrap_ratio_ci(
    numerator: Sequence[float],
    denominator: Sequence[float],
    *,
    paired: bool,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap interval for ``median(numerator) / median(denominator)``.

    With ``paired=True`` the two samples must have equal length and sample ``i`` of each was
    taken in the same round (the benchmark interleaves variants round-robin); rounds are then
    resampled as units, which keeps the shared machine noise of a round on both sides of the
    ratio and gives a tighter, honest interval. Otherwise the samples are resampled
    independently. A sample of one value yields a zero-width interval at the point estimate.
    """
    if not numerator or not denominator:
        raise ValueError("bootstrap needs non-empty samples")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if paired and len(numerator) != len(denominator):
        raise ValueError("paired bootstrap needs samples of equal length")
    num = torch.tensor(list(numerator), dtype=torch.float64)
    den = torch.tensor(list(denominator), dtype=torch.float64)
    if len(num) == 1 and len(den) == 1:
        point = float(num[0] / den[0])
        return point, point
    gen = torch.Generator().manual_seed(seed)
    idx_num = torch.randint(len(num), (resamples, len(num)), generator=gen)
    idx_den = idx_num if paired else torch.randint(len(den), (resamples, len(den)), generator=gen)
    med_num = torch.quantile(num[idx_num], 0.5, dim=1)
    med_den = torch.quantile(den[idx_den], 0.5, dim=1)
    ratios = med_num / med_den
    alpha = 1.0 - confidence
    bounds = torch.quantile(ratios, torch.tensor([alpha / 2, 1.0 - alpha / 2], dtype=torch.float64))
    return float(bounds[0]), float(bounds[1])
