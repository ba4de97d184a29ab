"""Optimized kernels that rewritten model code calls instead of the unfused originals.

Every kernel takes the model's *existing* modules (so parameter names and ``state_dict`` keys
never change), returns what the original code computed, and falls back to the original
computation whenever a fast path cannot reproduce it. Only ``torch`` is required; Triton is used
lazily on CUDA when installed. See :func:`describe_backends` for what runs on this machine.

Tracing convention (every kernel follows it, new ones too): a kernel's first check is
``adopter.kernels._util.tracing()``, true while ``torch.jit.trace`` or ``torch.fx`` symbolic
tracing (``torch.fx.symbolic_trace``, transformers' ``HFTracer``) records the model; when it
holds, the kernel runs the original computation it replaces - the same module calls and
functional ops, in the same order, taking no path from grad mode, parameter values, devices or
data - so the recorded graph is the original model's graph and is the same in every trace
(``torch.jit.trace``'s check re-traces under ``no_grad``; an fx ``Proxy`` cannot drive a Python
branch or be iterated). An attention subclass calls its ``original()`` forward. ``torch.compile``
and ``torch.export`` are not "tracing": Dynamo captures the fused paths, which is the point of
compiling them. ``tests/kernels/test_kernels_tracing.py`` checks every public kernel (the list
is ``__all__``) under both tracers.
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
