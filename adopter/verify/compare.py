"""Tolerances and the element-wise comparison of original against patched tensors.

Why these tolerances: a correct rewrite changes the *order* of floating-point operations (a fused
kernel accumulates in a different order, an SDPA kernel rescales its softmax online, a folded
batch norm multiplies weights before the convolution), never the mathematics. Each reordering
costs a few units in the last place (fp32: eps = 1.2e-7) of the values involved, and those
errors accumulate through the layers and through the backward pass. An element passes when

    |patched - original| <= atol * scale + rtol * |original|,   scale = max(1, max |original|)

per compared tensor. The relative term covers large elements. The absolute term is relative to
the largest magnitude *in that tensor* rather than a fixed number, because an element that came
out of a cancellation (a layer-norm output near zero, a gradient summed from terms of both
signs) carries the rounding error of the big terms it was computed from, not of itself.

For float32, ``rtol = 1e-4`` and ``atol = 1e-5``. Measured on the shrunk BERT, GPT-2 and T5
models patched with every ``adopter.kernels`` kernel (fused attention, softmax, dropout + add +
layer norm, bias + activation), correct patches use at most 3.4% of that allowance (absolute
differences up to 7e-5, in embedding gradients summed over every position), so there is
about 30x headroom; a real change - a different epsilon, a swapped argument, a missing residual -
moves values by 1e-3 or more and exceeds it hundredfold. Float64 runs use 1e-9 / 1e-10
(eps = 2.2e-16). Half precisions are only approximate (eps 1e-3 / 8e-3) and get 1e-2 / 1e-3.

Integer and boolean tensors (indices, masks) and non-tensor outputs must be exactly equal.

The float64 referee. Some models amplify rounding far beyond these few units in the last place
(activations in the tens, attention over wide heads, gradients summed over every position): two
correct float32 runs that only order their sums differently then differ beyond the tolerance,
and neither is the right one. Where a float32 (or half-precision) comparison fails only on such
finite differences - never on a shape, dtype, presence, NaN/inf pattern, integer value or
exception, which stay refuted - :mod:`adopter.verify.differential` runs the *original* once more
in float64 (its state and floating inputs cast) as the reference, and :func:`referee_value`
asks of each differing value whether the patched run is any farther from it than the original's
own float32 run:

    max |patched - reference| <= max |original - reference| + atol * max(1, max |reference|)

Per tensor, not per element: rounding errors land on different elements in two equally accurate
runs, so an element-wise rule would refute a correct reordering wherever the original happened
to come out closer at that element, while the largest error in a tensor is what its float32
precision bounds (and the tolerance above is per-tensor scaled for the same reason). So a change
passes only where it is smaller than the error of the original's own float32 run in that
tensor: below what float32 can resolve in this model. A wrong patch that moves a value by more
than that is still refuted, and a correct one whose largest error comes out larger than the
original's by chance is refuted too (the rule errs towards refuting). A reference that draws
random numbers is no reference (dropout masks depend on the dtype) and is not used. What the
original rounds on purpose (``softmax(..., dtype=torch.float32)``) stays rounded in the
reference: it is the original's computation, without float32 anywhere else.

A value that is all rounding - the original's float32 run is off by at least the value's own
magnitude in the reference, as the gradient of a bias feeding a train-mode batch norm (exactly
zero) is all cancellation - cannot tell two float32 runs apart, and the rule above would accept
any change smaller than that rounding. Such a value is judged instead by running the *patched*
model in float64 too: it passes only when that run agrees with the reference within the float32
tolerance (where the float32 value carries no digits, float64 decides).

A correct reordering may also, by chance, land up to about twice as far from the reference as
the original's own run (a folded batch norm rounds its scaled weights once more, and with
statistics that shift the activations its bias then cancels against the convolution). A value
whose patched error is within twice the original's (plus the allowance) passes only when the
patched model run in float64 agrees with the reference within the *float64* tolerance: the same
function to nine digits, so the difference is float32 rounding alone. A kernel that rounds to a
lower precision on purpose is still refuted, by its float32 error, which a half precision puts
far beyond twice the original's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "Difference",
    "RefereeFigures",
    "Tolerance",
    "compare_values",
    "mismatch",
    "referee_value",
    "tolerance_for",
]


@dataclass(frozen=True)
class Tolerance:
    """Relative and (per-tensor scaled) absolute tolerance, see the module docstring."""

    rtol: float
    atol: float


_TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(rtol=1e-9, atol=1e-10),
    torch.float32: Tolerance(rtol=1e-4, atol=1e-5),
    torch.bfloat16: Tolerance(rtol=2e-2, atol=1e-2),
    torch.float16: Tolerance(rtol=1e-2, atol=1e-3),
}


def tolerance_for(dtype: torch.dtype) -> Tolerance:
    """The tolerance for models run in ``dtype`` (float32's for anything unknown)."""
    return _TOLERANCES.get(dtype, _TOLERANCES[torch.float32])


@dataclass
class Difference:
    """How one named output or gradient differs between the original and the patched run.

    ``excess`` is the worst ratio of difference to allowed difference (``<= 1`` passes); it is
    ``inf`` for structural mismatches (shape, dtype, presence), which ``note`` then explains.
    """

    name: str
    max_abs_diff: float
    excess: float
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.excess <= 1.0

    @property
    def numeric(self) -> bool:
        """A finite difference of floating-point values (not a structural mismatch): the only
        kind the float64 referee may look at."""
        return not self.note and math.isfinite(self.excess)

    def describe(self) -> str:
        if self.note:
            return f"{self.name}: {self.note}"
        return f"{self.name}: max |diff| {self.max_abs_diff:.3g} ({self.excess:.3g}x the tolerance)"


def mismatch(name: str, note: str) -> Difference:
    """A structural mismatch of ``name``, which ``note`` explains."""
    return Difference(name, math.inf, math.inf, note)


def compare_values(name: str, original: Any, patched: Any, tol: Tolerance) -> Difference:
    """Compare one output (or gradient) of the original run with the patched run's."""
    if original is None or patched is None:
        if original is None and patched is None:
            return Difference(name, 0.0, 0.0)
        which = "original" if patched is None else "patched"
        return mismatch(name, f"present only in the {which} run")
    if isinstance(original, torch.Tensor) != isinstance(patched, torch.Tensor):
        return mismatch(
            name, f"type differs: {type(original).__name__} vs {type(patched).__name__}"
        )
    if not isinstance(original, torch.Tensor):
        if original == patched:
            return Difference(name, 0.0, 0.0)
        return mismatch(name, f"value differs: {original!r} vs {patched!r}")
    return _compare_tensors(name, original.detach(), patched.detach(), tol)


def _compare_tensors(name: str, ref: torch.Tensor, got: torch.Tensor, tol: Tolerance) -> Difference:
    if ref.shape != got.shape:
        return mismatch(name, f"shape differs: {tuple(ref.shape)} vs {tuple(got.shape)}")
    if ref.dtype != got.dtype:
        return mismatch(name, f"dtype differs: {ref.dtype} vs {got.dtype}")
    if ref.numel() == 0:
        return Difference(name, 0.0, 0.0)
    if not (ref.is_floating_point() or ref.is_complex()):
        if torch.equal(ref, got):
            return Difference(name, 0.0, 0.0)
        wrong = int((ref != got).sum())
        diff = (ref.double() - got.double()).abs().max().item()
        return Difference(name, diff, math.inf, f"{wrong} of {ref.numel()} elements differ")
    ref64, got64 = (
        ref.to(torch.complex128 if ref.is_complex() else torch.float64),
        got.to(torch.complex128 if ref.is_complex() else torch.float64),
    )
    ref_nan, got_nan = torch.isnan(ref64), torch.isnan(got64)
    if not torch.equal(ref_nan, got_nan):
        return mismatch(name, f"NaN in {int((ref_nan ^ got_nan).sum())} elements of one run only")
    same_inf = (ref64 == got64) & torch.isinf(ref64)
    if not torch.equal(torch.isinf(ref64), same_inf) or not torch.equal(
        torch.isinf(got64), same_inf
    ):
        return mismatch(name, "infinities differ")
    finite = ~(ref_nan | torch.isinf(ref64))
    if not bool(finite.any()):
        return Difference(name, 0.0, 0.0)
    ref_f, got_f = ref64[finite], got64[finite]
    diff = (got_f - ref_f).abs()
    magnitude = ref_f.abs()
    scale = max(1.0, float(magnitude.max()))
    allowed = tol.atol * scale + tol.rtol * magnitude
    return Difference(name, float(diff.max()), float((diff / allowed).max()))


@dataclass(frozen=True)
class RefereeFigures:
    """How far one differing value of each float32 run lies from the float64 reference.

    ``note`` says why the value could not be judged (it then fails)."""

    name: str
    original_error: float
    patched_error: float
    allowance: float
    note: str = ""
    # The largest magnitude of the value in the float64 run, and, for a value below the
    # original's own float32 noise (see ``is_noise``), whether the patched model run in float64
    # agrees with that run within the float32 tolerance.
    magnitude: float = math.inf
    agrees_in_float64: bool | None = None
    # Set where the float64 run drew random numbers (dropout, random masking): its draws need
    # not be the float32 runs' ones, so the errors against it mean nothing, and only the spread
    # of the two float32 runs (``max |original - patched|``) says whether a value is all rounding.
    float32_spread: float | None = None

    @property
    def is_noise(self) -> bool:
        """The original's float32 value is all rounding: off by at least the true value's
        magnitude (a bias feeding a train-mode batch norm has a true gradient of exactly zero
        and a float32 one of whatever the cancellation leaves). Such a value cannot tell two
        float32 runs apart, so it is judged by running the patched model in float64 too."""
        if self.note:
            return False
        if self.exact_zero:
            return True
        error = self.original_error if self.float32_spread is None else self.float32_spread
        return error >= max(self.magnitude, self.allowance)

    @property
    def exact_zero(self) -> bool:
        """The value is exactly zero in the float64 run: a structural zero (the gradient of a
        query that attends to a single key, of a key bias the softmax cancels). The original's
        float32 run may hit it exactly by its order of summation, and another order leaves
        rounding there, so it is judged as a value that is all rounding is."""
        return not self.note and self.float32_spread is None and self.magnitude == 0.0

    @property
    def passes(self) -> bool:
        if self.note:
            return False
        if self.is_noise:
            # Against all-rounding the error rule would accept any change smaller than that
            # rounding: only the patched model's own float64 run can tell.
            return self.agrees_in_float64 is True
        if self.float32_spread is not None:  # errors against other random draws: no rule
            return False
        if self.patched_error <= self.original_error + self.allowance:
            return True
        return self.near_miss and self.agrees_in_float64 is True

    @property
    def near_miss(self) -> bool:
        """Farther off than the original's own run, but within twice its error: a reordering
        that rounded worse by chance, or a change below float32's resolution here; the
        patched model's float64 run decides (see the module docstring)."""
        if self.note or self.float32_spread is not None or self.is_noise:
            return False
        error, allowed = self.patched_error, self.original_error + self.allowance
        return allowed < error <= 2 * self.original_error + self.allowance

    @property
    def ratio(self) -> float:
        """How much of what the rule allows the patched run uses (``<= 1`` passes; a noise
        value settled in float64 counts as just passing)."""
        if self.note or (self.float32_spread is not None and not self.is_noise):
            return math.inf
        ratio = self.patched_error / (self.original_error + self.allowance)
        return min(ratio, 1.0) if self.passes else ratio

    def describe(self) -> str:
        if self.note:
            return f"{self.name}: {self.note}"
        if self.float32_spread is not None and not self.is_noise:
            return (
                f"{self.name}: the float64 run draws other random numbers, and the value is not "
                f"all rounding (it is {self.magnitude:.3g}, the float32 runs differ by "
                f"{self.float32_spread:.3g}), so it cannot be judged there"
            )
        text = (
            f"{self.name}: the patched run is off by {self.patched_error:.3g}, the original's "
            f"own run by {self.original_error:.3g}"
        )
        agrees = "agrees" if self.agrees_in_float64 else "does not agree"
        if self.is_noise and self.agrees_in_float64 is not None:
            text += (
                f" (all rounding: the value itself is {self.magnitude:.3g}; the patched model "
                f"in float64 {agrees} with it)"
            )
        elif self.near_miss and self.agrees_in_float64 is not None:
            text += f" (within twice: the patched model in float64 {agrees} with it to 1e-9)"
        return text


def referee_value(
    name: str,
    original: torch.Tensor,
    patched: torch.Tensor,
    reference: Any,
    tol: Tolerance,
) -> RefereeFigures:
    """Judge one value whose float32 runs differ against the original's float64 run (see the
    module docstring); ``original`` and ``patched`` passed :func:`compare_values` structurally,
    so they share shape, dtype and NaN/inf pattern."""
    if not isinstance(reference, torch.Tensor) or not reference.is_floating_point():
        return RefereeFigures(
            name, math.inf, math.inf, 0.0, "no floating tensor in the float64 run"
        )
    if reference.shape != original.shape:
        return RefereeFigures(
            name, math.inf, math.inf, 0.0, f"shape {tuple(reference.shape)} in the float64 run"
        )
    ref, orig, got = (t.detach().to(torch.float64) for t in (reference, original, patched))
    finite = torch.isfinite(orig)
    if not torch.equal(finite, torch.isfinite(ref)):
        return RefereeFigures(
            name,
            math.inf,
            math.inf,
            0.0,
            "NaN or infinity in other elements than in the float64 run",
        )
    if not bool(finite.any()):
        return RefereeFigures(name, 0.0, 0.0, tol.atol)
    ref, orig, got = ref[finite], orig[finite], got[finite]
    magnitude = float(ref.abs().max())
    allowance = tol.atol * max(1.0, magnitude)
    return RefereeFigures(
        name,
        original_error=float((orig - ref).abs().max()),
        patched_error=float((got - ref).abs().max()),
        allowance=allowance,
        magnitude=magnitude,
    )
