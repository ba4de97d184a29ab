"""Fused ``layer_norm(dropout(hidden_states) + residual)`` (the post-LN residual block).

The unfused original runs, in training, ``bernoulli -> div -> mul`` for dropout, an ``add`` for
the residual and the layer norm: four full passes over the activation plus the norm, with the
scaled dropout mask and the dropout output materialised. :func:`dropout_add_layer_norm` does:

* **eval, or p == 0**: no dropout call at all; ``add`` + ``layer_norm`` (the dropout module is
  only consulted for its ``p``/``training``).
* **training, eager** (CPU, or CUDA without Triton): the keep-mask is drawn with
  ``empty_like(h).bernoulli_(1 - p)`` - exactly the draw ATen's CPU dropout makes, so on CPU the
  result is bit-for-bit reproducible against the original for the same seed - and scaling,
  masking and the residual add collapse into one ``torch.addcmul(residual, h, mask, 1/(1-p))``
  (under ``no_grad`` written into the mask buffer, so no extra allocation). Then the native
  layer-norm kernel.
* **compiled** (CUDA with Triton, or forced with ``ADOPTER_KERNELS_COMPILE=1``): the whole
  dropout + add + norm is one ``torch.compile``-d function; Inductor emits a single fused
  kernel for the forward (and one for the backward). Compilation failures fall back to eager.

Random numbers: on CUDA (eager or compiled) the dropout mask is drawn differently from
``nn.Dropout``'s fused CUDA kernel (philox offsets differ), so masks differ for the same seed;
the distribution - Bernoulli(1 - p) keep-mask scaled by ``1/(1-p)`` - is identical.

Supported norm modules: ``nn.LayerNorm`` (with or without affine/bias) and ``nn.RMSNorm``.
Any other callable norm is applied as-is to the fused dropout+add result. A dropout argument
that is not ``nn.Dropout`` / ``nn.Identity`` / a number is called as-is (unfused). Modules with
hooks or overridden ``forward`` are treated as "other callables".
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from numbers import Real
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import _backend
from ._util import grad_needed, is_plain, runs_original

__all__ = ["dropout_add_layer_norm"]

_NormSpec = tuple[str, tuple[int, ...], torch.Tensor | None, torch.Tensor | None, float | None]


def _dropout_prob(dropout: Any, training: bool | None, fallback_training: bool) -> float | None:
    """The effective drop probability, or ``None`` when ``dropout`` is an opaque callable."""
    if dropout is None:
        return 0.0
    if isinstance(dropout, Real) and not isinstance(dropout, bool):
        p = float(dropout)
        if p < 0.0 or p > 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        train = fallback_training if training is None else training
        return p if train else 0.0
    if is_plain(dropout, nn.Identity):
        return 0.0
    if is_plain(dropout, nn.Dropout):
        return float(dropout.p) if dropout.training else 0.0
    return None


def _dropout_unfused(
    hidden: torch.Tensor, dropout: Any, training: bool | None, fallback_training: bool
) -> torch.Tensor:
    """``dropout(hidden)`` as the original code wrote it: the module called, or ``F.dropout``."""
    if dropout is None:
        return hidden
    if isinstance(dropout, Real) and not isinstance(dropout, bool):
        _dropout_prob(dropout, training, fallback_training)  # the same range check
        active = fallback_training if training is None else training
        return F.dropout(hidden, float(dropout), training=active)
    return dropout(hidden)


def _norm_spec(norm: Any) -> _NormSpec | None:
    if is_plain(norm, nn.LayerNorm):
        return ("layer", tuple(norm.normalized_shape), norm.weight, norm.bias, norm.eps)
    rms = getattr(nn, "RMSNorm", None)
    if rms is not None and is_plain(norm, rms):
        return ("rms", tuple(norm.normalized_shape), norm.weight, None, norm.eps)
    return None


def _apply_norm(x: torch.Tensor, spec: _NormSpec) -> torch.Tensor:
    kind, shape, weight, bias, eps = spec
    if kind == "layer":
        return F.layer_norm(x, shape, weight, bias, eps)
    return F.rms_norm(x, shape, weight, eps)


def _dropout_add(hidden: torch.Tensor, residual: torch.Tensor, p: float) -> torch.Tensor:
    """``dropout(hidden, p, training=True) + residual`` with the mask applied by one addcmul."""
    if p == 0.0:
        return hidden + residual
    if p == 1.0:
        return torch.addcmul(residual, hidden, torch.zeros_like(hidden))
    mask = torch.empty_like(hidden).bernoulli_(1.0 - p)
    scale = 1.0 / (1.0 - p)
    if not grad_needed(hidden, residual):
        out_shape = torch.broadcast_shapes(hidden.shape, residual.shape)
        out_dtype = torch.result_type(hidden, residual)
        if out_shape == mask.shape and out_dtype == mask.dtype:
            return torch.addcmul(residual, hidden, mask, value=scale, out=mask)
    return torch.addcmul(residual, hidden, mask, value=scale)


def _fused_eager(
    hidden: torch.Tensor,
    residual: torch.Tensor,
    p: float,
    kind: str,
    shape: tuple[int, ...],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float | None,
) -> torch.Tensor:
    summed = F.dropout(hidden, p, True) + residual if p > 0.0 else hidden + residual
    if kind == "layer":
        return F.layer_norm(summed, shape, weight, bias, eps)
    return F.rms_norm(summed, shape, weight, eps)


_compiled: dict[str, Callable[..., torch.Tensor]] = {}
_compile_broken: list[str] = []


def _compiled_fn(backend: str) -> Callable[..., torch.Tensor]:
    fn = _compiled.get(backend)
    if fn is None:
        fn = torch.compile(_fused_eager, backend=backend, dynamic=True)
        _compiled[backend] = fn
    return fn


def dropout_add_layer_norm(
    hidden_states: torch.Tensor,
    residual: torch.Tensor,
    dropout: nn.Module | float | None,
    layer_norm: Callable[[torch.Tensor], torch.Tensor],
    *,
    training: bool | None = None,
) -> torch.Tensor:
    """Compute ``layer_norm(dropout(hidden_states) + residual)`` in one fused step.

    Args:
        hidden_states: the sub-layer output that is dropped out.
        residual: the skip connection (broadcastable to ``hidden_states``).
        dropout: an ``nn.Dropout`` (its ``p`` and ``training`` flag are honoured), an
            ``nn.Identity``, ``None``, or a float drop probability.
        layer_norm: an ``nn.LayerNorm`` / ``nn.RMSNorm`` (its weight, bias, eps and
            normalized_shape are used; affine-free and bias-free variants work), or any
            callable norm, which is then applied unfused.
        training: only for a float ``dropout``: whether dropout is active. Defaults to
            ``layer_norm.training`` (which follows the enclosing model's ``train()/eval()``).
    """
    fallback_training = bool(getattr(layer_norm, "training", False))
    # Under torch.compile the original: the eager mask is drawn with ``bernoulli_`` (other
    # random numbers than the original's dropout under the compiler's RNG) and checked with
    # ``torch.result_type``, which breaks the graph; Inductor fuses dropout+add+norm itself.
    if runs_original():
        return layer_norm(
            _dropout_unfused(hidden_states, dropout, training, fallback_training) + residual
        )
    p = _dropout_prob(dropout, training, fallback_training)
    if p is None:
        summed = dropout(hidden_states) + residual
        spec = _norm_spec(layer_norm)
        return _apply_norm(summed, spec) if spec is not None else layer_norm(summed)

    spec = _norm_spec(layer_norm)
    if spec is not None and _backend.should_compile(hidden_states):
        backend = _backend.compile_backend()
        if backend not in _compile_broken:
            try:
                return _compiled_fn(backend)(hidden_states, residual, p, *spec)
            except Exception as exc:  # compilation problems must not break the model
                # Re-run eagerly: a genuine input error raises here, before we blame the compiler.
                result = _fused_eager(hidden_states, residual, p, *spec)
                _compile_broken.append(backend)
                warnings.warn(
                    f"adopter.kernels.dropout_add_layer_norm: torch.compile failed ({exc!r}); "
                    "using the eager fused path from now on.",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return result

    summed = _dropout_add(hidden_states, residual, p)
    return _apply_norm(summed, spec) if spec is not None else layer_norm(summed)
