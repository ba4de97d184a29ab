"""``batch_norm(conv(x))`` with the BatchNorm folded into the convolution in eval mode.

Why it is faster: an eval-mode BatchNorm is a per-channel affine map, so it can be absorbed
into the convolution's weight and bias (see :mod:`adopter.kernels._fold`). The model then runs
one convolution instead of a convolution plus a full read/write pass over its output; under
``torch.no_grad`` / ``inference_mode`` the folded weights are cached and recomputed only when a
parameter or running statistic changes (version counter / storage pointer).

When it falls back (runs ``batch_norm(conv(x))`` unchanged):

* training mode, or no running statistics (``track_running_stats=False``): the normalisation
  statistics depend on the convolution output, so there is nothing to fold; the original
  modules run, which keeps running-stat updates (momentum, cumulative average with
  ``momentum=None``, ``num_batches_tracked``) exactly as before;
* anything other than a stock ``nn.Conv1d/2d/3d`` followed by a stock ``_BatchNorm`` subclass
  (overridden ``forward`` such as ``SyncBatchNorm``, hooks, tensor-subclass parameters) - except
  timm's ``BatchNormAct2d``, folded with its activation as :func:`adopter.kernels.conv_bn_act`
  does (and under the same conditions);
* unbatched input (``Conv1d`` on ``(C, L)`` would hand BatchNorm1d a 2-D tensor whose meaning
  differs) or mismatched channel counts / dtypes / devices;
* under ``torch.compile``: a compiled graph cannot keep the folded weights between calls, so
  the fold would be recomputed in every call - work the compiled original does not do (it cost
  ResNet 12% of its compiled inference step, docs/performance.md). The compiler gets the
  original ``batch_norm(conv(x))`` instead; Inductor's ``freezing`` folds it at compile time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._activations import resolve_activation
from ._fold import cached_fold, folded_weight_bias, stats_foldable
from ._util import grad_needed_through, has_hooks, is_plain, plain_tensors, tracing

__all__ = ["conv_batch_norm"]

CONVS: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_SPATIAL = {nn.Conv1d.forward: 1, nn.Conv2d.forward: 2, nn.Conv3d.forward: 3}
_BN_FOR_DIMS: dict[int, type[nn.Module]] = {
    1: nn.BatchNorm1d,
    2: nn.BatchNorm2d,
    3: nn.BatchNorm3d,
}


def conv_batch_norm(x: torch.Tensor, conv: nn.Module, batch_norm: nn.Module) -> torch.Tensor:
    """Return ``batch_norm(conv(x))``, folding the BatchNorm into ``conv`` in eval mode.

    Under autograd (eval-mode fine-tuning with frozen statistics) the two modules run as they
    are: the fold pays off in inference only.
    """
    if tracing() or not is_plain(conv, *CONVS) or torch.compiler.is_compiling():
        return batch_norm(conv(x))
    # timm's BatchNormAct2d (a BatchNorm2d subclass with its activation, identity when built
    # with ``apply_act=False``): folded with its activation by the conv + BN + act kernel.
    if timm_norm_act(batch_norm, "BatchNormAct2d"):
        fused = fold_timm(x, conv, batch_norm)
        return batch_norm(conv(x)) if fused is None else fused
    stock = is_plain(batch_norm, nn.modules.batchnorm._BatchNorm)
    folded = None if not stock or grad_needed_through(x, conv) else stock_fold(x, conv, batch_norm)
    if folded is None:
        return batch_norm(conv(x))
    return conv._conv_forward(x, *folded)


def stock_fold(
    x: torch.Tensor, conv: nn.Module, bn: nn.Module
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(W', b')`` of ``bn`` folded into ``conv`` for input ``x``, or ``None`` when it cannot
    be folded now (training, another layout, a norm of other dimensions). The caller checked
    that both modules are stock and that autograd does not record through the convolution:
    the conv + BN + act kernel checks more than that, and each check runs once a call."""
    spatial = _SPATIAL[type(conv).forward]
    if x.dim() != spatial + 2 or not plain_tensors(x) or not isinstance(bn, _BN_FOR_DIMS[spatial]):
        return None
    return _folded(conv, bn)


def _folded(conv: nn.Module, bn: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fold of ``bn`` into ``conv``: the stored one while nothing it read changed, else
    checked (eval mode, running statistics matching the convolution) and built."""
    hit = cached_fold(conv, bn)
    if hit is not None:
        return hit
    weight, bias = conv.weight, conv.bias
    if not plain_tensors(weight, bias) or not stats_foldable(bn, weight, conv.out_channels):
        return None
    return folded_weight_bias(conv, weight, bias, bn)


def timm_norm_act(norm: object, name: str) -> bool:
    """``norm`` is timm's ``name`` class (by defining module), unhooked, with an inactive
    dropout slot."""
    cls = type(norm)
    if cls.__name__ != name or not (cls.__module__ or "").startswith("timm."):
        return False
    if has_hooks(norm) or getattr(norm, "_fast_norm", False):  # type: ignore[arg-type]
        return False
    drop = getattr(norm, "drop", None)
    if is_plain(drop, nn.Identity):
        return True
    return is_plain(drop, nn.Dropout) and not drop.training  # type: ignore[union-attr]


def fold_timm(x: torch.Tensor, conv: nn.Module, bn: Any) -> torch.Tensor | None:
    """The folded convolution + activation for timm's ``BatchNormAct2d``, or ``None``."""
    spec = resolve_activation(bn.act)
    if spec is None or not is_plain(conv, nn.Conv2d) or x.dim() != 4 or not plain_tensors(x):
        return None
    # the batch norm's own parameters too: the in-place activation below must not run where
    # autograd records through the folded weights (frozen conv, trainable norm)
    if grad_needed_through(x, conv, bn):
        return None
    folded = _folded(conv, bn)  # a BatchNormAct2d is not stock: its statistics are checked
    if folded is None:
        return None
    return spec.apply(conv._conv_forward(x, *folded), recording=False)
