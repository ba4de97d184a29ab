"""The one list of ``adopter.kernels``' public names: what each is, how it draws random numbers,
and how :func:`~adopter.kernels.describe_backends` describes the implementation it runs.

Everything that enumerates kernels is derived from :data:`ENTRIES`: ``adopter.kernels.__all__``
(and the package's attributes), the keys of ``describe_backends()``, and the tracing test's
lists, and :mod:`adopter.kernels.rng`'s categories (which verify reads to decide whether train
mode with dropout can be compared). Adding a kernel: its module, one :class:`Entry` here, its
tests (CONTRIBUTING.md).

This module imports nothing: ``describe_backends`` hands each description a :class:`Backends`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["ENTRIES", "Backends", "Entry", "Needs", "RandomDraws", "Role", "entry", "names"]


class Role(StrEnum):
    KERNEL = "kernel"  # a function rewritten code calls in place of the original computation
    ATTENTION_FACTORY = "attention factory"  # returns the fused subclass of an attention class
    HELPER = "helper"  # public, but no kernel: a report, a cache, a run-time test of a rewrite
    # builds what a rewritten training script constructs (an optimizer), fused where it can
    OPTIMIZER = "optimizer"


class RandomDraws(StrEnum):
    """How a kernel draws random numbers compared with the code it replaces (the categories of
    ``adopter.kernels.rng``, which decide whether verify compares train mode with dropout)."""

    NONE = "none"  # draws nothing (nor does the code it replaces)
    DROPOUT_EAGER_CPU = "dropout-eager-cpu"  # as nn.Dropout, in eager mode on a CPU only
    SDPA = "sdpa"  # attention dropout is drawn inside scaled_dot_product_attention
    ORIGINAL_ON_CPU = "original-on-cpu"  # the original dropout on a CPU, SDPA's elsewhere


@dataclass(frozen=True)
class Backends:
    """What the device offers, as ``describe_backends`` found it."""

    device: str
    cuda: bool
    triton: bool  # Triton kernels run (CUDA, triton installed, not switched off)
    compiled: bool  # torch.compile fuses the chains eager PyTorch cannot
    compile_backend: str
    sdpa: str  # the scaled_dot_product_attention implementations enabled


@dataclass(frozen=True)
class Needs:
    """What a submodule the kernel is handed must be built with for a site to be one the kernel
    is for: a rule that passes, as the kernel's argument ``position`` (0-based; ``parameter`` is
    its name in the kernel's signature), a submodule whose construction names ``kind`` asks each
    of ``flags`` of that construction. A flag reads as in any rule: ``bias=True`` is anything but
    a literal ``bias=False`` (a flag chosen by the configuration may be either).

    Rules do not guess this from an example (one model's ``nn.Linear(a, b)`` does not say whether
    an unbiased one would do): ``adopter learn`` writes these flags into the constructions of a
    rule it learns, and loading any rule (``check_declared_kernels``) refuses one that hands the
    kernel such a submodule without asking them."""

    position: int
    parameter: str
    kind: str  # as a rule names the class: ``torch.nn.Linear``
    flags: tuple[tuple[str, bool], ...]
    why: str  # said in the error of a rule that does not ask them


@dataclass(frozen=True)
class Entry:
    name: str
    module: str  # the submodule of adopter.kernels that defines it
    role: Role
    rng: RandomDraws
    # The implementation it runs on a device; ``None`` for a helper (nothing to describe).
    backend: Callable[[Backends], str] | None = None
    # What a user must be told when code is rewritten to call it (``adopter.patch`` and
    # ``adopter run`` log it once per process): a visible change of the model's results.
    notice: str = ""
    needs: tuple[Needs, ...] = ()
    # The kernel returns the attention probabilities only when something asks for them
    # (``output_attentions``, a hook), ``None`` otherwise, as transformers' SDPA path does: code
    # that keeps them whether asked or not would see ``None`` (rewrite/checks.py refuses it).
    weights_when_asked: bool = False


def _softmax(b: Backends) -> str:
    if b.triton:
        return "triton row-softmax (last dim, contiguous, fp16/bf16/fp32, fused up-cast)"
    if b.cuda:
        return "aten _softmax (fp16->fp32 fused via half_to_float)"
    return "aten _softmax (direct dispatch)"


def _dropout_add_norm(b: Backends) -> str:
    if b.compiled:
        return f"torch.compile[{b.compile_backend}] fused dropout+add+norm"
    return "eager: bernoulli mask + one addcmul + native layer_norm (dropout skipped in eval)"


def _linear_activation(b: Backends) -> str:
    return "addmm with bias epilogue + single-kernel activation (in-place when autograd allows)" + (
        "; cuBLASLt bias+ReLU epilogue without autograd" if b.cuda else ""
    )


def _fold(b: Backends) -> str:
    return "eval: BatchNorm folded into weights (cached under no_grad); train: original modules"


def _qkv(b: Backends) -> str:
    return "one GEMM over concatenated weights (cached under no_grad)"


def _sdpa(b: Backends) -> str:
    return b.sdpa


def _attention_function(b: Backends) -> str:
    return b.sdpa + "; the original code while attention weights are requested"


def _triton_or(
    eager: str, triton: str = "triton forward and backward kernels"
) -> Callable[[Backends], str]:
    def describe(b: Backends) -> str:
        return triton if b.triton else eager

    return describe


def _gated(b: Backends) -> str:
    where = "triton gate kernels" if b.triton else "eager"
    return f"{where}; activation recomputed in backward (gate and up kept, not their product)"


def _cross_entropy(b: Backends) -> str:
    return "chunked LM head + log_softmax, gradients formed per chunk (logits never kept)"


def _group_norm_activation(b: Backends) -> str:
    return "eval: activation in place on the group-norm output; train: original modules"


def _conv_bn_act(b: Backends) -> str:
    return "eval: BatchNorm folded into the convolution + in-place activation; train: original"


K, A, H = Role.KERNEL, Role.ATTENTION_FACTORY, Role.HELPER
_rotary = _triton_or("eager: half-size products into one output buffer (autograd function)")

ENTRIES: tuple[Entry, ...] = (
    # the paper's kernels
    Entry("softmax", "softmax", K, RandomDraws.NONE, _softmax),
    Entry("dropout_add_layer_norm", "norm", K, RandomDraws.DROPOUT_EAGER_CPU, _dropout_add_norm),
    Entry(
        "linear_bias_activation",
        "linear",
        K,
        RandomDraws.NONE,
        _linear_activation,
        needs=(
            Needs(
                1,
                "linear",
                "torch.nn.Linear",
                (("bias", True),),
                "what it fuses is the bias add, folded into the GEMM with the activation after "
                "it; a Linear built with bias=False has no bias add to fold",
            ),
        ),
    ),
    Entry("conv_batch_norm", "conv", K, RandomDraws.NONE, _fold),
    Entry("linear_batch_norm", "linear", K, RandomDraws.NONE, _fold),
    Entry("qkv_projection", "linear", K, RandomDraws.NONE, _qkv),
    Entry("fused_bert_self_attention", "attention", A, RandomDraws.SDPA, _sdpa),
    Entry("fused_t5_attention", "attention", A, RandomDraws.SDPA, _sdpa),
    Entry("fused_gpt2_attention", "attention", A, RandomDraws.SDPA, _sdpa),
    # the extended rule set's attention classes
    Entry("fused_distilbert_attention", "attention_extended", A, RandomDraws.SDPA, _sdpa),
    Entry("fused_albert_attention", "attention_extended", A, RandomDraws.SDPA, _sdpa),
    Entry("fused_gpt_neo_self_attention", "attention_extended", A, RandomDraws.SDPA, _sdpa),
    # modern models
    Entry(
        "attention_function",
        "attention_function",
        K,
        RandomDraws.ORIGINAL_ON_CPU,
        _attention_function,
        weights_when_asked=True,
    ),
    Entry("scaled_attention", "attention_function", K, RandomDraws.ORIGINAL_ON_CPU, _sdpa),
    Entry(
        "rms_norm",
        "rms_norm",
        K,
        RandomDraws.NONE,
        _triton_or(
            "eager forward; backward in closed form from the inverse RMS",
            "triton forward and backward kernels (eager for the T5 spelling)",
        ),
    ),
    Entry(
        "add_rms_norm",
        "add_rms_norm",
        K,
        RandomDraws.NONE,
        lambda b: (
            "add + eager RMSNorm keeping the sum and the inverse RMS (recognised norms); "
            + ("Liger fused add + RMSNorm" if b.cuda else "other norms called on the sum")
        ),
    ),
    Entry("rotary", "rotary", K, RandomDraws.NONE, _rotary),
    Entry("apply_rotary", "rotary", K, RandomDraws.NONE, _rotary),
    Entry("apply_rotary_complex", "rotary", K, RandomDraws.NONE, _rotary),
    Entry("rotary_complex", "rotary", K, RandomDraws.NONE, _rotary),
    Entry("gated_activation", "gated", K, RandomDraws.NONE, _gated),
    Entry("gated_activation_chunked", "gated", K, RandomDraws.NONE, _gated),
    Entry("gated_mlp", "gated", K, RandomDraws.NONE, _gated),
    Entry("linear_cross_entropy", "cross_entropy", K, RandomDraws.NONE, _cross_entropy),
    Entry(
        "causal_lm_loss",
        "cross_entropy",
        K,
        RandomDraws.NONE,
        _cross_entropy,
        notice="in training with labels the patched model returns logits=None (the loss is "
        "computed chunk by chunk without them: that is where the memory saving comes from); "
        "to keep them, pass return_logits=True to the model's forward call",
    ),
    Entry("group_norm_activation", "norm_act", K, RandomDraws.NONE, _group_norm_activation),
    Entry("conv_bn_act", "norm_act", K, RandomDraws.NONE, _conv_bn_act),
    # training code (the train rule set): optimizers, fused where the parameters allow it
    Entry("fused_optimizer", "optimizer", Role.OPTIMIZER, RandomDraws.NONE),
    Entry("fused_training_optimizer", "optimizer", Role.OPTIMIZER, RandomDraws.NONE),
    # helpers: public, not kernels (fused_loss_applies is the run-time test of the
    # cross-entropy rewrite; it answers False under a tracer)
    Entry("fused_loss_applies", "cross_entropy", H, RandomDraws.NONE),
    Entry("describe_backends", "_backend", H, RandomDraws.NONE),
    Entry("clear_caches", "_util", H, RandomDraws.NONE),
)


def names(*roles: Role) -> list[str]:
    """The public names with one of ``roles`` (every role when none is given), sorted."""
    return sorted(e.name for e in ENTRIES if not roles or e.role in roles)


def entry(name: str) -> Entry:
    for candidate in ENTRIES:
        if candidate.name == name:
            return candidate
    raise KeyError(f"adopter.kernels has no {name!r}; known: {', '.join(names())}")
