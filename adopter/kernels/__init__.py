"""Optimized kernels that rewritten model code calls instead of the unfused originals.

Every kernel takes the model's *existing* modules (so parameter names and ``state_dict`` keys
never change), returns what the original code computed, and falls back to the original
computation whenever a fast path cannot reproduce it. Only ``torch`` is required; Triton is used
lazily on CUDA when installed. See :func:`describe_backends` for what runs on this machine.
"""

from ._backend import describe_backends
from ._util import clear_caches
from .attention import fused_bert_self_attention, fused_gpt2_attention, fused_t5_attention
from .attention_extended import (
    fused_albert_attention,
    fused_distilbert_attention,
    fused_gpt_neo_self_attention,
)
from .attention_function import attention_function, scaled_attention
from .conv import conv_batch_norm
from .cross_entropy import causal_lm_loss, fused_loss_applies, linear_cross_entropy
from .gated import gated_activation, gated_activation_chunked, gated_mlp
from .linear import linear_batch_norm, linear_bias_activation, qkv_projection
from .norm import dropout_add_layer_norm
from .norm_act import conv_bn_act, group_norm_activation
from .rms_norm import rms_norm
from .rotary import apply_rotary, apply_rotary_complex, rotary
from .softmax import softmax

__all__ = [
    "attention_function",
    "causal_lm_loss",
    "apply_rotary",
    "apply_rotary_complex",
    "clear_caches",
    "conv_batch_norm",
    "conv_bn_act",
    "describe_backends",
    "dropout_add_layer_norm",
    "fused_albert_attention",
    "fused_bert_self_attention",
    "fused_distilbert_attention",
    "fused_gpt2_attention",
    "fused_gpt_neo_self_attention",
    "fused_loss_applies",
    "fused_t5_attention",
    "gated_activation",
    "gated_activation_chunked",
    "gated_mlp",
    "group_norm_activation",
    "linear_batch_norm",
    "linear_bias_activation",
    "linear_cross_entropy",
    "qkv_projection",
    "rms_norm",
    "rotary",
    "scaled_attention",
    "softmax",
]
