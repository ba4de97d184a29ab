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

:func:`judge_variant` is ``apply --only-faster``'s criterion for one rule: faster in *some* mode
and reliably slower in none; its :class:`Judgement` says which way it went (:class:`Outcome`)
and prints as the one-line reason the command shows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum

from .results import BenchResult

__all__ = ["Decision", "Judgement", "Outcome", "decide", "faster_variants", "judge_variant"]


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


class Outcome(Enum):
    """How ``apply --only-faster`` judged one rule."""

    KEPT = "kept"
    """Reliably faster in some mode, reliably slower in none."""
    NO_SITE = "no site"
    """The rule patches nothing in the target: there was nothing to measure."""
    FAILED = "failed"
    """The rule's variant failed in some mode (its step or compilation raised)."""
    NO_TIMING = "no timing"
    """Some mode has no speedup (not measured)."""
    SLOWER = "slower"
    """Reliably slower (CI upper bound below 1) in some mode."""
    NOT_RELIABLY_FASTER = "not reliably faster"
    """Measured everywhere, neither kept nor reliably slower: more rounds could decide it."""


# The explanation after "kept: " / "dropped: ", from the judgement's detail.
_EXPLANATIONS = {
    Outcome.KEPT: "faster in {}",
    Outcome.FAILED: "{}",
    Outcome.NO_TIMING: "no timing in {}",
    Outcome.SLOWER: "slower in {}",
    Outcome.NOT_RELIABLY_FASTER: "not reliably faster ({})",
}
_KEPT = (Outcome.KEPT,)
_DROPPED = (Outcome.NO_TIMING, Outcome.SLOWER, Outcome.NOT_RELIABLY_FASTER)  # FAILED: the rest


@dataclass(frozen=True)
class Judgement:
    """Whether ``apply --only-faster`` keeps a rule, why, and the numbers or errors behind it.

    Unpacks as ``(keep, reason)``, the pair the command prints and saves.
    """

    outcome: Outcome
    detail: str = ""
    """What the outcome rests on: the deciding modes and every mode's ratio and interval
    (``train (inference 1.02x [0.97, 1.08]; train 1.10x [1.03, 1.17])``), or the errors."""

    @property
    def keep(self) -> bool:
        return self.outcome is Outcome.KEPT

    @property
    def dropped(self) -> bool:
        """Measured (or tried) and not kept; a rule without a site is neither."""
        return self.outcome not in (Outcome.KEPT, Outcome.NO_SITE)

    @property
    def explanation(self) -> str:
        """The reason without its ``kept: `` / ``dropped: `` verdict."""
        if self.outcome is Outcome.NO_SITE:
            return Outcome.NO_SITE.value
        return _EXPLANATIONS[self.outcome].format(self.detail)

    @property
    def reason(self) -> str:
        """One line for the user: ``no site``, ``kept: faster in ...``, ``dropped: ...``."""
        if self.outcome is Outcome.NO_SITE:
            return self.explanation
        return f"{'kept' if self.keep else 'dropped'}: {self.explanation}"

    @classmethod
    def from_reason(cls, reason: str) -> Judgement:
        """The judgement a saved :attr:`reason` line stands for (reports rendered from JSON).

        The inverse of :attr:`reason`; a ``dropped: `` line that no other explanation matches
        is a failure (failures read ``<mode>: <error>``).
        """
        if reason == Outcome.NO_SITE.value:
            return cls(Outcome.NO_SITE)
        verdict, _, explanation = reason.partition(": ")
        candidates = {"kept": _KEPT, "dropped": _DROPPED}.get(verdict, ())
        for outcome in candidates:
            prefix, _, suffix = _EXPLANATIONS[outcome].partition("{}")
            if explanation.startswith(prefix) and explanation.endswith(suffix):
                return cls(outcome, explanation[len(prefix) : len(explanation) - len(suffix)])
        if verdict == "dropped":
            return cls(Outcome.FAILED, explanation)
        raise ValueError(f"not an --only-faster reason: {reason!r}")

    def __iter__(self) -> Iterator[bool | str]:
        return iter((self.keep, self.reason))


def judge_variant(result: BenchResult, name: str, threshold: float = 1.0) -> Judgement:
    """The ``--only-faster`` criterion for one variant (see
    :func:`~adopter.bench.command.only_faster_rules`).

    Kept when :func:`faster_variants` finds it reliably faster (CI lower bound
    ``>= threshold``) in at least one measured mode and no mode is reliably slower (CI upper
    bound below 1); a failed mode drops it.
    """
    per_mode = [(mode, result.get(name, mode)) for mode in result.modes]
    errors = [f"{mode}: {res.error}" for mode, res in per_mode if res.error]
    if errors:
        return Judgement(Outcome.FAILED, "; ".join(errors))
    missing = [mode for mode, res in per_mode if res.speedup is None]
    if missing:
        return Judgement(Outcome.NO_TIMING, ", ".join(missing))
    faster = [m for m in result.modes if name in faster_variants(result, threshold, modes=m)]
    slower = [mode for mode, res in per_mode if res.speedup and res.speedup.ci_high < 1.0]
    numbers = "; ".join(
        f"{mode} {res.speedup.ratio:.2f}x [{res.speedup.ci_low:.2f}, {res.speedup.ci_high:.2f}]"
        for mode, res in per_mode
        if res.speedup is not None
    )
    if slower:
        return Judgement(Outcome.SLOWER, f"{', '.join(slower)} ({numbers})")
    if faster:
        return Judgement(Outcome.KEPT, f"{', '.join(faster)} ({numbers})")
    return Judgement(Outcome.NOT_RELIABLY_FASTER, numbers)
