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
sizes, ``torch.jit`` / ``torch.fx`` tracing and ``torch.compile`` (whose partitioner makes the
same recomputation choice itself).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import _triton_modern
from ._activations import resolve_activation
from ._util import grad_needed, has_hooks, is_plain, plain_tensors, runs_original

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


Derivative = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _silu_grad(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.silu_backward(grad, x)


def _relu_grad(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # Autograd passes ReLU's output; it is positive exactly where the input is.
    return torch.ops.aten.threshold_backward(grad, x, 0)


def _gelu_grad(approximate: str) -> Derivative:
    def grad_of(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.gelu_backward(grad, x, approximate=approximate)

    return grad_of


def _transformers_class(act: object, *names: str) -> bool:
    cls = type(act)
    return cls.__name__ in names and (cls.__module__ or "").startswith("transformers")


def _native_name(act: object) -> str | None:
    """``"silu"``, ``"relu"``, ``"gelu"`` or ``"gelu_tanh"`` for activations that are exactly
    that one native op (so its ATen backward is autograd's), else ``None``."""
    if act is F.silu or type(act) is nn.SiLU or _transformers_class(act, "SiLUActivation"):
        return "silu"
    if act is F.relu or act is torch.relu or type(act) is nn.ReLU:
        return "relu"
    if act is F.gelu:
        return "gelu"
    if type(act) is nn.GELU:
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    if _pure_gelu_partial(act):
        tanh = act.keywords.get("approximate", "none") == "tanh"  # type: ignore[union-attr]
        return "gelu_tanh" if tanh else "gelu"
    inner = getattr(act, "act", None)
    if _transformers_class(act, "GELUActivation") and inner is F.gelu:
        return "gelu"
    if _transformers_class(act, "GELUTanh", "PytorchGELUTanh"):
        if inner is None or _pure_gelu_partial(inner):
            return "gelu_tanh"  # 4.34's class calls F.gelu(approximate="tanh") itself
    return None


_DERIVATIVES: dict[str, Derivative] = {
    "silu": _silu_grad,
    "relu": _relu_grad,
    "gelu": _gelu_grad("none"),
    "gelu_tanh": _gelu_grad("tanh"),
}


def _derivative(act: object) -> Derivative | None:
    """The ATen backward autograd runs for ``act`` (called with ``(grad, input)``), for
    activations that are exactly one native op; ``None`` for the others, whose gradient
    autograd takes from a recomputation."""
    name = _native_name(act)
    return None if name is None else _DERIVATIVES[name]


def _triton_name(act: object, gate: torch.Tensor, up: torch.Tensor) -> str | None:
    """The Triton kernel's activation for this call, or ``None`` (CPU, unknown, layout)."""
    name = _native_name(act)
    if name is None or not _triton_modern.usable(gate):
        return None
    return name if _triton_modern.gate_supported(gate, up) else None


def _gated_forward(act: Activation, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``act(gate) * up``: one Triton kernel on CUDA, else the activation and an in-place
    product."""
    name = _triton_name(act, gate, up)
    if name is not None:
        try:
            return _triton_modern.gate_forward(gate, up, name)
        except Exception as exc:  # a Triton problem must not break the model
            _triton_modern.failed(exc)
    return _product(act(gate), gate, up)


def _product(activated: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``activated * up``, written into ``activated`` when it is a fresh buffer of the result."""
    fresh = activated._base is None and (
        activated.untyped_storage().data_ptr() != gate.untyped_storage().data_ptr()
    )
    if fresh and activated.shape == up.shape and activated.dtype == up.dtype:
        return activated.mul_(up)
    return activated * up


def _backward(
    act: Activation,
    gate: torch.Tensor,
    up: torch.Tensor,
    grad_h: torch.Tensor,
    wants: tuple[bool, bool],
    with_hidden: Callable[[torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of ``h = act(gate) * up`` for ``dL/dh = grad_h`` (a buffer of the caller's,
    overwritten), as autograd computes them for the original. ``with_hidden`` is handed the
    recomputed ``h`` first (for the down projection's weight gradient).

    Order and buffer reuse keep at most three intermediate-sized temporaries alive: the
    recomputed activation, ``grad_h`` and one gradient.
    """
    want_gate, want_up = wants
    name = _triton_name(act, gate, up)
    if name is not None:
        try:
            if with_hidden is not None:
                with_hidden(_triton_modern.gate_forward(gate, up, name))
            grad_gate, grad_up = _triton_modern.gate_backward(grad_h, gate, up, name)
            return (grad_gate if want_gate else None), (grad_up if want_up else None)
        except Exception as exc:  # a Triton problem must not break the model
            _triton_modern.failed(exc)
    derivative = _derivative(act)
    leaf = None
    if derivative is None and want_gate:
        with torch.enable_grad():  # autograd's own backward of the recomputed activation
            leaf = gate.detach().requires_grad_(True)
            activated = act(leaf)
        value = activated.detach()
    else:
        value = activated = act(gate)
    grad_up = grad_h * value if want_up else None
    if with_hidden is not None:
        # The activation is not needed any more when autograd does not hold it: reuse it.
        with_hidden(_product(value, gate, up) if leaf is None else value * up)
    del value
    if not want_gate:
        return None, grad_up
    grad_activated = grad_h.mul_(up)
    if derivative is not None:
        del activated
        return derivative(grad_activated, gate), grad_up
    (grad_gate,) = torch.autograd.grad(activated, leaf, grad_activated)
    return grad_gate, grad_up


class _GatedProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor, act: Activation) -> torch.Tensor:
        ctx.act = act
        ctx.save_for_backward(gate, up)
        return _gated_forward(act, gate, up)

    @staticmethod
    def backward(ctx: Any, grad_h: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gate, up = ctx.saved_tensors
        wants = (ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        # The incoming gradient may be shared with other consumers: overwrite a copy.
        own = grad_h.clone() if wants[0] else grad_h
        grad_gate, grad_up = _backward(ctx.act, gate, up, own, wants)
        return grad_gate, grad_up, None


def _chunks(x: torch.Tensor, gate: str, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    first, second = x.chunk(2, dim=dim)  # the keyword, as the model files spell it
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
        grad_gate, grad_up = _backward(ctx.act, gate_half, up_half, grad_h.clone(), (True, True))
        grad_x = torch.empty_like(x)
        grad_gate_half, grad_up_half = _chunks(grad_x, ctx.gate, ctx.dim)
        grad_up_half.copy_(grad_up)
        del grad_up
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
        hidden = _gated_forward(act, gate, up)
        return F.linear(hidden, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gate, up, weight = ctx.saved_tensors
        want_gate, want_up, want_w, want_b = ctx.needs_input_grad[:4]
        flat_grad = grad_y.reshape(-1, grad_y.shape[-1])
        grads: dict[str, torch.Tensor] = {}

        def weight_grad(hidden: torch.Tensor) -> None:
            # The transposed product is what addmm's backward computes for ``weight.t()``.
            grads["w"] = hidden.reshape(-1, hidden.shape[-1]).t().mm(flat_grad).t()

        grad_b = flat_grad.sum(0) if want_b and ctx.has_bias else None
        if not (want_gate or want_up):
            if want_w:
                weight_grad(ctx.act(gate) * up)
            return None, None, grads.get("w"), grad_b, None
        grad_h = flat_grad.mm(weight).view(*grad_y.shape[:-1], weight.shape[1])
        grad_gate, grad_up = _backward(
            ctx.act, gate, up, grad_h, (want_gate, want_up), weight_grad if want_w else None
        )
        return grad_gate, grad_up, grads.get("w"), grad_b, None


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
    # Under torch.compile the original product: the purity check reads storage pointers,
    # which Dynamo cannot trace, and AOT autograd's partitioner recomputes the activation in
    # backward by itself.
    fn = None if runs_original(gate, up) else pure_activation(act)
    if fn is None or not isinstance(gate, torch.Tensor) or not isinstance(up, torch.Tensor):
        return act(gate) * up  # type: ignore[operator]
    if not _pair_handled(gate, up):
        return act(gate) * up  # type: ignore[operator]
    if not grad_needed(gate, up):
        return _gated_forward(fn, gate, up)
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
    fn = None if runs_original(x) else pure_activation(act)  # as gated_activation()
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


def _chunked_mlp(
    both: torch.Tensor,
    down_proj: Callable[[torch.Tensor], torch.Tensor] | None,
    act: object,
    halves: str,
    dim: int,
) -> torch.Tensor:
    """``gate, up = halves of both``; ``down_proj(act(gate) * up)`` (no ``down_proj``: the
    product)."""
    if halves not in ("first", "second"):
        raise ValueError(f"halves must be 'first' or 'second', got {halves!r}")
    if down_proj is None:
        return gated_activation_chunked(both, act, gate=halves, dim=dim)
    fn = None if runs_original(both) else pure_activation(act)
    if fn is not None and isinstance(both, torch.Tensor) and grad_needed(both):
        gate, up = _chunks(both, halves, dim)
        if _pair_handled(gate, up) and _down_fusable(down_proj, gate):
            # The halves are views of ``both``: keeping them keeps nothing more than it.
            return _GatedDown.apply(gate, up, down_proj.weight, down_proj.bias, fn)  # type: ignore[union-attr]
    return down_proj(gated_activation_chunked(both, act, gate=halves, dim=dim))


def gated_mlp(
    x: torch.Tensor,
    gate_proj: Callable[[torch.Tensor], torch.Tensor] | None,
    up_proj: Callable[[torch.Tensor], torch.Tensor] | None,
    down_proj: Callable[[torch.Tensor], torch.Tensor] | None,
    act: object,
    *,
    halves: str | None = None,
    dim: int = -1,
    gate_scale: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` with the model's own modules.

    The three projections are called as they are (hooks, LoRA and quantised layers keep
    working); only the gated product - and, for a stock ``nn.Linear`` down projection, the
    down projection with it - is fused. Keeps ``gate`` and ``up`` for backward instead of the
    four intermediate tensors of the original.

    The other spellings of the same block:

    * ``down_proj=None``: the gated product alone, ``act(gate_proj(x)) * up_proj(x)`` (a
      dropout or norm follows before the down projection: T5, timm's ``SwiGLU``).
    * ``halves="first"`` / ``"second"``: ``x`` is the output of one fused gate/up projection,
      ``first, second = x.chunk(2, dim=dim)``, the activation applied to the named half
      (Phi-3, diffusers' ``GEGLU``/``SwiGLU``, MoE experts over indexed weights);
      ``gate_proj`` and ``up_proj`` are ``None``. ``down_proj`` may be ``None`` here too.
    * ``gate_scale``: the gate projection's output is multiplied by it before the activation,
      ``act(gate_proj(x) * gate_scale)`` (Falcon-H1's ``gate_multiplier``).
    """
    if halves is not None:
        if gate_scale is not None:
            raise TypeError("gated_mlp: gate_scale applies to a gate projection, not to halves")
        return _chunked_mlp(x, down_proj, act, halves, dim)
    assert gate_proj is not None and up_proj is not None

    def project_gate() -> torch.Tensor:
        gate = gate_proj(x)
        return gate if gate_scale is None else gate * gate_scale

    if down_proj is None:
        # The original's order: the gate's activation, then the up projection.
        return gated_activation(project_gate(), up_proj(x), act)
    if runs_original(x):  # as gated_activation()
        return down_proj(act(project_gate()) * up_proj(x))  # type: ignore[operator]
    gate = project_gate()
    fn = pure_activation(act)
    if fn is None:
        return down_proj(act(gate) * up_proj(x))  # type: ignore[operator]
    inference = not (isinstance(gate, torch.Tensor) and grad_needed(gate))
    if inference and not (_native_name(act) is not None and _triton_modern.usable(gate)):
        # Inference: the original's order (the gate's activation before the up projection),
        # so that the gate output is freed first; the product reuses the activation buffer.
        activated = fn(gate)
        fresh = activated is not gate and activated._base is None
        del gate  # freed here, as in the original's ``act(gate_proj(x))``
        up = up_proj(x)
        if fresh and _pair_handled(activated, up):
            return down_proj(activated.mul_(up))
        return down_proj(activated * up)
    up = up_proj(x)
    if not _pair_handled(gate, up):
        return down_proj(act(gate) * up)  # type: ignore[operator]
    if not inference and _down_fusable(down_proj, gate):
        return _GatedDown.apply(gate, up, down_proj.weight, down_proj.bias, fn)  # type: ignore[union-attr]
    return down_proj(gated_activation(gate, up, fn))
