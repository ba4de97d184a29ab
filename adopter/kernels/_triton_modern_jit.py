"""The Triton kernels of :mod:`adopter.kernels._triton_modern`.

This module imports ``triton`` at import time; :func:`adopter.kernels._triton_modern.kernels`
imports it the first time a CUDA tensor needs a kernel. (Triton resolves the helper functions a
kernel calls among the module's globals, hence a module of their own.)
"""

# ruff: noqa: N803 - Triton's compile-time constants are spelled in capitals

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rms_fwd(
    x_ptr, w_ptr, y_ptr, r_ptr, n_cols, eps, offset,
    HAS_W: tl.constexpr, CAST_AFTER: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < n_cols
    x_raw = tl.load(x_ptr + row * n_cols + cols, mask=valid, other=0.0)
    x = x_raw.to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    normed = x * inv
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=valid, other=0.0).to(tl.float32) + offset
        if CAST_AFTER:
            y = normed * w
        else:
            y = normed.to(x_raw.dtype).to(tl.float32) * w
    else:
        y = normed
    tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=valid)
    tl.store(r_ptr + row, inv)


@triton.jit
def rms_bwd(
    g_ptr, x_ptr, w_ptr, r_ptr, dx_ptr, dw_ptr, n_rows, n_cols, offset, rows_per_program,
    HAS_W: tl.constexpr, CAST_AFTER: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < n_cols
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=valid, other=0.0).to(tl.float32) + offset
    for i in range(0, rows_per_program):
        row = pid * rows_per_program + i
        ok = valid & ((cols * 0 + row) < n_rows)
        x_raw = tl.load(x_ptr + row * n_cols + cols, mask=ok, other=0.0)
        x = x_raw.to(tl.float32)
        g = tl.load(g_ptr + row * n_cols + cols, mask=ok, other=0.0).to(tl.float32)
        inv = tl.load(r_ptr + tl.minimum(row, n_rows - 1))  # past the end: masked anyway
        normed = x * inv
        if HAS_W:
            if CAST_AFTER:
                dw += g * normed
                grad_n = g * w
            else:
                # the original multiplies in the gradient's dtype, rounding each product
                dw += (
                    (g * normed.to(x_raw.dtype).to(tl.float32))
                    .to(g_ptr.dtype.element_ty)
                    .to(tl.float32)
                )
                grad_n = (g * w).to(x_raw.dtype).to(tl.float32)
        else:
            grad_n = g
        coeff = tl.sum(grad_n * x, axis=0) / n_cols * inv * inv * inv
        dx = grad_n * inv - x * coeff
        tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=ok)
    if HAS_W:
        tl.store(dw_ptr + pid * n_cols + cols, dw, mask=valid)


@triton.jit
def tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def act_and_grad(g, ACT: tl.constexpr):
    if ACT == 0:
        s = tl.sigmoid(g)
        a = g * s
        da = s * (1.0 + g * (1.0 - s))
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.erf(g * 0.7071067811865476))
        a = g * cdf
        da = cdf + g * tl.exp(-0.5 * g * g) * 0.3989422804014327
    elif ACT == 2:
        k = 0.7978845608028654
        t = tanh(k * (g + 0.044715 * g * g * g))
        a = 0.5 * g * (1.0 + t)
        da = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 0.134145 * g * g)
    else:
        a = tl.maximum(g, 0.0)
        da = tl.where(g > 0.0, 1.0, 0.0)
    return a, da


@triton.jit
def gate_fwd(g_ptr, u_ptr, h_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    g = tl.load(g_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    a, _ = act_and_grad(g, ACT)
    tl.store(h_ptr + offs, (a * u).to(h_ptr.dtype.element_ty), mask=valid)


@triton.jit
def gate_bwd(dh_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    dh = tl.load(dh_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    a, da = act_and_grad(g, ACT)
    tl.store(du_ptr + offs, (dh * a).to(du_ptr.dtype.element_ty), mask=valid)
    tl.store(dg_ptr + offs, (dh * u * da).to(dg_ptr.dtype.element_ty), mask=valid)


@triton.jit
def rotary(
    x_ptr, c_ptr, s_ptr, y_ptr, n_cols, width, d1, d2, cs0, cs1, cs2, cs3,
    INTERLEAVED: tl.constexpr, PER_PAIR: tl.constexpr, INVERSE: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    i0 = row // (d1 * d2)
    i1 = (row // d2) % d1
    i2 = row % d2
    base = i0 * cs0 + i1 * cs1 + i2 * cs2
    pairs = tl.arange(0, BLOCK)
    valid = pairs < width // 2
    if INTERLEAVED:
        first = 2 * pairs
        second = 2 * pairs + 1
    else:
        first = pairs
        second = pairs + width // 2
    if PER_PAIR:
        c1 = tl.load(c_ptr + base + pairs * cs3, mask=valid, other=0.0).to(tl.float32)
        s1 = tl.load(s_ptr + base + pairs * cs3, mask=valid, other=0.0).to(tl.float32)
        c2 = c1
        s2 = s1
    else:
        c1 = tl.load(c_ptr + base + first * cs3, mask=valid, other=0.0).to(tl.float32)
        c2 = tl.load(c_ptr + base + second * cs3, mask=valid, other=0.0).to(tl.float32)
        s1 = tl.load(s_ptr + base + first * cs3, mask=valid, other=0.0).to(tl.float32)
        s2 = tl.load(s_ptr + base + second * cs3, mask=valid, other=0.0).to(tl.float32)
    x1 = tl.load(x_ptr + row * n_cols + first, mask=valid, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + row * n_cols + second, mask=valid, other=0.0).to(tl.float32)
    if INVERSE:
        o1 = x1 * c1 + x2 * s2
        o2 = x2 * c2 - x1 * s1
    else:
        o1 = x1 * c1 - x2 * s1
        o2 = x2 * c2 + x1 * s2
    tl.store(y_ptr + row * n_cols + first, o1.to(y_ptr.dtype.element_ty), mask=valid)
    tl.store(y_ptr + row * n_cols + second, o2.to(y_ptr.dtype.element_ty), mask=valid)
