"""Which variants (rules) ``adopter apply --only-faster`` keeps, decided from a benchmark.

The criterion is deliberately conservative, because keeping a rule that is really slower costs
every user of the patched model, while dropping one that is really faster only forgoes a gain:

* a variant is judged in every requested mode (default: every mode the benchmark measured),
  and must pass in all of them;
* it passes a mode when the *lower bound* of the bootstrap confidence interval of its speedup
  is at least ``threshold`` (1.0: "faster with the benchmark's confidence, not just by luck of
  the noise"); with ``confidence=False`` the point estimate (ratio of medians) is used instead;
* a variant without a result in a judged mode (its step or compilation failed, or the mode was
  not measured) fails;
* optionally, ``max_memory_ratio`` also bounds the step's peak memory against the baseline
  (a variant whose memory was not measured then fails).

For per-rule ablation (one variant per rule, named by rule id) the returned names are the rule
ids to keep. The baseline itself is never returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .results import BenchResult

__all__ = ["Decision", "decide", "faster_variants"]


@dataclass(frozen=True)
class Decision:
    """Whether a variant is kept, and a one-line reason for the user."""

    keep: bool
    reason: str


def _modes(result: BenchResult, modes: str | Sequence[str] | None) -> tuple[str, ...]:
    if modes is None:
        return tuple(result.modes)
    return (modes,) if isinstance(modes, str) else tuple(modes)


def decide(
    result: BenchResult,
    threshold: float = 1.0,
    confidence: bool = True,
    *,
    modes: str | Sequence[str] | None = None,
    max_memory_ratio: float | None = None,
) -> dict[str, Decision]:
    """A :class:`Decision` for every non-baseline variant (see the module docstring)."""
    judged = _modes(result, modes)
    if not judged:
        raise ValueError("no mode to judge the variants in")
    decisions: dict[str, Decision] = {}
    for name in result.candidates:
        reasons: list[str] = []
        passed: list[str] = []
        for mode in judged:
            res = result.get(name, mode)
            if res.error:
                reasons.append(f"{mode}: {res.error}")
                continue
            if res.speedup is None:
                reasons.append(f"{mode}: no timing")
                continue
            sp = res.speedup
            value = sp.ci_low if confidence else sp.ratio
            what = f"CI low {sp.ci_low:.3f}" if confidence else f"speedup {sp.ratio:.3f}"
            if value < threshold:
                reasons.append(f"{mode}: {what} < {threshold:g}")
                continue
            if max_memory_ratio is not None:
                if res.memory is None or res.memory.ratio is None:
                    reasons.append(f"{mode}: memory not measured")
                    continue
                if res.memory.ratio > max_memory_ratio:
                    reasons.append(
                        f"{mode}: memory x{res.memory.ratio:.3f} > x{max_memory_ratio:g}"
                    )
                    continue
            passed.append(f"{mode}: {what} >= {threshold:g}")
        if reasons:
            decisions[name] = Decision(False, "dropped (" + "; ".join(reasons) + ")")
        else:
            decisions[name] = Decision(True, "kept (" + "; ".join(passed) + ")")
    return decisions


def faster_variants(
    result: BenchResult,
    threshold: float = 1.0,
    confidence: bool = True,
    *,
    modes: str | Sequence[str] | None = None,
    max_memory_ratio: float | None = None,
) -> set[str]:
    """Names of the variants that are reliably at least ``threshold`` times faster.

    Args:
        result: a benchmark whose baseline is the unpatched model.
        threshold: the speedup a variant must reach (1.0: not slower than the original).
        confidence: judge the CI lower bound (default) instead of the ratio of medians.
        modes: a mode or modes to judge; ``None`` = every mode measured, all must pass.
        max_memory_ratio: if set, also require ``variant peak / baseline peak`` at most this.
    """
    decisions = decide(
        result, threshold, confidence, modes=modes, max_memory_ratio=max_memory_ratio
    )
    return {name for name, decision in decisions.items() if decision.keep}
