"""Linear-layer kernels: bias+activation epilogue, fused QKV projection, BatchNorm folding.

``linear_bias_activation(x, linear, activation)`` == ``activation(linear(x))``
    The unfused original runs ``addmm`` and then the activation as a separate op that allocates
    a second output-sized tensor; transformers' formula activations (``NewGELUActivation``,
    ``FastGELUActivation``, ``QuickGELUActivation``...) are 3-9 elementwise kernels each, every
    one re-reading and re-writing the activation. Here:

    * the bias is added inside the GEMM (``addmm``'s ``beta * bias`` epilogue), never as a
      separate broadcast add;
    * the activation is one native kernel (tanh-GELU variants map to
      ``F.gelu(approximate="tanh")``), applied **in place on the GEMM output** whenever autograd
      is not recording, and also under autograd for activations whose backward only needs the
      output (ReLU, ReLU6, LeakyReLU with positive slope, tanh, sigmoid) - no second buffer;
    * ReLU without autograd goes through ``torch._addmm_activation``, which on CUDA is a
      cuBLASLt GEMM with a fused bias+ReLU epilogue (one kernel in total).

    Deliberately *not* done: computing ``x @ W.T`` without bias and adding the bias in a
    separately scripted bias+activation function. TorchScript is deprecated in this PyTorch
    (``torch.jit.script`` warns) and its fuser is disabled on CPU, so that split would add a pass
    instead of removing one; the bias-in-GEMM epilogue gets the same saving portably.

    Falls back to ``activation(linear(x))`` for unrecognised activations (any callable is
    accepted), non-stock ``nn.Linear`` subclasses (LoRA, quantised) and hooked modules.

``qkv_projection(x, query, key, value)`` == ``(query(x), key(x), value(x))``
    One GEMM over the concatenated ``[Wq; Wk; Wv]`` (better GEMM utilisation, reads ``x`` once,
    one kernel launch instead of three), then three ``narrow`` views of the result. Without
    autograd the concatenated weight/bias are cached per module and invalidated when any
    parameter changes (version counter / storage pointer); this costs one extra copy of the
    three weights in memory. With autograd recording they are concatenated per call so that
    gradients reach the three original parameters. The outputs are non-contiguous views of one
    buffer: ``.view`` that splits the last dimension (the usual ``(B, L, heads, head_dim)``
    reshape) works; in-place ops on them are allowed.

``linear_batch_norm(x, linear, batch_norm)`` == ``batch_norm(linear(x))``
    Eval-mode BatchNorm1d folded into the linear weights for 2-D ``(N, C)`` activations (see
    :mod:`adopter.kernels._fold`). Training mode, 3-D inputs (where BatchNorm1d's channel axis
    is not the linear's feature axis) and non-stock modules run the original modules unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ._activations import resolve_activation
from ._fold import bn_foldable, folded_weight_bias
from ._util import cached, grad_needed, is_plain, plain_tensors, tracing

__all__ = ["linear_batch_norm", "linear_bias_activation", "qkv_projection", "fused_linears"]


def linear_bias_activation(
    x: torch.Tensor, linear: nn.Module, activation: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """Return ``activation(linear(x))`` with the bias in the GEMM and a one-kernel activation."""
    if tracing() or not is_plain(linear, nn.Linear):
        return activation(linear(x))
    weight, bias = linear.weight, linear.bias
    spec = resolve_activation(activation)
    if spec is None or not plain_tensors(x, weight, bias):
        return activation(F.linear(x, weight, bias))
    recording = grad_needed(x, weight, bias)
    if (
        spec.name == "relu"
        and not recording
        and bias is not None
        and x.dim() >= 2
        and x.dtype == weight.dtype == bias.dtype
        and x.device == weight.device
        and not torch.is_autocast_enabled(x.device.type)
    ):
        flat = x.reshape(-1, x.shape[-1])
        out = torch._addmm_activation(bias, flat, weight.t())
        return out.view(*x.shape[:-1], weight.shape[0])
    return spec.apply(F.linear(x, weight, bias), recording)


def _concat(
    weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = torch.cat(list(weights), dim=0)
    if all(b is None for b in biases):
        return weight, None
    parts = [
        b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
        for w, b in zip(weights, biases, strict=True)
    ]
    return weight, torch.cat(parts, dim=0)


def _fusable(x: torch.Tensor, linears: Sequence[nn.Module]) -> bool:
    if not all(is_plain(lin, nn.Linear) for lin in linears):
        return False
    first = linears[0].weight
    for lin in linears:
        w, b = lin.weight, lin.bias
        if not plain_tensors(w, b) or w.dim() != 2:
            return False
        if w.shape[1] != first.shape[1] or w.dtype != first.dtype or w.device != first.device:
            return False
        if b is not None and (b.dtype != w.dtype or b.device != w.device):
            return False
    return plain_tensors(x)


# Devices where, under autograd, separate GEMMs serve better than one: on a CPU the single
# GEMM is no faster, and the concatenated weight it builds every step stays alive for backward
# (GPT-Neo's training peak grew by that copy, docs/performance.md). Tests empty it to check
# the concatenated path.
SEPARATE_UNDER_AUTOGRAD = {"cpu"}


def fused_linears(x: torch.Tensor, linears: Sequence[nn.Module]) -> tuple[torch.Tensor, ...]:
    """``tuple(lin(x) for lin in linears)`` computed with one GEMM (see :func:`qkv_projection`)."""
    if tracing() or len(linears) < 2 or not _fusable(x, linears):
        return tuple(lin(x) for lin in linears)
    weights = [lin.weight for lin in linears]
    biases = [lin.bias for lin in linears]
    sizes = tuple(int(w.shape[0]) for w in weights)
    if grad_needed(*weights, *biases):
        if x.device.type in SEPARATE_UNDER_AUTOGRAD:
            return tuple(lin(x) for lin in linears)
        weight, bias = _concat(weights, biases)
    else:
        slot = "concat:" + ":".join(str(id(lin)) for lin in linears[1:])
        weight, bias = cached(
            linears[0], slot, [*weights, *biases], sizes, lambda: _concat(weights, biases)
        )
    out = F.linear(x, weight, bias)
    pieces = []
    start = 0
    for size in sizes:
        pieces.append(out.narrow(-1, start, size))
        start += size
    return tuple(pieces)


def qkv_projection(
    x: torch.Tensor, query: nn.Module, key: nn.Module, value: nn.Module
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``(query(x), key(x), value(x))`` computed with a single matmul.

    The three modules must be ``nn.Linear`` with equal ``in_features`` (out_features and the
    presence of a bias may differ); otherwise the three modules are simply called. So are they
    on a CPU under autograd, where one GEMM is no faster and its concatenated weight would be
    kept for backward.
    """
    q, k, v = fused_linears(x, (query, key, value))
    return q, k, v


def linear_batch_norm(x: torch.Tensor, linear: nn.Module, batch_norm: nn.Module) -> torch.Tensor:
    """Return ``batch_norm(linear(x))``, folding an eval-mode BatchNorm1d into ``linear``.

    Under ``torch.compile`` the two modules run as they are, for the reason
    :func:`adopter.kernels.conv_batch_norm` gives.
    """
    if (
        tracing()
        or not is_plain(linear, nn.Linear)
        or not isinstance(batch_norm, nn.BatchNorm1d)
        or torch.compiler.is_compiling()
    ):
        return batch_norm(linear(x))
    weight, bias = linear.weight, linear.bias
    if x.dim() != 2 or not plain_tensors(x, weight, bias):
        return batch_norm(linear(x))
    # Folding pays off in inference only: under autograd the folded weights would be rebuilt
    # every call, and their backward rounds differently from the two layers it replaces.
    if not bn_foldable(batch_norm, weight, linear.out_features) or grad_needed(
        x, *linear.parameters()
    ):
        return batch_norm(linear(x))
    new_weight, new_bias = folded_weight_bias(linear, weight, bias, batch_norm)
    return F.linear(x, new_weight, new_bias)
