"""RMSNorm that keeps only the input and the inverse RMS for backward.

Every modern decoder normalises with a root-mean-square norm written out as five to seven
elementwise operations (upcast, square, mean, add eps, rsqrt, multiply, downcast, weight).
Under autograd the original keeps, per norm, the input *and* the normalised activation (plus
an fp32 copy of the input for half-precision models); :func:`rms_norm` keeps the input and one
float per row (the inverse RMS) and recomputes the normalised value in backward, where the
gradient is computed in closed form::

    n      = x32 * r,             r = rsqrt(mean(x32 ** 2) + eps)
    dL/dx  = r * g - x32 * r**3 * mean(g * x32)     with g = dL/dn (float32)

The forward runs the same operations in the same order as the originals, so outputs are
bit-identical to them; gradients agree to float rounding (the reductions are ordered
differently).

The three spellings, chosen with ``cast`` (``dt`` is the input dtype, ``x32 = x.float()``)::

    "before_weight"  (Llama, Mistral, Qwen, Phi-3 ...; the default)
        weight * (x32 * r).to(dt)
    "after_weight"   (Gemma with offset=1.0; OLMo, GPT-OSS, Moshi with offset=0.0)
        ((x32 * r) * (offset + weight.float())).to(dt)
    "weight_dtype"   (T5 and its descendants)
        n = x * rsqrt(mean(x32 ** 2) + eps)               # x in its own dtype, promoted
        weight * (n.to(weight.dtype) if weight is fp16/bf16 else n)

``offset`` is added to the weight (``(1 + w)`` of the Gemma family) in the dtype the weight is
multiplied in. ``weight=None`` normalises without a scale (``n.to(dt)`` for the first two
spellings). ``"after_weight"`` multiplies in float32, as Gemma's ``weight.float()`` does; OLMo's
``(weight * n)`` is the same for every weight of at most 32 bits, and ``weight_promoted=True``
says the spelling multiplies the weight as it is (a float64 weight then runs the original).
``input_promoted=True`` (Mochi: ``x * rsqrt(variance + eps)`` with ``x`` itself, not its float32
copy) is the same for every input of at most 32 bits; a float64 input runs the original.

On CUDA with Triton the forward and backward are one Triton kernel each
(:mod:`adopter.kernels._triton_modern`; not for ``"weight_dtype"``), equal to float rounding.

Backends (:mod:`adopter.kernels.backends`): this module's (``adopter``), ``F.rms_norm``
(``torch``, float32 input and weight, where every spelling computes the same; the one used under
``torch.compile``, which captures it whole) and Liger-Kernel's (``liger``, CUDA).

Falls back to the original composite code (:func:`rms_norm_reference`) under ``torch.jit`` /
``torch.fx`` tracing and ``torch.compile`` when ``torch`` does not take the call (Inductor fuses
the original itself), for tensor subclasses,
non-floating inputs, a weight whose shape is not ``(x.shape[-1],)`` or that lives elsewhere, empty
inputs, and a weight or input of float64 combined with ``"after_weight"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from . import _triton_modern, backends
from ._util import HALF_DTYPES, grad_needed, plain_tensors, tracing

__all__ = ["RMS_NORM_CASTS", "rms_norm", "rms_norm_reference"]

RMS_NORM_CASTS = ("before_weight", "after_weight", "weight_dtype")


def _check_cast(cast: str) -> None:
    if cast not in RMS_NORM_CASTS:
        raise ValueError(f"cast must be one of {RMS_NORM_CASTS}, got {cast!r}")


def rms_norm_reference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    *,
    offset: float = 0.0,
    cast: str = "before_weight",
    weight_promoted: bool = False,
    input_promoted: bool = False,
) -> torch.Tensor:
    """The original composite code of each spelling, operation for operation."""
    _check_cast(cast)
    if cast == "weight_dtype":
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        normed = x * torch.rsqrt(variance + eps)
        if weight is None:
            return normed
        if weight.dtype in HALF_DTYPES:
            normed = normed.to(weight.dtype)
        scale = weight + offset if offset else weight
        return scale * normed
    input_dtype = x.dtype
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = (x if input_promoted else hidden) * torch.rsqrt(variance + eps)
    if weight is None:
        return hidden.to(input_dtype)
    if cast == "before_weight":
        scale = weight + offset if offset else weight
        return scale * hidden.to(input_dtype)
    if weight_promoted:
        return (hidden * (weight + offset if offset else weight)).to(input_dtype)
    return (hidden * (offset + weight.float())).to(input_dtype)


def _inverse_rms(x32: torch.Tensor, eps: float) -> torch.Tensor:
    # x*x is what pow(2) computes (ATen special-cases the square), without the pow dispatch.
    return torch.rsqrt((x32 * x32).mean(-1, keepdim=True) + eps)


def _scale(weight: torch.Tensor, offset: float, dtype: torch.dtype | None = None) -> torch.Tensor:
    w = weight if dtype is None else weight.to(dtype)
    return w + offset if offset else w


def _forward(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float, cast: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, inverse_rms)``; the same operations as the reference, fewer temporaries."""
    x32 = x.to(torch.float32)
    inv = _inverse_rms(x32, eps)
    if cast == "weight_dtype":
        normed = x * inv
        if weight is None:
            return normed, inv
        if weight.dtype in HALF_DTYPES:
            normed = normed.to(weight.dtype)
        return _scale(weight, offset) * normed, inv
    normed = x32 * inv
    if weight is None:
        return normed.to(x.dtype), inv
    if cast == "before_weight":
        normed = normed.to(x.dtype)
        scale = _scale(weight, offset)
        if torch.result_type(scale, normed) == normed.dtype and normed.shape == x.shape:
            # ``normed`` is a fresh buffer (the multiply above allocated it): scale in place.
            return normed.mul_(scale), inv
        return scale * normed, inv
    return normed.mul_(_scale(weight, offset, torch.float32)).to(x.dtype), inv


def _normed_grad(
    cast: str,
    offset: float,
    want_w: bool,
    grad_out: torch.Tensor,
    x: torch.Tensor,
    inv: torch.Tensor,
    weight: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(dL/dn in float32, dL/dweight)`` where ``n = x32 * inv`` is the normalised input."""
    want_w = weight is not None and want_w
    grad_w = None
    if cast == "after_weight":
        g32 = grad_out.to(torch.float32)
        if want_w:
            grad_w = _row_sum(g32 * (x.to(torch.float32) * inv)).to(weight.dtype)
        if weight is None:
            return g32, None
        return g32 * _scale(weight, offset, torch.float32), grad_w
    if cast == "before_weight":
        if weight is None:
            return grad_out.to(torch.float32), None
        if want_w:
            normed = (x.to(torch.float32) * inv).to(x.dtype)
            grad_w = _row_sum(grad_out * normed).to(weight.dtype)
        grad_n = grad_out * _scale(weight, offset)
        return grad_n.to(x.dtype).to(torch.float32), grad_w
    # weight_dtype: n = x * inv is float32 (float64 inputs are not handled), then maybe cast
    # to the weight's half dtype.
    if weight is None:
        return grad_out.to(torch.float32), None
    narrowed = weight.dtype if weight.dtype in HALF_DTYPES else torch.float32
    if want_w:
        normed = (x * inv).to(narrowed)
        grad_w = _row_sum(grad_out * normed).to(weight.dtype)
    grad_n = (grad_out * _scale(weight, offset)).to(narrowed)
    return grad_n.to(torch.float32), grad_w


def closed_form_grads(
    cast: str,
    offset: float,
    wants: tuple[bool, bool],
    grad_out: torch.Tensor,
    x: torch.Tensor,
    inv: torch.Tensor,
    weight: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(dL/dx, dL/dweight)`` of the spelling ``cast`` from what forward kept (``x`` and the
    inverse RMS); ``wants`` says which of the two are needed. Shared with
    :mod:`adopter.kernels.add_rms_norm`, whose backward is this one plus the residual's."""
    grad_n, grad_w = _normed_grad(cast, offset, wants[1], grad_out, x, inv, weight)
    if not wants[0]:
        return None, grad_w
    x32 = x.to(torch.float32)
    # dL/dx = inv * g - x * inv^3 * mean(g * x): the variance path folded in.
    coeff = (grad_n * x32).mean(-1, keepdim=True).mul_(inv.pow(3))
    grad_x32 = grad_n.mul_(inv) if grad_n is not grad_out else grad_n * inv
    if cast == "weight_dtype" and x.dtype != torch.float32:
        # T5 multiplies the half-precision input itself, so autograd rounds the direct
        # and the variance contributions to x's dtype separately and adds them there.
        return grad_x32.to(x.dtype) - (x32 * coeff).to(x.dtype), grad_w
    return grad_x32.sub_(x32 * coeff).to(x.dtype), grad_w


def _row_sum(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]).sum(0)


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        eps: float,
        offset: float,
        cast: str,
    ) -> torch.Tensor:
        out, inv = _forward(x, weight, eps, offset, cast)
        ctx.eps, ctx.offset, ctx.cast = eps, offset, cast
        ctx.save_for_backward(x, inv, weight)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, inv, weight = ctx.saved_tensors
        wants = (ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        grad_x, grad_w = closed_form_grads(ctx.cast, ctx.offset, wants, grad_out, x, inv, weight)
        return grad_x, grad_w, None, None, None


class _TritonRMSNorm(torch.autograd.Function):
    """The CUDA path: :mod:`adopter.kernels._triton_modern` forward and backward."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float, cast: str
    ) -> torch.Tensor:
        out, inv = _triton_modern.rms_forward(x, weight, eps, offset, cast)
        ctx.offset, ctx.cast = offset, cast
        ctx.save_for_backward(x, inv, weight)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, inv, weight = ctx.saved_tensors
        grad_x, grad_w = _triton_modern.rms_backward(grad_out, x, weight, inv, ctx.offset, ctx.cast)
        wants = ctx.needs_input_grad
        return (grad_x if wants[0] else None), (grad_w if wants[1] else None), None, None, None


def _triton(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float, cast: str
) -> torch.Tensor | None:
    if not (_triton_modern.usable(x) and _triton_modern.rms_supported(x, weight, cast)):
        return None
    try:
        if grad_needed(x, weight):
            return _TritonRMSNorm.apply(x, weight, eps, offset, cast)
        return _triton_modern.rms_forward(x, weight, eps, offset, cast)[0]
    except Exception as exc:  # a Triton problem must not break the model
        _triton_modern.failed(exc)
        return None


def _handled(x: Any, weight: Any, cast: str, input_promoted: bool = False) -> bool:
    if not isinstance(x, torch.Tensor) or not plain_tensors(x, weight):
        return False
    if not x.is_floating_point() or x.dim() == 0 or x.numel() == 0:
        return False
    if input_promoted and x.dtype == torch.float64:
        return False  # ``x * rsqrt(...)`` stays in float64 there
    if cast == "weight_dtype" and x.dtype == torch.float64:
        return False  # the fp64 T5 path mixes a float32 variance into fp64 arithmetic
    if weight is None:
        return True
    if not weight.is_floating_point() or weight.device != x.device:
        return False
    if tuple(weight.shape) != (x.shape[-1],):
        return False
    return not (cast == "after_weight" and weight.dtype == torch.float64)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    *,
    offset: float = 0.0,
    cast: str = "before_weight",
    weight_promoted: bool = False,
    input_promoted: bool = False,
) -> torch.Tensor:
    """RMS-normalise the last dimension of ``x`` like the original spelling ``cast``.

    Args:
        x: the activation, any shape ``(..., hidden)``.
        weight: the module's scale parameter of shape ``(hidden,)``, or ``None``.
        eps: added to the mean square (``self.variance_epsilon`` / ``self.eps``).
        offset: added to the weight (1.0 for Gemma's ``(1 + weight)``).
        cast: ``"before_weight"``, ``"after_weight"`` or ``"weight_dtype"`` (module docstring).
        weight_promoted: ``"after_weight"`` multiplies the weight as it is (``weight * n``), not
            its float32 copy: equal for weights of at most 32 bits, the original otherwise.
        input_promoted: ``x`` itself is multiplied by the inverse RMS, not its float32 copy:
            equal for inputs of at most 32 bits, the original otherwise.

    Under autograd the backward keeps ``x`` and the inverse RMS only.
    """
    _check_cast(cast)

    def original() -> torch.Tensor:
        return rms_norm_reference(
            x,
            weight,
            eps,
            offset=offset,
            cast=cast,
            weight_promoted=weight_promoted,
            input_promoted=input_promoted,
        )

    if tracing(x, weight) or not _handled(x, weight, cast, input_promoted):
        return original()
    call = NormCall(x, weight, float(eps), float(offset), cast, weight_promoted)
    return backends.run(OP, BACKENDS, bucket, call, x.device.type, x.dtype, original)


# --------------------------------------------------------------------------------------------
# Backends (adopter.kernels.backends); every call has passed ``_handled``.

OP = "rms_norm"


@dataclass(frozen=True)
class NormCall:
    x: torch.Tensor
    weight: torch.Tensor | None
    eps: float
    offset: float
    cast: str
    weight_promoted: bool


def bucket(call: NormCall) -> str:
    return f"h{backends.pow2(call.x.shape[-1])}"


def _run_adopter(call: NormCall) -> torch.Tensor:
    x, weight, eps, offset, cast = call.x, call.weight, call.eps, call.offset, call.cast
    fast = _triton(x, weight, eps, offset, cast)
    if fast is not None:
        return fast
    if not grad_needed(x, weight):
        return _forward(x, weight, eps, offset, cast)[0]
    return _RMSNormFunction.apply(x, weight, eps, offset, cast)


def _torch_accepts(call: NormCall) -> bool:
    """``F.rms_norm`` computes ``x * rsqrt(mean(x²) + eps) * weight`` in the input's dtype
    (float32 accumulation for the mean): every spelling's computation when input and weight
    are float32 (each spelling upcasts to float32 and multiplies there), not for half
    precision, where the spellings round at different points."""
    if call.x.dtype != torch.float32:
        return False
    return call.weight is None or call.weight.dtype == torch.float32


def _run_torch(call: NormCall) -> torch.Tensor:
    weight = call.weight
    if weight is not None and call.offset:
        weight = weight + call.offset
    return F.rms_norm(call.x, (call.x.shape[-1],), weight, call.eps)


_LIGER_MODES = {"before_weight": "llama", "after_weight": "gemma"}


def _liger_accepts(call: NormCall) -> bool:
    """Liger's ``llama`` mode is the ``before_weight`` spelling, ``gemma`` the
    ``after_weight`` one (float32 throughout); it needs a weight of the input's dtype."""
    if not call.x.is_cuda or call.weight is None or call.cast not in _LIGER_MODES:
        return False
    if call.weight.dtype != call.x.dtype or call.x.dtype == torch.float64:
        return False
    return call.cast != "after_weight" or not call.weight_promoted


def _run_liger(call: NormCall) -> torch.Tensor:
    from liger_kernel.transformers.functional import liger_rms_norm

    return liger_rms_norm(
        call.x,
        call.weight,
        call.eps,
        offset=call.offset,
        casting_mode=_LIGER_MODES[call.cast],
        in_place=False,
    )


BACKENDS: tuple[backends.Backend, ...] = (
    backends.Backend(
        "adopter",
        lambda call: True,
        _run_adopter,
        summary="eager forward, closed-form backward from the inverse RMS (Triton on CUDA)",
    ),
    backends.Backend(
        "torch",
        _torch_accepts,
        _run_torch,
        compiles=True,
        summary="torch.nn.functional.rms_norm",
    ),
    backends.Backend(
        "liger",
        _liger_accepts,
        _run_liger,
        devices=frozenset({"cuda"}),
        requires="liger_kernel",
        summary="Liger-Kernel RMSNorm (Triton)",
    ),
)
