"""Tests for the extended rule set's attention factories (DistilBERT, ALBERT, GPT-Neo).

These run the real classes of transformers 4.34 (a test dependency): the factories must
reproduce exactly those forwards, so the reference is the released code, not a replica.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from adopter.kernels import attention as attention_module
from adopter.kernels import (
    fused_albert_attention,
    fused_bert_self_attention,
    fused_distilbert_attention,
    fused_gpt_neo_self_attention,
)

transformers = pytest.importorskip("transformers")
from transformers.models.albert import modeling_albert  # noqa: E402
from transformers.models.distilbert import modeling_distilbert  # noqa: E402
from transformers.models.gpt_neo import modeling_gpt_neo  # noqa: E402
from transformers.models.roberta import modeling_roberta  # noqa: E402

HIDDEN, HEADS, BATCH, SEQ = 32, 4, 2, 7


@pytest.fixture(autouse=True)
def fused_path_even_where_cpu_prefers_the_original(monkeypatch):
    monkeypatch.setattr(attention_module, "ORIGINAL_WHEN_UNFUSED_ON_CPU", False)


def _pair(factory, cls, *args):
    torch.manual_seed(0)
    original = cls(*args)
    fused = factory(cls)(*args)
    fused.load_state_dict(original.state_dict(), strict=True)
    return original, fused


def _assert_same(original, fused, *inputs, train=False, **kwargs):
    """Outputs, the gradient of the first input and the parameter gradients agree."""
    original.train(train)
    fused.train(train)
    results = []
    for module in (original, fused):
        module.zero_grad()
        hidden = inputs[0].detach().clone().requires_grad_(True)
        out = module(hidden, *inputs[1:], **kwargs)
        first = out[0]
        first.pow(2).sum().backward()
        grads = [hidden.grad]
        params = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
        results.append((out, first.detach(), grads, params))
    (out_a, a, grads_a, params_a), (out_b, b, grads_b, params_b) = results
    assert len(out_a) == len(out_b)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-5)
    assert params_a.keys() == params_b.keys()
    for name in params_a:
        torch.testing.assert_close(params_b[name], params_a[name], rtol=1e-4, atol=1e-5)
    return out_a, out_b


class _Calls(list):
    """``is_causal`` of each SDPA call; ``masks`` holds the masks passed."""

    masks: list


def _counting_sdpa(monkeypatch):
    calls = _Calls()
    real = attention_module._sdpa

    def counted(*args, **kwargs):
        calls.append(kwargs.get("is_causal", args[6] if len(args) > 6 else False))
        masks.append(args[3])
        return real(*args, **kwargs)

    masks: list[torch.Tensor | None] = []
    calls.masks = masks  # type: ignore[attr-defined]

    monkeypatch.setattr(attention_module, "_sdpa", counted)
    import adopter.kernels.attention_extended as extended

    monkeypatch.setattr(extended, "_sdpa", counted)
    return calls


# ---------------------------------------------------------------------------------------------
# RoBERTa (BERT's kernel on RoBERTa's class)
# ---------------------------------------------------------------------------------------------


def test_roberta_self_attention_with_the_bert_kernel(monkeypatch):
    config = transformers.RobertaConfig(
        hidden_size=HIDDEN, num_attention_heads=HEADS, attention_probs_dropout_prob=0.0
    )
    original, fused = _pair(
        fused_bert_self_attention, modeling_roberta.RobertaSelfAttention, config
    )
    x = torch.randn(BATCH, SEQ, HIDDEN)
    mask = torch.zeros(BATCH, 1, 1, SEQ)
    mask[1, ..., -2:] = torch.finfo(torch.float32).min
    calls = _counting_sdpa(monkeypatch)
    for train in (False, True):
        _assert_same(original, fused, x, mask, train=train)
    assert len(calls) == 2
    assert all(m is not None for m in calls.masks)
    # No padding: the all-zero additive mask adds nothing, SDPA gets none (its faster kernel).
    _assert_same(original, fused, x, torch.zeros(BATCH, 1, 1, SEQ))
    assert len(calls) == 3 and calls.masks[-1] is None


# ---------------------------------------------------------------------------------------------
# DistilBERT
# ---------------------------------------------------------------------------------------------


def _distilbert(dropout: float = 0.0):
    config = transformers.DistilBertConfig(dim=HIDDEN, n_heads=HEADS, attention_dropout=dropout)
    return _pair(fused_distilbert_attention, modeling_distilbert.MultiHeadSelfAttention, config)


def _padding_mask(fully_padded_row: bool = False) -> torch.Tensor:
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -3:] = 0
    if fully_padded_row:
        mask[0] = 0
    return mask


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("fully_padded_row", [False, True])
def test_distilbert_self_attention_matches(monkeypatch, train, fully_padded_row):
    original, fused = _distilbert()
    x = torch.randn(BATCH, SEQ, HIDDEN)
    mask = _padding_mask(fully_padded_row)
    calls = _counting_sdpa(monkeypatch)

    # DistilBERT passes the same tensor three times; the fused module sees one tensor object.
    def self_attention(module, hidden, padding):
        return module(hidden, hidden, hidden, padding)

    for module in (original, fused):
        module.train(train)
    torch.manual_seed(1)
    leaves = []
    outputs = []
    for module in (original, fused):
        module.zero_grad()
        hidden = x.clone().requires_grad_(True)
        out = self_attention(module, hidden, mask)[0]
        out.pow(2).sum().backward()
        leaves.append(hidden.grad)
        outputs.append((out.detach(), {n: p.grad for n, p in module.named_parameters()}))
    torch.testing.assert_close(outputs[1][0], outputs[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(leaves[1], leaves[0], rtol=1e-4, atol=1e-5)
    assert all(m is not None for m in calls.masks)
    for name, grad in outputs[0][1].items():
        torch.testing.assert_close(outputs[1][1][name], grad, rtol=1e-4, atol=1e-5)
    # A sequence that is all padding runs the original: only it stops those scores' gradient.
    assert len(calls) == (0 if fully_padded_row else 1)


def test_distilbert_cross_inputs_and_fallbacks(monkeypatch):
    original, fused = _distilbert()
    query = torch.randn(BATCH, 5, HIDDEN)
    memory = torch.randn(BATCH, SEQ, HIDDEN)
    calls = _counting_sdpa(monkeypatch)
    _assert_same(original, fused, query, memory, memory, _padding_mask())
    _assert_same(original, fused, query, memory, torch.randn(BATCH, SEQ, HIDDEN), _padding_mask())
    assert len(calls) == 2
    # Returned weights and head masks: the original code runs.
    out_a, out_b = _assert_same(
        original, fused, memory, memory, memory, _padding_mask(), None, True
    )
    assert len(out_b) == 2
    torch.testing.assert_close(out_b[1], out_a[1])
    head_mask = torch.tensor([1.0, 0.0, 1.0, 1.0]).view(1, HEADS, 1, 1)
    _assert_same(original, fused, memory, memory, memory, _padding_mask(), head_mask)
    assert len(calls) == 2


def test_distilbert_without_padding_passes_no_mask(monkeypatch):
    original, fused = _distilbert()
    x = torch.randn(BATCH, SEQ, HIDDEN)
    calls = _counting_sdpa(monkeypatch)
    _assert_same(original, fused, x, x, x, torch.ones(BATCH, SEQ, dtype=torch.long))
    assert calls.masks == [None]


def test_distilbert_dropout_on_cpu_runs_the_original(monkeypatch):
    monkeypatch.setattr(attention_module, "ORIGINAL_WHEN_UNFUSED_ON_CPU", True)
    original, fused = _distilbert(dropout=0.5)
    x = torch.randn(BATCH, SEQ, HIDDEN)
    calls = _counting_sdpa(monkeypatch)
    outputs = []
    for module in (original, fused):
        module.train()
        torch.manual_seed(3)
        outputs.append(module(x, x, x, _padding_mask())[0])
    torch.testing.assert_close(outputs[1], outputs[0])  # same code, same random numbers
    assert calls == []


# ---------------------------------------------------------------------------------------------
# ALBERT
# ---------------------------------------------------------------------------------------------


def _albert(**overrides):
    settings = dict(
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        intermediate_size=2 * HIDDEN,
        embedding_size=16,
        attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
    )
    settings.update(overrides)
    config = transformers.AlbertConfig(**settings)
    return _pair(fused_albert_attention, modeling_albert.AlbertAttention, config)


@pytest.mark.parametrize("train", [False, True])
def test_albert_attention_matches_including_the_closing_norm(monkeypatch, train):
    original, fused = _albert()
    x = torch.randn(BATCH, SEQ, HIDDEN)
    mask = torch.zeros(BATCH, 1, 1, SEQ)
    mask[1, ..., -2:] = torch.finfo(torch.float32).min
    calls = _counting_sdpa(monkeypatch)
    _assert_same(original, fused, x, mask, train=train)
    _assert_same(original, fused, x, train=train)
    assert len(calls) == 2


def test_albert_fallbacks(monkeypatch):
    original, fused = _albert()
    x = torch.randn(BATCH, SEQ, HIDDEN)
    calls = _counting_sdpa(monkeypatch)
    out_a, out_b = _assert_same(original, fused, x, None, None, True)
    torch.testing.assert_close(out_b[1], out_a[1])
    original, fused = _albert(position_embedding_type="relative_key")
    _assert_same(original, fused, x)
    assert calls == []


# ---------------------------------------------------------------------------------------------
# GPT-Neo
# ---------------------------------------------------------------------------------------------


def _gpt_neo(attention_type: str, dropout: float = 0.0):
    config = transformers.GPTNeoConfig(
        hidden_size=HIDDEN,
        num_heads=HEADS,
        num_layers=2,
        attention_types=[[["global", "local"], 1]],
        window_size=3,
        max_position_embeddings=16,
        attention_dropout=dropout,
        resid_dropout=0.0,
    )
    return _pair(
        fused_gpt_neo_self_attention, modeling_gpt_neo.GPTNeoSelfAttention, config, attention_type
    )


def _additive_padding(left: bool = False) -> torch.Tensor:
    mask = torch.zeros(BATCH, 1, 1, SEQ)
    if left:  # as in batched generation: the first queries of row 1 see only padding
        mask[1, ..., :2] = torch.finfo(torch.float32).min
    else:
        mask[1, ..., -2:] = torch.finfo(torch.float32).min
    return mask


@pytest.mark.parametrize("attention_type", ["global", "local"])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_gpt_neo_attention_matches(monkeypatch, attention_type, train, padded):
    original, fused = _gpt_neo(attention_type)
    x = torch.randn(BATCH, SEQ, HIDDEN)
    calls = _counting_sdpa(monkeypatch)
    mask = _additive_padding() if padded else None
    out_a, out_b = _assert_same(original, fused, x, mask, None, None, True, train=train)
    for cached_a, cached_b in zip(out_a[1], out_b[1]):
        torch.testing.assert_close(cached_b, cached_a)
    # Only a global layer without a padding mask can use SDPA's own causal kernel.
    assert calls == [attention_type == "global" and not padded]
    assert (calls.masks[0] is None) == (attention_type == "global" and not padded)


def test_gpt_neo_queries_that_see_only_padding_run_the_original(monkeypatch):
    original, fused = _gpt_neo("global")
    x = torch.randn(BATCH, SEQ, HIDDEN)
    calls = _counting_sdpa(monkeypatch)
    _assert_same(original, fused, x, _additive_padding(left=True), train=True)
    _assert_same(original, fused, x, torch.zeros(BATCH, 1, 1, SEQ))  # no padding at all
    assert calls == [True]


@pytest.mark.parametrize("attention_type", ["global", "local"])
def test_gpt_neo_generation_step_with_past(monkeypatch, attention_type):
    original, fused = _gpt_neo(attention_type)
    prompt = torch.randn(BATCH, SEQ - 1, HIDDEN)
    step = torch.randn(BATCH, 1, HIDDEN)
    calls = _counting_sdpa(monkeypatch)
    original.eval()
    with torch.no_grad():
        past = original(prompt, use_cache=True)[1]
    mask = _additive_padding(left=True)
    _assert_same(original, fused, step, mask, past, None, True)
    _assert_same(original, fused, step, None, past, None, True)
    assert calls == [False, False]


def test_gpt_neo_fallbacks(monkeypatch):
    original, fused = _gpt_neo("global")
    x = torch.randn(BATCH, SEQ, HIDDEN)
    calls = _counting_sdpa(monkeypatch)
    out_a, out_b = _assert_same(original, fused, x, None, None, None, False, True)
    torch.testing.assert_close(out_b[2], out_a[2])
    head_mask = torch.tensor([1.0, 0.0, 1.0, 1.0]).view(1, HEADS, 1, 1)
    _assert_same(original, fused, x, None, None, head_mask)
    original.double()
    fused.double()
    _assert_same(original, fused, x.double())  # the original's float32 upcast is kept
    assert calls == []


# ---------------------------------------------------------------------------------------------
# Common
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make", [_distilbert, _albert, lambda: _gpt_neo("local")], ids=["distilbert", "albert", "neo"]
)
def test_fused_modules_keep_keys_and_pickle(make):
    original, fused = make()
    assert list(fused.state_dict()) == list(original.state_dict())
    assert type(fused).__name__ == "Fused" + type(original).__name__
    for clone in (copy.deepcopy(fused), pickle.loads(pickle.dumps(fused))):
        assert type(clone) is type(original)  # the base class: a pickle names no Adopter code
        assert list(clone.state_dict()) == list(original.state_dict())


def test_factories_cache_and_are_idempotent():
    cls = modeling_distilbert.MultiHeadSelfAttention
    fused = fused_distilbert_attention(cls)
    assert fused_distilbert_attention(cls) is fused
    assert fused_distilbert_attention(fused) is fused
