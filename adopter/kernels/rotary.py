"""Rotary position embeddings without ``rotate_half`` temporaries.

The original ``q * cos + rotate_half(q) * sin`` materialises, per tensor, a negated half, the
concatenated rotated copy, two full-size products and their sum (and the same for ``k``).
Here each tensor takes one product into its output buffer and two half-size products that are
subtracted from / added to its two halves in place::

    out_first  = x_first  * cos_first  - x_second * sin_first
    out_second = x_second * cos_second + x_first  * sin_second

These are the original's operations on the same operands (``a + (-b)`` is ``a - b`` in IEEE
arithmetic), so results are bit-identical. The backward is the inverse rotation,
``g_first * cos_first + g_second * sin_second`` and ``g_second * cos_second - g_first *
sin_first``, again the operations autograd runs for the original; only ``cos`` and ``sin``
are kept for it.

Layouts of the rotated pairs:

* ``interleaved=False`` (Llama, Mistral, Qwen, Gemma, Phi, diffusers' ``use_real_unbind_dim=-2``):
  element ``i`` pairs with ``i + rotary_dim / 2``.
* ``interleaved=True`` (GPT-J ``rotate_every_two``, GLM, diffusers' ``use_real_unbind_dim=-1``):
  element ``2i`` pairs with ``2i + 1``; ``cos``/``sin`` are given per element (repeated per pair),
  as those models pass them.
* :func:`apply_rotary_complex` (Llama 4, diffusers' ``use_real=False``): the pairs of the complex
  view ``view_as_complex(x.float().reshape(..., -1, 2))`` multiplied by ``freqs_cis``.

Partial rotary (``partial=True``: Phi, GPT-NeoX, StableLM, GLM, ...): the width of ``cos`` is the
rotary dimension and the rest of the head passes through unchanged, as in
``cat([rotate(x[..., :rotary_dim]), x[..., rotary_dim:]], -1)``. With ``partial=False`` (the
spelling without the split) ``cos`` must be as wide as the head.

``per_pair=True`` (GPT-OSS's chunked halves, DeepSeek's even/odd slices, Mochi): ``cos``/``sin``
hold one angle per pair (``rotary_dim / 2`` wide) instead of one per element.
``deinterleave=True`` (DeepSeek-V3's ``apply_rotary_pos_emb_interleave``, with
``interleaved=True, per_pair=True``): the pairs are read interleaved and written as halves,
``cat([x_even * cos - x_odd * sin, x_odd * cos + x_even * sin], -1)``.

``upcast=True`` (Cohere, diffusers) computes in float32 (``x.float()``) and casts the result
back to ``x``'s dtype, or keeps it in float32 with ``cast_back=False`` (ModernBERT, ESM,
ERNIE: ``x.float() * cos + rotate_half(x.float()) * sin``); otherwise the result has the dtype
``x * cos`` has.

On CUDA with Triton each direction is one Triton kernel (:mod:`adopter.kernels._triton_modern`,
float32 arithmetic, equal to float rounding).

Falls back to the original composite code under ``torch.jit`` / ``torch.fx`` tracing and
``torch.compile`` (which fuses it itself), when
``cos``/``sin`` need a gradient, for shapes where ``cos`` would broadcast ``x`` to a larger
shape, odd rotary widths, tensor subclasses, non-floating inputs and (complex form) ``freqs_cis``
other than complex64 or inputs other than 4-D.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import _triton_modern
from ._util import grad_needed, plain_tensors, runs_original

__all__ = [
    "apply_rotary",
    "apply_rotary_complex",
    "apply_rotary_complex_reference",
    "rotary",
    "rotary_complex",
    "rotary_complex_reference",
    "rotary_reference",
]


# --------------------------------------------------------------------------------------------
# The original spellings


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _rotate_per_pair(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, deinterleave: bool
) -> torch.Tensor:
    """The spellings with one angle per pair: the two elements of each pair rotated apart."""
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = torch.chunk(x, 2, dim=-1)
    first = x1 * cos - x2 * sin
    second = x2 * cos + x1 * sin
    if interleaved and not deinterleave:
        return torch.stack([first, second], dim=-1).flatten(-2)
    return torch.cat((first, second), dim=-1)


def rotary_reference(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    upcast: bool = False,
    partial: bool = False,
    per_pair: bool = False,
    deinterleave: bool = False,
    cast_back: bool = True,
) -> torch.Tensor:
    """The original composite code: ``x * cos + rotate(x) * sin`` (partial, upcast, per-pair
    angles, de-interleaved output)."""
    dtype = x.dtype
    if upcast:
        x = x.float()
    if per_pair:
        width = 2 * cos.shape[-1] if partial else x.shape[-1]
        rotated = _rotate_per_pair(x[..., :width], cos, sin, interleaved, deinterleave)
        out = torch.cat([rotated, x[..., width:]], dim=-1) if partial else rotated
        return out.to(dtype) if upcast and cast_back else out
    rotate = _rotate_every_two if interleaved else _rotate_half
    if partial:
        width = cos.shape[-1]
        x_rot, x_pass = x[..., :width], x[..., width:]
        out = torch.cat([(x_rot * cos) + (rotate(x_rot) * sin), x_pass], dim=-1)
    else:
        out = (x * cos) + (rotate(x) * sin)
    return out.to(dtype) if upcast and cast_back else out


def rotary_complex_reference(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """The original complex spelling of one tensor (Llama 4, DeepSeek-V2, diffusers'
    ``use_real=False``) with ``freqs_cis`` already broadcastable."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs_cis).flatten(3).type_as(x)


def apply_rotary_complex_reference(
    q: torch.Tensor, k: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The original complex spelling (Llama 4) with ``freqs_cis`` already broadcastable."""
    return rotary_complex_reference(q, freqs_cis), rotary_complex_reference(k, freqs_cis)


# --------------------------------------------------------------------------------------------
# The kernel


@dataclass(frozen=True)
class _Plan:
    """How one tensor is rotated: pair layout, rotary width and the dtypes involved."""

    interleaved: bool
    per_pair_angles: bool  # complex form: one cos/sin per pair instead of per element
    width: int
    compute: torch.dtype
    output: torch.dtype
    out_interleaved: bool | None = None  # the output's pair layout when it differs (DeepSeek)

    @property
    def written_interleaved(self) -> bool:
        return self.interleaved if self.out_interleaved is None else self.out_interleaved


def _pairs(t: torch.Tensor, interleaved: bool, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    if interleaved:
        return t[..., 0:width:2], t[..., 1:width:2]
    half = width // 2
    return t[..., :half], t[..., half:width]


def _angles(t: torch.Tensor, plan: _Plan) -> tuple[torch.Tensor, torch.Tensor]:
    if plan.per_pair_angles:
        return t, t
    return _pairs(t, plan.interleaved, plan.width)


def _rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    plan: _Plan,
    inverse: bool,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Rotate ``x`` by the angles (``inverse``: by their negatives, with the pair roles of
    the transposed rotation - the gradient of the forward rotation)."""
    xc = x.to(plan.compute)
    out = torch.empty(x.shape, dtype=plan.compute, device=x.device)
    # the gradient comes in the output's layout and goes out in the input's
    read, written = plan.interleaved, plan.written_interleaved
    if inverse:
        read, written = written, read
    x1, x2 = _pairs(xc, read, plan.width)
    o1, o2 = _pairs(out, written, plan.width)
    c1, c2 = _angles(cos, plan)
    s1, s2 = _angles(sin, plan)
    torch.mul(x1, c1, out=o1)
    torch.mul(x2, c2, out=o2)
    scratch = torch.mul(x2, s2 if inverse else s1)
    if inverse:
        o1.add_(scratch)
        o2.sub_(torch.mul(x1, s1, out=scratch))
    else:
        o1.sub_(scratch)
        o2.add_(torch.mul(x1, s2, out=scratch))
    del scratch
    if plan.width < x.shape[-1]:
        out[..., plan.width :].copy_(xc[..., plan.width :])
    return out if out.dtype == out_dtype else out.to(out_dtype)


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: _Plan
    ) -> torch.Tensor:
        ctx.plan = plan
        ctx.input_dtype = x.dtype
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin, plan, inverse=False, out_dtype=plan.output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors
        grad_x = _rotate(grad, cos, sin, ctx.plan, inverse=True, out_dtype=ctx.input_dtype)
        return grad_x, None, None, None


def _triton_rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    plan: _Plan,
    inverse: bool,
    out: torch.dtype,
) -> torch.Tensor:
    return _triton_modern.rotary(
        x.contiguous(), cos, sin, plan.width, plan.interleaved, plan.per_pair_angles, inverse, out
    )


class _TritonRotary(torch.autograd.Function):
    """The CUDA path: one Triton kernel per direction (:mod:`adopter.kernels._triton_modern`)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: _Plan
    ) -> torch.Tensor:
        ctx.plan, ctx.input_dtype = plan, x.dtype
        ctx.save_for_backward(cos, sin)
        return _triton_rotate(x, cos, sin, plan, False, plan.output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors
        return _triton_rotate(grad, cos, sin, ctx.plan, True, ctx.input_dtype), None, None, None


def _triton_layout(plan: _Plan) -> bool:
    """The layouts the Triton kernel is used for: one layout in and out, and per-pair angles
    only with interleaved pairs (the complex form)."""
    if plan.written_interleaved != plan.interleaved:
        return False
    return plan.interleaved or not plan.per_pair_angles


def _run(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: _Plan) -> torch.Tensor:
    if (
        _triton_layout(plan)
        and _triton_modern.usable(x)
        and _triton_modern.rotary_supported(x, cos, plan.output)
    ):
        try:
            if grad_needed(x):
                return _TritonRotary.apply(x, cos, sin, plan)
            return _triton_rotate(x, cos, sin, plan, False, plan.output)
        except Exception as exc:  # a Triton problem must not break the model
            _triton_modern.failed(exc)
    if grad_needed(x):
        return _Rotary.apply(x, cos, sin, plan)
    return _rotate(x, cos, sin, plan, inverse=False, out_dtype=plan.output)


def _angles_fit(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, width: int) -> bool:
    """``cos``/``sin`` broadcast into ``x[..., :width]`` without enlarging it."""
    if cos.shape != sin.shape or cos.dim() > x.dim() or width <= 0 or width > x.shape[-1]:
        return False
    target = (*x.shape[:-1], cos.shape[-1])
    try:
        return tuple(torch.broadcast_shapes(cos.shape, target)) == target
    except RuntimeError:
        return False


def _plan(
    x: Any,
    cos: Any,
    sin: Any,
    interleaved: bool,
    upcast: bool,
    partial: bool,
    per_pair: bool = False,
    deinterleave: bool = False,
    cast_back: bool = True,
) -> _Plan | None:
    if not all(isinstance(t, torch.Tensor) for t in (x, cos, sin)):
        return None
    if not plain_tensors(x, cos, sin) or grad_needed(cos, sin):
        return None
    if not (x.is_floating_point() and cos.is_floating_point() and sin.is_floating_point()):
        return None
    if x.dim() == 0 or x.numel() == 0 or cos.device != x.device or sin.device != x.device:
        return None
    if deinterleave and not (interleaved and per_pair):
        return None  # only the DeepSeek spelling reads pairs in one layout and writes another
    angles = cos.shape[-1] if cos.dim() else 0
    width = 2 * angles if per_pair else angles
    if width % 2 or not _angles_fit(x, cos, sin, width):
        return None
    if not partial and width != x.shape[-1]:
        return None
    angle_dtype = torch.promote_types(cos.dtype, sin.dtype)
    if upcast:
        compute = torch.promote_types(torch.float32, angle_dtype)
        output = x.dtype if cast_back else compute
    else:
        compute = torch.promote_types(x.dtype, angle_dtype)
        output = compute
    out_interleaved = False if deinterleave else None
    return _Plan(interleaved, per_pair, width, compute, output, out_interleaved)


def rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor | None = None,
    *,
    complex_pairs: bool = False,
    interleaved: bool = False,
    upcast: bool = False,
    partial: bool = False,
    per_pair: bool = False,
    deinterleave: bool = False,
    cast_back: bool = True,
) -> torch.Tensor:
    """``x * cos + rotate(x) * sin`` for one tensor, ``cos``/``sin`` already broadcastable to
    ``x[..., :rotary_dim]`` (``per_pair``: to ``x[..., :rotary_dim / 2]``; module docstring:
    layouts, ``upcast``, ``cast_back``, ``partial``, ``deinterleave``).

    ``complex_pairs=True``: ``cos`` is the complex ``freqs_cis`` (``cos + i sin``, one angle per
    interleaved pair) and ``sin`` is not given: :func:`rotary_complex`."""
    if complex_pairs:
        if sin is not None:
            raise TypeError("rotary(complex_pairs=True) takes freqs_cis in place of cos, no sin")
        return rotary_complex(x, cos)
    if sin is None:
        raise TypeError("rotary() needs sin unless complex_pairs=True")
    # Under torch.compile the reference: the half-size products write into views of one
    # buffer (``out=`` a non-contiguous tensor), which breaks Dynamo's graph; Inductor fuses
    # ``x * cos + rotate(x) * sin`` into one loop without the temporaries anyway.
    options = {
        "interleaved": interleaved,
        "upcast": upcast,
        "partial": partial,
        "per_pair": per_pair,
        "deinterleave": deinterleave,
        "cast_back": cast_back,
    }
    original = runs_original(x, cos, sin)
    plan = None if original else _plan(x, cos, sin, **options)
    if plan is None:
        return rotary_reference(x, cos, sin, **options)
    return _run(x, cos, sin, plan)


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int | None = 1,
    *,
    interleaved: bool = False,
    upcast: bool = False,
    partial: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_embed, k_embed)`` as transformers' ``apply_rotary_pos_emb(q, k, cos, sin,
    unsqueeze_dim)`` computes them: ``cos``/``sin`` are unsqueezed at ``unsqueeze_dim`` (``None``:
    used as given) and both tensors rotated."""
    if unsqueeze_dim is not None:
        cos = cos.unsqueeze(unsqueeze_dim)
        sin = sin.unsqueeze(unsqueeze_dim)
    options = {"interleaved": interleaved, "upcast": upcast, "partial": partial}
    return rotary(q, cos, sin, **options), rotary(k, cos, sin, **options)


def _complex_plan(x: Any, freqs_cis: Any) -> _Plan | None:
    if not isinstance(x, torch.Tensor) or not plain_tensors(x, freqs_cis):
        return None
    if freqs_cis.dtype != torch.complex64 or grad_needed(freqs_cis):
        return None
    if x.dim() != 4 or not x.is_floating_point() or x.numel() == 0 or x.shape[-1] % 2:
        return None
    if freqs_cis.device != x.device or freqs_cis.dim() > 4:
        return None
    pairs = (*x.shape[:-1], x.shape[-1] // 2)
    try:
        if tuple(torch.broadcast_shapes(freqs_cis.shape, pairs)) != pairs:
            return None
    except RuntimeError:
        return None
    return _Plan(True, True, x.shape[-1], torch.float32, x.dtype)


def apply_rotary_complex(
    q: torch.Tensor, k: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4's ``apply_rotary_emb(xq, xk, freqs_cis)`` after its indexing: the pairs
    ``(x[2i], x[2i+1])`` of 4-D ``q``/``k`` as complex numbers times ``freqs_cis``
    (complex64, broadcastable to ``(..., head_dim / 2)``), computed in float32 and returned in
    the inputs' dtypes."""
    return rotary_complex(q, freqs_cis), rotary_complex(k, freqs_cis)


def rotary_complex(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """``view_as_real(view_as_complex(x.float().reshape(..., -1, 2)) * freqs_cis).flatten(3)
    .type_as(x)`` for one 4-D tensor: the pairs ``(x[2i], x[2i+1])`` rotated by the angles of
    ``freqs_cis`` (complex64, broadcastable to ``(..., head_dim / 2)``) in float32, without the
    float32 copy, the complex product and its real view; returned in ``x``'s dtype."""
    if runs_original(x, freqs_cis):  # as rotary(): the reference under torch.compile
        return rotary_complex_reference(x, freqs_cis)
    plan = _complex_plan(x, freqs_cis)
    if plan is None:
        return rotary_complex_reference(x, freqs_cis)
    return _run(x, freqs_cis.real, freqs_cis.imag, plan)
