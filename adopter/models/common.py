"""Helpers that every side of a check shares: dtypes, inputs, error texts, module sources.

Used inside verify's worker by the harness and by the adapters alike; imports torch only
inside the functions that need it.
"""

from __future__ import annotations

import random
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "Continued",
    "call_model",
    "cast_inputs",
    "error_line",
    "map_tensors",
    "module_sources",
    "module_text",
    "seed_everything",
    "short_traceback",
    "torch_dtype",
]


def torch_dtype(name: str) -> Any:
    """The floating-point torch dtype called ``name`` (``float32``)."""
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"not a floating-point torch dtype: {name!r}")
    return dtype


def seed_everything(seed: int) -> None:
    """Seed every generator model code commonly draws from (LayerDrop uses ``random``)."""
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:  # numpy is optional for the code under test
        pass


@dataclass(frozen=True)
class Continued:
    """Inputs of two calls of one model, the second continuing from the first: ``first`` as
    keyword arguments, then ``second`` together with what ``carry`` takes from the first call's
    output (a language model's cache of keys and values: code that runs only on a cached step
    runs then). The model's output is both calls' outputs, in order; the first alone where
    ``carry`` finds nothing to continue from (``None``)."""

    first: dict[str, Any]
    second: dict[str, Any]
    carry: Callable[[Any], dict[str, Any] | None]


def map_tensors(value: Any, change: Callable[[Any], Any]) -> Any:
    """``value`` with ``change`` applied to every tensor in it, nested in mappings (which come
    back as dicts), tuples, lists and :class:`Continued` calls; anything else as it is."""
    import torch

    if isinstance(value, torch.Tensor):
        return change(value)
    if isinstance(value, Continued):
        first, second = map_tensors(value.first, change), map_tensors(value.second, change)
        return Continued(first, second, value.carry)
    if isinstance(value, Mapping):
        return {key: map_tensors(item, change) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(item, change) for item in value)
    return value


def cast_inputs(inputs: Any, dtype: Any) -> Any:
    """``inputs`` with every floating-point tensor in it cast to ``dtype``."""
    return map_tensors(inputs, lambda t: t.to(dtype) if t.is_floating_point() else t)


def call_model(model: Any, inputs: Any) -> Any:
    """``model`` called with ``inputs``: a mapping as keyword arguments, a tuple or list as
    positional ones, :class:`Continued` inputs as two calls, anything else as the one
    argument."""
    if isinstance(inputs, Continued):
        first = model(**inputs.first)
        carried = inputs.carry(first)
        return (first,) if carried is None else (first, model(**inputs.second, **carried))
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def short_traceback(exc: BaseException, limit: int = 1500) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) <= limit else "..." + text[-limit:]


def error_line(exc: BaseException) -> str:
    """The error's type and first line; where that line only introduces the complaint
    (``Class validation error for validator 'validate_architecture':``), the next one too."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    elif text.endswith(":") and exc.__cause__ is not None:
        text = f"{text} {type(exc.__cause__).__name__}: {str(exc.__cause__).strip()}"
    return f"{type(exc).__name__}: {text}"[:300]


def module_text(module: ModuleType) -> str:
    """The source text of ``module`` ('' where it has none on disk)."""
    file = getattr(module, "__file__", None)
    try:
        return Path(file).read_text(encoding="utf-8") if file else ""
    except (OSError, UnicodeDecodeError):
        return ""


def module_sources(model: Any, extra: list[str]) -> list[str]:
    """Texts of the modules defining ``model``'s submodule classes (outside torch), plus extra."""
    texts = list(extra)
    seen: set[str] = set()
    for module in model.modules():
        name = type(module).__module__
        if name in seen or name.split(".")[0] == "torch":
            continue
        seen.add(name)
        file = getattr(sys.modules.get(name), "__file__", None)
        if file and file.endswith(".py") and Path(file).exists():
            texts.append(Path(file).read_text(encoding="utf-8", errors="replace"))
    return texts
