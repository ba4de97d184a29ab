"""Triton row-softmax (forward and backward) used by :func:`adopter.kernels.softmax` on CUDA.

This module imports nothing at import time; :func:`build_kernels` imports ``triton`` and
JIT-decorates the kernels when first asked. Under ``TRITON_INTERPRET=1`` the same kernels run
on CPU tensors, which is how the unit tests exercise them on machines without a GPU.

One program handles one row of the (rows, n_cols) view of a contiguous tensor:

* forward: load the row once in its storage dtype, up-cast to fp32 in registers, subtract the
  max, exponentiate, normalise, store in the requested output dtype. A ``bf16 -> fp32`` or
  ``fp16 -> fp32`` softmax therefore reads 2 bytes and writes 4 bytes per element, where
  ``F.softmax(x, dtype=torch.float32)`` first materialises an fp32 copy of the input
  (ATen only fuses the up-cast for fp16 on CUDA, not for bf16).
* backward: ``dx = y * (g - sum(g * y))`` with fp32 accumulation, written in the input dtype.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import torch

MAX_COLS = 16384
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def build_kernels() -> SimpleNamespace:
    """Import triton and return freshly JIT-decorated ``fwd``/``bwd`` kernels."""
    import triton
    import triton.language as tl

    @triton.jit
    def _softmax_fwd(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        valid = offs < n_cols
        x = tl.load(x_ptr + row * x_row_stride + offs, mask=valid, other=-float("inf"))
        x = x.to(tl.float32)
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        den = tl.sum(num, axis=0)
        y = num / den
        tl.store(y_ptr + row * y_row_stride + offs, y.to(y_ptr.dtype.element_ty), mask=valid)

    @triton.jit
    def _softmax_bwd(
        g_ptr, y_ptr, dx_ptr, n_cols, g_row_stride, y_row_stride, dx_row_stride, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        valid = offs < n_cols
        g = tl.load(g_ptr + row * g_row_stride + offs, mask=valid, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + row * y_row_stride + offs, mask=valid, other=0.0).to(tl.float32)
        dot = tl.sum(g * y, axis=0)
        dx = y * (g - dot)
        tl.store(dx_ptr + row * dx_row_stride + offs, dx.to(dx_ptr.dtype.element_ty), mask=valid)

    return SimpleNamespace(
        fwd=_softmax_fwd, bwd=_softmax_bwd, next_power_of_2=triton.next_power_of_2
    )


@functools.lru_cache(maxsize=1)
def kernels() -> SimpleNamespace:
    """The process-wide kernel set (built once)."""
    return build_kernels()


def supported(x: torch.Tensor, dim: int, out_dtype: torch.dtype) -> bool:
    """Whether the Triton kernel can handle ``softmax(x, dim)`` producing ``out_dtype``."""
    if x.dim() == 0 or x.numel() == 0:
        return False
    if dim % x.dim() != x.dim() - 1 or not x.is_contiguous():
        return False
    if x.dtype not in SUPPORTED_DTYPES or out_dtype not in SUPPORTED_DTYPES:
        return False
    return x.shape[-1] <= MAX_COLS


def _num_warps(block: int) -> int:
    if block <= 2048:
        return 4
    if block <= 8192:
        return 8
    return 16


class TritonSoftmax(torch.autograd.Function):
    """Autograd wrapper: saves the output only (softmax's gradient needs nothing else)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, out_dtype: torch.dtype, ks: SimpleNamespace
    ) -> torch.Tensor:
        n_cols = x.shape[-1]
        x2 = x.view(-1, n_cols)
        y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
        y2 = y.view(-1, n_cols)
        block = ks.next_power_of_2(n_cols)
        ks.fwd[(x2.shape[0],)](
            x2, y2, n_cols, x2.stride(0), y2.stride(0), BLOCK=block, num_warps=_num_warps(block)
        )
        ctx.save_for_backward(y)
        ctx.in_dtype = x.dtype
        ctx.ks = ks
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        (y,) = ctx.saved_tensors
        n_cols = y.shape[-1]
        g2 = grad.contiguous().view(-1, n_cols)
        y2 = y.view(-1, n_cols)
        dx = torch.empty(y.shape, dtype=ctx.in_dtype, device=y.device)
        dx2 = dx.view(-1, n_cols)
        block = ctx.ks.next_power_of_2(n_cols)
        ctx.ks.bwd[(g2.shape[0],)](
            g2,
            y2,
            dx2,
            n_cols,
            g2.stride(0),
            y2.stride(0),
            dx2.stride(0),
            BLOCK=block,
            num_warps=_num_warps(block),
        )
        return dx, None, None


def triton_softmax(
    x: torch.Tensor, out_dtype: torch.dtype, ks: SimpleNamespace | None = None
) -> torch.Tensor:
    """Last-dim softmax of contiguous ``x`` producing ``out_dtype`` (see :func:`supported`)."""
    return TritonSoftmax.apply(x, out_dtype, ks if ks is not None else kernels())
