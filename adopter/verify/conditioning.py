"""The weights a proof runs with: a freshly initialised model, made able to show a difference.

A model straight from its initialiser hides kernels that ignore part of what they are given:

* a norm's weight of ones and bias of zeros (and a zero-initialised gate, layer scale or
  output projection) let a kernel drop them and still match;
* a batch norm's running statistics of mean 0 and variance 1 let a conv + batch-norm fold that
  ignored them match in eval mode, and leave eval-mode activations unnormalised: Visformer
  (a vision transformer with batch norms) reached outputs of 262 there, and its float32
  gradients were 60 % off a float64 run of the same model, so no float comparison could judge
  its patch.

So each parameter whose elements all hold one value is redrawn around it (seeded), and each
batch norm's running statistics are set to the mean and variance of what it receives from the
inputs in an eval-mode pass, layer by layer, as a trained model's would roughly be. Both sides
then load these weights: the model is the same on both, only no longer degenerate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..models.common import call_model, map_tensors, seed_everything

__all__ = ["conditioned_state"]

_ZERO_SPREAD = 0.02
"""The standard deviation a parameter of zeros is redrawn with (a common initialiser's)."""

_MIN_VARIANCE = 1e-2
"""The smallest running variance set: a channel that is constant on these inputs would
otherwise be scaled by up to ``1 / sqrt(eps)`` in eval mode."""


def _redrawn(value: torch.Tensor, generator: torch.Generator) -> torch.Tensor | None:
    """``value`` redrawn around its one constant, or ``None`` where its elements differ."""
    if not value.is_floating_point() or value.numel() == 0 or value.device.type == "meta":
        return None
    first = value.detach().reshape(-1)[0]
    if not bool((value.detach() == first).all()):
        return None
    noise = torch.rand(value.shape, generator=generator, dtype=torch.float64)
    if float(first) == 0.0:
        drawn = torch.randn(value.shape, generator=generator, dtype=torch.float64) * _ZERO_SPREAD
    else:  # the constant times a factor in [0.5, 1.5): same sign and scale
        drawn = float(first) * (0.5 + noise)
    return drawn.to(dtype=value.dtype, device=value.device)


def _redraw_constants(model: nn.Module, state: dict[str, Any], seed: int) -> None:
    """Redraw, in ``state``, every parameter of ``model`` that holds one value throughout; a
    parameter reached under several names (tied weights) gets one value under all of them."""
    generator = torch.Generator().manual_seed(seed + 7)
    parameters = {id(p) for p in model.parameters()}
    drawn: dict[int, torch.Tensor | None] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) not in parameters or name not in state:
            continue
        if id(value) not in drawn:
            drawn[id(value)] = _redrawn(value, generator)
        if drawn[id(value)] is not None:
            state[name] = drawn[id(value)].clone()


def _statistics_hook(found: dict[str, torch.Tensor], name: str) -> Callable[..., None]:
    def before(norm: nn.modules.batchnorm._BatchNorm, args: tuple[Any, ...]) -> None:
        x = args[0] if args else None
        if name in found or not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return
        if x.dim() < 2 or x.shape[1] != norm.num_features:
            return
        per_channel = x.detach().transpose(0, 1).reshape(x.shape[1], -1).double()
        if per_channel.shape[1] < 2:
            return
        mean = per_channel.mean(dim=1)
        variance = per_channel.var(dim=1, unbiased=False).clamp_min(_MIN_VARIANCE)
        if not bool(torch.isfinite(mean).all() and torch.isfinite(variance).all()):
            return
        found[name] = mean
        # Set now, so that the layers after this one see what it normalises.
        norm.running_mean.copy_(mean.to(norm.running_mean.dtype))
        norm.running_var.copy_(variance.to(norm.running_var.dtype))

    return before


def _calibrate_statistics(model: nn.Module, state: dict[str, Any], inputs: Any, seed: int) -> None:
    """Set, in ``state``, each batch norm's running statistics from an eval-mode pass of
    ``model`` (loaded with ``state``) on ``inputs``; a norm the pass does not reach, or one
    that sees a single value per channel, keeps its own. A pass that fails sets nothing."""
    norms = {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm)
        and module.running_mean is not None
        and module.running_var is not None
        and f"{name}.running_mean" in state
    }
    if not norms:
        return
    found: dict[str, torch.Tensor] = {}
    handles = [
        norm.register_forward_pre_hook(_statistics_hook(found, name))
        for name, norm in norms.items()
    ]
    try:
        model.load_state_dict(state, strict=False)
        model.eval()
        seed_everything(seed)
        with torch.no_grad():
            call_model(model, map_tensors(inputs, torch.Tensor.clone))
    except Exception:
        return
    finally:
        for handle in handles:
            handle.remove()
    for name in found:
        for buffer in ("running_mean", "running_var"):
            state[f"{name}.{buffer}"] = getattr(norms[name], buffer).detach().clone()


def conditioned_state(
    state: dict[str, Any], fresh_model: Callable[[], nn.Module], inputs: Any, seed: int
) -> dict[str, Any]:
    """``state`` (the original's, as built) with its constant parameters redrawn and its batch
    norms' statistics calibrated on ``inputs``; ``fresh_model`` gives a copy of the original
    that has never run, to run the calibration on (the model itself stays unrun)."""
    conditioned = dict(state)
    try:
        model = fresh_model()
    except Exception:
        return conditioned
    _redraw_constants(model, conditioned, seed)
    _calibrate_statistics(model, conditioned, inputs, seed)
    return conditioned
