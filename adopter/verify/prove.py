"""The proof of one model: both sides built alike, weights shared, each mode compared.

Modes, in order: ``eval``; ``train`` with every dropout at 0 (both sides built without
dropout where the subject can, and dropout modules switched off either way); ``train-dropout``
with the configured dropout where the kernels draw random numbers like the original; and
``train-labels``, a training step on the loss, where the model takes labels. Each mode notes
which patched sites ran in it. Worker side only: imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..kernels.rng import rng_mismatch_reason
from ..models.common import error_line, torch_dtype
from ..models.dropout import has_dropout, zero_dropout_modules
from ..models.interface import Subject, Unbuildable
from .compare import Tolerance, tolerance_for
from .conditioning import conditioned_state
from .differential import (
    SKIPPED,
    ModelSource,
    ModeOutcome,
    check_mode,
    conclude,
    load_strictly,
    pristine_copies,
    snapshot_state,
)
from .options import VerifyOptions
from .results import NOT_CHECKABLE, REFUTED, ClassVerification

__all__ = ["ModeRun", "Sides", "prove", "run_modes", "sides_of", "verdict_of"]


@dataclass
class Sides:
    """Both sides of one comparison as model sources, and the original's weights."""

    original: ModelSource
    patched: ModelSource
    state: dict[str, Any]


def sides_of(
    build_original: Callable[[], nn.Module],
    build_patched: Callable[[], nn.Module],
    inputs: Any,
    seed: int,
) -> tuple[Sides, str | None]:
    """Fresh-model sources of both sides, the weights both run with (the original's,
    conditioned on ``inputs``: :mod:`adopter.verify.conditioning`), and why the patched model
    does not take them (``None`` when it does)."""
    original, patched = build_original(), build_patched()
    state = snapshot_state(original)
    problem = load_strictly(patched, state)
    originals = pristine_copies(original, build_original)
    sides = Sides(
        originals,
        pristine_copies(patched, build_patched),
        conditioned_state(state, originals, inputs, seed),
    )
    return sides, problem


@dataclass
class ModeRun:
    """What the modes share: which to run, the inputs, the tolerance and seed, and the
    recorder (a :class:`~adopter.verify.coverage.SiteRecorder`, or ``None``) counting sites."""

    modes: list[str]
    inputs: Any
    tol: Tolerance
    seed: int
    recorder: Any = None
    labelled_inputs: Any = None

    def measured(self, runs: dict[str, dict[str, int]], mode: str, check: Any) -> Any:
        """Run one mode's check, noting which patched sites ran in it."""
        if self.recorder is None:
            return check()
        before = self.recorder.snapshot()
        backends_before = self.recorder.backends_snapshot()
        try:
            return check()
        finally:
            ran = self.recorder.since(before)
            if ran:
                runs[mode] = ran
                dispatched = self.recorder.backends_since(backends_before)
                if dispatched:  # read by with_backends: which backend each site ran on
                    runs.setdefault(BACKENDS_KEY, {})[mode] = dispatched  # type: ignore[assignment]

    def compare(self, sides: Sides, training: bool, inputs: Any = None, **extra: Any) -> Any:
        return check_mode(
            sides.original,
            sides.patched,
            sides.state,
            self.inputs if inputs is None else inputs,
            training=training,
            seed=self.seed,
            tol=self.tol,
            **extra,
        )


# A key of a check's ``runs`` that is no mode: the backends per mode and site (with_backends).
BACKENDS_KEY = "__backends__"


def with_backends(verdict: Any, runs: dict[str, Any]) -> Any:
    """Set the verdict's ``runs`` and ``backends`` from the record ``ModeRun.measured`` kept."""
    runs = dict(runs)
    verdict.backends = runs.pop(BACKENDS_KEY, {})
    verdict.runs = runs
    return verdict


def prove(subject: Subject, recorder: Any, options: VerifyOptions) -> ClassVerification:
    """The verdict of ``subject`` in the modes of ``options``; ``recorder`` (a
    :class:`~adopter.verify.coverage.SiteRecorder`, or ``None``) counts the sites that run."""
    try:
        sides, problem = sides_of(
            subject.build_original, subject.build_patched, subject.inputs, options.seed
        )
    except Exception as exc:
        reason = f"building the patched model raised {error_line(exc)}"
        return ClassVerification(subject.name, REFUTED, reason, where="construction")
    if problem is not None:
        return ClassVerification(subject.name, REFUTED, problem, where="state_dict")
    run = ModeRun(
        list(options.modes), subject.inputs, tolerance_for(torch_dtype(options.dtype)),
        options.seed, recorder, subject.labelled_inputs,
    )  # fmt: skip
    texts = subject.dropout_texts if subject.dropout_mode else None
    outcomes, runs = run_modes(run, sides, subject.quiet, texts)
    prefix = f"{subject.label}: " if subject.label else ""
    return with_backends(conclude(subject.name, outcomes, prefix), runs)


def verdict_of(
    found: Subject | Unbuildable, name: str, recorder: Any, options: VerifyOptions
) -> ClassVerification:
    """:func:`prove`'s verdict of what an adapter built, or, where it could build nothing, the
    verdict its reason gives (under ``name``)."""
    if isinstance(found, Unbuildable):
        return ClassVerification(name, REFUTED if found.refuted else NOT_CHECKABLE, found.reason)
    return prove(found, recorder, options)


def run_modes(
    run: ModeRun, sides: Sides, quiet: Any, dropout_texts: list[str] | None
) -> tuple[dict[str, ModeOutcome], dict[str, dict[str, int]]]:
    """Each mode's outcome, and the sites that ran in each. ``quiet`` builds both sides
    without dropout for train mode (``None``: ``sides`` with dropout modules off);
    ``dropout_texts`` decide whether train mode with dropout can be compared (``None``: it is
    not compared)."""
    outcomes: dict[str, ModeOutcome] = {}
    runs: dict[str, dict[str, int]] = {}
    if "eval" in run.modes:
        outcomes["eval"] = run.measured(runs, "eval", lambda: run.compare(sides, False))
    if "train" not in run.modes:
        return outcomes, runs
    quiet_sides = sides if quiet is None else None
    if quiet is not None:
        try:
            quiet_sides, problem = sides_of(*quiet(), run.inputs, run.seed)
        except Exception as exc:
            reason = f"building the models without dropout raised {error_line(exc)}"
            outcomes["train"] = ModeOutcome(NOT_CHECKABLE, reason)
        else:
            if problem is not None:
                outcomes["train"] = ModeOutcome(REFUTED, problem)
                quiet_sides = None
    if quiet_sides is not None:
        outcomes["train"] = run.measured(
            runs,
            "train",
            lambda: run.compare(quiet_sides, True, prepare=zero_dropout_modules),
        )
    if dropout_texts is not None:
        outcomes["train-dropout"] = run.measured(
            runs, "train-dropout", lambda: _train_dropout_outcome(run, sides, dropout_texts)
        )
    if run.labelled_inputs is not None and quiet_sides is not None:
        _train_labels(run, quiet_sides, outcomes, runs)
    return outcomes, runs


def _train_labels(
    run: ModeRun,
    sides: Sides,
    outcomes: dict[str, ModeOutcome],
    runs: dict[str, dict[str, int]],
) -> None:
    """A training step on the loss with labels, unless train mode was refuted already."""
    if outcomes["train"].status == REFUTED:
        return
    outcome = run.measured(
        runs,
        "train-labels",
        lambda: run.compare(
            sides, True, run.labelled_inputs, prepare=zero_dropout_modules, objective="loss"
        ),
    )
    if outcome.status != NOT_CHECKABLE:  # a model that takes no such labels: no check
        outcomes["train-labels"] = outcome
    else:
        runs.pop("train-labels", None)


def _train_dropout_outcome(run: ModeRun, sides: Sides, sources: list[str]) -> Any:
    """Train mode with the configured dropout, or a skip saying why it cannot be compared."""
    if not has_dropout(sides.original()):
        return ModeOutcome(SKIPPED, "the model has no active dropout")
    reason = rng_mismatch_reason(sources, "cpu")
    if reason is not None:
        return ModeOutcome(SKIPPED, f"random numbers are drawn differently: {reason}")
    return run.compare(sides, True)
