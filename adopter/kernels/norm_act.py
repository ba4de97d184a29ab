"""Normalisation followed by an activation: GroupNorm -> SiLU, Conv -> BatchNorm -> activation.

``group_norm_activation(x, norm, act)`` == ``act(norm(x))``
    diffusers' ResNet blocks (``norm1`` / ``norm2`` then ``nonlinearity``) and timm's
    ``GroupNormAct`` (pass ``act=None``; its ``act`` is used). In inference the activation is
    applied in place on the group-norm output, so the block allocates and writes one tensor
    instead of two.

``conv_bn_act(x, conv, bn, act=None, drop=None)`` == ``act(drop(bn(conv(x))))``
    torchvision-style ``Conv2dNormActivation`` (conv, plain BatchNorm, activation module) and
    timm's ``ConvNormAct`` (``bn`` is a ``BatchNormAct2d`` holding the activation; pass
    ``act=None``); ``drop`` is timm's ``drop_block`` slot between norm and activation (an
    ``nn.Identity`` by default). In inference the eval-mode BatchNorm is folded into the convolution
    (:mod:`adopter.kernels._fold`, cached while the parameters are unchanged) and the
    activation runs in place on the convolution output: one convolution and one in-place
    activation instead of a convolution, a normalisation pass and an activation pass.

In training (or whenever autograd records through the inputs or parameters) both run the
original modules unchanged - batch statistics, running-stat updates and gradients are the
original's. They also do for non-stock modules (hooks, overridden ``forward``, tensor-subclass
parameters), activations :mod:`adopter.kernels._activations` does not recognise, timm norm
layers with an active dropout or timm's fast-norm mode, ``torch.compile`` (where the fold
cannot be cached; see :func:`adopter.kernels.conv_batch_norm`) and ``torch.jit`` / ``torch.fx``
tracing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._activations import ActSpec, resolve_activation
from ._util import grad_needed, grad_needed_through, is_plain, plain_tensors, tracing
from .conv import CONVS, conv_batch_norm, fold_timm, stock_fold, timm_norm_act

__all__ = ["conv_bn_act", "group_norm_activation"]

Module = Callable[[torch.Tensor], torch.Tensor]


def _inplace(y: torch.Tensor, spec: ActSpec) -> torch.Tensor:
    """The activation applied to ``y``, a fresh buffer nobody else holds."""
    return spec.apply(y, recording=False)


# --------------------------------------------------------------------------------------------
# GroupNorm -> activation


def group_norm_activation(
    x: torch.Tensor, norm: nn.Module, act: Module | None = None
) -> torch.Tensor:
    """``act(norm(x))`` with the activation in place in inference.

    ``norm`` is an ``nn.GroupNorm`` (``act`` the activation module or function that follows
    it), or timm's ``GroupNormAct`` with ``act=None`` (its own activation is applied).
    """
    if act is None:

        def original() -> torch.Tensor:
            return norm(x)
    else:

        def original() -> torch.Tensor:
            return act(norm(x))

    if tracing(x):
        return original()
    if act is None:
        if not timm_norm_act(norm, "GroupNormAct"):
            return original()
        activation: Any = norm.act
    elif is_plain(norm, nn.GroupNorm):
        activation = act
    else:
        return original()
    spec = resolve_activation(activation)
    weight, bias = norm.weight, norm.bias
    if spec is None or not isinstance(x, torch.Tensor) or not plain_tensors(x, weight, bias):
        return original()
    if grad_needed(x, weight, bias):
        return original()
    y = F.group_norm(x, norm.num_groups, weight, bias, norm.eps)
    return _inplace(y, spec)


# --------------------------------------------------------------------------------------------
# Conv -> BatchNorm -> activation


def _inactive(drop: object) -> bool:
    """``drop`` passes its input through unchanged: an ``nn.Identity`` or an eval-mode
    ``nn.Dropout`` (stock, unhooked). timm's ``DropBlock2d`` and the like are not recognised."""
    if is_plain(drop, nn.Identity):
        return True
    return is_plain(drop, nn.Dropout) and not drop.training  # type: ignore[union-attr]


def conv_bn_act(
    x: torch.Tensor,
    conv: nn.Module,
    bn: nn.Module,
    act: Module | None = None,
    drop: Module | None = None,
) -> torch.Tensor:
    """``act(drop(bn(conv(x))))``; in inference the BatchNorm is folded and the activation runs
    in place. ``act=None`` with timm's ``BatchNormAct2d`` uses its activation; with a plain
    BatchNorm it means no activation. ``drop`` is the module between the norm and the
    activation (timm's ``drop_block``, ``nn.Identity`` unless a drop block is configured): the
    fold is taken only while it passes values through unchanged, else the original runs."""

    def original() -> torch.Tensor:
        y = bn(conv(x))
        if drop is not None:
            y = drop(y)
        return y if act is None else act(y)

    if tracing(x) or torch.compiler.is_compiling() or not isinstance(x, torch.Tensor):
        return original()
    if drop is not None and not _inactive(drop):
        return original()
    if act is None and timm_norm_act(bn, "BatchNormAct2d"):
        fused = fold_timm(x, conv, bn)
        return original() if fused is None else fused
    if act is None:
        return conv_batch_norm(x, conv, bn)
    spec = resolve_activation(act)
    recording = grad_needed_through(x, conv, bn)
    stock = is_plain(conv, *CONVS) and is_plain(bn, nn.modules.batchnorm._BatchNorm)
    if spec is None or recording or not stock:
        return original()
    # Without autograd the folded convolution's output, or the BatchNorm's, is a fresh buffer,
    # so the activation may overwrite it.
    folded = stock_fold(x, conv, bn)
    y = bn(conv(x)) if folded is None else conv._conv_forward(x, *folded)
    return _inplace(y, spec)
