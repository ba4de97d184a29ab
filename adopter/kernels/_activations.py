"""Recognise activation callables and map them to single-kernel ATen implementations.

``resolve_activation`` returns an :class:`ActSpec` for:

* ``torch.nn`` modules: ``GELU`` (both approximations), ``ReLU``, ``ReLU6``, ``SiLU``, ``Tanh``,
  ``Sigmoid``, ``Mish``, ``LeakyReLU``, ``Identity`` (exact type, no hooks);
* functions: ``F.gelu``, ``F.relu``/``torch.relu``, ``F.relu6``, ``F.silu``, ``torch.tanh``/
  ``F.tanh``, ``torch.sigmoid``/``F.sigmoid``, ``F.mish``;
* ``transformers.activations`` classes, recognised by class name *and* a module path under
  ``transformers`` (transformers itself is never imported): ``GELUActivation``,
  ``PytorchGELUTanh``, ``NewGELUActivation``, ``FastGELUActivation``,
  ``AccurateGELUActivation``, ``QuickGELUActivation``, ``ClippedGELUActivation``,
  ``SiLUActivation``, ``MishActivation``, ``LinearActivation``, ``ReLUSquaredActivation``.

The transformers tanh-GELU variants (``NewGELU``, ``FastGELU``, ``AccurateGELU``) evaluate the
same formula as ``F.gelu(x, approximate="tanh")`` with 6-9 separate elementwise kernels (and as
many saved intermediates under autograd); here they become the single native kernel. The values
agree to float rounding (``FastGELU``'s constant 0.7978845608 differs from sqrt(2/pi) by 3e-12).

Each spec has an out-of-place form, an in-place form usable when autograd is not recording, and
(only for activations whose backward needs just the output, so in-place costs no clone) an
in-place form that is safe under autograd.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from ._util import has_hooks, is_plain

__all__ = ["ActSpec", "resolve_activation"]

Fn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ActSpec:
    """How to apply one recognised activation."""

    name: str
    fn: Fn
    inplace: Fn | None = None
    inplace_under_grad: bool = False

    def apply(self, y: torch.Tensor, recording: bool) -> torch.Tensor:
        """Apply to ``y`` (a fresh buffer owned by the caller), in place when legal."""
        if self.inplace is not None and (not recording or self.inplace_under_grad):
            return self.inplace(y)
        return self.fn(y)


def _identity(y: torch.Tensor) -> torch.Tensor:
    return y


def _gelu_(y: torch.Tensor, approximate: str) -> torch.Tensor:
    return torch._C._nn.gelu_(y, approximate=approximate)


def _quick_gelu(y: torch.Tensor) -> torch.Tensor:
    return y * torch.sigmoid(1.702 * y)


def _quick_gelu_(y: torch.Tensor) -> torch.Tensor:
    gate = torch.mul(y, 1.702).sigmoid_()
    return y.mul_(gate)


def _relu2(y: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(y))


def _relu2_(y: torch.Tensor) -> torch.Tensor:
    return torch.relu_(y).square_()


def _clipped_gelu(lo: float, hi: float, y: torch.Tensor) -> torch.Tensor:
    return torch.clip(F.gelu(y), lo, hi)


def _clipped_gelu_(lo: float, hi: float, y: torch.Tensor) -> torch.Tensor:
    return _gelu_(y, "none").clamp_(lo, hi)


def _gelu_spec(approximate: str) -> ActSpec:
    name = "gelu" if approximate == "none" else "gelu_tanh"
    return ActSpec(
        name, partial(F.gelu, approximate=approximate), partial(_gelu_, approximate=approximate)
    )


_RELU = ActSpec("relu", F.relu, torch.relu_, inplace_under_grad=True)
_RELU6 = ActSpec(
    "relu6",
    partial(F.hardtanh, min_val=0.0, max_val=6.0),
    partial(F.hardtanh_, min_val=0.0, max_val=6.0),
    inplace_under_grad=True,
)
_SILU = ActSpec("silu", F.silu, partial(F.silu, inplace=True))
_TANH = ActSpec("tanh", torch.tanh, torch.tanh_, inplace_under_grad=True)
_SIGMOID = ActSpec("sigmoid", torch.sigmoid, torch.sigmoid_, inplace_under_grad=True)
_MISH = ActSpec("mish", F.mish, partial(F.mish, inplace=True))
_IDENTITY = ActSpec("identity", _identity, _identity, inplace_under_grad=True)
_GELU = _gelu_spec("none")
_GELU_TANH = _gelu_spec("tanh")
_QUICK_GELU = ActSpec("quick_gelu", _quick_gelu, _quick_gelu_)
_RELU2 = ActSpec("relu2", _relu2, _relu2_)

_FUNCTIONS: dict[Callable[..., torch.Tensor], ActSpec] = {
    F.gelu: _GELU,
    F.relu: _RELU,
    torch.relu: _RELU,
    F.relu6: _RELU6,
    F.silu: _SILU,
    torch.tanh: _TANH,
    F.tanh: _TANH,
    torch.sigmoid: _SIGMOID,
    F.sigmoid: _SIGMOID,
    F.mish: _MISH,
}

_SIMPLE_MODULES: dict[type[nn.Module], ActSpec] = {
    nn.ReLU: _RELU,
    nn.ReLU6: _RELU6,
    nn.SiLU: _SILU,
    nn.Tanh: _TANH,
    nn.Sigmoid: _SIGMOID,
    nn.Mish: _MISH,
    nn.Identity: _IDENTITY,
}

_TRANSFORMERS_FIXED: dict[str, ActSpec] = {
    "PytorchGELUTanh": _GELU_TANH,
    "NewGELUActivation": _GELU_TANH,
    "FastGELUActivation": _GELU_TANH,
    "AccurateGELUActivation": _GELU_TANH,
    "QuickGELUActivation": _QUICK_GELU,
    "SiLUActivation": _SILU,
    "LinearActivation": _IDENTITY,
    "ReLUSquaredActivation": _RELU2,
}


def _from_transformers(act: nn.Module) -> ActSpec | None:
    cls = type(act)
    if not (cls.__module__ or "").startswith("transformers"):
        return None
    if has_hooks(act):
        return None
    name = cls.__name__
    if name in _TRANSFORMERS_FIXED:
        return _TRANSFORMERS_FIXED[name]
    inner = getattr(act, "act", None)
    if name == "GELUActivation":
        # ``act`` is F.gelu, or the bound ``_gelu_python`` (same erf formula).
        if inner is F.gelu or getattr(inner, "__name__", "") == "_gelu_python":
            return _GELU
        return None
    if name == "MishActivation":
        if inner is F.mish or getattr(inner, "__name__", "") == "_mish_python":
            return _MISH
        return None
    if name == "ClippedGELUActivation":
        lo, hi = getattr(act, "min", None), getattr(act, "max", None)
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
            lo, hi = float(lo), float(hi)
            return ActSpec(
                "gelu_clip", partial(_clipped_gelu, lo, hi), partial(_clipped_gelu_, lo, hi)
            )
    return None


def resolve_activation(act: object) -> ActSpec | None:
    """Return the :class:`ActSpec` for ``act``, or ``None`` when it is not recognised."""
    if isinstance(act, nn.Module):
        cls = type(act)
        if cls in _SIMPLE_MODULES and not has_hooks(act):
            return _SIMPLE_MODULES[cls]
        if is_plain(act, nn.GELU) and cls is nn.GELU:
            return _GELU_TANH if act.approximate == "tanh" else _GELU
        if cls is nn.LeakyReLU and not has_hooks(act):
            slope = float(act.negative_slope)
            return ActSpec(
                "leaky_relu",
                partial(F.leaky_relu, negative_slope=slope),
                partial(F.leaky_relu_, negative_slope=slope),
                inplace_under_grad=slope > 0.0,
            )
        return _from_transformers(act)
    try:
        return _FUNCTIONS.get(act)  # type: ignore[arg-type]
    except TypeError:  # unhashable callable
        return None
