"""Gated MLPs (SwiGLU, GeGLU, ...) that recompute the activation in backward.

``down(act(gate(x)) * up(x))`` is the MLP of every Llama-family decoder; diffusers' GEGLU and
timm's GluMlp split one projection instead: ``a, g = proj(x).chunk(2, -1); a * act(g)``. Under
autograd the original keeps, per MLP, the gate output (for the activation's backward), the
activation output and the up output (for the product's backward) and the product (for the
down projection's backward): four tensors of the intermediate size.

* :func:`gated_activation` / :func:`gated_activation_chunked` compute ``act(gate) * up`` as one
  autograd function that keeps only ``gate`` and ``up`` (or the one projection output they are
  halves of) and recomputes ``act(gate)`` in backward.
* :func:`gated_mlp` takes the model's modules. With a stock ``nn.Linear`` as the down
  projection it runs product and down projection as one autograd function that keeps only
  ``gate``, ``up`` and the weight: the product is recomputed in backward as well, so two of the
  four intermediate tensors are never kept.

The activation is recomputed by calling the model's own activation again, and its gradient is
taken by autograd from that recomputation, so values and gradients are the original's (the
same operations on the same inputs). That is only legal for activations known to be pure
functions of their input without parameters: the ``torch.nn`` / ``torch.nn.functional``
activations and the ``transformers`` ones :mod:`adopter.kernels._activations` recognises, the
transformers 5 ``GELUTanh``, ``SqrtSoftplusActivation`` and ``LaplaceActivation``, timm's
activation layers (without ``inplace=True``) and ``functools.partial(F.gelu, approximate=...)``.
Any other activation (hooked, parametric such as ``PReLU`` or ``XIELU``, unknown) runs the
original code; so do tensor subclasses, gate/up pairs of different shapes or dtypes, odd chunk
sizes, and ``torch.jit`` / ``torch.fx`` tracing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._activations import resolve_activation
from ._trace import tracing
from ._util import grad_needed, has_hooks, is_plain, plain_tensors

__all__ = ["gated_activation", "gated_activation_chunked", "gated_mlp", "pure_activation"]

Activation = Callable[[torch.Tensor], torch.Tensor]

# Classes outside adopter.kernels._activations' table that compute a pure function of their
# input, by defining module prefix.
_PURE_CLASSES: dict[str, frozenset[str]] = {
    "transformers": frozenset({"GELUTanh", "SqrtSoftplusActivation", "LaplaceActivation"}),
    "timm": frozenset(
        {
            "GELU",
            "GELUTanh",
            "QuickGELU",
            "Swish",
            "Mish",
            "Sigmoid",
            "Tanh",
            "HardSwish",
            "HardSigmoid",
            "HardMish",
        }
    ),
}
_GELU_APPROXIMATIONS = ("none", "tanh")


def _pure_gelu_partial(act: object) -> bool:
    return (
        isinstance(act, functools.partial)
        and act.func is F.gelu
        and not act.args
        and set(act.keywords) <= {"approximate"}
        and act.keywords.get("approximate", "none") in _GELU_APPROXIMATIONS
    )


def pure_activation(act: object) -> Activation | None:
    """A callable computing ``act`` that may be called again to recompute it, or ``None``.

    The model's own activation object is returned whenever calling it is side-effect free
    (no hooks, no parameters, not in place); an ``inplace=True`` torch module is replaced by
    its out-of-place function, which computes the same values.
    """
    if _pure_gelu_partial(act):
        return act  # type: ignore[return-value]
    if isinstance(act, nn.Module):
        if has_hooks(act) or any(True for _ in act.parameters()):
            return None
        spec = resolve_activation(act)
        if spec is not None:
            return spec.fn if getattr(act, "inplace", False) else act
        module = type(act).__module__ or ""
        prefix = module.split(".", 1)[0]
        if type(act).__name__ in _PURE_CLASSES.get(prefix, ()) and not getattr(
            act, "inplace", False
        ):
            return act
        return None
    spec = resolve_activation(act)
    return act if spec is not None else None  # type: ignore[return-value]


def _recompute(act: Activation, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gate leaf, act(gate))`` recorded by autograd, for the activation's own backward."""
    with torch.enable_grad():
        leaf = gate.detach().requires_grad_(True)
        return leaf, act(leaf)


def _product(activated: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``activated * up``, written into ``activated`` when it is a fresh buffer of the result."""
    fresh = activated._base is None and (
        activated.untyped_storage().data_ptr() != gate.untyped_storage().data_ptr()
    )
    if fresh and activated.shape == up.shape and activated.dtype == up.dtype:
        return activated.mul_(up)
    return activated * up


def _gate_grads(
    act: Activation,
    gate: torch.Tensor,
    up: torch.Tensor,
    grad_h: torch.Tensor,
    want_gate: bool,
    want_up: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of ``h = act(gate) * up`` given ``dL/dh``, as autograd computes them."""
    leaf, activated = _recompute(act, gate)
    grad_up = grad_h * activated.detach() if want_up else None
    grad_gate = None
    if want_gate:
        (grad_gate,) = torch.autograd.grad(activated, leaf, grad_h * up)
    return grad_gate, grad_up


class _GatedProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor, act: Activation) -> torch.Tensor:
        ctx.act = act
        ctx.save_for_backward(gate, up)
        return _product(act(gate), gate, up)

    @staticmethod
    def backward(ctx: Any, grad_h: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gate, up = ctx.saved_tensors
        want_gate, want_up = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_gate, grad_up = _gate_grads(ctx.act, gate, up, grad_h, want_gate, want_up)
        return grad_gate, grad_up, None


def _chunks(x: torch.Tensor, gate: str, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    first, second = x.chunk(2, dim)
    return (first, second) if gate == "first" else (second, first)


class _ChunkedGatedProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, act: Activation, gate: str, dim: int) -> torch.Tensor:
        ctx.act, ctx.gate, ctx.dim = act, gate, dim
        ctx.save_for_backward(x)
        gate_half, up_half = _chunks(x, gate, dim)
        return _product(act(gate_half), gate_half, up_half)

    @staticmethod
    def backward(ctx: Any, grad_h: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (x,) = ctx.saved_tensors
        gate_half, up_half = _chunks(x, ctx.gate, ctx.dim)
        grad_x = torch.empty_like(x)
        grad_gate_half, grad_up_half = _chunks(grad_x, ctx.gate, ctx.dim)
        leaf, activated = _recompute(ctx.act, gate_half)
        torch.mul(grad_h, activated.detach(), out=grad_up_half)
        (grad_gate,) = torch.autograd.grad(activated, leaf, grad_h * up_half)
        grad_gate_half.copy_(grad_gate)
        return grad_x, None, None, None


class _GatedDown(torch.autograd.Function):
    """``F.linear(act(gate) * up, weight, bias)`` keeping ``gate``, ``up`` and ``weight``."""

    @staticmethod
    def forward(
        ctx: Any,
        gate: torch.Tensor,
        up: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        act: Activation,
    ) -> torch.Tensor:
        ctx.act = act
        ctx.has_bias = bias is not None
        ctx.save_for_backward(gate, up, weight)
        hidden = _product(act(gate), gate, up)
        return F.linear(hidden, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gate, up, weight = ctx.saved_tensors
        want_gate, want_up, want_w, want_b = ctx.needs_input_grad[:4]
        flat_grad = grad_y.reshape(-1, grad_y.shape[-1])
        grad_w = grad_b = None
        if want_w:
            hidden = _product(ctx.act(gate), gate, up)
            # The transposed product is what addmm's backward computes for ``weight.t()``.
            grad_w = hidden.reshape(-1, hidden.shape[-1]).t().mm(flat_grad).t()
            del hidden
        if want_b and ctx.has_bias:
            grad_b = flat_grad.sum(0)
        grad_gate = grad_up = None
        if want_gate or want_up:
            grad_h = flat_grad.mm(weight).view(*grad_y.shape[:-1], weight.shape[1])
            grad_gate, grad_up = _gate_grads(ctx.act, gate, up, grad_h, want_gate, want_up)
        return grad_gate, grad_up, grad_w, grad_b, None


def _pair_handled(gate: torch.Tensor, up: torch.Tensor) -> bool:
    return (
        plain_tensors(gate, up)
        and gate.is_floating_point()
        and gate.shape == up.shape
        and gate.dtype == up.dtype
        and gate.device == up.device
    )


def gated_activation(gate: torch.Tensor, up: torch.Tensor, act: object) -> torch.Tensor:
    """``act(gate) * up``, keeping only ``gate`` and ``up`` for backward."""
    fn = None if tracing(gate, up) else pure_activation(act)
    if fn is None or not isinstance(gate, torch.Tensor) or not isinstance(up, torch.Tensor):
        return act(gate) * up  # type: ignore[operator]
    if not _pair_handled(gate, up):
        return act(gate) * up  # type: ignore[operator]
    if not grad_needed(gate, up):
        return _product(fn(gate), gate, up)
    return _GatedProduct.apply(gate, up, fn)


def gated_activation_chunked(
    x: torch.Tensor, act: object, *, gate: str = "second", dim: int = -1
) -> torch.Tensor:
    """``first, second = x.chunk(2, dim)``; ``act(gate half) * other half``.

    ``gate`` names the half the activation is applied to: ``"second"`` for diffusers' GEGLU /
    SwiGLU and timm's ``GluMlp(gate_last=True)``, ``"first"`` for ``gate_last=False``. Only
    ``x`` is kept for backward (the two halves are views of it).
    """
    if gate not in ("first", "second"):
        raise ValueError(f"gate must be 'first' or 'second', got {gate!r}")
    fn = None if tracing(x) else pure_activation(act)
    handled = (
        fn is not None
        and isinstance(x, torch.Tensor)
        and plain_tensors(x)
        and x.is_floating_point()
        and x.dim() > 0
        and -x.dim() <= dim < x.dim()
        and x.shape[dim] % 2 == 0
        and x.shape[dim] > 0
    )
    if not handled:
        gate_half, up_half = _chunks(x, gate, dim)
        return act(gate_half) * up_half  # type: ignore[operator]
    if not grad_needed(x):
        gate_half, up_half = _chunks(x, gate, dim)
        return _product(fn(gate_half), gate_half, up_half)
    return _ChunkedGatedProduct.apply(x, fn, gate, dim)


def _down_fusable(down: object, hidden_like: torch.Tensor) -> bool:
    if not is_plain(down, nn.Linear):
        return False
    weight, bias = down.weight, down.bias  # type: ignore[union-attr]
    return (
        plain_tensors(weight, bias)
        and weight.dtype == hidden_like.dtype
        and weight.device == hidden_like.device
        and (bias is None or bias.dtype == weight.dtype)
        and weight.shape[1] == hidden_like.shape[-1]
        and hidden_like.dim() >= 1
        and not torch.is_autocast_enabled(hidden_like.device.type)
    )


def gated_mlp(
    x: torch.Tensor,
    gate_proj: Callable[[torch.Tensor], torch.Tensor],
    up_proj: Callable[[torch.Tensor], torch.Tensor],
    down_proj: Callable[[torch.Tensor], torch.Tensor],
    act: object,
) -> torch.Tensor:
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` with the model's own modules.

    The three projections are called as they are (hooks, LoRA and quantised layers keep
    working); only the gated product - and, for a stock ``nn.Linear`` down projection, the
    down projection with it - is fused. Keeps ``gate`` and ``up`` for backward instead of the
    four intermediate tensors of the original.
    """
    if tracing(x):
        return down_proj(act(gate_proj(x)) * up_proj(x))  # type: ignore[operator]
    gate = gate_proj(x)
    fn = pure_activation(act)
    if fn is None:
        return down_proj(act(gate) * up_proj(x))  # type: ignore[operator]
    up = up_proj(x)
    if not _pair_handled(gate, up):
        return down_proj(act(gate) * up)  # type: ignore[operator]
    if grad_needed(gate, up) and _down_fusable(down_proj, gate):
        return _GatedDown.apply(gate, up, down_proj.weight, down_proj.bias, fn)  # type: ignore[union-attr]
    return down_proj(gated_activation(gate, up, fn))
