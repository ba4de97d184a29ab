"""Backend detection for :mod:`adopter.kernels`.

Everything here is lazy: importing this module imports nothing beyond ``torch`` and the
standard library. Optional accelerators (Triton, xFormers, flash-attn) are looked up with
:func:`importlib.util.find_spec`, which only searches the import path and never executes the
package; Triton itself is imported the first time a kernel actually needs it (a CUDA tensor
reaches a Triton-backed kernel).

Environment switches (read at call time, so tests and users can flip them):

``ADOPTER_KERNELS_TRITON``
    ``auto`` (default): use Triton kernels for CUDA tensors when ``triton`` is installed.
    ``0``: never use Triton.
``ADOPTER_KERNELS_COMPILE``
    ``auto`` (default): wrap the elementwise+reduction chains that eager PyTorch cannot fuse
    (dropout + residual add + layer norm) in ``torch.compile`` for CUDA tensors when Triton is
    installed (Inductor then emits one fused Triton kernel). ``1``: compile on every device.
    ``0``: never compile.
``ADOPTER_KERNELS_COMPILE_BACKEND``
    The ``torch.compile`` backend to use (default ``inductor``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import warnings
from types import ModuleType

import torch

from .registry import ENTRIES, Backends

__all__ = [
    "compile_backend",
    "describe_backends",
    "flash_attn_available",
    "load_triton",
    "should_compile",
    "triton_available",
    "use_triton",
    "xformers_available",
]


@functools.cache
def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def triton_available() -> bool:
    """Whether the ``triton`` package is installed (not imported)."""
    return _has_module("triton")


def xformers_available() -> bool:
    """Whether the ``xformers`` package is installed (not imported)."""
    return _has_module("xformers")


def flash_attn_available() -> bool:
    """Whether the ``flash_attn`` package is installed (not imported)."""
    return _has_module("flash_attn")


@functools.cache
def load_triton() -> ModuleType | None:
    """Import and return ``triton``, or ``None`` when it is missing or fails to import."""
    if not triton_available():
        return None
    try:
        return importlib.import_module("triton")
    except Exception as exc:  # a broken install must not break the model
        warnings.warn(
            f"adopter.kernels: triton is installed but failed to import: {exc}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def _switch(name: str) -> str:
    value = os.environ.get(name, "auto").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return "on"
    if value in ("0", "false", "no", "off"):
        return "off"
    return "auto"


def use_triton(tensor: torch.Tensor) -> bool:
    """Whether a Triton kernel should handle ``tensor`` (CUDA tensor, triton importable)."""
    if not tensor.is_cuda or _switch("ADOPTER_KERNELS_TRITON") == "off":
        return False
    return load_triton() is not None


def should_compile(tensor: torch.Tensor) -> bool:
    """Whether to route ``tensor`` through a ``torch.compile``-fused function."""
    mode = _switch("ADOPTER_KERNELS_COMPILE")
    if mode == "off" or not hasattr(torch, "compile"):
        return False
    if torch.compiler.is_compiling():
        # Already inside an outer torch.compile graph: let that compiler fuse instead.
        return False
    if mode == "on":
        return True
    return tensor.is_cuda and triton_available()


def compile_backend() -> str:
    """The ``torch.compile`` backend requested through ``ADOPTER_KERNELS_COMPILE_BACKEND``."""
    return os.environ.get("ADOPTER_KERNELS_COMPILE_BACKEND", "inductor")


def _sdpa_backends(device: torch.device) -> str:
    if device.type != "cuda":
        return "torch.nn.functional.scaled_dot_product_attention (CPU flash/math kernels)"
    enabled = []
    for name, probe in (
        ("flash", "flash_sdp_enabled"),
        ("mem_efficient", "mem_efficient_sdp_enabled"),
        ("cudnn", "cudnn_sdp_enabled"),
        ("math", "math_sdp_enabled"),
    ):
        check = getattr(torch.backends.cuda, probe, None)
        if check is not None and check():
            enabled.append(name)
    return "torch.nn.functional.scaled_dot_product_attention (CUDA: " + ", ".join(enabled) + ")"


def describe_backends(device: str | torch.device | None = None) -> dict[str, str]:
    """Report which implementation each kernel uses for tensors on ``device``.

    ``device`` defaults to ``cuda`` when CUDA is available, else ``cpu``. The values are
    human-readable one-liners; the keys are ``device``, the availability of the optional
    packages, and every kernel and attention factory of :mod:`adopter.kernels.registry`.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    mode = _switch("ADOPTER_KERNELS_COMPILE")
    backends = Backends(
        device=str(dev),
        cuda=cuda,
        triton=cuda and triton_available() and _switch("ADOPTER_KERNELS_TRITON") != "off",
        compiled=mode == "on" or (mode == "auto" and cuda and triton_available()),
        compile_backend=compile_backend(),
        sdpa=_sdpa_backends(dev),
    )
    report = {
        "device": str(dev),
        "triton": "available" if triton_available() else "missing",
        "xformers": "available" if xformers_available() else "missing",
        "flash_attn": "available" if flash_attn_available() else "missing",
        "liger_kernel": "available" if _has_module("liger_kernel") else "missing",
    }
    from . import backends as dispatch  # the ops with several backends

    alternatives = {}
    for o in dispatch.OPS:
        offered = dispatch.available(o.name, dev.type)
        for kernel in o.kernels:
            alternatives[kernel] = "; backends here: " + ", ".join(offered) + " (chosen per call)"
    for entry in ENTRIES:
        if entry.backend is not None:
            report[entry.name] = entry.backend(backends) + alternatives.get(entry.name, "")
    return report
