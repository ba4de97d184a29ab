"""Attention class factories that route eager attention through fused SDPA.

Each factory takes a model's own attention class and returns a subclass (built once per input
class and cached) that keeps ``__init__`` - hence the same parameters, buffers and
``state_dict`` keys - and replaces ``forward``. The new forward computes the projections as the
original does (self-attention Q/K/V through one concatenated GEMM via
:func:`adopter.kernels.qkv_projection`) and then calls
``torch.nn.functional.scaled_dot_product_attention``, which dispatches to FlashAttention /
memory-efficient / cuDNN kernels on CUDA and to the fused flash kernel on CPU: the
``(batch, heads, q_len, k_len)`` score and probability tensors are never materialised in HBM,
and the scale, mask add, softmax, dropout and second matmul happen in one kernel.

Fallback: whenever the fused path cannot reproduce the original exactly, the subclass calls the
original ``forward`` (``super().forward``) with the unchanged arguments. That covers
``output_attentions=True`` (probabilities must be returned), head masks, masks that are not a
floating tensor of the query dtype or that would broadcast the scores to a bigger shape,
non-standard dropout modules, and the model-specific cases listed with each factory.

Dropout: in training with attention-dropout ``p > 0`` SDPA draws its own dropout mask, so the
random stream (and therefore the exact mask for a given seed) differs from the original's
``nn.Dropout`` on the probabilities; the distribution is the same. In eval mode, or with
``p == 0``, results match the original up to float rounding.

Instances pickle and ``copy.deepcopy`` as the base class with the same state: a saved model
loads where Adopter is not installed, and loads (or copies) unfused where it is, until
``adopter.patch`` is called on it.
"""

from __future__ import annotations

import copyreg
import inspect
import math
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from ._util import cached, is_plain, tracing
from .linear import fused_linears, qkv_projection

__all__ = ["fused_bert_self_attention", "fused_gpt2_attention", "fused_t5_attention"]

T = TypeVar("T", bound=type)

_FUSED: dict[tuple[str, type], type] = {}
_LOCK = threading.Lock()
_FACTORIES: dict[str, Callable[[type], type]] = {}
_BASE_ATTR = "__adopter_fused_base__"


def _rebuild(kind: str, base: type) -> nn.Module:
    """Loads pickles written before fused instances reduced to their base class."""
    fused = _FACTORIES[kind](base)
    return fused.__new__(fused)


def _finish(kind: str, base: type, fused: type) -> type:
    fused.__name__ = f"Fused{base.__name__}"
    fused.__qualname__ = f"Fused{base.__qualname__}"
    fused.__module__ = base.__module__
    fused.__doc__ = (base.__doc__ or "") + (
        f"\n\n[adopter] forward routed through scaled_dot_product_attention ({kind})."
    )
    setattr(fused, _BASE_ATTR, base)

    def __reduce_ex__(self: nn.Module, protocol: int) -> tuple[Any, ...]:  # noqa: N807
        # copyreg's constructor (the standard library's) of the base class, with the state of
        # __getstate__: the pickle names no Adopter code at all. (``__newobj__`` would do, but
        # pickle insists that its class is the instance's own.)
        return (copyreg._reconstructor, (base, object, None), self.__getstate__())

    fused.__reduce_ex__ = __reduce_ex__  # type: ignore[method-assign]
    return fused


def _build(kind: str, cls: type, make: Callable[[type], type]) -> type:
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise TypeError(f"{kind} expects an nn.Module subclass, got {cls!r}")
    base = cls.__dict__.get(_BASE_ATTR)
    if base is not None and _FUSED.get((kind, base)) is cls:
        return cls  # already fused by this factory
    with _LOCK:
        fused = _FUSED.get((kind, cls))
        if fused is None:
            candidate = make(cls)
            unknown = _unknown_parameters(cls, candidate)
            if unknown:
                warnings.warn(
                    f"{kind}: {cls.__qualname__}.forward takes {', '.join(unknown)}, which the "
                    "fused forward was not written for; the original class is used unchanged",
                    RuntimeWarning,
                    stacklevel=3,
                )
                fused = cls
            else:
                fused = _finish(kind, cls, candidate)
            _FUSED[(kind, cls)] = fused
        return fused


def _unknown_parameters(base: type, fused: type) -> list[str]:
    """Parameters of ``base.forward`` that ``fused.forward`` would not take in the same place.

    The fused forwards follow one release's signature (transformers 4.34); a later release
    that adds a parameter (T5's ``cache_position``) or changes the order would otherwise get
    calls the fused code misreads, or rejects.
    """
    try:
        original = list(inspect.signature(base.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return ["an unreadable signature"]
    ours = [p.name for p in list(inspect.signature(fused.forward).parameters.values())[1:]]
    unknown = []
    for index, parameter in enumerate(original):
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            stars = "*" if parameter.kind is inspect.Parameter.VAR_POSITIONAL else "**"
            unknown.append(stars + parameter.name)
        elif parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            if parameter.name not in ours:
                unknown.append(parameter.name)
        elif index >= len(ours) or ours[index] != parameter.name:
            unknown.append(parameter.name)
    return unknown


def _dropout_p(module: Any) -> float | None:
    """Effective dropout probability of a dropout module, ``None`` if it is not a plain one."""
    if module is None or is_plain(module, nn.Identity):
        return 0.0
    if is_plain(module, nn.Dropout):
        return float(module.p) if module.training else 0.0
    return None


# PyTorch's CPU attention kernels support neither dropout nor a mask that needs a gradient:
# there ``scaled_dot_product_attention`` runs its unfused math path, the original's work plus
# the kernel's overhead, and keeps more for backward (docs/performance.md). In those cases the
# module's own code runs. The kernel tests switch this off to check the fused math on a CPU.
ORIGINAL_WHEN_UNFUSED_ON_CPU = True


def _unfused_on_cpu(
    dropout_p: float, hidden_states: torch.Tensor, mask_needs_grad: bool = False
) -> bool:
    """Whether SDPA would fall back to its unfused math path on this (CPU) input."""
    if not ORIGINAL_WHEN_UNFUSED_ON_CPU or hidden_states.device.type != "cpu":
        return False
    return dropout_p > 0 or (mask_needs_grad and torch.is_grad_enabled())


def _t5_bias_needs_grad(module: nn.Module, position_bias: torch.Tensor | None) -> bool:
    """Whether T5's additive mask (position bias + padding mask) will need a gradient."""
    if position_bias is not None:
        return position_bias.requires_grad
    if getattr(module, "has_relative_attention_bias", False):
        return bool(module.relative_attention_bias.weight.requires_grad)
    return bool(getattr(module, "gradient_checkpointing", False) and module.training)


def _mask_is_float(mask: object) -> bool:
    return mask is None or (isinstance(mask, torch.Tensor) and mask.is_floating_point())


_ZERO_CHECK_LOCK = threading.Lock()
_last_zero_check: tuple[weakref.ref[torch.Tensor], int, bool] | None = None


def _without_zero_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """``None`` for an additive mask that is all zeros, else ``mask``.

    Models build such a mask from an all-ones ``attention_mask`` (no padding). Adding zeros
    changes no score, but SDPA with any mask runs a slower kernel (on a CPU core about 25% more
    time for 512 tokens; on CUDA it rules out FlashAttention), and a causal model would need the
    causal part spelled out as a dense mask instead of ``is_causal``. The answer is remembered
    for the last mask seen (by identity and version): a model passes one mask to every layer,
    so the check - a reduction and, on a GPU, a host sync - runs once per forward.
    """
    global _last_zero_check
    if (
        mask is None
        or torch.compiler.is_compiling()  # a data-dependent branch would break the graph
        or not mask.is_floating_point()
        or (mask.requires_grad and torch.is_grad_enabled())  # its gradient is wanted
    ):
        return mask
    with _ZERO_CHECK_LOCK:
        last = _last_zero_check
        if last is not None and last[0]() is mask and last[1] == mask._version:
            zero = last[2]
        else:
            zero = bool(mask.eq(0).all())
            _last_zero_check = (weakref.ref(mask), mask._version, zero)
    return None if zero else mask


def _mask_for(mask: torch.Tensor | None, query: torch.Tensor) -> tuple[bool, torch.Tensor | None]:
    """``(ok, mask)`` with ``mask`` in the query dtype as SDPA requires.

    A dtype mismatch is only bridged under autocast (where the original's matmuls are cast
    anyway); otherwise it is reported as not ok so the original runs and promotes (or raises)
    exactly as before.
    """
    if mask is None:
        return True, None
    if mask.device != query.device:
        return False, None
    if mask.dtype == query.dtype:
        return True, mask
    if torch.is_autocast_enabled(query.device.type):
        return True, mask.to(query.dtype)
    return False, None


def _broadcasts_into(mask: torch.Tensor | None, shape: tuple[int, ...]) -> bool:
    if mask is None:
        return True
    if mask.dim() > len(shape):
        return False
    try:
        return tuple(torch.broadcast_shapes(mask.shape, shape)) == tuple(shape)
    except RuntimeError:
        return False


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    p: float,
    scale: float,
    is_causal: bool = False,
) -> torch.Tensor:
    # Looked up on the module at call time on purpose (profilers / tests may wrap it).
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal, scale=scale
    )


def _sdpa_mask(
    mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> tuple[bool, torch.Tensor | None]:
    """``(ok, mask)`` for SDPA over ``(batch, heads, len, dim)`` inputs: the mask in the
    query dtype (:func:`_mask_for`); not ok when it would broadcast the scores to a bigger
    shape or key / value have another dtype - cases only the original code handles."""
    ok, mask = _mask_for(mask, query)
    ok = (
        ok
        and _broadcasts_into(mask, (*query.shape[:3], key.shape[2]))
        and key.dtype == query.dtype
        and value.dtype == query.dtype
    )
    return ok, mask


def _checked_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    p: float,
    scale: float,
) -> torch.Tensor | None:
    """SDPA with an additive ``mask``, or ``None`` when :func:`_sdpa_mask` refuses it."""
    ok, mask = _sdpa_mask(mask, query, key, value)
    return _sdpa(query, key, value, mask, p, scale) if ok else None


def _bert_like_needs_original(
    module: nn.Module,
    hidden_states: torch.Tensor,
    mask: object,
    p: float | None,
    head_mask: object,
    output_attentions: object,
) -> bool:
    """The cases the fused forward of a BERT-style attention (BERT, ALBERT) leaves to the
    original code: returned probabilities, head masks, an opaque or CPU-unfused dropout,
    relative position embeddings, other than 3-D inputs, a mask that is not a float tensor."""
    return bool(
        tracing()
        or output_attentions
        or head_mask is not None
        or p is None
        or _unfused_on_cpu(p, hidden_states)
        or getattr(module, "position_embedding_type", "absolute") != "absolute"
        or hidden_states.dim() != 3
        or not _mask_is_float(mask)
    )


# --------------------------------------------------------------------------------------------
# BERT
# --------------------------------------------------------------------------------------------


def fused_bert_self_attention(cls: T) -> T:
    """Fused-SDPA subclass of a ``BertSelfAttention``-like class.

    Expected attributes: ``query``, ``key``, ``value`` (linear layers), ``dropout``,
    ``num_attention_heads``, ``attention_head_size``, ``all_head_size``,
    ``position_embedding_type``, ``is_decoder``; forward signature ``(hidden_states,
    attention_mask=None, head_mask=None, encoder_hidden_states=None,
    encoder_attention_mask=None, past_key_value=None, output_attentions=False)``.

    Fused: absolute position embeddings with self-attention, cross-attention (with or without
    cached encoder keys/values) and decoder self-attention with ``past_key_value``; the
    additive ``attention_mask`` (already containing the causal part for decoders, as BERT
    builds it) is passed to SDPA; decoder outputs carry ``past_key_value`` like the original.
    Falls back for ``output_attentions``, ``head_mask``, relative position embeddings
    (``relative_key``/``relative_key_query``), non-3-D hidden states and unsupported masks.
    """
    return _build("bert_self_attention", cls, _make_bert)  # type: ignore[return-value]


def _make_bert(base: type) -> type:
    class Fused(base):  # type: ignore[misc, valid-type]
        def forward(
            self,
            hidden_states: torch.Tensor,
            attention_mask: torch.Tensor | None = None,
            head_mask: torch.Tensor | None = None,
            encoder_hidden_states: torch.Tensor | None = None,
            encoder_attention_mask: torch.Tensor | None = None,
            past_key_value: tuple[torch.Tensor, ...] | None = None,
            output_attentions: bool | None = False,
        ) -> tuple[Any, ...]:
            def original() -> tuple[Any, ...]:
                return super(Fused, self).forward(
                    hidden_states,
                    attention_mask,
                    head_mask,
                    encoder_hidden_states,
                    encoder_attention_mask,
                    past_key_value,
                    output_attentions,
                )

            p = _dropout_p(getattr(self, "dropout", None))
            is_cross = encoder_hidden_states is not None
            mask = encoder_attention_mask if is_cross else attention_mask
            if _bert_like_needs_original(
                self, hidden_states, mask, p, head_mask, output_attentions
            ):
                return original()
            mask = _without_zero_mask(mask)

            split = self.transpose_for_scores
            if is_cross and past_key_value is not None:
                mixed_query = self.query(hidden_states)
                key_layer, value_layer = past_key_value[0], past_key_value[1]
            elif is_cross:
                mixed_query = self.query(hidden_states)
                k, v = fused_linears(encoder_hidden_states, (self.key, self.value))
                key_layer, value_layer = split(k), split(v)
            else:
                mixed_query, k, v = qkv_projection(hidden_states, self.query, self.key, self.value)
                key_layer, value_layer = split(k), split(v)
                if past_key_value is not None:
                    key_layer = torch.cat([past_key_value[0], key_layer], dim=2)
                    value_layer = torch.cat([past_key_value[1], value_layer], dim=2)
            query_layer = split(mixed_query)
            context = _checked_sdpa(
                query_layer,
                key_layer,
                value_layer,
                mask,
                p,
                1.0 / math.sqrt(self.attention_head_size),
            )
            if context is None:
                return original()
            context = context.permute(0, 2, 1, 3).contiguous()
            context = context.view(context.size()[:-2] + (self.all_head_size,))
            outputs: tuple[Any, ...] = (context,)
            if self.is_decoder:
                outputs = outputs + ((key_layer, value_layer),)
            return outputs

    return Fused


# --------------------------------------------------------------------------------------------
# T5
# --------------------------------------------------------------------------------------------


def fused_t5_attention(cls: T) -> T:
    """Fused-SDPA subclass of a ``T5Attention``-like class.

    Expected attributes: ``q``, ``k``, ``v``, ``o``, ``n_heads``, ``key_value_proj_dim``,
    ``inner_dim``, ``dropout`` (a float), ``is_decoder``, ``has_relative_attention_bias``,
    ``pruned_heads``, ``gradient_checkpointing`` and ``compute_bias``; forward signature
    ``(hidden_states, mask=None, key_value_states=None, position_bias=None,
    past_key_value=None, layer_head_mask=None, query_length=None, use_cache=False,
    output_attentions=False)`` returning ``(attn_output, present_key_value, position_bias)``.

    The relative position bias is computed by the class's own ``compute_bias`` (so it is
    trainable through SDPA's mask gradient), the padding/causal ``mask`` is added to it exactly
    as the original does, pruned heads are dropped from the bias, and it goes to SDPA as an
    additive float mask with ``scale=1.0`` (T5 does not scale scores). ``past_key_value`` /
    ``use_cache`` / cross-attention follow the original, including the prefix-tuning case where
    cached cross keys have a different length. Falls back for ``output_attentions`` and
    ``layer_head_mask``, and on a CPU while attention dropout is active or the position bias
    needs a gradient (training): CPU SDPA could only run its unfused math path there.
    """
    return _build("t5_attention", cls, _make_t5)  # type: ignore[return-value]


def _make_t5(base: type) -> type:
    class Fused(base):  # type: ignore[misc, valid-type]
        def forward(
            self,
            hidden_states: torch.Tensor,
            mask: torch.Tensor | None = None,
            key_value_states: torch.Tensor | None = None,
            position_bias: torch.Tensor | None = None,
            past_key_value: tuple[torch.Tensor, ...] | None = None,
            layer_head_mask: torch.Tensor | None = None,
            query_length: int | None = None,
            use_cache: bool = False,
            output_attentions: bool = False,
        ) -> tuple[Any, ...]:
            def original() -> tuple[Any, ...]:
                return super(Fused, self).forward(
                    hidden_states,
                    mask,
                    key_value_states,
                    position_bias,
                    past_key_value,
                    layer_head_mask,
                    query_length,
                    use_cache,
                    output_attentions,
                )

            drop = getattr(self, "dropout", None)
            if (
                tracing()
                or output_attentions
                or layer_head_mask is not None
                or not isinstance(drop, (int, float))
                or isinstance(drop, bool)
                or hidden_states.dim() != 3
                or (past_key_value is not None and len(past_key_value) != 2)
                or (mask is not None and not mask.is_floating_point())
                or _unfused_on_cpu(
                    float(drop) if self.training else 0.0,
                    hidden_states,
                    _t5_bias_needs_grad(self, position_bias),
                )
            ):
                return original()

            batch_size, seq_length = hidden_states.shape[:2]
            real_seq_length = seq_length
            if past_key_value is not None:
                real_seq_length += (
                    past_key_value[0].shape[2] if query_length is None else query_length
                )
            key_length = real_seq_length if key_value_states is None else key_value_states.shape[1]

            def shape(states: torch.Tensor) -> torch.Tensor:
                return states.view(batch_size, -1, self.n_heads, self.key_value_proj_dim).transpose(
                    1, 2
                )

            if key_value_states is None:
                q, k, v = qkv_projection(hidden_states, self.q, self.k, self.v)
                key_states, value_states = shape(k), shape(v)
                if past_key_value is not None:
                    key_states = torch.cat([past_key_value[0], key_states], dim=2)
                    value_states = torch.cat([past_key_value[1], value_states], dim=2)
            else:
                q = self.q(hidden_states)
                kv_len = key_value_states.shape[1]
                need_k = past_key_value is None or past_key_value[0].shape[2] != kv_len
                need_v = past_key_value is None or past_key_value[1].shape[2] != kv_len
                if need_k and need_v:
                    k, v = fused_linears(key_value_states, (self.k, self.v))
                    key_states, value_states = shape(k), shape(v)
                else:
                    key_states = shape(self.k(key_value_states)) if need_k else past_key_value[0]
                    value_states = shape(self.v(key_value_states)) if need_v else past_key_value[1]
            query_states = shape(q)
            scores_dtype = query_states.dtype

            if position_bias is None:
                if not self.has_relative_attention_bias:
                    position_bias = torch.zeros(
                        (1, self.n_heads, real_seq_length, key_length),
                        device=query_states.device,
                        dtype=scores_dtype,
                    )
                    if self.gradient_checkpointing and self.training:
                        position_bias.requires_grad = True
                else:
                    position_bias = self.compute_bias(
                        real_seq_length, key_length, device=query_states.device
                    )
                if past_key_value is not None:
                    position_bias = position_bias[:, :, -hidden_states.size(1) :, :]
                if mask is not None:
                    position_bias = position_bias + mask

            if self.pruned_heads:
                keep = torch.ones(position_bias.shape[1], dtype=torch.bool)
                keep[list(self.pruned_heads)] = False
                bias_masked = position_bias[:, keep.to(position_bias.device)]
            else:
                bias_masked = position_bias

            scores_shape = (
                query_states.shape[0],
                query_states.shape[1],
                query_states.shape[2],
                key_states.shape[2],
            )
            if (
                not _broadcasts_into(bias_masked, scores_shape)
                or not bias_masked.is_floating_point()
                or key_states.dtype != scores_dtype
            ):
                return original()
            attn_mask = bias_masked.to(scores_dtype)
            p = float(drop) if self.training else 0.0
            out = _sdpa(query_states, key_states, value_states, attn_mask, p, 1.0)
            attn_output = out.transpose(1, 2).contiguous().view(batch_size, -1, self.inner_dim)
            attn_output = self.o(attn_output)

            present = (key_states, value_states) if (self.is_decoder and use_cache) else None
            return (attn_output, present, position_bias)

    return Fused


# --------------------------------------------------------------------------------------------
# GPT-2
# --------------------------------------------------------------------------------------------


def _causal_buffer_is_tril(owner: nn.Module, bias: torch.Tensor) -> bool:
    if torch.compiler.is_compiling():
        # A data-dependent check would break the graph; the explicit-mask path is exact.
        return False

    def check() -> bool:
        return bool(torch.equal(bias, torch.tril(torch.ones_like(bias))))

    return cached(owner, "gpt2_causal_is_tril", [bias], None, check)


def _causal_attention_mask(
    owner: nn.Module,
    causal_buffer: object,
    mask: torch.Tensor | None,
    query: torch.Tensor,
    k_len: int,
) -> tuple[torch.Tensor | None, bool] | None:
    """``(attn_mask, is_causal)`` for SDPA from a model's boolean causal buffer and an additive
    padding ``mask``; ``None`` when the original code must run.

    The buffer slice ``[k-q:k, :k]`` is the mask (SDPA's own ``is_causal`` kernel once the
    buffer is verified lower-triangular and there is no padding), combined with padding as
    ``where(causal, 0, finfo.min) + mask``, which reproduces the original's ``where(causal,
    w, finfo.min) + mask`` value for value. A query that sees only padding runs the original:
    its outputs would agree, but the original's ``where`` stops the gradient of the hidden
    scores it spreads over, and an additive mask would not.
    """
    q_len = query.size(-2)
    if (
        not isinstance(causal_buffer, torch.Tensor)
        or causal_buffer.dtype != torch.bool
        or causal_buffer.dim() != 4
        or k_len > causal_buffer.size(-1)
        or q_len > k_len
    ):
        return None
    causal = causal_buffer[:, :, k_len - q_len : k_len, :k_len]
    if mask is None:
        if q_len == k_len and _causal_buffer_is_tril(owner, causal_buffer):
            return None, True
        return causal, False
    lowest = torch.finfo(query.dtype).min
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    floor = torch.full((), lowest, dtype=query.dtype, device=query.device)
    combined = torch.where(causal, zero, floor) + mask
    if bool((combined <= lowest).all(dim=-1).any()):
        return None
    return combined, False


def fused_gpt2_attention(cls: T) -> T:
    """Fused-SDPA subclass of a ``GPT2Attention``-like class.

    Expected attributes: ``c_attn`` (and ``q_attn`` for cross-attention), ``c_proj``,
    ``attn_dropout``, ``resid_dropout``, ``bias`` (boolean lower-triangular causal buffer),
    ``num_heads``, ``head_dim``, ``split_size``, ``scale_attn_weights``,
    ``scale_attn_by_inverse_layer_idx``, ``layer_idx``, ``reorder_and_upcast_attn``,
    ``is_cross_attention`` and the ``_split_heads``/``_merge_heads`` helpers; forward signature
    ``(hidden_states, layer_past=None, attention_mask=None, head_mask=None,
    encoder_hidden_states=None, encoder_attention_mask=None, use_cache=False,
    output_attentions=False)`` returning ``(attn_output, present)``.

    Causal masking: with no padding (no ``attention_mask``, or an all-zero one) and ``q_len ==
    k_len`` (and the ``bias`` buffer verified lower-triangular, checked once per buffer
    version) SDPA's ``is_causal`` kernel is used; otherwise the original's ``bias[...,
    k-q:k, :k]`` slice is the mask - boolean alone, or combined with the additive mask as
    ``where(causal, 0, finfo.min) + attention_mask``, which reproduces the original's
    ``where(causal, w, finfo.min) + attention_mask``. A batch with a query whose visible keys
    are all padding (left padding) runs the original: the values would agree, but the
    original's ``where`` blocks the gradient to the future keys such a query spreads its
    probability over. Scale is ``1/sqrt(head_dim)`` if
    ``scale_attn_weights``, further divided by ``layer_idx + 1`` if
    ``scale_attn_by_inverse_layer_idx``. Falls back for ``output_attentions``, ``head_mask``,
    ``reorder_and_upcast_attn`` and unsupported masks / buffers.
    """
    return _build("gpt2_attention", cls, _make_gpt2)  # type: ignore[return-value]


def _make_gpt2(base: type) -> type:
    class Fused(base):  # type: ignore[misc, valid-type]
        def forward(
            self,
            hidden_states: torch.Tensor,
            layer_past: tuple[torch.Tensor, ...] | None = None,
            attention_mask: torch.Tensor | None = None,
            head_mask: torch.Tensor | None = None,
            encoder_hidden_states: torch.Tensor | None = None,
            encoder_attention_mask: torch.Tensor | None = None,
            use_cache: bool | None = False,
            output_attentions: bool | None = False,
        ) -> tuple[Any, ...]:
            def original() -> tuple[Any, ...]:
                return super(Fused, self).forward(
                    hidden_states,
                    layer_past,
                    attention_mask,
                    head_mask,
                    encoder_hidden_states,
                    encoder_attention_mask,
                    use_cache,
                    output_attentions,
                )

            p = _dropout_p(getattr(self, "attn_dropout", None))
            is_cross = encoder_hidden_states is not None
            mask = encoder_attention_mask if is_cross else attention_mask
            if (
                tracing()
                or output_attentions
                or head_mask is not None
                or p is None
                or _unfused_on_cpu(p, hidden_states)
                or getattr(self, "reorder_and_upcast_attn", False)
                or (is_cross and not hasattr(self, "q_attn"))
                or (self.scale_attn_by_inverse_layer_idx and self.layer_idx is None)
                or hidden_states.dim() != 3
                or not _mask_is_float(mask)
            ):
                return original()
            mask = _without_zero_mask(mask)

            if is_cross:
                query = self.q_attn(hidden_states)
                key, value = self.c_attn(encoder_hidden_states).split(self.split_size, dim=2)
            else:
                query, key, value = self.c_attn(hidden_states).split(self.split_size, dim=2)
            query = self._split_heads(query, self.num_heads, self.head_dim)
            key = self._split_heads(key, self.num_heads, self.head_dim)
            value = self._split_heads(value, self.num_heads, self.head_dim)
            if layer_past is not None:
                past_key, past_value = layer_past
                key = torch.cat((past_key, key), dim=-2)
                value = torch.cat((past_value, value), dim=-2)
            present = (key, value) if use_cache is True else None

            k_len = key.size(-2)
            ok, mask = _sdpa_mask(mask, query, key, value)
            if not ok:
                return original()

            is_causal = False
            attn_mask = mask
            if not self.is_cross_attention:
                causal = _causal_attention_mask(self, self.bias, mask, query, k_len)
                if causal is None:
                    return original()
                attn_mask, is_causal = causal

            scale = 1.0
            if self.scale_attn_weights:
                scale = 1.0 / math.sqrt(value.size(-1))
            if self.scale_attn_by_inverse_layer_idx:
                scale = scale / float(self.layer_idx + 1)

            attn_output = _sdpa(query, key, value, attn_mask, p, scale, is_causal=is_causal)
            attn_output = self._merge_heads(attn_output, self.num_heads, self.head_dim)
            attn_output = self.c_proj(attn_output)
            attn_output = self.resid_dropout(attn_output)
            return (attn_output, present)

    return Fused


_FACTORIES.update(
    bert_self_attention=fused_bert_self_attention,
    t5_attention=fused_t5_attention,
    gpt2_attention=fused_gpt2_attention,
)
