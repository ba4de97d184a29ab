"""adopter.kernels linear_cross_entropy / causal_lm_loss against the original head + loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from adopter.kernels import causal_lm_loss, fused_loss_applies, linear_cross_entropy
from adopter.kernels.cross_entropy import causal_lm_loss_reference
from tests.kernels.conftest import assert_close, assert_same_function, assert_traces_like_reference

# --- transformers 5's loss, as loss_utils.py writes it ---------------------------------------


def fixed_cross_entropy(source, target, num_items_in_batch=None, ignore_index=-100, **kwargs):
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = nn.functional.cross_entropy(
        source, target, ignore_index=ignore_index, reduction=reduction
    )
    if reduction == "sum":
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def for_causal_lm_loss(
    logits,
    labels,
    vocab_size,
    num_items_in_batch=None,
    ignore_index=-100,
    shift_labels=None,
    **kwargs,
):
    logits = logits.float()
    if shift_labels is None:
        labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1)
    shift_labels = shift_labels.to(logits.device)
    return fixed_cross_entropy(logits, shift_labels, num_items_in_batch, ignore_index, **kwargs)


def gemma_head(hidden, lm_head, cap):
    logits = lm_head(hidden)
    if cap is not None:
        logits = logits / cap
        logits = torch.tanh(logits)
        logits = logits * cap
    return logits


def head(vocab=50, hidden=16, bias=False, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(hidden, vocab, bias=bias).to(dtype)


def labels_for(batch, seq, vocab, ignore_every=0, seed=1):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, vocab, (batch, seq), generator=generator)
    if ignore_every:
        labels.view(-1)[::ignore_every] = -100
    return labels


def compare_head_losses(kernel, original, lm_head, hidden, scale=1.0):
    """Loss, hidden-state gradient and head-parameter gradients of two loss callables."""
    results = []
    for fn in (kernel, original):
        lm_head.zero_grad(set_to_none=True)
        h = hidden.detach().clone().requires_grad_()
        loss = fn(h)
        (loss * scale).backward()
        results.append([loss.detach(), h.grad] + [p.grad for p in lm_head.parameters()])
    for a, b in zip(*results, strict=True):
        assert_close(a, b, scale=4)


@pytest.mark.parametrize("ignore_every", [0, 3])
@pytest.mark.parametrize("num_items", [None, "int", "tensor"])
@pytest.mark.parametrize("cap", [None, 5.0])
@pytest.mark.parametrize("bias", [False, True])
def test_causal_lm_loss_matches_for_causal_lm_loss(ignore_every, num_items, cap, bias):
    lm_head = head(bias=bias)
    hidden = torch.randn(3, 11, 16)
    labels = labels_for(3, 11, 50, ignore_every)
    items = {None: None, "int": 17, "tensor": torch.tensor(17)}[num_items]
    compare_head_losses(
        lambda h: causal_lm_loss(
            h, lm_head, labels, 50, items, final_logit_softcapping=cap, chunk_size=7
        ),
        lambda h: for_causal_lm_loss(gemma_head(h, lm_head, cap), labels, 50, items),
        lm_head,
        hidden,
    )


def test_shift_labels_given():
    lm_head = head()
    hidden = torch.randn(2, 9, 16)
    shift = labels_for(2, 9, 50, 4)
    compare_head_losses(
        lambda h: causal_lm_loss(h, lm_head, None, 50, shift_labels=shift),
        lambda h: for_causal_lm_loss(lm_head(h), None, 50, shift_labels=shift),
        lm_head,
        hidden,
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_head(dtype):
    lm_head = head(dtype=dtype)
    hidden = torch.randn(2, 13, 16).to(dtype)
    labels = labels_for(2, 13, 50, 5)
    results = []
    for fn in (
        lambda h: causal_lm_loss(h, lm_head, labels, 50, chunk_size=4),
        lambda h: for_causal_lm_loss(lm_head(h), labels, 50),
    ):
        lm_head.zero_grad(set_to_none=True)
        h = hidden.clone().requires_grad_()
        loss = fn(h)
        loss.backward()
        results.append((loss.detach(), h.grad, lm_head.weight.grad))
    assert_close(results[0][0], results[1][0])
    # The original rounds the logit gradient to 8 (11) bits before one big GEMM; the kernel
    # accumulates the weight gradient over chunks in float32: both carry dtype rounding.
    for a, b in zip(results[0][1:], results[1][1:], strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), rtol=0.05, atol=2e-3)


def test_matches_transformers_llama_loss():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    input_ids = torch.randint(0, 64, (2, 10))
    labels = input_ids.clone()
    labels[0, :3] = -100
    model.zero_grad()
    expected = model(input_ids=input_ids, labels=labels).loss
    expected.backward()
    grad_expected = model.lm_head.weight.grad.clone()
    model.zero_grad()
    hidden = model.model(input_ids=input_ids)[0]
    loss = causal_lm_loss(hidden, model.lm_head, labels, config.vocab_size)
    loss.backward()
    assert_close(loss, expected.detach())
    assert_close(model.lm_head.weight.grad, grad_expected)


def test_all_tokens_ignored_gives_nan_and_zero_gradients():
    lm_head = head()
    hidden = torch.randn(2, 4, 16)
    labels = torch.full((2, 4), -100)
    results = []
    for fn in (
        lambda h: causal_lm_loss(h, lm_head, labels, 50),
        lambda h: for_causal_lm_loss(lm_head(h), labels, 50),
    ):
        lm_head.zero_grad(set_to_none=True)
        h = hidden.clone().requires_grad_()
        loss = fn(h)
        loss.backward()
        results.append((loss.detach(), h.grad, lm_head.weight.grad))
    assert results[0][0].isnan() and results[1][0].isnan()
    for a, b in zip(results[0][1:], results[1][1:], strict=True):
        assert torch.equal(a, b)


def test_gradient_of_a_scaled_loss():
    lm_head = head()
    labels = labels_for(2, 6, 50, 4)
    compare_head_losses(
        lambda h: causal_lm_loss(h, lm_head, labels, 50),
        lambda h: for_causal_lm_loss(lm_head(h), labels, 50),
        lm_head,
        torch.randn(2, 6, 16),
        scale=3.5,
    )


def test_backward_twice_is_refused():
    lm_head = head()
    h = torch.randn(2, 6, 16, requires_grad=True)
    loss = causal_lm_loss(h, lm_head, labels_for(2, 6, 50), 50)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        loss.backward()


def test_frozen_head_and_no_grad():
    lm_head = head().requires_grad_(False)
    labels = labels_for(2, 6, 50)
    assert_same_function(
        lambda h: causal_lm_loss(h, lm_head, labels, 50),
        lambda h: for_causal_lm_loss(lm_head(h), labels, 50),
        [torch.randn(2, 6, 16)],
        scale=4,
    )
    with torch.no_grad():
        hidden = torch.randn(2, 6, 16)
        assert_close(
            causal_lm_loss(hidden, lm_head, labels, 50),
            for_causal_lm_loss(lm_head(hidden), labels, 50),
            scale=4,
        )


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operation produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_never_materialises_the_logits():
    tokens, vocab, width = 64, 300, 8
    lm_head = head(vocab=vocab, hidden=width)
    hidden = torch.randn(2, tokens // 2, width, requires_grad=True)
    labels = labels_for(2, tokens // 2, vocab)
    with _LargestTensor() as probe:
        causal_lm_loss(hidden, lm_head, labels, vocab, chunk_size=8).backward()
    assert probe.largest == vocab * width  # the weight gradient; a chunk is 8 x vocab
    with _LargestTensor() as probe:
        for_causal_lm_loss(lm_head(hidden), labels, vocab).backward()
    assert probe.largest == tokens * vocab


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(1, 40),
    vocab=st.integers(2, 70),
    width=st.integers(1, 12),
    ignore_every=st.sampled_from([0, 1, 2, 5]),
    chunk=st.sampled_from([None, 1, 3, 16]),
    reduction=st.sampled_from(["mean", "sum"]),
    cap=st.sampled_from([None, 2.0]),
    bias=st.booleans(),
)
def test_property_linear_cross_entropy(
    tokens, vocab, width, ignore_every, chunk, reduction, cap, bias
):
    generator = torch.Generator().manual_seed(tokens * 131 + vocab * 7 + width)
    hidden = torch.randn(tokens, width, generator=generator)
    weight = torch.randn(vocab, width, generator=generator)
    b = torch.randn(vocab, generator=generator) if bias else None
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    if ignore_every:
        targets[::ignore_every] = -100

    def original(h, w, b):
        logits = gemma_head(h, lambda x: F.linear(x, w, b), cap).float()
        return F.cross_entropy(logits, targets, reduction=reduction)

    assert_same_function(
        lambda h, w, b: linear_cross_entropy(
            h, w, b, targets, reduction=reduction, softcap=cap, chunk_size=chunk
        ),
        original,
        [hidden, weight, b],
        scale=10,
    )


@pytest.mark.parametrize(
    "case", ["int32_labels", "out_of_range", "hooked_head", "autocast", "other_vocab"]
)
def test_falls_back_to_the_original(case, monkeypatch):
    import importlib

    module = importlib.import_module("adopter.kernels.cross_entropy")
    monkeypatch.setattr(module, "_forward_chunks", None)  # the chunked path would crash
    lm_head = head()
    hidden = torch.randn(2, 5, 16)
    labels = labels_for(2, 5, 50)
    vocab = 50
    if case == "int32_labels":
        labels = labels.int()
    elif case == "out_of_range":
        labels[0, 2] = 50
    elif case == "hooked_head":
        calls = []
        lm_head.register_forward_hook(lambda *args: calls.append(1))
    elif case == "other_vocab":
        vocab = 25  # the original's view(-1, vocab_size) reinterprets the logits
    try:
        expected = for_causal_lm_loss(lm_head(hidden), labels, vocab)
    except (RuntimeError, IndexError, ValueError) as exc:
        with pytest.raises(type(exc)):
            causal_lm_loss(hidden, lm_head, labels, vocab)
        return
    if case == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = causal_lm_loss(hidden, lm_head, labels, vocab)
            expected = for_causal_lm_loss(lm_head(hidden), labels, vocab)
    else:
        got = causal_lm_loss(hidden, lm_head, labels, vocab)
    assert torch.equal(got, expected)
    if case == "hooked_head":
        assert calls == [1, 1]


def test_traces_record_the_original_operations():
    lm_head = head()
    labels = labels_for(2, 5, 50, 3)

    class Kernel(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = lm_head

        def forward(self, h, labels):
            return causal_lm_loss(h, self.lm_head, labels, 50)

    class Original(Kernel):
        def forward(self, h, labels):
            return causal_lm_loss_reference(h, self.lm_head, labels, 50)

    assert_traces_like_reference(Kernel(), Original(), [torch.randn(2, 5, 16), labels])


def for_masked_lm_loss(
    logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, **kwargs
):
    logits = logits.float().view(-1, vocab_size)
    labels = labels.view(-1).to(logits.device)
    return fixed_cross_entropy(logits, labels, num_items_in_batch, ignore_index, **kwargs)


def transformers_loss(name, function):
    """``function`` under transformers 5's name and module (the kernel knows it by both;
    transformers 4.34, installed here, has no ``loss`` package)."""

    def loss(*args, **kwargs):
        return function(*args, **kwargs)

    loss.__name__ = name
    loss.__module__ = "transformers.loss.loss_utils"
    return loss


@pytest.mark.parametrize("ignore_every", [0, 3])
@pytest.mark.parametrize("num_items", [None, 17])
def test_causal_lm_loss_told_the_masked_lm_loss_does_not_shift(ignore_every, num_items):
    """Masked-LM heads (ModernBERT) and T5Gemma's decoder call ``ForMaskedLMLoss``: the
    labels are the targets where they stand."""
    masked = transformers_loss("ForMaskedLMLoss", for_masked_lm_loss)
    lm_head = head(bias=True)
    hidden = torch.randn(3, 11, 16)
    labels = labels_for(3, 11, 50, ignore_every)
    compare_head_losses(
        lambda h: causal_lm_loss(
            h, lm_head, labels, 50, num_items, chunk_size=7, loss_function=masked
        ),
        lambda h: masked(lm_head(h), labels, 50, num_items),
        lm_head,
        hidden,
    )


def test_fused_loss_applies():
    ForCausalLMLoss = transformers_loss("ForCausalLMLoss", for_causal_lm_loss)  # noqa: N806
    ForMaskedLMLoss = transformers_loss("ForMaskedLMLoss", for_masked_lm_loss)  # noqa: N806
    model = nn.Linear(2, 2).train()
    labels = torch.zeros(2, 3, dtype=torch.long)
    assert fused_loss_applies(model, labels, ForCausalLMLoss)
    assert fused_loss_applies(model, labels, ForMaskedLMLoss)
    assert not fused_loss_applies(model, labels, transformers_loss("ForTokenClassification", print))
    assert fused_loss_applies(model, labels)
    assert not fused_loss_applies(model, None)
    # Moonshine hands its (already shifted) targets as shift_labels, with labels=None
    assert fused_loss_applies(model, None, ForCausalLMLoss, shift_labels=labels)
    assert not fused_loss_applies(model, labels, for_causal_lm_loss)  # not transformers' own
    assert not fused_loss_applies(model, labels, return_logits=True)
    assert not fused_loss_applies(model.eval(), labels)
    with torch.no_grad():
        assert not fused_loss_applies(model.train(), labels)


def test_in_place_log_softmax_equals_the_out_of_place_one():
    from adopter.kernels.cross_entropy import _log_softmax

    logits = torch.randn(16, 32001) * 7
    expected = F.log_softmax(logits, dim=-1)
    assert torch.equal(_log_softmax(logits.clone()), expected)
    assert torch.equal(_log_softmax(logits[:, :-1]), F.log_softmax(logits[:, :-1], dim=-1))


# -- the spellings of models that compute their loss themselves (issue 22) -------------------


def _explicit_loss(logits, labels, vocab=None, ignore_index=-100):
    """``CrossEntropyLoss(ignore_index=...)(logits.view(-1, V), labels.view(-1))``."""
    loss_fct = nn.CrossEntropyLoss(ignore_index=ignore_index)
    vocab = logits.size(-1) if vocab is None else vocab
    return loss_fct(logits.view(-1, vocab), labels.view(-1))


@pytest.mark.parametrize("ignore_every", [0, 3])
@pytest.mark.parametrize("vocab", [50, None])
@pytest.mark.parametrize("bias", [False, True])
def test_unshifted_cross_entropy_matches_cross_entropy_loss(ignore_every, vocab, bias):
    lm_head = head(bias=bias)
    hidden = torch.randn(3, 11, 16)
    labels = labels_for(3, 11, 50, ignore_every)
    compare_head_losses(
        lambda h: causal_lm_loss(
            h, lm_head, labels, vocab, shift=False, upcast=False, chunk_size=7
        ),
        lambda h: _explicit_loss(lm_head(h), labels, vocab),
        lm_head,
        hidden,
    )


def test_unshifted_cross_entropy_never_materialises_the_logits():
    tokens, vocab, width = 64, 300, 8
    lm_head = head(vocab=vocab, hidden=width)
    hidden = torch.randn(2, tokens // 2, width, requires_grad=True)
    labels = labels_for(2, tokens // 2, vocab)
    with _LargestTensor() as probe:
        loss = causal_lm_loss(
            hidden, lm_head, labels, vocab, shift=False, upcast=False, chunk_size=8
        )
        loss.backward()
    assert probe.largest == vocab * width  # the weight gradient; a chunk is 8 x vocab


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_unshifted_half_precision_runs_the_original(dtype):
    lm_head = head(dtype=dtype)
    hidden = torch.randn(2, 5, 16, dtype=dtype)
    labels = labels_for(2, 5, 50)
    got = causal_lm_loss(hidden, lm_head, labels, 50, shift=False, upcast=False)
    expected = _explicit_loss(lm_head(hidden), labels, 50)
    assert got.dtype == expected.dtype == dtype
    assert torch.equal(got, expected)


@pytest.mark.parametrize("cap", [None, 5.0])
@pytest.mark.parametrize("shape", [(1, 50), (50,)])
@pytest.mark.parametrize("trainable", [False, True])
def test_logit_bias_after_the_head(cap, shape, trainable):
    lm_head = head()
    bias = torch.randn(*shape, requires_grad=trainable)
    hidden = torch.randn(3, 11, 16)
    labels = labels_for(3, 11, 50, 4)

    def bart(h):
        logits = gemma_head(h, lambda x: lm_head(x) + bias, cap)
        return _explicit_loss(logits, labels, 50)

    results = []
    for fn in (
        lambda h: causal_lm_loss(
            h,
            lm_head,
            labels,
            50,
            logit_bias=bias,
            final_logit_softcapping=cap,
            shift=False,
            upcast=False,
            chunk_size=5,
        ),
        bart,
    ):
        bias.grad = None
        lm_head.zero_grad(set_to_none=True)
        h = hidden.detach().clone().requires_grad_()
        loss = fn(h)
        loss.backward()
        results.append([loss.detach(), h.grad, lm_head.weight.grad, bias.grad])
    for a, b in zip(*results, strict=True):
        if a is None or b is None:
            assert a is None and b is None
        else:
            assert_close(a, b, scale=4)


def test_logit_bias_with_a_head_bias_runs_the_original():
    lm_head = head(bias=True)
    bias = torch.randn(1, 50)
    hidden = torch.randn(2, 5, 16)
    labels = labels_for(2, 5, 50)
    got = causal_lm_loss(hidden, lm_head, labels, 50, logit_bias=bias, shift=False, upcast=False)
    assert torch.equal(got, _explicit_loss(lm_head(hidden) + bias, labels, 50))
    wrong = torch.randn(2, 50)  # not the (1, vocab) broadcast of a bias: the original raises
    with pytest.raises(RuntimeError):
        causal_lm_loss(hidden, head(), labels, 50, logit_bias=wrong, shift=False, upcast=False)


@pytest.mark.parametrize("factor", ["logit_scale", "logit_divisor"])
@pytest.mark.parametrize("num_items", [None, 13])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logit_scale_between_head_and_loss(factor, num_items, dtype):
    """Cohere's ``logits * self.logit_scale`` and Granite's ``logits / logits_scaling``."""
    lm_head = head(dtype=dtype)
    hidden = torch.randn(3, 11, 16, dtype=dtype)
    labels = labels_for(3, 11, 50, 5)
    value = 0.0625 if factor == "logit_scale" else 8.0

    def scaled(h):
        logits = lm_head(h)
        logits = logits * value if factor == "logit_scale" else logits / value
        return for_causal_lm_loss(logits, labels, 50, num_items)

    compare_head_losses(
        lambda h: causal_lm_loss(
            h, lm_head, labels, 50, num_items, chunk_size=6, **{factor: value}
        ),
        scaled,
        lm_head,
        hidden,
    )


@pytest.mark.parametrize("value", [torch.tensor(0.5), 0.0, float("inf")])
def test_logit_scale_other_than_a_number_runs_the_original(value):
    lm_head = head()
    hidden = torch.randn(2, 5, 16)
    labels = labels_for(2, 5, 50)
    got = causal_lm_loss(hidden, lm_head, labels, 50, logit_scale=value)
    expected = for_causal_lm_loss(lm_head(hidden) * value, labels, 50)
    assert torch.equal(got, expected) or (got.isnan() and expected.isnan())
