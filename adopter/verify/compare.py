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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Difference", "Tolerance", "compare_values", "tolerance_for"]


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

    def describe(self) -> str:
        if self.note:
            return f"{self.name}: {self.note}"
        return f"{self.name}: max |diff| {self.max_abs_diff:.3g} ({self.excess:.3g}x the tolerance)"


def _mismatch(name: str, note: str) -> Difference:
    return Difference(name, math.inf, math.inf, note)


def compare_values(name: str, original: Any, patched: Any, tol: Tolerance) -> Difference:
    """Compare one output (or gradient) of the original run with the patched run's."""
    if original is None or patched is None:
        if original is None and patched is None:
            return Difference(name, 0.0, 0.0)
        which = "original" if patched is None else "patched"
        return _mismatch(name, f"present only in the {which} run")
    if isinstance(original, torch.Tensor) != isinstance(patched, torch.Tensor):
        return _mismatch(
            name, f"type differs: {type(original).__name__} vs {type(patched).__name__}"
        )
    if not isinstance(original, torch.Tensor):
        if original == patched:
            return Difference(name, 0.0, 0.0)
        return _mismatch(name, f"value differs: {original!r} vs {patched!r}")
    return _compare_tensors(name, original.detach(), patched.detach(), tol)


def _compare_tensors(name: str, ref: torch.Tensor, got: torch.Tensor, tol: Tolerance) -> Difference:
    if ref.shape != got.shape:
        return _mismatch(name, f"shape differs: {tuple(ref.shape)} vs {tuple(got.shape)}")
    if ref.dtype != got.dtype:
        return _mismatch(name, f"dtype differs: {ref.dtype} vs {got.dtype}")
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
        return _mismatch(name, f"NaN in {int((ref_nan ^ got_nan).sum())} elements of one run only")
    same_inf = (ref64 == got64) & torch.isinf(ref64)
    if not torch.equal(torch.isinf(ref64), same_inf) or not torch.equal(
        torch.isinf(got64), same_inf
    ):
        return _mismatch(name, "infinities differ")
    finite = ~(ref_nan | torch.isinf(ref64))
    if not bool(finite.any()):
        return Difference(name, 0.0, 0.0)
    ref_f, got_f = ref64[finite], got64[finite]
    diff = (got_f - ref_f).abs()
    magnitude = ref_f.abs()
    scale = max(1.0, float(magnitude.max()))
    allowed = tol.atol * scale + tol.rtol * magnitude
    return Difference(name, float(diff.max()), float((diff / allowed).max()))
