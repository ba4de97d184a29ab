"""Attention *functions* (transformers 5 ``eager_attention_forward``, timm's and diffusers'
unfused paths) routed through ``scaled_dot_product_attention``.

The unfused original materialises the ``(batch, heads, q_len, k_len)`` scores, the mask sum,
the probabilities (in float32, then cast back) and, in training, the dropout output, and keeps
most of them for backward. ``scaled_dot_product_attention`` computes the same result without
them (on a CPU with its fused flash kernel: about 4x faster forward+backward at 512 tokens).

Two entries, one per calling convention:

:func:`attention_function` - ``eager_attention_forward(module, query, key, value,
attention_mask, scaling, dropout=0.0, **kwargs)`` of transformers 5: ``(batch, heads, len,
head_dim)`` inputs, grouped-query keys/values repeated ``module.num_key_value_groups`` times,
``softmax(..., dtype=float32).to(query.dtype)``, dropout active when ``module.training``;
returns ``(attn_output transposed to (batch, len, heads, head_dim), attn_weights)``.

:func:`scaled_attention` - ``softmax(q @ k^T * scale + mask) @ v`` as timm's ``Attention``
(``fused_attn=False``: the query is scaled before the product) and diffusers' ``AttnProcessor``
(``get_attention_scores`` + ``bmm``, with ``upcast_attention`` / ``upcast_softmax``) write it;
returns the product in the inputs' layout.

When the fused path runs, the attention weights are not computed: :func:`attention_function`
returns ``None`` in their place. So the original code runs (and returns the weights) whenever
they may be used: ``output_attentions`` in the keyword arguments or the module's config, or
any hook on the module (transformers records attentions through forward hooks). It also runs
for everything SDPA cannot reproduce exactly:

* masks that are not a floating tensor of the query dtype or that would broadcast the scores
  to a larger shape (a boolean mask is *added* by the original, which SDPA would read as
  "keep/drop"), masks with a query row whose every key is masked (``<= finfo.min / 2``: the
  original then averages the values uniformly, SDPA does not), keys/values of another dtype,
  inputs that are not 4-D (3-D for :func:`scaled_attention`), tensor subclasses, autocast;
* dropout on a CPU, and a mask that needs a gradient on a CPU: SDPA would run its unfused math
  path there (no faster) and, for dropout, draw its own mask - the original draws exactly the
  random numbers ``nn.functional.dropout`` draws, so training on a CPU stays bit-reproducible;
* ``torch.jit`` / ``torch.fx`` tracing.

Dropout on other devices is handed to SDPA (``dropout_p``), which draws its own mask: same
distribution, other random numbers for a given seed (recorded in
:mod:`adopter.kernels.rng`, so verification compares those runs without dropout).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import attention as _attention
from . import backends
from ._util import HALF_DTYPES, has_hooks, plain_tensors, tracing

__all__ = [
    "attention_function",
    "attention_call_reference",
    "attention_function_reference",
    "attention_weights_needed",
    "scaled_attention",
    "scaled_attention_reference",
]


# --------------------------------------------------------------------------------------------
# The original spellings


def _repeat_kv(hidden: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, kv_heads, length, dim = hidden.shape
    if n_rep == 1:
        return hidden
    hidden = hidden[:, :, None, :, :].expand(batch, kv_heads, n_rep, length, dim)
    return hidden.reshape(batch, kv_heads * n_rep, length, dim)


def attention_function_reference(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    *,
    repeat_kv: bool = True,
    softmax_dtype: torch.dtype | None = torch.float32,
    slice_mask: bool = False,
    transpose_last: bool = False,
    position_bias: torch.Tensor | None = None,
    weights_to_value_dtype: bool = False,
    contiguous: bool = True,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``eager_attention_forward`` in the spelling the options describe."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    if repeat_kv:
        key = _repeat_kv(key, module.num_key_value_groups)
        value = _repeat_kv(value, module.num_key_value_groups)
    key_t = key.transpose(-1, -2) if transpose_last else key.transpose(2, 3)
    attn_weights = torch.matmul(query, key_t) * scaling
    if softcap is not None:
        attn_weights = attn_weights / softcap
        attn_weights = torch.tanh(attn_weights)
        attn_weights = attn_weights * softcap
    if position_bias is not None:
        attn_weights = attn_weights + position_bias
    if attention_mask is not None:
        if slice_mask:
            attention_mask = attention_mask[:, :, :, : key.shape[-2]]
        attn_weights = attn_weights + attention_mask
    if softmax_dtype is None:
        attn_weights = F.softmax(attn_weights, dim=-1)
    else:
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=softmax_dtype).to(query.dtype)
    if weights_to_value_dtype:
        attn_weights = attn_weights.type(value.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    attn_output = attn_output.transpose(1, 2)
    return (attn_output.contiguous() if contiguous else attn_output), attn_weights


def _apply_dropout(
    probs: torch.Tensor, dropout: nn.Module | float | None, training: bool
) -> torch.Tensor:
    if dropout is None:
        return probs
    if isinstance(dropout, nn.Module):
        return dropout(probs)
    return F.dropout(probs, p=float(dropout), training=training)


def self_attention_bias(
    length: int, like: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool
) -> torch.Tensor | None:
    """The additive bias SDPA applies for self-attention over ``length`` tokens, in the dtype
    and on the device of ``like`` (the scores): causal (which takes precedence over the mask)
    is ``-inf`` above the diagonal, a boolean mask keeps where ``True``, a float mask is added
    as it is (timm's ``resolve_self_attn_mask``)."""
    if is_causal:
        return like.new_full((length, length), float("-inf")).triu_(1)
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros_like(attn_mask, dtype=like.dtype)
        return bias.masked_fill_(~attn_mask, float("-inf"))
    return attn_mask


def scaled_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    dropout: nn.Module | float | None = None,
    training: bool = False,
    scale_query: bool = False,
    upcast_qk: bool = False,
    softmax_dtype: torch.dtype | None = None,
    self_attn_len: int | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """``softmax(q @ k^T * scale + mask) @ v`` as timm / diffusers write it; with
    ``self_attn_len`` the mask is ``self_attention_bias(self_attn_len, scores, attn_mask,
    is_causal)``."""
    if scale is None:
        scale = query.size(-1) ** -0.5
    dtype = query.dtype
    if upcast_qk:
        query, key = query.float(), key.float()
    if scale_query:
        scores = (query * scale) @ key.transpose(-2, -1)
    else:
        scores = (query @ key.transpose(-2, -1)) * scale
    if self_attn_len is not None:
        attn_mask = self_attention_bias(self_attn_len, scores, attn_mask, is_causal)
    if attn_mask is not None:
        scores = scores + attn_mask
    probs = scores.softmax(dim=-1) if softmax_dtype is None else scores.softmax(-1, softmax_dtype)
    probs = _apply_dropout(probs.to(dtype), dropout, training)
    return probs @ value


def attention_call_reference(call: AttentionCall) -> torch.Tensor:
    """The original computation of a backend call (eager attention with the shared key/value
    heads repeated), in ``(batch, heads, len, head_dim)`` as the backends return it."""
    key, value = _repeat_kv(call.key, call.groups), _repeat_kv(call.value, call.groups)
    return scaled_attention_reference(
        call.query, key, value, call.mask, scale=call.scale, dropout=call.dropout,
        training=bool(call.dropout), softmax_dtype=torch.float32,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Decisions


def attention_weights_needed(module: object, kwargs: dict[str, Any] | None = None) -> bool:
    """Whether the attention weights of ``module``'s call may be used by someone.

    True when ``output_attentions`` is requested in ``kwargs`` or in ``module.config``, or when
    the module has hooks (transformers 5 collects attentions with forward hooks on the
    attention modules).
    """
    if kwargs and kwargs.get("output_attentions"):
        return True
    config = getattr(module, "config", None)
    if config is not None and getattr(config, "output_attentions", False):
        return True
    return isinstance(module, nn.Module) and has_hooks(module)


def _dropout_probability(dropout: nn.Module | float | None, training: bool) -> float | None:
    """Active drop probability, ``None`` for a dropout module the kernel does not know."""
    if dropout is None:
        return 0.0
    if isinstance(dropout, nn.Module):
        return _attention._dropout_p(dropout)
    p = float(dropout)
    return p if training else 0.0


def _sdpa_inputs_ok(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: Any,
    p: float | None,
    dims: int,
) -> bool:
    tensors = (query, key, value)
    if p is None or not all(isinstance(t, torch.Tensor) for t in tensors):
        return False
    if mask is not None and not isinstance(mask, torch.Tensor):
        return False
    if not plain_tensors(query, key, value, mask) or query.dim() != dims:
        return False
    if key.dim() != dims or value.dim() != dims or not query.is_floating_point():
        return False
    if query.numel() == 0 or key.shape[-2] == 0:
        return False
    if torch.is_autocast_enabled(query.device.type):
        return False
    if mask is not None and not mask.is_floating_point():
        return False
    if query.device.type == "cpu" and _attention.ORIGINAL_WHEN_UNFUSED_ON_CPU:
        mask_grad = mask is not None and mask.requires_grad and torch.is_grad_enabled()
        if p > 0 or mask_grad:
            return False
    return True


_MASK_CHECK_LOCK = threading.Lock()
_last_mask_check: tuple[weakref.ref[torch.Tensor], int, bool] | None = None


def _has_fully_masked_row(mask: torch.Tensor) -> bool:
    """Whether some query row of the additive ``mask`` masks every key.

    The original adds ``finfo.min`` to every score of such a row; they all round to
    ``finfo.min`` and the softmax becomes uniform, which SDPA does not reproduce. Remembered
    for the last mask seen (identity and version): a model hands one mask to every layer.
    """
    global _last_mask_check
    with _MASK_CHECK_LOCK:
        last = _last_mask_check
        if last is not None and last[0]() is mask and last[1] == mask._version:
            return last[2]
        threshold = torch.finfo(mask.dtype).min / 2
        found = bool((mask.detach().amax(-1) <= threshold).any())
        _last_mask_check = (weakref.ref(mask), mask._version, found)
        return found


def _sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    p: float,
    scale: float,
    groups: int,
) -> torch.Tensor | None:
    """SDPA over 4-D inputs, ``None`` when the mask or dtypes do not fit."""
    ok, mask = _attention._sdpa_mask(mask, query, key, value)
    if not ok:
        return None
    if mask is not None:
        if torch.compiler.is_compiling() or _has_fully_masked_row(mask):
            return None  # a data-dependent check cannot go into a compiled graph
        mask = _attention._without_zero_mask(mask)
    call = AttentionCall(query, key, value, mask, p, scale, groups)
    return backends.run(OP, BACKENDS, bucket, call, query.device.type, query.dtype, lambda: None)


# --------------------------------------------------------------------------------------------
# Backends (adopter.kernels.backends): every call has 4-D ``(batch, heads, len, head_dim)``
# inputs SDPA reproduces the original for (the checks above); none accepting it runs the
# original spelling (the caller's).

OP = "attention"


@dataclass(frozen=True)
class AttentionCall:
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: torch.Tensor | None
    dropout: float
    scale: float
    groups: int  # key/value heads are shared by this many query heads


def bucket(call: AttentionCall) -> str:
    return f"d{call.query.shape[-1]}-s{backends.pow2(call.key.shape[-2])}"


def _run_sdpa(call: AttentionCall) -> torch.Tensor:
    extra = {"enable_gqa": True} if call.groups > 1 else {}
    return F.scaled_dot_product_attention(
        call.query,
        call.key,
        call.value,
        attn_mask=call.mask,
        dropout_p=call.dropout,
        scale=call.scale,
        **extra,
    )


def _run_sdpa_math(call: AttentionCall) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return _run_sdpa(call)


def _flash_attn_accepts(call: AttentionCall) -> bool:
    """flash-attn: CUDA, half precision, no mask (it takes none), no dropout (it draws its own
    mask, unlike SDPA's), head size a multiple of 8 up to 256, query len = key len."""
    q, k = call.query, call.key
    if not q.is_cuda or q.dtype not in HALF_DTYPES:
        return False
    if call.mask is not None or call.dropout or q.shape[-1] % 8 or q.shape[-1] > 256:
        return False
    return k.dtype == q.dtype and call.value.dtype == q.dtype


def _run_flash_attn(call: AttentionCall) -> torch.Tensor:
    from flash_attn import flash_attn_func

    q, k, v = (t.transpose(1, 2) for t in (call.query, call.key, call.value))
    out = flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=call.scale, causal=False)
    return out.transpose(1, 2)


BACKENDS: tuple[backends.Backend, ...] = (
    backends.Backend(
        "torch",
        lambda call: True,
        _run_sdpa,
        compiles=True,
        summary="torch.nn.functional.scaled_dot_product_attention (its own kernel choice)",
    ),
    backends.Backend(
        "torch_math",
        lambda call: True,
        _run_sdpa_math,
        summary="scaled_dot_product_attention restricted to its math kernel",
    ),
    backends.Backend(
        "flash_attn",
        _flash_attn_accepts,
        _run_flash_attn,
        devices=frozenset({"cuda"}),
        requires="flash_attn",
        summary="flash-attn's flash_attn_func",
    ),
)


# --------------------------------------------------------------------------------------------
# Entries


def attention_function(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    *,
    repeat_kv: bool = True,
    softmax_dtype: torch.dtype | None = torch.float32,
    slice_mask: bool = False,
    transpose_last: bool = False,
    position_bias: torch.Tensor | None = None,
    weights_to_value_dtype: bool = False,
    contiguous: bool = True,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers 5 ``eager_attention_forward`` through SDPA.

    Args:
        module: the attention module (``training``, ``num_key_value_groups``, hooks, config).
        query, key, value: ``(batch, heads, len, head_dim)``; key/value may have
            ``heads / module.num_key_value_groups`` heads.
        attention_mask: additive float mask broadcastable to the scores, or ``None``.
        scaling: score scale; ``None`` means ``query.size(-1) ** -0.5``.
        dropout: drop probability on the probabilities, active when ``module.training``.
        repeat_kv: the spelling repeats keys/values ``module.num_key_value_groups`` times
            (Llama family); ``False`` for the spellings without it (BERT family).
        softmax_dtype: ``torch.float32`` for ``softmax(..., dtype=float32).to(query.dtype)``,
            ``None`` for a softmax in the scores' dtype.
        slice_mask: the spelling slices the mask to the key length first.
        transpose_last: the spelling transposes the key as ``key.transpose(-1, -2)`` (CLIP)
            rather than ``key.transpose(2, 3)``; the same for the 4-D inputs SDPA takes, and
            the original runs for any other.
        position_bias: an additive bias added to the scores before the mask (T5), or ``None``.
            SDPA gets ``position_bias + attention_mask`` as its one additive mask.
        weights_to_value_dtype: the spelling casts the probabilities to the value's dtype
            (``attn_weights.type(value.dtype)``, GPT-2); SDPA runs only when the two agree.
        contiguous: the spelling ends with ``.contiguous()`` after the transpose back; without
            it (GPT-2) the output is the transposed view, with the same values.
        softcap: the scores' soft cap (``tanh(scores / cap) * cap`` after the scale: Gemma 2,
            which sets it); SDPA has no such step, so the original runs when it is given and
            SDPA only where it is ``None`` (Gemma 3 and 4, whose configurations leave it unset).
        kwargs: the caller's remaining keyword arguments; only ``output_attentions`` is read.

    Returns ``(attn_output, attn_weights)``; ``attn_weights`` is ``None`` when SDPA ran.
    """
    options = {
        "repeat_kv": repeat_kv,
        "softmax_dtype": softmax_dtype,
        "slice_mask": slice_mask,
        "transpose_last": transpose_last,
        "position_bias": position_bias,
        "weights_to_value_dtype": weights_to_value_dtype,
        "contiguous": contiguous,
        "softcap": softcap,
    }

    def original() -> tuple[torch.Tensor, torch.Tensor]:
        return attention_function_reference(
            module, query, key, value, attention_mask, scaling, dropout, **options
        )

    if tracing(query, key, value, attention_mask) or attention_weights_needed(module, kwargs):
        return original()
    if softcap is not None:
        return original()
    p = float(dropout) if module.training else 0.0
    if not _sdpa_inputs_ok(query, key, value, attention_mask, p, 4):
        return original()
    groups = int(getattr(module, "num_key_value_groups", 1)) if repeat_kv else 1
    if groups < 1 or key.shape[1] * groups != query.shape[1] or value.shape[1] != key.shape[1]:
        return original()
    mask = attention_mask
    if mask is not None and slice_mask:
        mask = mask[:, :, :, : key.shape[-2]]
    if position_bias is not None:
        if not _sdpa_inputs_ok(query, key, value, position_bias, p, 4):
            return original()
        # one additive mask: the bias first, as the original adds it first
        mask = position_bias if mask is None else position_bias + mask
    scale = query.size(-1) ** -0.5 if scaling is None else float(scaling)
    out = _sdpa(query, key, value, mask, p, scale, groups)
    if out is None:
        return original()
    out = out.transpose(1, 2)
    return (out.contiguous() if contiguous else out), None


def scaled_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    dropout: nn.Module | float | None = None,
    training: bool = False,
    scale_query: bool = False,
    upcast_qk: bool = False,
    softmax_dtype: torch.dtype | None = None,
    scores_of: nn.Module | None = None,
    self_attn_len: int | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """``softmax(q @ k^T * scale + attn_mask) @ v`` through SDPA (timm, diffusers).

    Args:
        query, key, value: ``(..., len, head_dim)`` with 3 (diffusers' ``(batch * heads, len,
            dim)``) or 4 dimensions.
        attn_mask: additive float mask broadcastable to the scores, or ``None``.
        scale: score scale; ``None`` means ``query.size(-1) ** -0.5``.
        dropout: ``nn.Dropout`` module (timm's ``attn_drop``), a probability used when
            ``training``, or ``None``.
        scale_query: the spelling scales the query before the product (timm).
        upcast_qk: query and key are cast to float32 first (diffusers' ``upcast_attention``).
        softmax_dtype: ``torch.float32`` when the scores are upcast for the softmax
            (diffusers' ``upcast_softmax``); the probabilities return to the query's dtype.
        scores_of: the spelling is ``torch.bmm(scores_of.get_attention_scores(query, key,
            attn_mask), value)`` (diffusers' eager processors: ``AttnProcessor``, the sliced,
            added-KV, IP-adapter and custom-diffusion ones), over ``(batch * heads, len,
            head_dim)`` inputs. That method computes ``softmax(baddbmm(mask, q, k^T,
            alpha=scale))`` with the module's ``scale``, ``upcast_attention`` and
            ``upcast_softmax``, which the kernel reads (the other settings are not used); the
            original is the module's own method, run whenever SDPA cannot reproduce it (as
            above), and also when the method is replaced on the instance (attention-map tools
            patch it), the settings are not a number and two flags, or the module has hooks.
        self_attn_len, is_causal: the spelling builds the mask from ``(attn_mask, is_causal)``
            as SDPA reads them, for self-attention over ``self_attn_len`` tokens (timm's
            ``resolve_self_attn_mask(N, scores, attn_mask, is_causal)``, which reads the scores
            only for their dtype and device; see :func:`self_attention_bias`). The fused path
            builds the same bias in the query's dtype, so it runs only when the scores have that
            dtype (a number as ``scale``, no ``upcast_qk``) and the query and key lengths are
            ``self_attn_len``; a bias with a fully masked row (``-inf`` everywhere: the
            original's softmax is NaN there) runs the original.
    """
    if scores_of is not None:
        return _processor_attention(scores_of, query, key, value, attn_mask)
    options = {
        "scale": scale,
        "dropout": dropout,
        "training": training,
        "scale_query": scale_query,
        "upcast_qk": upcast_qk,
        "softmax_dtype": softmax_dtype,
        "self_attn_len": self_attn_len,
        "is_causal": is_causal,
    }

    def original() -> torch.Tensor:
        return scaled_attention_reference(query, key, value, attn_mask, **options)

    if tracing(query, key, value, attn_mask):
        return original()
    mask = attn_mask
    if self_attn_len is not None:
        mask = _fused_self_attention_bias(
            query, key, attn_mask, scale, upcast_qk, self_attn_len, is_causal
        )
        if mask is False:
            return original()
    p = _dropout_probability(dropout, training)
    out = _scaled_sdpa(query, key, value, mask, scale, p, upcast_qk)
    return original() if out is None else out


def _fused_self_attention_bias(
    query: torch.Tensor,
    key: torch.Tensor,
    attn_mask: torch.Tensor | None,
    scale: float | None,
    upcast_qk: bool,
    length: int,
    is_causal: bool,
) -> torch.Tensor | None | bool:
    """The bias the original builds from its scores, built from the query instead; ``False``
    where that may differ (scores of another dtype, lengths other than ``length``)."""
    if upcast_qk or isinstance(scale, bool) or not isinstance(scale, (int, float, type(None))):
        return False  # a tensor scale may promote the scores to another dtype
    if not isinstance(query, torch.Tensor) or not isinstance(key, torch.Tensor):
        return False
    if query.dim() < 2 or key.dim() < 2 or query.dtype != key.dtype:
        return False
    if isinstance(length, bool) or not isinstance(length, int):
        return False
    if query.shape[-2] != length or key.shape[-2] != length:
        return False
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        return False
    return self_attention_bias(length, query, attn_mask, is_causal)


def _scaled_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    scale: float | None,
    p: float | None,
    upcast_qk: bool,
) -> torch.Tensor | None:
    """SDPA over 3-D or 4-D ``(..., len, head_dim)`` inputs, ``None`` where it cannot
    reproduce ``softmax(q @ k^T * scale + attn_mask) @ v``."""
    dims = query.dim() if isinstance(query, torch.Tensor) else 0
    if dims not in (3, 4) or not _sdpa_inputs_ok(query, key, value, attn_mask, p, dims):
        return None
    if isinstance(scale, torch.Tensor):
        return None  # a learned or per-head scale (XCiT's temperature): SDPA takes a number
    if upcast_qk and query.dtype != torch.float32:
        return None  # the upcast product would be rounded back to the query dtype
    lift = dims == 3  # SDPA's CPU flash kernel wants (batch, heads, len, dim)
    q, k, v = (t.unsqueeze(0) if lift else t for t in (query, key, value))
    mask = attn_mask
    if lift and mask is not None:
        if mask.dim() > 3:
            return None
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    scale_value = query.size(-1) ** -0.5 if scale is None else float(scale)
    out = _sdpa(q, k, v, mask, float(p or 0.0), scale_value, 1)
    if out is None:
        return None
    return out.squeeze(0) if lift else out


def _scores_settings(attn: object) -> tuple[float, bool, bool] | None:
    """``(scale, upcast_attention, upcast_softmax)`` of a diffusers-style attention module whose
    ``get_attention_scores`` the kernel may compute itself, ``None`` otherwise: the method
    replaced on the instance (attention-map tools patch it), settings that are not plain
    numbers and flags, or hooks on the module."""
    if not isinstance(attn, nn.Module) or "get_attention_scores" in vars(attn):
        return None
    scale = getattr(attn, "scale", None)
    upcast_qk = getattr(attn, "upcast_attention", None)
    upcast_softmax = getattr(attn, "upcast_softmax", None)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        return None
    if not isinstance(upcast_qk, bool) or not isinstance(upcast_softmax, bool):
        return None
    if has_hooks(attn):
        return None
    return float(scale), upcast_qk, upcast_softmax


def _processor_attention(
    attn: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
) -> torch.Tensor:
    """``torch.bmm(attn.get_attention_scores(query, key, attention_mask), value)``."""

    def original() -> torch.Tensor:
        return torch.bmm(attn.get_attention_scores(query, key, attention_mask), value)

    if tracing(query, key, value, attention_mask):
        return original()
    settings = _scores_settings(attn)
    if settings is None:
        return original()
    # upcast_softmax: SDPA's softmax already accumulates in float32
    scale, upcast_qk, _ = settings
    out = _scaled_sdpa(query, key, value, attention_mask, scale, 0.0, upcast_qk)
    return original() if out is None else out
