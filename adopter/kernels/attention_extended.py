"""Fused-SDPA attention for the classes of the ``extended`` rule set.

The paper's rules rewrite the attention of BERT, T5 and GPT-2 only; these factories do the same
for DistilBERT's ``MultiHeadSelfAttention``, ALBERT's ``AlbertAttention`` and GPT-Neo's
``GPTNeoSelfAttention`` (RoBERTa's ``RobertaSelfAttention`` is a verbatim copy of BERT's and
uses :func:`adopter.kernels.fused_bert_self_attention`). They follow the conventions of
:mod:`adopter.kernels.attention`: a cached subclass that keeps ``__init__`` (so the same
``state_dict``), replaces ``forward``, and calls the original ``forward`` whenever the fused path
could not reproduce it - returned attention probabilities, head masks, masks of an unexpected
kind, and on a CPU while attention dropout is active (PyTorch's CPU kernel has no fused dropout).
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import torch

from ._util import tracing
from .attention import (
    _FACTORIES,
    _bert_like_needs_original,
    _build,
    _causal_attention_mask,
    _checked_sdpa,
    _dropout_p,
    _mask_is_float,
    _sdpa,
    _sdpa_mask,
    _unfused_on_cpu,
    _without_zero_mask,
)
from .linear import fused_linears, qkv_projection
from .norm import dropout_add_layer_norm

__all__ = [
    "fused_albert_attention",
    "fused_distilbert_attention",
    "fused_gpt_neo_self_attention",
]

T = TypeVar("T", bound=type)


def _projections(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, names: tuple[str, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three input projections, sharing one GEMM where their inputs are the same tensor."""
    q_lin, k_lin, v_lin = (getattr(module, name) for name in names)
    if query is key and key is value:
        return qkv_projection(query, q_lin, k_lin, v_lin)
    if key is value:
        k, v = fused_linears(key, (k_lin, v_lin))
        return q_lin(query), k, v
    return q_lin(query), k_lin(key), v_lin(value)


# --------------------------------------------------------------------------------------------
# DistilBERT
# --------------------------------------------------------------------------------------------


def fused_distilbert_attention(cls: T) -> T:
    """Fused-SDPA subclass of a DistilBERT ``MultiHeadSelfAttention``-like class.

    Expected attributes: ``q_lin``, ``k_lin``, ``v_lin``, ``out_lin``, ``dropout``,
    ``n_heads``, ``dim``; forward signature ``(query, key, value, mask, head_mask=None,
    output_attentions=False)`` returning ``(context,)``.

    The original turns the ``(batch, k_len)`` 0/1 padding ``mask`` into ``masked_fill(mask == 0,
    finfo.min)`` on the scores; here it becomes the additive mask ``finfo.min`` where ``mask ==
    0`` (a score plus ``finfo.min`` rounds to ``finfo.min``, so the probabilities are the same).
    Self-attention (``query is key is value``) projects with one GEMM. Falls back for
    ``output_attentions``, ``head_mask``, a mask of another shape, and a batch holding a
    sequence that is all padding (its outputs would agree, but ``masked_fill`` stops the
    gradient of those scores and an additive mask does not).
    """
    return _build("distilbert_attention", cls, _make_distilbert)  # type: ignore[return-value]


def _make_distilbert(base: type) -> type:
    class Fused(base):  # type: ignore[misc, valid-type]
        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            mask: torch.Tensor,
            head_mask: torch.Tensor | None = None,
            output_attentions: bool = False,
        ) -> tuple[Any, ...]:
            def original() -> tuple[Any, ...]:
                return super(Fused, self).forward(
                    query, key, value, mask, head_mask, output_attentions
                )

            p = _dropout_p(getattr(self, "dropout", None))
            if (
                tracing()
                or output_attentions
                or head_mask is not None
                or p is None
                or _unfused_on_cpu(p, query)
                or query.dim() != 3
                or key.dim() != 3
                or not isinstance(mask, torch.Tensor)
                or mask.shape != (query.size(0), key.size(1))
                or mask.device != query.device
                or not query.is_floating_point()
            ):
                return original()

            bs = query.size(0)
            k_length = key.size(1)
            dim_per_head = self.dim // self.n_heads
            q, k, v = _projections(self, query, key, value, ("q_lin", "k_lin", "v_lin"))

            def shape(x: torch.Tensor) -> torch.Tensor:
                return x.view(bs, -1, self.n_heads, dim_per_head).transpose(1, 2)

            q, k, v = shape(q), shape(k), shape(v)
            if k.dtype != q.dtype or v.dtype != q.dtype:
                return original()
            padding = (mask == 0).view(bs, 1, 1, k_length)
            # One host sync for both questions.
            all_padding, any_padding = torch.stack(
                (padding.all(dim=-1).any(), padding.any())
            ).tolist()
            if all_padding:
                # A sequence that is all padding: the original's masked_fill stops the score
                # gradient there, an additive mask would not (same outputs, other gradients).
                return original()
            additive = None
            if any_padding:  # without padding, SDPA runs its faster unmasked kernel
                additive = torch.zeros(padding.shape, dtype=q.dtype, device=q.device).masked_fill(
                    padding, torch.finfo(q.dtype).min
                )
            context = _sdpa(q, k, v, additive, p, 1.0 / math.sqrt(dim_per_head))
            context = context.transpose(1, 2).contiguous().view(bs, -1, self.n_heads * dim_per_head)
            return (self.out_lin(context),)

    return Fused


# --------------------------------------------------------------------------------------------
# ALBERT
# --------------------------------------------------------------------------------------------


def fused_albert_attention(cls: T) -> T:
    """Fused-SDPA subclass of an ``AlbertAttention``-like class.

    Expected attributes: ``query``, ``key``, ``value``, ``dense``, ``attention_dropout``,
    ``output_dropout``, ``LayerNorm``, ``num_attention_heads``, ``attention_head_size``,
    ``position_embedding_type``; forward signature ``(hidden_states, attention_mask=None,
    head_mask=None, output_attentions=False)`` returning ``(LayerNorm(hidden_states +
    output_dropout(dense(context))),)``.

    ALBERT's attention module also does the output projection, dropout, residual add and layer
    norm, so the fused forward ends with :func:`adopter.kernels.dropout_add_layer_norm` (what
    rule paper.5 would have put there). Falls back for ``output_attentions``, ``head_mask``,
    relative position embeddings and unsupported masks.
    """
    return _build("albert_attention", cls, _make_albert)  # type: ignore[return-value]


def _make_albert(base: type) -> type:
    class Fused(base):  # type: ignore[misc, valid-type]
        def forward(
            self,
            hidden_states: torch.Tensor,
            attention_mask: torch.Tensor | None = None,
            head_mask: torch.Tensor | None = None,
            output_attentions: bool = False,
        ) -> tuple[Any, ...]:
            def original() -> tuple[Any, ...]:
                return super(Fused, self).forward(
                    hidden_states, attention_mask, head_mask, output_attentions
                )

            p = _dropout_p(getattr(self, "attention_dropout", None))
            if _bert_like_needs_original(
                self, hidden_states, attention_mask, p, head_mask, output_attentions
            ):
                return original()

            attention_mask = _without_zero_mask(attention_mask)
            q, k, v = qkv_projection(hidden_states, self.query, self.key, self.value)
            split = self.transpose_for_scores
            context = _checked_sdpa(
                split(q),
                split(k),
                split(v),
                attention_mask,
                p,
                1.0 / math.sqrt(self.attention_head_size),
            )
            if context is None:
                return original()
            context = context.transpose(2, 1).flatten(2)
            projected = self.dense(context)
            normed = dropout_add_layer_norm(
                projected, hidden_states, self.output_dropout, self.LayerNorm
            )
            return (normed,)

    return Fused


# --------------------------------------------------------------------------------------------
# GPT-Neo
# --------------------------------------------------------------------------------------------


def fused_gpt_neo_self_attention(cls: T) -> T:
    """Fused-SDPA subclass of a ``GPTNeoSelfAttention``-like class.

    Expected attributes: ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``, ``attn_dropout``,
    ``resid_dropout``, ``bias`` (the boolean causal buffer: lower-triangular for global
    attention, a band for local attention), ``num_heads``, ``head_dim`` and the
    ``_split_heads``/``_merge_heads`` helpers; forward signature ``(hidden_states,
    attention_mask=None, layer_past=None, head_mask=None, use_cache=False,
    output_attentions=False)`` returning ``(attn_output, present)``.

    GPT-Neo does not scale its scores (``scale=1.0``). The causal (or local-window) buffer
    slice is the mask, combined with a padding ``attention_mask`` as ``where(causal, 0,
    finfo.min) + attention_mask`` (the original's ``where(causal, w, finfo.min) +
    attention_mask``); a global layer without padding (no mask, or an all-zero one) uses
    SDPA's ``is_causal`` kernel once its buffer is verified lower-triangular. A query that
    sees only padding falls back (same outputs, but the original's ``where`` stops the
    gradient of its hidden scores). The original computes scores in float32 whatever the
    input dtype, so other dtypes fall back, as do ``output_attentions`` and ``head_mask``.
    """
    return _build("gpt_neo_self_attention", cls, _make_gpt_neo)  # type: ignore[return-value]


def _make_gpt_neo(base: type) -> type:
    class Fused(base):  # type: ignore[misc, valid-type]
        def forward(
            self,
            hidden_states: torch.Tensor,
            attention_mask: torch.Tensor | None = None,
            layer_past: tuple[torch.Tensor, ...] | None = None,
            head_mask: torch.Tensor | None = None,
            use_cache: bool = False,
            output_attentions: bool = False,
        ) -> tuple[Any, ...]:
            def original() -> tuple[Any, ...]:
                return super(Fused, self).forward(
                    hidden_states,
                    attention_mask,
                    layer_past,
                    head_mask,
                    use_cache,
                    output_attentions,
                )

            p = _dropout_p(getattr(self, "attn_dropout", None))
            if (
                tracing()
                or output_attentions
                or head_mask is not None
                or p is None
                or _unfused_on_cpu(p, hidden_states)
                or hidden_states.dim() != 3
                or hidden_states.dtype != torch.float32
                or torch.is_autocast_enabled(hidden_states.device.type)
                or not _mask_is_float(attention_mask)
            ):
                return original()
            attention_mask = _without_zero_mask(attention_mask)

            q, k, v = qkv_projection(hidden_states, self.q_proj, self.k_proj, self.v_proj)
            query = self._split_heads(q, self.num_heads, self.head_dim)
            key = self._split_heads(k, self.num_heads, self.head_dim)
            value = self._split_heads(v, self.num_heads, self.head_dim)
            if layer_past is not None:
                key = torch.cat((layer_past[0], key), dim=-2)
                value = torch.cat((layer_past[1], value), dim=-2)
            present = (key, value) if use_cache is True else None

            ok, mask = _sdpa_mask(attention_mask, query, key, value)
            if not ok:
                return original()
            causal = _causal_attention_mask(self, self.bias, mask, query, key.size(-2))
            if causal is None:
                return original()
            attn_mask, is_causal = causal
            attn_output = _sdpa(query, key, value, attn_mask, p, 1.0, is_causal=is_causal)
            attn_output = self._merge_heads(attn_output, self.num_heads, self.head_dim)
            attn_output = self.out_proj(attn_output)
            attn_output = self.resid_dropout(attn_output)
            return (attn_output, present)

    return Fused


_FACTORIES.update(
    distilbert_attention=fused_distilbert_attention,
    albert_attention=fused_albert_attention,
    gpt_neo_self_attention=fused_gpt_neo_self_attention,
)
