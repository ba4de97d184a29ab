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

import torch
from torch import nn

from ._fold import bn_foldable, folded_weight_bias
from ._util import grad_needed_through, is_plain, plain_tensors, tracing

__all__ = ["conv_batch_norm"]

_CONVS: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
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
    if tracing() or not is_plain(conv, *_CONVS) or torch.compiler.is_compiling():
        return batch_norm(conv(x))
    # timm's BatchNormAct2d (a BatchNorm2d subclass with its activation, identity when built
    # with ``apply_act=False``): folded with its activation by the conv + BN + act kernel.
    from .norm_act import _fold_timm, _timm_norm_act  # norm_act imports this module

    if _timm_norm_act(batch_norm, "BatchNormAct2d"):
        fused = _fold_timm(x, conv, batch_norm)
        return batch_norm(conv(x)) if fused is None else fused
    weight, bias = conv.weight, conv.bias
    spatial = _SPATIAL[type(conv).forward]
    if x.dim() != spatial + 2 or not plain_tensors(x, weight, bias):
        return batch_norm(conv(x))
    if not isinstance(batch_norm, _BN_FOR_DIMS[spatial]):
        return batch_norm(conv(x))
    if not bn_foldable(batch_norm, weight, conv.out_channels) or grad_needed_through(x, conv):
        return batch_norm(conv(x))
    new_weight, new_bias = folded_weight_bias(conv, weight, bias, batch_norm)
    return conv._conv_forward(x, new_weight, new_bias)
