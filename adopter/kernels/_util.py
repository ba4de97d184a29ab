"""Shared helpers: "is this module stock?" checks and parameter-version keyed caches.

The fused kernels only take their fast path when the modules they are handed behave exactly
like the stock PyTorch class: the ``forward`` is not overridden (LoRA / quantised subclasses
override it), no forward or backward hooks are registered (hooks would be skipped by the fused
path) and the parameters are plain dense tensors (not tensor subclasses). Everything else goes
through the original modules.

Tracing (:func:`tracing`): while ``torch.jit.trace`` or ``torch.fx`` symbolic tracing (plain
``torch.fx.symbolic_trace``, transformers' ``HFTracer``) records a model, every kernel runs the
original, unfused computation it replaces. A tracer records one path through Python, so a kernel
that chose its path from grad mode, parameter values or a data-dependent check would record a
graph that differs between traces (``torch.jit.trace``'s check re-traces under ``no_grad``) or
fail on a symbolic value; the original code is what the model's exporters expect to see.

Compiling (:func:`compiling`, :func:`runs_original`): Dynamo (``torch.compile`` in every mode,
``fullgraph=True``, the compiled forward of ``generate``; ``torch.export``) is not a tracer in
the sense above - it follows Python branches and guards on them - but it cannot capture
everything the fused eager paths do (a non-contiguous ``out=`` buffer, ``torch.result_type``,
storage pointers, data-dependent checks, Triton launches outside a registered op) and breaks the
graph there, and ``fullgraph=True`` then fails. The fused paths exist to fuse what *eager*
PyTorch cannot; under a compiler Inductor fuses the original chain itself. So every kernel
whose fused path Dynamo cannot capture asks :func:`runs_original` and, under Dynamo, runs the
original computation: the compiled graph is the original model's graph, with no break the
original does not have, and the same values. ``tracing()`` itself stays false under Dynamo.

Derived tensors (folded BatchNorm weights, concatenated QKV weights) are cached per owner module
in a :class:`weakref.WeakKeyDictionary`. An entry is keyed on, for every source tensor, its
identity, ``data_ptr``, ``_version`` counter, dtype, device, shape and stride, plus the
inference-mode flag. In-place updates through autograd-visible ops (``optimizer.step()``,
``load_state_dict``, ``param.mul_()`` under ``no_grad``) bump ``_version`` and ``.to()`` /
``param.data = ...`` change ``data_ptr``, so both invalidate the entry. Writes that bypass the
version counter (``param.data.copy_(...)``) cannot be seen; call :func:`clear_caches` after
those.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

__all__ = [
    "HALF_DTYPES",
    "cached",
    "cached_value",
    "clear_caches",
    "compiling",
    "grad_needed",
    "has_hooks",
    "is_plain",
    "plain_tensors",
    "runs_original",
    "tracing",
]

HALF_DTYPES = (torch.float16, torch.bfloat16)
"""The half-precision float dtypes (their sums and products are kept in float32)."""


def tracing(*values: object) -> bool:
    """True while ``torch.jit.trace`` or ``torch.fx`` symbolic tracing records the caller.

    Every kernel checks this first and, when it holds, runs the original computation (see the
    module docstring). ``torch.compile`` / ``torch.export`` (Dynamo) are not tracing here, and
    this stays false under Dynamo; the kernels that must not run their fused path under Dynamo
    ask :func:`runs_original`, which covers both.
    ``values`` (the kernel's tensor arguments) are also checked for ``torch.fx.Proxy``, which
    catches a custom tracer that hands over proxies without setting the global flag.
    """
    # Both reads are a flag lookup: cheap enough for every kernel call.
    if torch.jit.is_tracing() or is_fx_symbolic_tracing():
        return True
    return any(isinstance(value, torch.fx.Proxy) for value in values)


def compiling() -> bool:
    """True while Dynamo captures the caller (``torch.compile``, ``torch.export``).

    ``torch.compiler.is_compiling()`` is the check Dynamo itself understands: it is constant
    folded into the graph (no guard, no break), and it is false in eager code, so the eager
    fused paths are unaffected.
    """
    return torch.compiler.is_compiling()


def runs_original(*values: object) -> bool:
    """True when a kernel must run the original computation it replaces: a tracer records
    (:func:`tracing`) or Dynamo compiles (:func:`compiling`; the module docstring says why)."""
    return tracing(*values) or compiling()


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOK_DICTS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


def has_hooks(module: nn.Module) -> bool:
    """True when ``module`` (or the global module registry) has any forward/backward hook."""
    # Checked on every kernel call: plain reads, no generator (a small layer's whole call in
    # inference is ~100 microseconds, and these checks were a fifth of the kernel's share).
    attributes = module.__dict__
    for name in _HOOK_DICTS:
        if attributes.get(name):
            return True
    registry = vars(nn.modules.module)
    for name in _GLOBAL_HOOK_DICTS:
        if registry.get(name):
            return True
    return False


def is_plain(module: object, *bases: type[nn.Module]) -> bool:
    """True when ``module`` runs the stock ``forward`` of one of ``bases`` without hooks."""
    if not isinstance(module, nn.Module):
        return False
    forward = type(module).forward
    for base in bases:  # a loop, not any(generator): this runs on every kernel call
        if forward is base.forward:
            return not has_hooks(module)
    return False


_PLAIN_TENSOR_TYPES = (torch.Tensor, nn.Parameter)


def plain_tensors(*tensors: torch.Tensor | None) -> bool:
    """True when every non-``None`` argument is a dense, strided, non-subclass tensor."""
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _PLAIN_TENSOR_TYPES or t.layout != torch.strided or t.is_meta:
            return False
    return True


def grad_needed(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd will record an op on ``tensors`` (grad mode on and one requires grad)."""
    if not torch.is_grad_enabled():
        return False
    return any(t is not None and t.requires_grad for t in tensors)


def grad_needed_through(x: torch.Tensor, *modules: nn.Module) -> bool:
    """:func:`grad_needed` of ``x`` and every parameter of ``modules``; the parameters are only
    listed with grad mode on (listing them is most of a small layer's check in inference)."""
    if not torch.is_grad_enabled():
        return False
    return grad_needed(x, *(p for module in modules for p in module.parameters()))


_CACHE: weakref.WeakKeyDictionary[nn.Module, dict[Hashable, tuple]]
_CACHE = weakref.WeakKeyDictionary()


def clear_caches() -> None:
    """Drop every cached derived tensor (folded BatchNorm weights, concatenated QKV weights)."""
    _CACHE.clear()


def _state(t: torch.Tensor | None) -> Hashable:
    """What an entry remembers of a source tensor besides its identity: storage, version
    counter, dtype, device, shape and stride (``param.data = param.data[:n]`` keeps the first
    two, so the shape and stride are kept too). Raises ``RuntimeError`` for an inference tensor
    (it has no version counter)."""
    if t is None:
        return None
    return (t.data_ptr(), t._version, t.dtype, t.device, t.shape, t.stride())


def _cacheable(sources: Sequence[torch.Tensor | None]) -> tuple | None:
    """The sources' states, or ``None`` when one cannot be tracked (an inference tensor: its
    version counter does not exist, so an in-place update could not be seen)."""
    if not torch.is_inference_mode_enabled():
        if any(t is not None and t.is_inference() for t in sources):
            return None
    try:
        return tuple([_state(t) for t in sources])
    except RuntimeError:
        return None


def cached_value(
    owner: nn.Module, slot: Hashable, sources: Sequence[torch.Tensor | None], extra: Hashable
) -> Any:
    """What :func:`cached` stored in ``slot`` of ``owner``, when ``sources`` are the very tensors
    it was built from, unchanged since, with the same ``extra`` and inference-mode flag; else
    ``None``. Cheap (a few microseconds): a kernel asks it before the checks a stored value
    already passed."""
    slots = _CACHE.get(owner)
    entry = None if slots is None else slots.get(slot)
    if entry is None:
        return None
    stored, states, stored_extra, inference, value = entry
    if stored_extra != extra or inference != torch.is_inference_mode_enabled():
        return None
    if len(sources) != len(stored) or any(a is not b for a, b in zip(sources, stored)):
        return None
    try:
        current = tuple([_state(t) for t in sources])
    except RuntimeError:
        return None
    return value if current == states else None


def _cache_allowed() -> bool:
    return not runs_original()


def cached(
    owner: nn.Module,
    slot: Hashable,
    sources: Sequence[torch.Tensor | None],
    extra: Hashable,
    build: Callable[[], Any],
) -> Any:
    """Return ``build()``, memoised on ``owner`` while ``sources`` are unchanged.

    The caller decides whether caching is legal (no autograd recording through ``sources``);
    this function only handles keying and invalidation. ``extra`` carries non-tensor inputs
    (``eps``, split sizes, ...) that must also match.
    """
    if not _cache_allowed():
        return build()
    hit = cached_value(owner, slot, sources, extra)
    if hit is not None:
        return hit
    states = _cacheable(sources)
    if states is None:
        return build()
    value = build()
    slots = _CACHE.get(owner)
    if slots is None:
        slots = {}
        _CACHE[owner] = slots
    # The entry keeps the source tensors alive, so an identity it compares is never recycled.
    inference = torch.is_inference_mode_enabled()
    slots[slot] = (tuple(sources), states, extra, inference, value)
    return value


def cache_size() -> int:
    """Number of cached entries (for tests and diagnostics)."""
    return sum(len(slots) for slots in list(_CACHE.values()))
