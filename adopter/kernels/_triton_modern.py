"""Triton kernels for RMSNorm, the gated activation and rotary embeddings (CUDA only).

Nothing is imported at import time; :func:`kernels` imports ``triton`` and JIT-decorates the
kernels the first time a CUDA tensor needs them (see :func:`adopter.kernels._backend.use_triton`).
Under ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors, which is how the unit tests
exercise their logic on machines without a GPU; ``benchmarks/gpu_check.py`` checks and times
them on a GPU.

Each kernel reads its inputs once, computes in float32 registers and writes its outputs once:

* RMSNorm: one program per row; forward stores the output and the row's inverse RMS, backward
  the input gradient and per-program partial sums of the weight gradient (summed by torch).
* gated activation (SiLU, GELU, tanh-GELU, ReLU): forward ``act(g) * u``; backward both
  gradients from ``dL/dh``, ``g`` and ``u`` (the activation recomputed in registers).
* rotary: one program per row of ``x``; pairs in the half-split or interleaved layout, angles
  per element or per pair, partial rotary (the tail is copied by torch).

Results agree with the eager kernels to float rounding: float32 arithmetic in registers rounds
once where the eager operations round after each step (half precision), and reductions run in
another order.
"""

from __future__ import annotations

import functools
import math
import warnings
from types import SimpleNamespace
from typing import Any

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_COLS = 16384
ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3}


def build_kernels() -> SimpleNamespace:
    """Import triton and the kernels (:mod:`adopter.kernels._triton_modern_jit`)."""
    import triton

    from . import _triton_modern_jit as jit

    return SimpleNamespace(
        rms_fwd=jit.rms_fwd,
        rms_bwd=jit.rms_bwd,
        gate_fwd=jit.gate_fwd,
        gate_bwd=jit.gate_bwd,
        rotary=jit.rotary,
        next_power_of_2=triton.next_power_of_2,
    )


@functools.lru_cache(maxsize=1)
def kernels() -> SimpleNamespace:
    """The process-wide kernel set (built once)."""
    return build_kernels()


_FAILURES: list[str] = []


def usable(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` should take a Triton kernel: a CUDA tensor, Triton importable and
    enabled (``ADOPTER_KERNELS_TRITON``), and no Triton kernel of this module failed before."""
    from . import _backend

    return not _FAILURES and _backend.use_triton(tensor)


def failed(exc: BaseException) -> None:
    """Record a Triton failure: the eager kernels are used from now on."""
    _FAILURES.append(repr(exc))
    warnings.warn(
        f"adopter.kernels: a Triton kernel failed ({exc!r}); using the PyTorch kernels from now on",
        RuntimeWarning,
        stacklevel=3,
    )


# --------------------------------------------------------------------------------------------
# RMSNorm


def rms_supported(x: torch.Tensor, weight: torch.Tensor | None, cast: str) -> bool:
    """Whether the Triton RMSNorm handles this call (``weight_dtype`` spelling excluded)."""
    if cast == "weight_dtype" or x.dtype not in DTYPES or not x.is_contiguous():
        return False
    if weight is not None and (weight.dtype not in DTYPES or not weight.is_contiguous()):
        return False
    return 0 < x.shape[-1] <= MAX_COLS and x.numel() > 0


def _rms_output_dtype(x: torch.Tensor, weight: torch.Tensor | None, cast: str) -> torch.dtype:
    if weight is None or cast == "after_weight":
        return x.dtype
    return torch.promote_types(weight.dtype, x.dtype)


def rms_forward(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float, cast: str
) -> tuple[torch.Tensor, torch.Tensor]:
    k = kernels()
    n_cols = x.shape[-1]
    rows = x.numel() // n_cols
    y = torch.empty(x.shape, dtype=_rms_output_dtype(x, weight, cast), device=x.device)
    inv = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    k.rms_fwd[(rows,)](
        x, x if weight is None else weight, y, inv, n_cols, float(eps), float(offset),
        HAS_W=weight is not None, CAST_AFTER=cast == "after_weight",
        BLOCK=k.next_power_of_2(n_cols),
    )  # fmt: skip
    return y, inv


def rms_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    inv: torch.Tensor,
    offset: float,
    cast: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    k = kernels()
    n_cols = x.shape[-1]
    rows = x.numel() // n_cols
    programs = max(1, min(rows, 4 * _multiprocessors(x.device)))
    per_program = math.ceil(rows / programs)
    programs = math.ceil(rows / per_program)
    dx = torch.empty_like(x)
    partial = (
        torch.empty((programs, n_cols), dtype=torch.float32, device=x.device)
        if weight is not None
        else dx
    )
    k.rms_bwd[(programs,)](
        grad.contiguous(), x, x if weight is None else weight, inv, dx, partial, rows, n_cols,
        float(offset), per_program,
        HAS_W=weight is not None, CAST_AFTER=cast == "after_weight",
        BLOCK=k.next_power_of_2(n_cols),
    )  # fmt: skip
    dw = None if weight is None else partial.sum(0).to(weight.dtype)
    return dx, dw


def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


# --------------------------------------------------------------------------------------------
# Gated activation


def gate_supported(gate: torch.Tensor, up: torch.Tensor) -> bool:
    return (
        gate.dtype in DTYPES
        and gate.is_contiguous()
        and up.is_contiguous()
        and gate.shape == up.shape
        and gate.dtype == up.dtype
        and gate.numel() > 0
    )


_ELEMENTWISE_BLOCK = 1024


def gate_forward(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    k = kernels()
    out = torch.empty_like(gate)
    n = gate.numel()
    grid = (triton_cdiv(n, _ELEMENTWISE_BLOCK),)
    k.gate_fwd[grid](gate, up, out, n, ACT=ACTIVATIONS[activation], BLOCK=_ELEMENTWISE_BLOCK)
    return out


def gate_backward(
    grad_h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str
) -> tuple[torch.Tensor, torch.Tensor]:
    k = kernels()
    grad_gate = torch.empty_like(gate)
    grad_up = torch.empty_like(up)
    n = gate.numel()
    grid = (triton_cdiv(n, _ELEMENTWISE_BLOCK),)
    k.gate_bwd[grid](
        grad_h.contiguous(), gate, up, grad_gate, grad_up, n,
        ACT=ACTIVATIONS[activation], BLOCK=_ELEMENTWISE_BLOCK,
    )  # fmt: skip
    return grad_gate, grad_up


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------------------------
# Rotary


def rotary_supported(x: torch.Tensor, cos: torch.Tensor, dtype: torch.dtype) -> bool:
    return (
        x.dtype in DTYPES
        and dtype in DTYPES
        and cos.dtype in DTYPES
        and x.is_contiguous()
        and 1 <= x.dim() <= 4
        and x.numel() > 0
        and x.shape[-1] <= MAX_COLS
    )


def rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    width: int,
    interleaved: bool,
    per_pair: bool,
    inverse: bool,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Rotate the first ``width`` features of ``x`` (float32 arithmetic); the rest is copied."""
    k = kernels()
    shape4 = (1,) * (4 - x.dim()) + tuple(x.shape)
    angle_width = width // 2 if per_pair else width
    cos4 = cos.expand(*x.shape[:-1], angle_width).reshape(*shape4[:-1], angle_width)
    sin4 = sin.expand(*x.shape[:-1], angle_width).reshape(*shape4[:-1], angle_width)
    if cos4.stride() != sin4.stride():
        sin4 = sin4.contiguous()
        cos4 = cos4.contiguous()
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rows = x.numel() // x.shape[-1]
    strides: Any = cos4.stride()
    k.rotary[(rows,)](
        x, cos4, sin4, out, x.shape[-1], width, shape4[1], shape4[2],
        strides[0], strides[1], strides[2], strides[3],
        INTERLEAVED=interleaved, PER_PAIR=per_pair, INVERSE=inverse,
        BLOCK=k.next_power_of_2(max(width // 2, 1)),
    )  # fmt: skip
    if width < x.shape[-1]:
        out[..., width:] = x[..., width:]
    return out
