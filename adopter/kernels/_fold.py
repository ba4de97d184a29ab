"""Folding an eval-mode BatchNorm into the weights of the preceding conv / linear layer.

In eval mode ``BN(y) = (y - mean) / sqrt(var + eps) * gamma + beta`` is a per-channel affine map,
so for ``y = W x + b``::

    scale = gamma / sqrt(var + eps)
    W'    = W * scale            (per output channel)
    b'    = (b - mean) * scale + beta

and ``BN(W x + b) == W' x + b'``. The fold costs O(weights); the unfused BatchNorm costs a full
extra pass over the (usually much larger) activation. The arithmetic runs in at least fp32 and
the result is cast to the layer's weight dtype. Every op is differentiable, so when autograd
records through the parameters the fold is simply recomputed per call and gradients reach
``W``, ``b``, ``gamma`` and ``beta``; otherwise the folded tensors are cached (see
:mod:`adopter.kernels._util`).
"""

from __future__ import annotations

import torch
from torch import nn

from ._util import HALF_DTYPES, cached, cached_value, grad_needed, is_plain, plain_tensors

__all__ = ["bn_foldable", "cached_fold", "folded_weight_bias", "stats_foldable"]


def bn_foldable(bn: nn.Module, weight: torch.Tensor, out_channels: int) -> bool:
    """Whether ``bn`` (following a layer with ``weight``) can be folded right now."""
    return is_plain(bn, nn.modules.batchnorm._BatchNorm) and stats_foldable(
        bn, weight, out_channels
    )


def stats_foldable(bn: nn.Module, weight: torch.Tensor, out_channels: int) -> bool:
    """The checks of :func:`bn_foldable` after its stock-module test, for a batch norm that
    overrides ``forward`` but keeps the statistics (timm's ``BatchNormAct2d``): in eval mode,
    with running statistics for ``out_channels`` channels, as plain tensors on the layer's
    device in a dtype ``F.batch_norm`` accepts with its weight."""
    if bn.training or bn.running_mean is None or bn.running_var is None:
        return False
    if bn.num_features != out_channels:
        return False
    tensors = (bn.weight, bn.bias, bn.running_mean, bn.running_var)
    if not plain_tensors(*tensors):
        return False
    for t in tensors:
        if t is None:
            continue
        if t.device != weight.device:
            return False
        # Same dtype, or the mixed-precision layout F.batch_norm accepts (half data, fp32 stats).
        if t.dtype != weight.dtype and not (
            weight.dtype in HALF_DTYPES and t.dtype == torch.float32
        ):
            return False
    return True


def _fold(
    weight: torch.Tensor, bias: torch.Tensor | None, bn: nn.modules.batchnorm._BatchNorm
) -> tuple[torch.Tensor, torch.Tensor]:
    # In float64 where the device has it: the fold is computed once and cached, and each of
    # W' and b' is then rounded once to the layer's dtype, where float32 arithmetic rounds the
    # scale, its product and the shifted bias one after another (MobileViT's folded outputs
    # sat 2x farther from a float64 run than the unfolded ones).
    acc = torch.float32 if weight.device.type == "mps" else torch.float64
    inv_std = torch.rsqrt(bn.running_var.to(acc) + bn.eps)
    scale = inv_std if bn.weight is None else bn.weight.to(acc) * inv_std
    centred = -bn.running_mean.to(acc) if bias is None else bias.to(acc) - bn.running_mean.to(acc)
    new_bias = centred * scale
    if bn.bias is not None:
        new_bias = new_bias + bn.bias.to(acc)
    view = (-1,) + (1,) * (weight.dim() - 1)
    new_weight = weight.to(acc) * scale.view(view)
    return new_weight.to(weight.dtype), new_bias.to(weight.dtype)


def _slot(bn: nn.Module) -> tuple[str, int]:
    return ("bn_fold", id(bn))


def folded_weight_bias(
    owner: nn.Module,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    bn: nn.modules.batchnorm._BatchNorm,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W', b')`` for ``bn(layer(x))``; cached on ``owner`` unless autograd needs the graph."""
    if grad_needed(weight, bias, bn.weight, bn.bias):
        return _fold(weight, bias, bn)
    sources = (weight, bias, bn.weight, bn.bias, bn.running_mean, bn.running_var)
    return cached(owner, _slot(bn), sources, float(bn.eps), lambda: _fold(weight, bias, bn))


def cached_fold(owner: nn.Module, bn: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The ``(W', b')`` :func:`folded_weight_bias` stored for ``bn`` on ``owner``, while grad
    mode is off, ``bn`` is in eval mode and the six tensors the fold read are still the ones
    the modules hold, unchanged; else ``None``.

    Why: the fold was stored only after its checks passed (:func:`stats_foldable`), and they
    read nothing but those tensors and the eval flag, so a caller that gets a value skips them.
    In a small layer the checks and the cache key cost more than the BatchNorm pass the fold
    saves (timm's ResNet-50 at 64 x 64 pixels ran 5 % slower patched); this costs a few
    microseconds. The modules' own dictionaries are read: a parametrised weight is not in
    ``_parameters`` and takes the full path.
    """
    if torch.is_grad_enabled() or bn.training:
        return None
    parameters = owner._parameters
    weight = parameters.get("weight")
    if weight is None:
        return None
    norm_parameters, buffers = bn._parameters, bn._buffers
    sources = (
        weight,
        parameters.get("bias"),
        norm_parameters.get("weight"),
        norm_parameters.get("bias"),
        buffers.get("running_mean"),
        buffers.get("running_var"),
    )
    return cached_value(owner, _slot(bn), sources, float(bn.eps))
