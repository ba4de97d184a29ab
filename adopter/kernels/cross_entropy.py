"""LM head + token-level cross-entropy without materialising the logits.

A causal LM computes ``logits = lm_head(hidden)`` - ``tokens x vocab`` floats, 131 MB for 1,024
tokens and a 32,000 vocabulary, 525 MB at 128,256 - and the loss keeps them (and their log-softmax)
for backward, then allocates their gradient. :func:`linear_cross_entropy` walks the tokens in
chunks instead. Per chunk it computes the logits, the loss terms and - when autograd will need
them - the logit gradients, which it immediately turns into the gradients of the hidden states
(one GEMM into their rows) and of the weight (accumulated *in place* into one weight-sized
buffer) and bias; then the chunk's logits are freed. Backward only hands these gradients out,
scaled by the incoming gradient (not at all in the usual case of a gradient of one: no
full-size scaled copy is made).

Semantics are those of ``cross_entropy(logits.float(), targets, ignore_index=..., reduction=...)``
on ``logits = linear(hidden, weight, bias)`` (optionally soft-capped ``tanh(logits / c) * c`` in
the logits' dtype first, as Gemma 2/3 do): per token ``logsumexp(z) - z[target]`` from the same
row-wise ``log_softmax``, tokens whose target is ``ignore_index`` skipped (they are not even
multiplied out), ``mean`` dividing the sum by the number of counted tokens (``nan`` when there
are none, like PyTorch), ``sum`` by an optional ``divisor`` (transformers' ``num_items_in_batch``).
The logit gradient is formed as autograd forms it (``p * s`` and ``- s`` at the target, ``s`` the
reduction's scale). Values agree with the original to float rounding: the sums over tokens run
in another order.

:func:`causal_lm_loss` is transformers 5's ``ForCausalLMLoss`` on top: labels padded with
``ignore_index`` and shifted left by one (or ``shift_labels`` as given), ``num_items_in_batch``
turning the mean into ``sum / num_items_in_batch``.

**Logits are not returned.** Code that returns the logits (every ``*ForCausalLM.forward``) can
only use this kernel when nobody needs them; :func:`fused_loss_applies` is the run-time test a
rewrite calls (labels given, training with autograd on, the model's loss function being
``ForCausalLMLoss``), falling back to the original ``lm_head`` + loss otherwise.

Backends (:mod:`adopter.kernels.backends`, :data:`BACKENDS`): this module's chunked kernel
(``adopter``; an autograd function in eager code and, under ``torch.compile``, the same kernel
as the ``torch.library`` op ``adopter::chunked_linear_cross_entropy``, which Inductor keeps as
one opaque node, so the compiled graph keeps the memory saving), PyTorch's chunked
``F.linear_cross_entropy`` (``torch``: float32/64 heads without soft-cap or logit scaling; a
``torch.library`` op too) and Liger-Kernel's (``liger``, CUDA).

The original computation runs instead (inside the kernel) for ``torch.jit`` / ``torch.fx`` tracing,
autocast, a head that is
not a stock ``nn.Linear`` (hooks, LoRA, quantised), weights of another dtype or device than the
hidden states, non-``int64`` targets, targets out of range (which the original reports), and shapes
the original would reject.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import backends
from ._util import HALF_DTYPES, compiling, grad_needed, is_plain, plain_tensors, tracing

__all__ = [
    "causal_lm_loss",
    "causal_lm_loss_reference",
    "fused_loss_applies",
    "linear_cross_entropy",
    "linear_cross_entropy_reference",
]

CHUNK_BYTES = 32 << 20
"""Smallest default size of one chunk's float32 logits.

Every chunk reads the whole weight again (and, with gradients, reads and writes the weight
gradient): with chunks much smaller than the weight that traffic dominates (at vocab 128,256 and
width 768, 65-token chunks made the CPU loss 35% slower than the unchunked original, 384-token
chunks as fast). So a chunk's logits take at least half the weight's bytes."""


# --------------------------------------------------------------------------------------------
# The original computation


def _softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    if cap is None:
        return logits
    logits = logits / cap
    logits = torch.tanh(logits)
    return logits * cap


def _scale(logits: torch.Tensor, scaling: tuple[Any, Any]) -> torch.Tensor:
    """``logits * logit_scale`` (Cohere), ``logits / logit_divisor`` (Granite), in that order."""
    multiplier, divisor = scaling
    if multiplier is not None:
        logits = logits * multiplier
    if divisor is not None:
        logits = logits / divisor
    return logits


def _divide(loss: torch.Tensor, divisor: Any) -> torch.Tensor:
    if torch.is_tensor(divisor):
        divisor = divisor.to(loss.device)
    return loss / divisor


def linear_cross_entropy_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    divisor: Any = None,
    softcap: float | None = None,
    logit_scale: float | None = None,
    logit_divisor: float | None = None,
) -> torch.Tensor:
    """``cross_entropy(softcap(linear(hidden) * scale / divisor).float(), targets)`` with the
    logits in memory."""
    logits = F.linear(hidden, weight, bias)
    logits = _softcap(_scale(logits, (logit_scale, logit_divisor)), softcap).float()
    logits = logits.view(-1, logits.shape[-1])
    loss = F.cross_entropy(logits, targets.view(-1), ignore_index=ignore_index, reduction=reduction)
    return loss if divisor is None else _divide(loss, divisor)


def _shifted(labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    labels = F.pad(labels, (0, 1), value=ignore_index)
    return labels[..., 1:].contiguous()


def causal_lm_loss_reference(
    hidden_states: torch.Tensor,
    lm_head: nn.Module,
    labels: torch.Tensor,
    vocab_size: int | None,
    num_items_in_batch: Any = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    *,
    final_logit_softcapping: float | None = None,
    logit_bias: torch.Tensor | None = None,
    logit_scale: float | None = None,
    logit_divisor: float | None = None,
    shift: bool = True,
    upcast: bool = True,
    **kwargs: Any,
) -> torch.Tensor:
    """``ForCausalLMLoss(softcap(lm_head(hidden_states) + logit_bias), labels, vocab_size,
    ...)``; with ``shift=False, upcast=False`` the ``CrossEntropyLoss()(logits.view(-1, V),
    labels.view(-1))`` of models that compute their loss themselves."""
    logits = lm_head(hidden_states)
    if logit_bias is not None:
        logits = logits + logit_bias.to(logits.device)
    logits = _scale(logits, (logit_scale, logit_divisor))
    logits = _softcap(logits, final_logit_softcapping)
    if upcast:
        logits = logits.float()
    if vocab_size is None:
        vocab_size = logits.size(-1)
    if not shift:
        shift_labels = labels.reshape(-1)
    elif shift_labels is None:
        shift_labels = _shifted(labels, ignore_index)
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1).to(logits.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction=reduction)
    return loss if num_items_in_batch is None else _divide(loss, num_items_in_batch)


# --------------------------------------------------------------------------------------------
# The chunked kernel


def _chunk_rows(weight: torch.Tensor, rows: int, chunk_size: int | None) -> int:
    if chunk_size is not None:
        return max(1, min(int(chunk_size), rows))
    budget = max(CHUNK_BYTES, weight.numel() * weight.element_size() // 2)
    return max(1, min(rows, budget // (4 * max(weight.shape[0], 1))))


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise log-softmax; on a CPU written over ``logits`` when they are a buffer of our own
    (the kernel reads each row before it writes it, so the values are those of the
    out-of-place call), which halves the chunk's memory."""
    if logits.device.type == "cpu" and logits._base is None and logits.is_contiguous():
        return torch.log_softmax(logits, dim=-1, out=logits)
    return torch.log_softmax(logits, dim=-1)


def _logit_grad(
    logp: torch.Tensor,
    targets: torch.Tensor,
    scale: torch.Tensor,
    dtype: torch.dtype,
    softcap: float | None,
    capped: torch.Tensor | None,
    scaling: tuple[Any, Any] = (None, None),
) -> torch.Tensor:
    """dLoss/dlogits for one chunk from its log-probabilities (overwritten), as autograd
    forms it: ``exp(logp) * s`` everywhere, ``- s`` added at the target, cast to the logits'
    dtype, through the soft-cap's ``* c``, ``tanh`` and ``/ c``."""
    grad = logp.exp_().mul_(scale)
    rows = torch.arange(grad.shape[0], device=grad.device)
    grad[rows, targets] -= scale
    grad = grad.to(dtype)
    if softcap is not None:
        grad = torch.ops.aten.tanh_backward(grad * softcap, capped) / softcap
    multiplier, divisor = scaling  # the scale's backward, in the reverse order
    if divisor is not None:
        grad = grad / divisor
    if multiplier is not None:
        grad = grad * multiplier
    return grad


_HALF_GEMM_INTO_FLOAT = {"cuda": True}  # set to False the first time the device refuses


def _accumulate(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``total += a @ b`` in place. A half-precision head's gradient is summed in float32 (one
    rounding to 8 or 11 bits per chunk would lose the small chunks); on CUDA the product runs
    on the half-precision tensor cores with a float32 result, as the original's single GEMM does,
    where a float32 GEMM of up-cast copies would be several times slower."""
    if total.dtype == a.dtype:
        total.addmm_(a, b)
        return
    if a.is_cuda and _HALF_GEMM_INTO_FLOAT["cuda"]:
        try:
            torch.addmm(total, a, b, out_dtype=total.dtype, out=total)
            return
        except (RuntimeError, TypeError):  # a torch or device without the mixed-dtype GEMM
            _HALF_GEMM_INTO_FLOAT["cuda"] = False
    total.addmm_(a.to(total.dtype), b.to(total.dtype))


def _forward_chunks(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    softcap: float | None,
    scale: torch.Tensor | None,
    chunk: int,
    grads: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
    scaling: tuple[Any, Any] = (None, None),
) -> torch.Tensor:
    """Sum of the per-token losses over ``hidden``'s rows (all counted); with ``scale`` the
    gradients go into ``grads = (hidden rows, weight, bias)`` buffers (``None``: not wanted)."""
    grad_h, grad_w, grad_b = grads
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk):
        h = hidden[start : start + chunk]
        y = targets[start : start + chunk]
        logits = _scale(F.linear(h, weight, bias), scaling)
        capped = None
        if softcap is not None:
            capped = torch.tanh(logits / softcap)
            logits = capped * softcap
        logp = _log_softmax(logits.float())
        del logits
        total -= logp.gather(1, y[:, None]).sum()
        if scale is None:
            continue
        grad = _logit_grad(logp, y, scale, h.dtype, softcap, capped, scaling)
        del logp, capped
        if grad_h is not None:
            torch.mm(grad, weight, out=grad_h[start : start + chunk])
        if grad_w is not None:
            _accumulate(grad_w, grad.t(), h)
        if grad_b is not None:
            grad_b.add_(grad.sum(0, dtype=grad_b.dtype))
        del grad  # before the next chunk's logits are allocated
    return total


def _loss_and_grads(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    ignore_index: int,
    reduction: str,
    divisor: Any,
    softcap: float | None,
    chunk_size: int | None,
    scaling: tuple[Any, Any],
    wanted: tuple[bool, bool, bool],
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The loss and, for each of ``(hidden, weight, bias)`` that ``wanted`` names, its gradient
    for ``d(loss) = 1``, computed chunk by chunk in one pass."""
    want_h, want_w, want_b = wanted
    want_b = want_b and bias is not None
    counted = targets != ignore_index
    rows = counted.nonzero().squeeze(1)
    count = rows.numel()
    # The reduction's scale of each counted token's gradient, as autograd computes it.
    if reduction == "mean":
        loss_divisor: Any = torch.tensor(float(count), device=hidden.device)
    else:
        loss_divisor = divisor
    one = torch.ones((), dtype=torch.float32, device=hidden.device)
    scale = one if loss_divisor is None else _divide(one, loss_divisor).to(torch.float32)

    full = rows.numel() == hidden.shape[0]
    picked = hidden if full else hidden.index_select(0, rows)
    picked_targets = targets if full else targets.index_select(0, rows)
    # Half-precision weights accumulate their gradient in float32 (one GEMM per chunk
    # would otherwise round the running sum to 8 or 11 bits each time).
    accumulate = torch.float32 if weight.dtype in HALF_DTYPES else None
    grad_rows = torch.empty_like(picked) if want_h else None
    grad_w = (
        torch.zeros(weight.shape, dtype=accumulate or weight.dtype, device=weight.device)
        if want_w
        else None
    )
    grad_b = (
        torch.zeros(bias.shape, dtype=accumulate or bias.dtype, device=bias.device)
        if want_b and bias is not None
        else None
    )
    chunk = _chunk_rows(weight, max(count, 1), chunk_size)
    total = _forward_chunks(
        picked,
        weight,
        bias,
        picked_targets,
        softcap,
        scale if (want_h or want_w or want_b) else None,
        chunk,
        (grad_rows, grad_w, grad_b),
        scaling,
    )
    if want_h and not full:
        grad_h = torch.zeros_like(hidden)
        grad_h.index_copy_(0, rows, grad_rows)
    else:
        grad_h = grad_rows
    loss = total if loss_divisor is None else _divide(total, loss_divisor)
    return (
        loss,
        grad_h,
        None if grad_w is None else grad_w.to(weight.dtype),
        None if grad_b is None or bias is None else grad_b.to(bias.dtype),
    )


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        ignore_index: int,
        reduction: str,
        divisor: Any,
        softcap: float | None,
        chunk_size: int | None,
        recording: bool,
        scaling: tuple[Any, Any],
    ) -> torch.Tensor:
        # ``needs_input_grad`` ignores the grad mode: the caller says whether autograd records.
        wanted = tuple(ctx.needs_input_grad[:3]) if recording else (False,) * 3
        loss, *grads = _loss_and_grads(
            hidden,
            weight,
            bias,
            targets,
            ignore_index,
            reduction,
            divisor,
            softcap,
            chunk_size,
            scaling,
            wanted,  # type: ignore[arg-type]
        )
        ctx.grads = tuple(grads)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads = ctx.grads
        if grads is None:
            raise RuntimeError(
                "adopter.kernels.linear_cross_entropy: its gradients were already handed out; "
                "backward through the same loss twice (retain_graph=True) is not supported"
            )
        ctx.grads = None
        # The gradients were computed for d(loss) = 1; scale (in place) only when it is not.
        if bool(grad_loss.ne(1).item()):
            grads = tuple(None if g is None else g.mul_(grad_loss) for g in grads)
        grad_h, grad_w, grad_b = grads
        return grad_h, grad_w, grad_b, None, None, None, None, None, None, None, None


# The same kernel as a torch.library op, for torch.compile: Dynamo cannot trace the autograd
# function above (its chunking depends on how many targets count, which is data), and an opaque
# op keeps the memory saving in the compiled graph, where Inductor's own lowering of the
# original keeps the logits. The op returns the loss and its gradients (empty tensors for those
# not wanted); its backward scales them in place by a second op, as the eager backward does.


def _divisor_args(divisor: Any) -> tuple[torch.Tensor | None, float | None]:
    if divisor is None or torch.is_tensor(divisor):
        return divisor, None
    return None, float(divisor)


@torch.library.custom_op("adopter::chunked_linear_cross_entropy", mutates_args=())
def _chunked_loss_op(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    ignore_index: int,
    reduction: str,
    divisor_tensor: torch.Tensor | None,
    divisor_number: float | None,
    softcap: float | None,
    chunk_size: int | None,
    logit_scale: float | None,
    logit_divisor: float | None,
    want_hidden: bool,
    want_weight: bool,
    want_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    divisor = divisor_tensor if divisor_tensor is not None else divisor_number
    loss, grad_h, grad_w, grad_b = _loss_and_grads(
        hidden,
        weight,
        bias,
        targets,
        ignore_index,
        reduction,
        divisor,
        softcap,
        chunk_size,
        (logit_scale, logit_divisor),
        (want_hidden, want_weight, want_bias),
    )
    empty = hidden.new_empty(0)
    return (
        loss,
        empty if grad_h is None else grad_h,
        empty.clone() if grad_w is None else grad_w,
        empty.clone() if grad_b is None else grad_b,
    )


@_chunked_loss_op.register_fake
def _(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    ignore_index: int,
    reduction: str,
    divisor_tensor: torch.Tensor | None,
    divisor_number: float | None,
    softcap: float | None,
    chunk_size: int | None,
    logit_scale: float | None,
    logit_divisor: float | None,
    want_hidden: bool,
    want_weight: bool,
    want_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    total = hidden.new_empty((), dtype=torch.float32)
    divisor = divisor_tensor if divisor_tensor is not None else divisor_number
    loss = total if divisor is None or reduction == "mean" else _divide(total, divisor)
    return (
        loss,
        torch.empty_like(hidden) if want_hidden else hidden.new_empty(0),
        torch.empty_like(weight) if want_weight else hidden.new_empty(0),
        torch.empty_like(bias) if want_bias and bias is not None else hidden.new_empty(0),
    )


@torch.library.custom_op(
    "adopter::scale_loss_grads_", mutates_args=("grad_hidden", "grad_weight", "grad_bias")
)
def _scale_grads_op(
    grad_hidden: torch.Tensor,
    grad_weight: torch.Tensor,
    grad_bias: torch.Tensor,
    grad_loss: torch.Tensor,
) -> None:
    # The gradients were computed for d(loss) = 1: scale only when it is not (the usual
    # backward of a loss passes 1, and then no weight-sized pass is made).
    if bool(grad_loss.ne(1).item()):
        for grad in (grad_hidden, grad_weight, grad_bias):
            grad.mul_(grad_loss)


@_scale_grads_op.register_fake
def _(
    grad_hidden: torch.Tensor,
    grad_weight: torch.Tensor,
    grad_bias: torch.Tensor,
    grad_loss: torch.Tensor,
) -> None:
    return None


def _op_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    ctx.wanted = inputs[-3:]
    ctx.save_for_backward(*output[1:])


def _op_backward(ctx: Any, grad_loss: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
    grad_h, grad_w, grad_b = ctx.saved_tensors
    _scale_grads_op(grad_h, grad_w, grad_b, grad_loss)
    grads = tuple(g if w else None for g, w in zip((grad_h, grad_w, grad_b), ctx.wanted))
    return (*grads, *(None,) * 12)


_chunked_loss_op.register_autograd(_op_backward, setup_context=_op_setup)


_REDUCTIONS = ("mean", "sum")


def _handled(hidden: Any, weight: Any, bias: Any, targets: Any, reduction: str) -> bool:
    if not all(isinstance(t, torch.Tensor) for t in (hidden, weight, targets)):
        return False
    if not plain_tensors(hidden, weight, bias, targets) or reduction not in _REDUCTIONS:
        return False
    if hidden.dim() != 2 or weight.dim() != 2 or not hidden.is_floating_point():
        return False
    if hidden.shape[1] != weight.shape[1] or weight.shape[0] == 0:
        return False
    if weight.dtype != hidden.dtype or weight.device != hidden.device:
        return False
    if bias is not None and (bias.dtype != hidden.dtype or bias.shape != (weight.shape[0],)):
        return False
    if targets.dtype != torch.long or targets.shape != (hidden.shape[0],):
        return False
    if targets.device != hidden.device or torch.is_autocast_enabled(hidden.device.type):
        return False
    return True


def _targets_in_range(targets: torch.Tensor, vocab: int, ignore_index: int) -> bool:
    counted = targets[targets != ignore_index]
    return counted.numel() == 0 or bool(((counted >= 0) & (counted < vocab)).all())


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    divisor: Any = None,
    softcap: float | None = None,
    chunk_size: int | None = None,
    logit_scale: float | None = None,
    logit_divisor: float | None = None,
) -> torch.Tensor:
    """``cross_entropy(softcap(linear(hidden, weight, bias)).float(), targets)``, chunked.

    Args:
        hidden: ``(tokens, hidden)`` inputs of the head.
        weight, bias: the head's parameters (``(vocab, hidden)``, ``(vocab,)`` or ``None``).
        targets: ``(tokens,)`` int64 class indices.
        ignore_index: targets not counted.
        reduction: ``"mean"`` (over counted tokens) or ``"sum"``.
        divisor: with ``reduction="sum"``, the sum is divided by it (a number or a tensor).
        softcap: ``c`` of ``tanh(logits / c) * c``, or ``None``.
        logit_scale, logit_divisor: the logits are ``linear(...) * logit_scale /
            logit_divisor`` before the soft-cap (Cohere's ``logit_scale``, Granite's
            ``logits_scaling``); plain numbers, ``None`` for none.
        chunk_size: tokens per chunk (default: a chunk's float32 logits take half the
            weight's bytes, at least :data:`CHUNK_BYTES`).
    """
    options = {
        "ignore_index": ignore_index,
        "reduction": reduction,
        "softcap": softcap,
        "logit_scale": logit_scale,
        "logit_divisor": logit_divisor,
    }

    def original() -> torch.Tensor:
        return linear_cross_entropy_reference(
            hidden, weight, bias, targets, divisor=divisor, **options
        )

    if tracing(hidden, weight, bias, targets) or not _handled(
        hidden, weight, bias, targets, reduction
    ):
        return original()
    if divisor is not None and reduction != "sum":
        return original()
    # The range check of the targets depends on the data; a compiled graph cannot hold it (the
    # compiled original does not check either).
    if not compiling() and not _targets_in_range(targets, weight.shape[0], ignore_index):
        return original()  # the original raises its own error for these
    if softcap is not None:
        softcap = float(softcap)
        if softcap == 0.0 or not math.isfinite(softcap):
            return original()
    if not all(_plain_factor(f) for f in (logit_scale, logit_divisor)):
        return original()  # a tensor factor (it may need a gradient) or 0, inf, nan
    call = LossCall(
        hidden,
        weight,
        bias,
        targets,
        ignore_index,
        reduction,
        divisor,
        softcap,
        chunk_size,
        logit_scale,
        logit_divisor,
    )
    return backends.run(OP, BACKENDS, bucket, call, hidden.device.type, hidden.dtype, original)


def _plain_factor(factor: Any) -> bool:
    """``None`` or a finite, non-zero Python number."""
    if factor is None:
        return True
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        return False
    return factor != 0 and math.isfinite(factor)


# --------------------------------------------------------------------------------------------
# Backends (adopter.kernels.backends): every call that reaches them has passed the checks of
# linear_cross_entropy (plain 2-D tensors of one dtype and device, int64 targets in range,
# mean/sum, finite factors); each says what else it needs.

OP = "linear_cross_entropy"


@dataclass(frozen=True)
class LossCall:
    hidden: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    targets: torch.Tensor
    ignore_index: int
    reduction: str
    divisor: Any
    softcap: float | None
    chunk_size: int | None
    logit_scale: float | None
    logit_divisor: float | None


def bucket(call: LossCall) -> str:
    """Vocabulary and width, each rounded up to a power of two."""
    vocab, width = call.weight.shape
    return f"v{backends.pow2(vocab)}-h{backends.pow2(width)}"


def _run_adopter(call: LossCall) -> torch.Tensor:
    if compiling():
        return _run_adopter_op(call)
    return _LinearCrossEntropy.apply(
        call.hidden,
        call.weight,
        call.bias,
        call.targets,
        call.ignore_index,
        call.reduction,
        call.divisor,
        call.softcap,
        call.chunk_size,
        grad_needed(call.hidden, call.weight, call.bias),
        (call.logit_scale, call.logit_divisor),
    )


def _run_adopter_op(call: LossCall) -> torch.Tensor:
    recording = torch.is_grad_enabled()
    wanted = [
        recording and t is not None and t.requires_grad
        for t in (call.hidden, call.weight, call.bias)
    ]
    divisor_tensor, divisor_number = _divisor_args(call.divisor)
    loss, *_ = _chunked_loss_op(
        call.hidden,
        call.weight,
        call.bias,
        call.targets,
        call.ignore_index,
        call.reduction,
        divisor_tensor,
        divisor_number,
        call.softcap,
        call.chunk_size,
        call.logit_scale,
        call.logit_divisor,
        *wanted,
    )
    return loss


# torch's chunked op computes ``cross_entropy(linear(h, w, b), t)`` with its logits in the
# input's dtype and float32 where they are float32: the original's for float32 and float64
# heads. For half precision it accumulates in float32 without rounding the logits to the
# head's dtype first, which the original does: not the original computation.
_TORCH_DTYPES = (torch.float32, torch.float64)


def _torch_accepts(call: LossCall) -> bool:
    if call.softcap is not None or call.logit_scale is not None or call.logit_divisor is not None:
        return False
    return call.hidden.dtype in _TORCH_DTYPES and call.hidden.shape[0] > 0


def _torch_options(call: LossCall) -> Any:
    from torch.nn import LinearCrossEntropyOptions

    rows = call.hidden.shape[0]
    # Our chunk size (half the weight's bytes of float32 logits per chunk, see CHUNK_BYTES):
    # torch's own "aspect_ratio:2" takes 16 rows per chunk at width 768 and vocab 32,000 on a
    # CPU, each reading the whole weight again (docs/kernels.md measures both).
    chunk = _chunk_rows(call.weight, rows, call.chunk_size)
    # Under torch.compile torch forces allow_retain_graph=True (with a warning, which Dynamo
    # cannot trace): say it ourselves.
    return LinearCrossEntropyOptions(
        batch_chunk_size=chunk,
        chunking_method=None,
        acc_policy="accurate",
        allow_retain_graph=compiling(),
    )


def _run_torch(call: LossCall) -> torch.Tensor:
    # The mean as a sum over the counted tokens: torch's op gives nan gradients when no token
    # counts, the original zeros (with a nan loss), and whether any counts is data that a
    # compiled graph cannot branch on.
    total = F.linear_cross_entropy(
        call.hidden,
        call.weight,
        call.targets,
        linear_bias=call.bias,
        reduction="sum",
        ignore_index=call.ignore_index,
        options=_torch_options(call),
    )
    if call.reduction == "sum":
        return total if call.divisor is None else _divide(total, call.divisor)
    count = (call.targets != call.ignore_index).sum().to(total.dtype)
    mean = total / count.clamp(min=1)
    return torch.where(count > 0, mean, torch.full_like(mean, math.nan))


def _liger_accepts(call: LossCall) -> bool:
    if call.logit_scale is not None or call.logit_divisor is not None:
        return False
    return call.hidden.is_cuda and call.hidden.dtype in (
        torch.float32,
        torch.bfloat16,
        torch.float16,
    )


def _run_liger(call: LossCall) -> torch.Tensor:
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    loss = liger_fused_linear_cross_entropy(
        call.hidden,
        call.weight,
        call.targets,
        bias=call.bias,
        ignore_index=call.ignore_index,
        reduction=call.reduction,
        softcap=call.softcap,
    )
    if isinstance(loss, tuple):  # versions that return (loss, z_loss, ...)
        loss = loss[0]
    return loss if call.divisor is None else _divide(loss, call.divisor)


BACKENDS: tuple[backends.Backend, ...] = (
    backends.Backend(
        "adopter",
        lambda call: True,
        _run_adopter,
        compiles=True,  # under torch.compile it runs as the torch.library op above
        summary="chunked LM head + log_softmax, gradients formed per chunk (logits never kept)",
    ),
    backends.Backend(
        "torch",
        _torch_accepts,
        _run_torch,
        compiles=True,  # a torch.library custom op: opaque to Inductor, no graph break
        summary="torch.nn.functional.linear_cross_entropy, chunked (LinearCrossEntropyOptions)",
    ),
    backends.Backend(
        "liger",
        _liger_accepts,
        _run_liger,
        devices=frozenset({"cuda"}),
        requires="liger_kernel",
        summary="Liger-Kernel fused linear cross-entropy (Triton)",
    ),
)


# --------------------------------------------------------------------------------------------
# transformers' ForCausalLMLoss


def _fold_logit_bias(bias: torch.Tensor | None, logit_bias: Any, vocab: int) -> Any:
    """The head's bias with a logit bias added after the head (BART's ``final_logits_bias``,
    ``(1, vocab)``) as one ``(vocab,)`` bias, or ``False`` when that is not the original's
    broadcast (or both are given: their sum would round once more)."""
    if logit_bias is None:
        return bias
    if bias is not None or not isinstance(logit_bias, torch.Tensor) or logit_bias.dim() == 0:
        return False
    if logit_bias.shape[-1] != vocab or logit_bias.numel() != vocab:
        return False
    return logit_bias.reshape(vocab)


def causal_lm_loss(
    hidden_states: torch.Tensor,
    lm_head: nn.Module,
    labels: torch.Tensor,
    vocab_size: int | None,
    num_items_in_batch: Any = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    *,
    final_logit_softcapping: float | None = None,
    logit_bias: torch.Tensor | None = None,
    logit_scale: float | None = None,
    logit_divisor: float | None = None,
    shift: bool = True,
    upcast: bool = True,
    chunk_size: int | None = None,
    loss_function: object = None,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' ``ForCausalLMLoss(lm_head(hidden_states), labels, vocab_size, ...)``
    without the logits (soft-capped first when ``final_logit_softcapping`` is set).

    ``loss_function`` is the loss the replaced call made (``self.loss_function``): when it is
    transformers' ``ForMaskedLMLoss`` (masked-LM heads, and the encoder-decoders whose decoder
    inputs are already shifted: T5Gemma) the labels are the targets as they are, with no shift
    (``shift=False``), the logits upcast as that loss does.

    ``hidden_states`` are the head's inputs (after ``logits_to_keep`` slicing); the remaining
    arguments are ``ForCausalLMLoss``'s, so a rewrite can pass the model's ``**kwargs``
    through (unknown keywords are ignored, as ``ForCausalLMLoss`` ignores them).

    The spellings of models that compute the loss themselves: ``logit_bias`` is added to the
    logits after the head (BART's ``lm_logits + self.final_logits_bias``), then multiplied by
    ``logit_scale`` (Cohere) and divided by ``logit_divisor`` (Granite's ``logits_scaling``);
    ``shift=False``
    takes ``labels`` as the targets as they are (``CrossEntropyLoss()(logits.view(-1, V),
    labels.view(-1))``, mean over the tokens not ``ignore_index``); ``upcast=False`` computes in
    the logits' dtype, as ``CrossEntropyLoss`` on them does (the chunked path then runs for
    float32 heads only, the original for others); ``vocab_size=None`` is the head's width
    (``logits.view(-1, logits.size(-1))``).
    """

    if _loss_kind(loss_function) == "masked":
        shift = False

    def original() -> torch.Tensor:
        return causal_lm_loss_reference(
            hidden_states,
            lm_head,
            labels,
            vocab_size,
            num_items_in_batch,
            ignore_index,
            shift_labels,
            final_logit_softcapping=final_logit_softcapping,
            logit_bias=logit_bias,
            logit_scale=logit_scale,
            logit_divisor=logit_divisor,
            shift=shift,
            upcast=upcast,
        )

    # Under torch.compile too: the dispatch then picks a backend that compiles (ours as a
    # torch.library op, or torch's chunked op) and the compiled graph keeps the memory saving.
    if tracing(hidden_states, labels, shift_labels, logit_bias):
        return original()
    if not is_plain(lm_head, nn.Linear):
        return original()
    weight = lm_head.weight
    if vocab_size is None:
        vocab_size = weight.shape[0]
    if not isinstance(hidden_states, torch.Tensor) or weight.shape[0] != vocab_size:
        return original()
    if not upcast and weight.dtype != torch.float32:
        return original()  # the original's loss is computed and returned in half precision
    bias = _fold_logit_bias(lm_head.bias, logit_bias, vocab_size)
    if bias is False:
        return original()
    if not shift:
        shift_labels = None
    targets = shift_labels if shift_labels is not None else labels
    if not isinstance(targets, torch.Tensor) or targets.dtype != torch.long:
        return original()
    if shift_labels is None and shift:
        if labels.dim() == 0:
            return original()
        targets = _shifted(labels, ignore_index)
    try:
        targets = (targets.view(-1) if shift else targets.reshape(-1)).to(hidden_states.device)
    except RuntimeError:
        return original()  # the original's ``view`` raises for this layout
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1]) if hidden_states.dim() else None
    if hidden is None or targets.numel() != hidden.shape[0]:
        return original()
    reduction = "sum" if num_items_in_batch is not None else "mean"
    if bias is not None and bias.device != hidden.device:
        return original()
    return linear_cross_entropy(
        hidden,
        weight,
        bias,
        targets,
        ignore_index=ignore_index,
        reduction=reduction,
        divisor=num_items_in_batch,
        softcap=final_logit_softcapping,
        chunk_size=chunk_size,
        logit_scale=logit_scale,
        logit_divisor=logit_divisor,
    )


# transformers' token-level losses the kernel computes, by name: the causal one shifts the
# labels by one token, the masked one takes them as they are.
_TOKEN_LOSSES = {"ForCausalLMLoss": "causal", "ForMaskedLMLoss": "masked"}


def _loss_kind(loss_function: object) -> str | None:
    """``"causal"`` or ``"masked"`` for transformers' own token-level losses, else ``None``."""
    if not (getattr(loss_function, "__module__", "") or "").startswith("transformers."):
        return None
    return _TOKEN_LOSSES.get(getattr(loss_function, "__name__", None) or "")


def fused_loss_applies(
    model: nn.Module, labels: object, loss_function: object = None, **kwargs: Any
) -> bool:
    """Whether a causal LM's ``logits`` + loss may be replaced by :func:`causal_lm_loss`.

    True when labels are given (or, with ``labels=None``, ``shift_labels`` in ``kwargs``), the
    model is training with autograd on (the logits of a training step are not used; evaluation
    and generation keep them), and - when ``loss_function`` is passed - it is transformers'
    ``ForCausalLMLoss`` or ``ForMaskedLMLoss`` (the kernel arm hands the same function to
    :func:`causal_lm_loss`, which then knows whether to shift). A caller that needs
    the logits in training passes ``return_logits=True`` (read from ``kwargs``). When this is
    true the rewritten model returns ``logits=None``.
    """
    if kwargs.get("return_logits"):
        return False
    if labels is None:  # the targets handed as ``shift_labels`` (Moonshine, PP-FormulaNet)
        labels = kwargs.get("shift_labels")
    if not isinstance(labels, torch.Tensor) or not model.training or not torch.is_grad_enabled():
        return False
    if loss_function is not None and _loss_kind(loss_function) is None:
        return False
    # Under a tracer the model keeps its original head and loss (and its logits), as
    # linear_cross_entropy() would run them anyway. Under torch.compile it does not: the loss
    # dispatches to a backend that compiles (see causal_lm_loss).
    return not tracing(labels)
