"""Fused optimizers for training code (the ``train`` rule set, ``adopter/rules/train.py``).

``torch.optim``'s Adam, AdamW and SGD have a fused implementation (``fused=True``: one kernel
per device and dtype updates every parameter) beside the default per-tensor or ``foreach`` one,
whose whole-model temporaries can set a training step's peak memory. The fused kernels require
every parameter to be a dense floating-point tensor on a device that has them; torch raises
otherwise. These functions choose fused only where torch would accept it and build exactly what
the user wrote everywhere else, so a rewritten script never fails where the original ran.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any

import torch

# Keywords with which a call already chose an implementation (or asked for something the fused
# kernels refuse): the call is built as written. The rule leaves such calls alone statically;
# this holds for calls that reach the kernel some other way (``**kwargs``).
_CHOSEN = ("fused", "foreach", "capturable", "differentiable")
# The optimizers whose fused implementation computes what the default one does (within
# rounding). Others with a ``fused`` flag (Adagrad) are left to the user.
_FUSED_CLASSES = ("Adam", "AdamW", "SGD")


def fused_optimizer(optimizer_class: type, *args: Any, **kwargs: Any) -> torch.optim.Optimizer:
    """``optimizer_class(*args, **kwargs)``, with ``fused=True`` when every parameter allows it.

    ``optimizer_class`` is the class the user's call named (``torch.optim.AdamW``,
    ``torch.optim.Adam`` or ``torch.optim.SGD``; any other class, or a subclass, is built as
    written). The parameters (``args[0]`` or ``params=``: tensors, or parameter-group dicts) are
    read once into lists, so a generator such as ``model.parameters()`` is not consumed twice.
    Fused is chosen when every parameter is a dense floating-point ``Tensor``/``Parameter`` on a
    device with fused optimizer kernels, the class accepts ``fused=`` and the call chose no
    implementation itself (``fused``, ``foreach``, ``capturable``, ``differentiable``). An SGD
    optimizer that meets a sparse gradient (``nn.Embedding(sparse=True)``), which its fused
    kernel refuses, runs that step, and the ones after it, with the default implementation.
    """
    args_list = list(args)
    if args_list:
        args_list[0] = _materialized(args_list[0])
    elif "params" in kwargs:
        kwargs["params"] = _materialized(kwargs["params"])
    params = args_list[0] if args_list else kwargs.get("params")
    if not _fused_allowed(optimizer_class, params, kwargs):
        return optimizer_class(*args_list, **kwargs)
    optimizer = optimizer_class(*args_list, fused=True, **kwargs)
    if issubclass(optimizer_class, torch.optim.SGD):
        optimizer.register_step_pre_hook(_unfuse_groups_with_sparse_gradients)
    return optimizer


def fused_training_optimizer(optim: str) -> str:
    """The transformers ``TrainingArguments.optim`` to use for ``optim``: ``"adamw_torch_fused"``
    for ``"adamw_torch"`` when fused AdamW runs on the device training will use (the
    accelerator torch reports, else the CPU) and torch_xla is not in use; ``optim`` otherwise.
    The Trainer then builds ``torch.optim.AdamW(..., fused=True)`` from its own parameters."""
    if optim != "adamw_torch" or "torch_xla" in sys.modules:
        return optim
    accelerator = getattr(torch, "accelerator", None)
    device = accelerator.current_accelerator() if accelerator is not None else None
    device_type = device.type if device is not None else "cpu"
    return "adamw_torch_fused" if device_type in _fused_devices() else optim


def _materialized(params: Any) -> Any:
    """``params`` with every iterable of tensors read into a list (groups stay dicts)."""
    if isinstance(params, torch.Tensor):
        return params
    listed = list(params)
    return [
        {**item, "params": _materialized_group(item["params"])}
        if isinstance(item, dict) and "params" in item
        else item
        for item in listed
    ]


def _materialized_group(params: Any) -> Any:
    return params if isinstance(params, torch.Tensor) else list(params)


def _tensors(params: Any) -> Iterator[Any]:
    items: Iterable[Any] = [params] if isinstance(params, torch.Tensor) else params
    for item in items:
        if isinstance(item, dict):
            group = item.get("params", [])
            yield from [group] if isinstance(group, torch.Tensor) else group
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            yield item[1]  # named parameters: (name, tensor)
        else:
            yield item


def _fused_devices() -> list[str]:
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return _get_fused_kernels_supported_devices()


def _fused_allowed(optimizer_class: type, params: Any, kwargs: dict[str, Any]) -> bool:
    if optimizer_class not in tuple(getattr(torch.optim, name) for name in _FUSED_CLASSES):
        return False  # a subclass may override step(); only the classes themselves are known
    if any(key in kwargs for key in _CHOSEN) or torch.jit.is_scripting():
        return False
    tensors = list(_tensors(params)) if params is not None else []
    devices = _fused_devices()
    return bool(tensors) and all(
        type(tensor) in (torch.Tensor, torch.nn.Parameter)
        and tensor.layout is torch.strided
        and tensor.is_floating_point()
        and tensor.device.type in devices
        for tensor in tensors
    )


def _unfuse_groups_with_sparse_gradients(
    optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
) -> None:
    for group in optimizer.param_groups:
        if group.get("fused") and any(
            p.grad is not None and p.grad.is_sparse for p in group["params"]
        ):
            group["fused"] = False
