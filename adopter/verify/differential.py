"""Run the original and the patched model side by side and judge one mode (worker side only).

One *mode* is a forward pass on fixed inputs, a backward pass from a fixed random projection of
every floating-point output, and a look at the state afterwards. Both sides start from the same
weights (the original's ``state_dict``, loaded strictly) and the same random seed, so in eval
mode, in train mode without dropout and - where the kernels draw random numbers like the
original code - in train mode with dropout, the runs must agree up to rounding
(:mod:`adopter.verify.compare`) in

* every output, including nested ones (``hidden_states[1]``, ``past_key_values[0][1]``),
* every parameter's gradient (a gradient present on one side only is a difference), and
* every buffer of the ``state_dict`` after the step (batch-norm running statistics).

Every run gets a model that has never run before (a copy of a pristine one), so state a model
keeps between calls cannot make the sides differ. The original is run twice first: if it does
not reproduce itself (random numbers drawn outside torch's seeded generator, non-deterministic
kernels), a difference would prove nothing, and the mode is "not checkable" instead.

Where a float32 or half-precision mode fails only on finite differences of floating-point
values, a float64 run of the original referees it (:mod:`adopter.verify.compare` says when a
value passes): if no differing value of the patched run is farther from that reference than the
original's own run, the difference is rounding the model amplifies, and the mode is verified
with a detail saying so and the referee's figures in :attr:`ModeOutcome.referee`; otherwise, or
where the float64 run cannot be built, run or trusted, it stays refuted with the figures or the
reason added. Structural mismatches (shape, dtype, presence, NaN/inf pattern, integer values)
and exceptions never reach the referee.

A difference the referee does not settle is last tested for conditioning: the original runs
once more from weights each moved by one rounding unit (:func:`one_ulp_apart`). When that alone
moves every unsettled value beyond the tolerance too, and as far as the patch does, the model
at this size does not fix those values to within the tolerance in its precision (a train-mode
batch norm over a 4 x 4 map, a layer norm of nearly constant features), so no float comparison
there can tell the patch from rounding: the mode is "not checkable", saying so, never refuted
or verified. A change the patched model's own float64 run shows stays refuted.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..models.common import call_model, cast_inputs, map_tensors, seed_everything
from .compare import (
    Difference,
    RefereeFigures,
    Tolerance,
    compare_values,
    mismatch,
    referee_value,
    tolerance_for,
)
from .results import NOT_CHECKABLE, REFUTED, VERIFIED, ClassVerification

__all__ = [
    "ModeOutcome",
    "ModelSource",
    "SideRun",
    "check_mode",
    "conclude",
    "load_strictly",
    "pristine_copies",
    "run_side",
    "snapshot_state",
]

SKIPPED = "skipped"


@dataclass
class SideRun:
    """What one side produced: named outputs, gradients and buffers, in a stable order.

    ``drew_random``: the run drew from torch's seeded generator (dropout, noise)."""

    outputs: list[tuple[str, Any]]
    grads: list[tuple[str, torch.Tensor | None]]
    buffers: list[tuple[str, torch.Tensor]]
    drew_random: bool = False

    def labelled(self) -> dict[str, Any]:
        """Every value under the label :func:`compare_runs` gives its difference."""
        return {
            f"{kind} {name}": value
            for kind, values in (
                ("output", self.outputs),
                ("grad", self.grads),
                ("buffer", self.buffers),
            )
            for name, value in values
        }


@dataclass
class ModeOutcome:
    """The verdict of one mode, with the differences behind it.

    ``referee``: where the float64 referee judged the mode, its figures (JSON-ready: ``settled``,
    the number of ``values`` it judged, and at the value that came closest to failing,
    ``where``, ``patched_error``, ``original_error`` and ``allowance``; or ``reason`` when it
    could not judge)."""

    status: str
    detail: str
    differences: list[Difference] = field(default_factory=list)
    referee: dict[str, Any] | None = None

    def line(self) -> str:
        return f"{self.status}: {self.detail}" if self.detail else self.status


def snapshot_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of ``model.state_dict()`` to restore before every run."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def load_strictly(model: nn.Module, state: dict[str, torch.Tensor]) -> str | None:
    """Load ``state`` into ``model``; why it does not fit exactly, or ``None`` when it does.

    A patch must keep every parameter and buffer name and shape (the kernels take the model's
    existing modules precisely so that checkpoints keep loading), so any missing or unexpected
    key, or any shape change, is a failure of the patch.
    """
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches raise even with strict=False
        return f"state_dict does not load: {str(exc).strip()}"
    problems = []
    if result.missing_keys:
        problems.append(f"missing keys {sorted(result.missing_keys)}")
    if result.unexpected_keys:
        problems.append(f"unexpected keys {sorted(result.unexpected_keys)}")
    if problems:
        return "state_dict of the original does not load strictly: " + "; ".join(problems)
    return None


def _flatten(value: Any, prefix: str, out: list[tuple[str, Any]]) -> None:
    if isinstance(value, torch.Tensor):
        out.append((prefix or "output", value))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            _flatten(item, f"{prefix}[{index}]" if prefix else f"output[{index}]", out)
    elif value is None or isinstance(value, (bool, int, float, str)):
        out.append((prefix or "output", value))
    else:
        out.append((prefix or "output", f"<{type(value).__name__}>"))


def _fresh(inputs: Any) -> Any:
    """A copy of the inputs' tensors, so that a model writing into its inputs in place cannot
    change what the next run sees; a tensor given twice is one copy given twice (code that
    tests ``key is query`` takes the same path on the copies)."""
    copies: dict[int, torch.Tensor] = {}

    def copy_once(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in copies:
            copies[id(tensor)] = tensor.clone()
        return copies[id(tensor)]

    return map_tensors(inputs, copy_once)


def _projection_loss(outputs: list[tuple[str, Any]], seed: int) -> torch.Tensor | None:
    """A fixed random projection of every differentiable output, to back-propagate from.

    Random weights (rather than ``sum()``) make each output element's gradient distinct, so a
    permuted or mis-scaled output cannot cancel out in the backward pass. The weights depend
    only on the seed and the output shapes, so both sides use the same ones.
    """
    gen = torch.Generator().manual_seed(seed + 1)
    total = None
    for _name, value in outputs:
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            continue
        weights = torch.randn(value.shape, generator=gen, dtype=torch.float64)
        if not value.requires_grad:
            continue
        term = (value * weights.to(dtype=value.dtype, device=value.device)).sum()
        total = term if total is None else total + term
    return total


def run_side(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    inputs: Any,
    *,
    training: bool,
    seed: int,
    objective: str | None = None,
) -> SideRun:
    """Restore ``state``, run forward and backward once, and collect what to compare.

    ``objective``: compare only this output (``"loss"`` of a model given labels) and
    back-propagate from it, as a training step does: a kernel that computes the loss without
    returning the logits (:func:`adopter.kernels.causal_lm_loss`) is judged on the loss and
    every parameter gradient."""
    model.load_state_dict(state, strict=True)
    model.train(training)
    model.zero_grad(set_to_none=True)
    seed_everything(seed)
    seeded = torch.get_rng_state()
    with torch.enable_grad():
        result = call_model(model, _fresh(inputs))
        outputs: list[tuple[str, Any]] = []
        _flatten(result, "", outputs)
        if objective is not None:
            outputs = [(name, value) for name, value in outputs if name == objective]
            if not outputs or not isinstance(outputs[0][1], torch.Tensor):
                raise ValueError(f"the model returned no {objective!r} tensor")
        loss = _projection_loss(outputs, seed)
        if loss is not None:
            loss.backward()
    drew_random = not torch.equal(torch.get_rng_state(), seeded)
    param_names = set()
    grads: list[tuple[str, torch.Tensor | None]] = []
    for name, param in model.named_parameters():
        param_names.add(name)
        grads.append((name, None if param.grad is None else param.grad.detach().clone()))
    buffers = [
        (name, value.detach().clone())
        for name, value in model.state_dict().items()
        if name not in param_names
    ]
    if not training and objective is None:
        # Inference takes other kernel paths (folded batch norms, cached fused weights): check
        # those outputs too, not only the ones computed for the backward pass.
        seed_everything(seed)
        with torch.no_grad():
            inference: list[tuple[str, Any]] = []
            _flatten(call_model(model, _fresh(inputs)), "", inference)
        outputs += [(f"no_grad {name}", value) for name, value in inference]
        drew_random = drew_random or not torch.equal(torch.get_rng_state(), seeded)
    detached = [(n, v.detach() if isinstance(v, torch.Tensor) else v) for n, v in outputs]
    return SideRun(detached, grads, buffers, drew_random)


def _compare_named(
    kind: str,
    original: list[tuple[str, Any]],
    patched: list[tuple[str, Any]],
    tol: Tolerance,
) -> list[Difference]:
    patched_by_name = dict(patched)
    diffs = []
    for name, value in original:
        label = f"{kind} {name}"
        if name not in patched_by_name:
            diffs.append(mismatch(label, "missing in the patched run"))
            continue
        diffs.append(compare_values(label, value, patched_by_name[name], tol))
    original_names = {name for name, _ in original}
    for name, _ in patched:
        if name not in original_names:
            diffs.append(mismatch(f"{kind} {name}", "only in the patched run"))
    return diffs


def compare_runs(original: SideRun, patched: SideRun, tol: Tolerance) -> list[Difference]:
    """Every output, then every gradient, then every buffer, compared by name."""
    return (
        _compare_named("output", original.outputs, patched.outputs, tol)
        + _compare_named("grad", original.grads, patched.grads, tol)
        + _compare_named("buffer", original.buffers, patched.buffers, tol)
    )


def _largest(diffs: list[Difference]) -> Difference | None:
    return max(diffs, key=lambda d: (d.max_abs_diff, d.excess), default=None)


def _error_line(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


ModelSource = Callable[[], nn.Module]


def pristine_copies(pristine: nn.Module, rebuild: ModelSource | None = None) -> ModelSource:
    """A source of copies of ``pristine``, a model that has never run.

    Every run gets its own copy because models keep state between calls - LeViT caches its
    attention biases (with or without an autograd graph, depending on the first call),
    sinusoidal position tables grow to the longest input seen - and a comparison is only fair
    between models with the same history: none. ``rebuild`` builds a fresh model where
    ``copy.deepcopy`` fails.
    """

    def make() -> nn.Module:
        try:
            return copy.deepcopy(pristine)
        except Exception:
            if rebuild is None:
                raise
            return rebuild()

    return make


# The precisions a float64 run can referee (complex and float64 values stay as judged).
_REFEREED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_LOWER_FLOATS = frozenset(_REFEREED_DTYPES)
_TO_LOWER = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}


class Float64Throughout(TorchFunctionMode):
    """Inside it, what a model casts to float32 or half precision is cast to float64 instead,
    and factories without a dtype make float64 tensors.

    The referee's float64 run must carry no float32 rounding: eager attention computes its
    softmax with ``dtype=torch.float32`` and casts back, so in a float64 run the original's
    probabilities (and the gradients through them) would keep float32's rounding, which the
    patch, computing in float64 throughout, does not share. Phi-4 multimodal's key-bias
    gradients, zero in exact arithmetic, were 8e-5 in such a run."""

    def __enter__(self) -> Float64Throughout:
        self._default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        # A kernel's own backward (an autograd.Function) runs in the autograd engine, where
        # function modes are not active and dispatch modes are: its casts are widened there.
        self._backward = _WidenedDtypes()
        self._backward.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._backward.__exit__(*exc)
        torch.set_default_dtype(self._default)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = dict(kwargs or {})
        if func in _TO_LOWER:
            return args[0].to(torch.float64)
        if kwargs.get("dtype") in _LOWER_FLOATS:
            kwargs["dtype"] = torch.float64
        if func is torch.Tensor.to or func is torch.Tensor.type:
            args = tuple(torch.float64 if a in _LOWER_FLOATS else a for a in args)
        return func(*args, **kwargs)


class _WidenedDtypes(TorchDispatchMode):
    """Every operation asked for a float32 or half-precision result (``_to_copy``, factories)
    gives float64 instead: :class:`Float64Throughout`'s casts, where its function mode does not
    reach (the backward of an ``autograd.Function``)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if kwargs.get("dtype") in _LOWER_FLOATS:
            kwargs = {**kwargs, "dtype": torch.float64}
        return func(*args, **kwargs)


@dataclass
class _Referee:
    """The float64 referee's judgement of one mode's failing values."""

    settled: bool
    figures: list[RefereeFigures] = field(default_factory=list)
    reason: str = ""

    def closest(self) -> RefereeFigures | None:
        """The value that came closest to failing (or failed by most)."""
        return max(self.figures, key=lambda f: f.ratio, default=None)

    def to_json(self) -> dict[str, Any]:
        if self.reason:
            return {"settled": False, "reason": self.reason}
        closest = self.closest()
        assert closest is not None
        return {
            "settled": self.settled,
            "values": len(self.figures),
            "where": closest.name,
            "patched_error": closest.patched_error,
            "original_error": closest.original_error,
            "allowance": closest.allowance,
        }


def _referee(
    reference_model: Callable[[], nn.Module],
    patched_model: Callable[[], nn.Module],
    state: dict[str, torch.Tensor],
    inputs: Any,
    side: dict[str, Any],
    original: SideRun,
    patched: SideRun,
    failing: list[Difference],
    tol: Tolerance,
) -> _Referee | None:
    """Judge ``failing`` against a float64 run of the original, or ``None`` where the referee
    does not apply: a structural mismatch, or a value that is not float32 or half precision."""
    original_values, patched_values = original.labelled(), patched.labelled()
    for difference in failing:
        value = original_values.get(difference.name)
        if not (
            difference.numeric
            and isinstance(value, torch.Tensor)
            and value.dtype in _REFEREED_DTYPES
        ):
            return None

    def in_float64(source: Callable[[], nn.Module]) -> SideRun:
        model = source().to(torch.float64)
        with Float64Throughout():
            return run_side(model, state64, inputs64, **side)

    state64, inputs64 = cast_inputs(state, torch.float64), cast_inputs(inputs, torch.float64)
    try:
        reference = in_float64(reference_model)
    except Exception as exc:
        return _Referee(False, reason=f"the original model in float64 raised {_error_line(exc)}")
    reference_values = reference.labelled()
    figures = [
        referee_value(
            d.name,
            original_values[d.name],
            patched_values[d.name],
            reference_values.get(d.name),
            tol,
        )
        for d in failing
    ]
    if reference.drew_random:
        # Random draws may differ between dtypes (a float64 dropout mask need not be the
        # float32 one), so this run is no reference for the float32 errors; values that are
        # all rounding can still be judged float64 against float64, where both sides draw alike.
        spread = {d.name: d.max_abs_diff for d in failing}
        figures = [replace(f, float32_spread=spread[f.name]) for f in figures]
    if any(f.is_noise or f.near_miss for f in figures):
        run = partial(in_float64, patched_model)
        figures = _patched_in_float64(figures, run, reference_values, tol)
    return _Referee(all(f.passes for f in figures), figures)


def _patched_in_float64(
    figures: list[RefereeFigures],
    patched_run: Callable[[], SideRun],
    reference_values: dict[str, Any],
    tol: Tolerance,
) -> list[RefereeFigures]:
    """``figures`` with ``agrees_in_float64`` set where the patched model's own float64 run
    (``patched_run``) decides: on values all rounding in the original's float32 run (or exactly
    zero), within ``tol``; on near misses (:attr:`RefereeFigures.near_miss`), within the
    float64 tolerance. Unset where that run fails."""
    try:
        patched_values = patched_run().labelled()
    except Exception:
        return figures
    strict = tolerance_for(torch.float64)

    def judged(figure: RefereeFigures) -> RefereeFigures:
        if not (figure.is_noise or figure.near_miss):
            return figure
        found = compare_values(
            figure.name,
            reference_values.get(figure.name),
            patched_values.get(figure.name),
            tol if figure.is_noise else strict,
        )
        return replace(figure, agrees_in_float64=found.ok)

    return [judged(f) for f in figures]


def _refereed(
    referee: _Referee,
    refuted: str,
    diffs: list[Difference],
    failing: list[Difference],
    worst: Difference,
    precision: str,
) -> ModeOutcome:
    """The outcome of a mode whose ``failing`` values went to the referee; ``refuted`` is the
    detail the mode would have without it."""
    if referee.reason:
        return ModeOutcome(
            REFUTED, f"{refuted}; no float64 referee: {referee.reason}", diffs, referee.to_json()
        )
    closest = referee.closest()
    assert closest is not None
    if not referee.settled:
        detail = (
            f"{refuted}; float64 referee: against a float64 run of the original, "
            f"{closest.describe()} (allowed {closest.original_error + closest.allowance:.3g})"
        )
        return ModeOutcome(REFUTED, detail, diffs, referee.to_json())
    at_worst = next(f for f in referee.figures if f.name == worst.name)
    figures = at_worst.describe()
    if closest is not at_worst:
        figures += f"; closest: {closest.describe()}"
    detail = (
        f"{precision} results differ beyond the tolerance ({len(failing)} of {len(diffs)} "
        f"values; largest: {worst.describe()}), but against a float64 run of the original no "
        f"patched {precision} value is farther off than the original's own {precision} "
        f"run ({figures}): rounding the model amplifies, not a change"
    )
    return ModeOutcome(VERIFIED, detail, diffs, referee.to_json())


def check_mode(
    original: ModelSource,
    patched: ModelSource,
    state: dict[str, torch.Tensor],
    inputs: Any,
    *,
    training: bool,
    seed: int,
    tol: Tolerance,
    prepare: Callable[[nn.Module], None] | None = None,
    objective: str | None = None,
) -> ModeOutcome:
    """Run fresh models of both sides in one mode and judge: verified, refuted or not checkable.

    ``original`` and ``patched`` hand out fresh models (:func:`pristine_copies`); ``prepare``
    is applied to each before it runs (switching dropout off); ``objective`` is
    :func:`run_side`'s. A failure on finite floating-point differences alone goes to the float64
    referee (see the module docstring).
    """
    side = {"training": training, "seed": seed, "objective": objective}

    def fresh(source: ModelSource) -> nn.Module:
        model = source()
        if prepare is not None:
            prepare(model)
        return model

    try:
        first = run_side(fresh(original), state, inputs, **side)
        second = run_side(fresh(original), state, inputs, **side)
    except Exception as exc:
        return ModeOutcome(NOT_CHECKABLE, f"the original model raised {_error_line(exc)}")
    unstable = [d for d in compare_runs(first, second, tol) if not d.ok]
    if unstable:
        return ModeOutcome(
            NOT_CHECKABLE,
            f"the original model does not reproduce itself under a fixed seed "
            f"({unstable[0].describe()})",
        )
    try:
        other = run_side(fresh(patched), state, inputs, **side)
    except Exception as exc:
        return ModeOutcome(REFUTED, f"the patched model raised {_error_line(exc)}")
    diffs = compare_runs(first, other, tol)
    if any(not d.ok for d in diffs):
        sources = (lambda: fresh(original), lambda: fresh(patched))
        return _judge_failing(sources, state, inputs, side, (first, other), diffs, tol)
    largest = _largest(diffs)
    detail = f"{len(diffs)} values agree"
    if largest is not None and largest.max_abs_diff > 0:
        closest = max(diffs, key=lambda d: d.excess)
        detail += (
            f" (max |diff| {largest.max_abs_diff:.3g} at {largest.name}; closest to the "
            f"tolerance: {closest.name} at {closest.excess:.2g}x)"
        )
    return ModeOutcome(VERIFIED, detail, diffs)


def _judge_failing(
    sources: tuple[Callable[[], nn.Module], Callable[[], nn.Module]],
    state: dict[str, torch.Tensor],
    inputs: Any,
    side: dict[str, Any],
    runs: tuple[SideRun, SideRun],
    diffs: list[Difference],
    tol: Tolerance,
) -> ModeOutcome:
    """A mode whose runs (``runs``: the original's, the patched one's) differ in ``diffs``:
    refuted, unless the float64 referee settles it or the comparison is ill-conditioned."""
    (original, patched), (first, other) = sources, runs
    failing = [d for d in diffs if not d.ok]
    worst = _largest(failing)
    assert worst is not None
    detail = f"{len(failing)} of {len(diffs)} compared values differ; largest: {worst.describe()}"
    if failing[0] is not worst:
        detail += f"; first: {failing[0].describe()}"
    referee = _referee(original, patched, state, inputs, side, first, other, failing, tol)
    if referee is None:
        return ModeOutcome(REFUTED, detail, diffs)
    precision = str(first.labelled()[worst.name].dtype).removeprefix("torch.")
    outcome = _refereed(referee, detail, diffs, failing, worst, precision)
    if outcome.status != REFUTED:
        return outcome
    moved = partial(_moved_by_rounding, original, state, inputs, side, first, tol)
    return _unless_ill_conditioned(outcome, referee, failing, moved)


def _unless_ill_conditioned(
    outcome: ModeOutcome,
    referee: _Referee,
    failing: list[Difference],
    measure_moved: Callable[[], dict[str, Difference]],
) -> ModeOutcome:
    """A refuted ``outcome``, or "not checkable" where the weights one rounding unit apart move
    (``measure_moved``, run only when it can decide) every value the referee did not settle
    beyond the tolerance, and at least as far as the patch does: a real change larger than the
    model's rounding stays refuted, and so does one the patched model's own float64 run showed
    (``agrees_in_float64`` false)."""
    if any(f.agrees_in_float64 is False for f in referee.figures):
        return outcome
    unsettled = {f.name for f in referee.figures if not f.passes} or {d.name for d in failing}
    patch = {d.name: d.max_abs_diff for d in failing}
    moved = measure_moved()
    if not all(n in moved and moved[n].max_abs_diff >= patch[n] for n in unsettled):
        return outcome
    most = max((moved[name] for name in unsettled), key=lambda d: d.excess)
    return ModeOutcome(
        NOT_CHECKABLE,
        f"{outcome.detail}; but the comparison is ill-conditioned here: the original itself, "
        f"from weights one rounding unit apart, moves every such value as far "
        f"({most.describe()})",
        outcome.differences,
        outcome.referee,
    )


_ROUNDING_DRAWS = 3
"""Weights one rounding unit apart are drawn this often: how far rounding moves a value is a
maximum over draws, and one draw may fall short of it."""


def one_ulp_apart(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """``state`` with each floating-point value moved by one rounding unit of its precision, up
    or down at random (seeded): what float rounding alone may do to the weights."""
    generator = torch.Generator().manual_seed(seed)
    moved = {}
    for name, value in state.items():
        if value.is_floating_point():
            signs = torch.randint(0, 2, value.shape, generator=generator).to(value.dtype) * 2 - 1
            value = value * (1 + signs * torch.finfo(value.dtype).eps)
        moved[name] = value
    return moved


def _moved_by_rounding(
    original: Callable[[], nn.Module],
    state: dict[str, torch.Tensor],
    inputs: Any,
    side: dict[str, Any],
    first: SideRun,
    tol: Tolerance,
) -> dict[str, Difference]:
    """The values of the original's run ``first`` that runs from :func:`one_ulp_apart` weights
    (``_ROUNDING_DRAWS`` draws) move beyond ``tol``, each with its largest move (none where a
    run fails)."""
    moved: dict[str, Difference] = {}
    for draw in range(_ROUNDING_DRAWS):
        try:
            shaken = run_side(original(), one_ulp_apart(state, side["seed"] + draw), inputs, **side)
        except Exception:
            return {}
        for d in compare_runs(first, shaken, tol):
            if not d.ok and (d.name not in moved or d.max_abs_diff > moved[d.name].max_abs_diff):
                moved[d.name] = d
    return moved


def conclude(
    cls_name: str, outcomes: dict[str, ModeOutcome], prefix: str = ""
) -> ClassVerification:
    """Fold per-mode outcomes into one class verdict.

    Refuted if any mode is; verified if every mode that ran is verified (skipped modes are
    named in the reason); otherwise not checkable, naming the mode that could not be checked.
    The float64 referee's figures of every mode it judged are kept in ``referee``.
    """
    modes = {name: outcome.line() for name, outcome in outcomes.items()}
    referee = {name: o.referee for name, o in outcomes.items() if o.referee is not None}
    verdict = partial(ClassVerification, cls_name, modes=modes, referee=referee)
    refuted = {n: o for n, o in outcomes.items() if o.status == REFUTED}
    every_diff = [d for o in outcomes.values() for d in o.differences]
    if refuted:
        failing = [d for o in refuted.values() for d in o.differences if not d.ok]
        worst = _largest(failing)
        name, outcome = next(iter(refuted.items()))
        return verdict(
            REFUTED,
            f"{prefix}{name}: {outcome.detail}",
            max_abs_diff=None if worst is None else worst.max_abs_diff,
            where=None if worst is None else worst.name,
        )
    blocked = {n: o for n, o in outcomes.items() if o.status == NOT_CHECKABLE}
    if blocked or not outcomes:
        name, outcome = (
            next(iter(blocked.items())) if blocked else ("-", ModeOutcome("", "no mode"))
        )
        return verdict(NOT_CHECKABLE, f"{prefix}{name}: {outcome.detail}")
    largest = _largest(every_diff)
    if largest is not None and largest.max_abs_diff == 0.0:
        largest = None  # bit-identical: there is no "where" to point at
    ran = [n for n, o in outcomes.items() if o.status == VERIFIED]
    skipped = [f"{n} ({o.detail})" for n, o in outcomes.items() if o.status == SKIPPED]
    reason = f"{prefix}agrees in {', '.join(ran)}"
    settled = [name for name, figures in referee.items() if figures.get("settled")]
    if settled:
        reason += (
            f"; in {', '.join(settled)} only after the float64 referee: the differences beyond "
            "the tolerance are rounding the model amplifies"
        )
    if skipped:
        reason += "; skipped " + "; ".join(skipped)
    return verdict(
        VERIFIED,
        reason,
        max_abs_diff=0.0 if largest is None else largest.max_abs_diff,
        where=None if largest is None else largest.name,
    )
