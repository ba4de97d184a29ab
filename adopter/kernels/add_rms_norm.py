"""Residual add + RMSNorm: ``summed = hidden_states + residual; norm(summed)`` in one call.

Every pre-norm decoder layer ends its attention half with::

    hidden_states = residual + hidden_states      # the new residual
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)

:func:`add_rms_norm` takes the two addends and the model's own norm module and returns both
results, ``(norm(a + b), a + b)``: the normalised activation and the new residual. The norm module
is not replaced and its parameters are read where they are, so ``state_dict`` keys are unchanged.

The norm is computed fused only when the module is known to compute one of the RMSNorm spellings
of :mod:`adopter.kernels.rms_norm` (``_recognise``):

* ``torch.nn.RMSNorm`` (stock ``forward``, one normalised dimension);
* a module whose ``forward`` compiles to the same instructions as one of the spellings below,
  reading the same globals (``torch``, ``adopter.kernels.rms_norm``) - the attribute holding
  ``eps`` may have any name, everything else must be identical, so the recognised forward
  computes exactly what the spelling computes:

  - Llama's ``self.weight * (x32 * rsqrt(mean(x32²) + eps)).to(dtype)`` (``"before_weight"``,
    the RMSNorm of about 140 transformers 5.x model families);
  - OLMo-Hybrid's ``(self.weight * ...).to(dtype)`` (``"after_weight"``, weight as it is);
  - the one-line forward ``apply`` writes for the first two under rule modern.1,
    ``return rms_norm(x, self.weight, self.eps)`` (and its ``after_weight`` form), so a model
    patched with both rules keeps the fused path.

Any other norm (Gemma's ``(1 + weight)`` through a helper, diffusers' and timm's RMSNorm layers
with their branches, a hooked module, a subclass overriding ``forward``) is called as it is on
the sum: the result is the original's, without the fusion. So are tensor subclasses, addends of
different shapes or dtypes, ``torch.jit`` / ``torch.fx`` tracing (the recorded graph is the
original's ``add`` and module call) and ``torch.compile`` (Inductor fuses add and norm itself;
the instruction check would break the graph).

What the fusion saves (``adopter`` backend, an autograd function): the unfused module keeps for
backward its input, the normalised activation and, for half precision, a float32 copy of the
input; the fused call keeps the sum and one float per row (the inverse RMS). In backward the
gradient reaching the new residual is added in place to the norm's input gradient, where autograd
would allocate the sum of the two. ``torch`` backend: ``F.rms_norm`` on the sum (float32 input and
weight, where every spelling computes the same; and ``nn.RMSNorm`` itself in every dtype).
``liger`` (CUDA): Liger-Kernel's fused add + RMSNorm, one pass for the add and the norm.
"""

from __future__ import annotations

import dis
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import backends
from ._util import grad_needed, has_hooks, plain_tensors, runs_original
from .rms_norm import _forward as _rms_forward
from .rms_norm import _handled as _rms_handled
from .rms_norm import closed_form_grads, rms_norm

__all__ = ["add_rms_norm", "add_rms_norm_reference"]


def add_rms_norm_reference(
    hidden_states: torch.Tensor, residual: torch.Tensor, norm: Callable[[torch.Tensor], Any]
) -> tuple[Any, torch.Tensor]:
    """The original code: the add, then the module called on the sum."""
    summed = hidden_states + residual
    return norm(summed), summed


# --------------------------------------------------------------------------------------------
# Recognising the norm module


@dataclass(frozen=True)
class NormSpec:
    """How a recognised norm computes: ``F.rms_norm`` (``torch.nn.RMSNorm``) or one of
    :func:`adopter.kernels.rms_norm`'s spellings."""

    weight: torch.Tensor | None
    eps: float | None  # None: nn.RMSNorm's default, the machine epsilon of the input's dtype
    cast: str  # "torch" for nn.RMSNorm, else an RMS_NORM_CASTS spelling
    weight_promoted: bool = False


# The spellings, written as forwards of our own. Only their compiled instructions are used: a
# module's forward is recognised when its instructions are these, with the same globals and
# attribute names, except the attribute holding eps (``variance_epsilon`` here).
_EPS_ATTRIBUTE = "variance_epsilon"


def _llama_spelling(self: Any, x: torch.Tensor) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(torch.float32)
    mean_square = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(mean_square + self.variance_epsilon)
    return self.weight * x.to(dtype)


def _weight_first_spelling(self: Any, x: torch.Tensor) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(torch.float32)
    mean_square = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(mean_square + self.variance_epsilon)
    return (self.weight * x).to(dtype)


# ``rms_norm`` is the global the patched spellings read, as rewritten files import it.
def _patched_spelling(self: Any, x: torch.Tensor) -> torch.Tensor:
    return rms_norm(x, self.weight, self.variance_epsilon)


def _patched_weight_first_spelling(self: Any, x: torch.Tensor) -> torch.Tensor:
    return rms_norm(
        x, self.weight, self.variance_epsilon, cast="after_weight", weight_promoted=True
    )


_SPELLINGS: tuple[tuple[Callable[..., Any], str, bool], ...] = (
    (_llama_spelling, "before_weight", False),
    (_weight_first_spelling, "after_weight", True),
    (_patched_spelling, "before_weight", False),
    (_patched_weight_first_spelling, "after_weight", True),
)
_LOCAL_OPS = frozenset({"LOAD_FAST", "STORE_FAST", "LOAD_FAST_CHECK", "DELETE_FAST"})
_NOISE = frozenset({"RESUME", "NOP", "CACHE", "EXTENDED_ARG", "PRECALL"})


def _instructions(code: Any) -> list[tuple[str, Any]]:
    """``(opname, argument)`` per instruction: locals by slot (their names do not matter),
    names and constants by value; no line numbers, no docstring."""
    found = []
    for ins in dis.get_instructions(code):
        if ins.opname in _NOISE:
            continue
        found.append((ins.opname, ins.arg if ins.opname in _LOCAL_OPS else ins.argval))
    return found


def _global_names(code: Any) -> set[str]:
    return {ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"}


def _shape_of(fn: Callable[..., Any]) -> tuple[list[tuple[str, Any]], int]:
    code = fn.__code__
    return _instructions(code), code.co_argcount


_TEMPLATES = [(_shape_of(fn), fn, cast, promoted) for fn, cast, promoted in _SPELLINGS]
# code object -> (eps attribute, cast, weight_promoted, the template) or None; code objects are
# immutable, so a forward whose code is replaced in place (adopter.patch) is looked up afresh.
_SEEN: dict[Any, tuple[str, str, bool, Callable[..., Any]] | None] = {}


def _match_code(code: Any) -> tuple[str, str, bool, Callable[..., Any]] | None:
    if code in _SEEN:
        return _SEEN[code]
    found = None
    if not (code.co_freevars or code.co_cellvars or code.co_kwonlyargcount):
        shape = (_instructions(code), code.co_argcount)
        for (template, argcount), fn, cast, promoted in _TEMPLATES:
            eps_name = _same_but_eps(shape[0], template)
            if eps_name is not None and shape[1] == argcount:
                found = (eps_name, cast, promoted, fn)
                break
    _SEEN[code] = found
    return found


def _same_but_eps(seen: list[tuple[str, Any]], template: list[tuple[str, Any]]) -> str | None:
    """The name read where the template reads eps, when the instructions are otherwise equal."""
    if len(seen) != len(template):
        return None
    eps_name = None
    for (op, arg), (t_op, t_arg) in zip(seen, template, strict=True):
        if op != t_op:
            return None
        if op == "LOAD_ATTR" and t_arg == _EPS_ATTRIBUTE and isinstance(arg, str):
            eps_name = arg
        elif arg != t_arg:
            return None
    return eps_name


def _recognise(norm: Any) -> NormSpec | None:
    """How ``norm`` computes, when it is a norm this kernel reproduces; else ``None``."""
    if not isinstance(norm, nn.Module) or has_hooks(norm):
        return None
    forward = type(norm).forward
    if forward is nn.RMSNorm.forward:
        if len(norm.normalized_shape) != 1:
            return None
        return NormSpec(norm.weight, norm.eps, "torch")
    if type(norm).__call__ is not nn.Module.__call__ or not hasattr(forward, "__code__"):
        return None
    matched = _match_code(forward.__code__)
    if matched is None:
        return None
    eps_name, cast, promoted, template = matched
    globals_ = forward.__globals__
    for name in _global_names(template.__code__):
        if globals_.get(name, _MISSING) is not template.__globals__[name]:
            return None  # ``torch`` or ``rms_norm`` is another object in the module's namespace
    eps = getattr(norm, eps_name, None)
    if not isinstance(eps, Real) or isinstance(eps, bool):
        return None
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return None
    return NormSpec(weight, float(eps), cast, promoted)


_MISSING = object()


# --------------------------------------------------------------------------------------------
# The kernel


def add_rms_norm(
    hidden_states: torch.Tensor, residual: torch.Tensor, norm: Callable[[torch.Tensor], Any]
) -> tuple[Any, torch.Tensor]:
    """``(norm(hidden_states + residual), hidden_states + residual)``.

    Args:
        hidden_states: the first addend (the sub-layer's output, or the residual when the model
            writes ``residual + hidden_states``: the addition keeps the model's operand order).
        residual: the second addend.
        norm: the model's norm module, fused when it is one of the RMSNorms the module docstring
            lists; any other callable is called on the sum.

    Returns the normalised sum and the sum (the new residual).
    """

    def original() -> tuple[Any, torch.Tensor]:
        return add_rms_norm_reference(hidden_states, residual, norm)

    if runs_original(hidden_states, residual):
        return original()
    spec = _recognise(norm) if _addends_fit(hidden_states, residual) else None
    if spec is None or not _norm_fits(spec, hidden_states):
        # recorded, so that ``adopter verify`` says the site ran unfused
        backends.note(OP, backends.ORIGINAL)
        return original()
    call = AddNormCall(hidden_states, residual, spec)
    device, dtype = hidden_states.device.type, hidden_states.dtype
    return backends.run(OP, BACKENDS, bucket, call, device, dtype, original)


def _addends_fit(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if not plain_tensors(a, b) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.device == b.device


def _norm_fits(spec: NormSpec, x: torch.Tensor) -> bool:
    if spec.cast == "torch":
        weight = spec.weight
        if not plain_tensors(weight) or not x.is_floating_point() or x.numel() == 0:
            return False
        return weight is None or (
            tuple(weight.shape) == (x.shape[-1],) and weight.device == x.device
        )
    return _rms_handled(x, spec.weight, spec.cast)


# --------------------------------------------------------------------------------------------
# Backends (adopter.kernels.backends); every call has passed the checks above.

OP = "add_rms_norm"


@dataclass(frozen=True)
class AddNormCall:
    hidden_states: torch.Tensor
    residual: torch.Tensor
    spec: NormSpec


def bucket(call: AddNormCall) -> str:
    return f"h{backends.pow2(call.hidden_states.shape[-1])}"


class _AddRMSNormFunction(torch.autograd.Function):
    """``(rms_norm(a + b), a + b)`` keeping the sum and the inverse RMS for backward."""

    @staticmethod
    def forward(
        ctx: Any,
        a: torch.Tensor,
        b: torch.Tensor,
        weight: torch.Tensor | None,
        eps: float,
        cast: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        summed = a + b
        out, inv = _rms_forward(summed, weight, eps, 0.0, cast)
        ctx.cast = cast
        ctx.save_for_backward(summed, inv, weight)
        return out, summed

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor | None, grad_sum: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        summed, inv, weight = ctx.saved_tensors
        wants_x = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_x, grad_w = None, None
        if grad_out is not None:
            wants = (wants_x, ctx.needs_input_grad[2])
            grad_x, grad_w = closed_form_grads(ctx.cast, 0.0, wants, grad_out, summed, inv, weight)
        if grad_sum is not None and wants_x:
            # The new residual's gradient joins the norm's in the buffer the norm's made.
            grad_x = grad_sum.clone() if grad_x is None else grad_x.add_(grad_sum)
        grad_a = grad_x if ctx.needs_input_grad[0] else None
        grad_b = grad_x if ctx.needs_input_grad[1] else None
        return grad_a, grad_b, grad_w, None, None


def _torch_norm(summed: torch.Tensor, spec: NormSpec) -> torch.Tensor:
    return F.rms_norm(summed, (summed.shape[-1],), spec.weight, spec.eps)


def _run_adopter(call: AddNormCall) -> tuple[torch.Tensor, torch.Tensor]:
    a, b, spec = call.hidden_states, call.residual, call.spec
    if spec.cast == "torch":  # nn.RMSNorm is F.rms_norm: the add, then the module's own op
        summed = a + b
        return _torch_norm(summed, spec), summed
    eps = float(spec.eps)  # a spelling's eps is always a number (``_recognise``)
    if not grad_needed(a, b, spec.weight):
        summed = a + b
        return _rms_forward(summed, spec.weight, eps, 0.0, spec.cast)[0], summed
    return _AddRMSNormFunction.apply(a, b, spec.weight, eps, spec.cast)


def _torch_accepts(call: AddNormCall) -> bool:
    """``F.rms_norm`` is ``nn.RMSNorm`` itself, and every spelling's computation for float32
    input and weight (:func:`adopter.kernels.rms_norm._torch_accepts`)."""
    spec = call.spec
    if spec.cast == "torch":
        return True
    weight = spec.weight
    return call.hidden_states.dtype == torch.float32 and (
        weight is None or weight.dtype == torch.float32
    )


def _run_torch(call: AddNormCall) -> tuple[torch.Tensor, torch.Tensor]:
    summed = call.hidden_states + call.residual
    return _torch_norm(summed, call.spec), summed


def _liger_accepts(call: AddNormCall) -> bool:
    """Liger's ``llama`` casting mode is the ``before_weight`` spelling; it needs a weight of
    the input's dtype on CUDA."""
    spec, x = call.spec, call.hidden_states
    if not x.is_cuda or spec.cast != "before_weight" or spec.weight is None:
        return False
    return spec.weight.dtype == x.dtype and x.dtype != torch.float64


def _run_liger(call: AddNormCall) -> tuple[torch.Tensor, torch.Tensor]:
    from liger_kernel.transformers.functional import liger_fused_add_rms_norm

    spec = call.spec
    normed, summed = liger_fused_add_rms_norm(
        call.hidden_states,
        call.residual,
        spec.weight,
        spec.eps,
        offset=0.0,
        casting_mode="llama",
        in_place=False,
    )
    return normed, summed


BACKENDS: tuple[backends.Backend, ...] = (
    backends.Backend(
        "adopter",
        lambda call: True,
        _run_adopter,
        summary="add + eager RMSNorm, backward in closed form with the residual's gradient added "
        "in place (keeps the sum and the inverse RMS)",
    ),
    backends.Backend(
        "torch",
        _torch_accepts,
        _run_torch,
        summary="add + torch.nn.functional.rms_norm",
    ),
    backends.Backend(
        "liger",
        _liger_accepts,
        _run_liger,
        devices=frozenset({"cuda"}),
        requires="liger_kernel",
        summary="Liger-Kernel fused add + RMSNorm (Triton)",
    ),
)
