"""adopter.kernels attention_function / scaled_attention against the original spellings."""

from __future__ import annotations

import importlib
import types

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from adopter.kernels import attention_function, scaled_attention
from adopter.kernels.attention_function import (
    attention_function_reference,
    attention_weights_needed,
    scaled_attention_reference,
)
from tests.kernels.conftest import assert_close, assert_same_function, assert_traces_like_reference

module_of_kernel = importlib.import_module("adopter.kernels.attention_function")

# --- the spellings as the model files write them --------------------------------------------


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(
        batch, num_key_value_heads, n_rep, slen, head_dim
    )
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def llama_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


def bert_eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


def timm_attention(q, k, v, attn_mask, scale, attn_drop):
    q = q * scale
    attn = q @ k.transpose(-2, -1)
    if attn_mask is not None:
        attn = attn + attn_mask
    attn = attn.softmax(dim=-1)
    attn = attn_drop(attn)
    return attn @ v


def diffusers_scores(query, key, attention_mask, scale, upcast_attention, upcast_softmax):
    dtype = query.dtype
    if upcast_attention:
        query = query.float()
        key = key.float()
    if attention_mask is None:
        baddbmm_input = torch.empty(query.shape[0], query.shape[1], key.shape[1], dtype=query.dtype)
        beta = 0
    else:
        baddbmm_input = attention_mask
        beta = 1
    scores = torch.baddbmm(baddbmm_input, query, key.transpose(-1, -2), beta=beta, alpha=scale)
    if upcast_softmax:
        scores = scores.float()
    return scores.softmax(dim=-1).to(dtype)


class Attn(nn.Module):
    def __init__(self, groups=1, p=0.0):
        super().__init__()
        self.num_key_value_groups = groups
        self.attention_dropout = p
        self.config = types.SimpleNamespace(output_attentions=False)


def causal_mask(batch, q_len, k_len, dtype=torch.float32, pad=0):
    mask = torch.full((q_len, k_len), torch.finfo(dtype).min, dtype=dtype).triu(k_len - q_len + 1)
    mask = mask[None, None].repeat(batch, 1, 1, 1)
    if pad:  # right padding: the last keys of the first sequence
        mask[0, :, :, k_len - pad :] = torch.finfo(dtype).min
    return mask


def qkv(batch=2, heads=6, kv_heads=2, q_len=7, k_len=7, dim=8, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=generator).to(dtype)
    k = torch.randn(batch, kv_heads, k_len, dim, generator=generator).to(dtype)
    v = torch.randn(batch, kv_heads, k_len, dim, generator=generator).to(dtype)
    return q, k, v


def fused_only(fn):
    """``fn`` whose attention weights must be ``None`` (the fused path ran)."""

    def run(*args):
        out, weights = fn(*args)
        assert weights is None
        return out

    return run


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("mask", ["none", "causal", "padded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_spelling(groups, mask, dtype):
    module = Attn(groups)
    q, k, v = qkv(heads=6, kv_heads=6 // groups, dtype=dtype)
    attention_mask = (
        None if mask == "none" else causal_mask(2, 7, 7, dtype, pad=2 * (mask == "padded"))
    )
    assert_same_function(
        fused_only(lambda q, k, v: attention_function(module, q, k, v, attention_mask, 0.3)),
        lambda q, k, v: llama_eager(module, q, k, v, attention_mask, 0.3)[0],
        [q, k, v],
        scale=4 if dtype == torch.bfloat16 else 1,
    )


def test_bert_spelling_with_default_scaling():
    module = Attn()
    q, k, v = qkv(heads=4, kv_heads=4)
    mask = causal_mask(2, 7, 7)
    assert_same_function(
        fused_only(
            lambda q, k, v: attention_function(
                module, q, k, v, mask, None, repeat_kv=False, softmax_dtype=None
            )
        ),
        lambda q, k, v: bert_eager(module, q, k, v, mask)[0],
        [q, k, v],
    )


def test_sliced_mask_and_cross_lengths():
    module = Attn(2)
    q, k, v = qkv(heads=4, kv_heads=2, q_len=3, k_len=9)
    long_mask = torch.randn(2, 1, 3, 12)

    def original(q, k, v):
        return llama_eager(module, q, k, v, long_mask[:, :, :, : k.shape[-2]], 0.2)[0]

    assert_same_function(
        fused_only(
            lambda q, k, v: attention_function(module, q, k, v, long_mask, 0.2, slice_mask=True)
        ),
        original,
        [q, k, v],
    )


def test_query_rows_that_see_no_key_run_the_original():
    module = Attn(3)
    q, k, v = qkv()
    mask = causal_mask(2, 7, 7)
    mask[0, :, :, :2] = torch.finfo(torch.float32).min  # left padding: rows 0-1 see nothing
    out, weights = attention_function(module, q, k, v, mask, 0.3)
    out_o, weights_o = llama_eager(module, q, k, v, mask, 0.3)
    assert torch.equal(out, out_o) and torch.equal(weights, weights_o)


@pytest.mark.parametrize("how", ["kwarg", "config", "hook"])
def test_weights_are_returned_when_they_may_be_used(how):
    module = Attn(3)
    q, k, v = qkv()
    kwargs = {}
    if how == "kwarg":
        kwargs["output_attentions"] = True
    elif how == "config":
        module.config.output_attentions = True
    else:
        module.register_forward_hook(lambda *args: None)
    assert attention_weights_needed(module, kwargs)
    out, weights = attention_function(module, q, k, v, None, 0.3, **kwargs)
    out_o, weights_o = llama_eager(module, q, k, v, None, 0.3)
    assert torch.equal(out, out_o) and torch.equal(weights, weights_o)


def test_dropout_on_cpu_draws_like_the_original():
    module = Attn(3, p=0.4).train()
    q, k, v = qkv()
    mask = causal_mask(2, 7, 7)
    torch.manual_seed(5)
    out, weights = attention_function(module, q, k, v, mask, 0.3, dropout=0.4)
    torch.manual_seed(5)
    out_o, weights_o = llama_eager(module, q, k, v, mask, 0.3, dropout=0.4)
    assert torch.equal(out, out_o) and torch.equal(weights, weights_o)


def test_dropout_through_sdpa_when_allowed(monkeypatch):
    monkeypatch.setattr(
        importlib.import_module("adopter.kernels.attention"), "ORIGINAL_WHEN_UNFUSED_ON_CPU", False
    )
    module = Attn(1).train()
    q, k, v = qkv(heads=2, kv_heads=2, q_len=64, k_len=64, dim=4)
    v = torch.ones_like(v)  # every output is then the kept probability mass, scaled back
    out, weights = attention_function(module, q, k, v, None, 0.3, dropout=0.5)
    assert weights is None
    assert 0.6 < out.mean().item() < 1.4  # E[out] = 1 with the 1/(1-p) rescale
    out_eval, _ = attention_function(module.eval(), q, k, v, None, 0.3, dropout=0.5)
    assert torch.allclose(out_eval, torch.ones_like(out_eval))


@pytest.mark.parametrize(
    "case",
    [
        "bool_mask",
        "mask_other_dtype",
        "mask_needs_grad",
        "grows_scores",
        "subclass",
        "autocast",
        "3d",
    ],
)
def test_falls_back_to_the_original(case, monkeypatch):
    module = Attn(1)
    q, k, v = qkv(heads=2, kv_heads=2)
    mask = causal_mask(2, 7, 7)
    if case == "bool_mask":
        mask = torch.rand(2, 1, 7, 7) > 0.5
    elif case == "mask_other_dtype":
        mask = mask.double()
    elif case == "mask_needs_grad":
        mask = torch.randn(2, 1, 7, 7, requires_grad=True)
    elif case == "grows_scores":
        mask = torch.zeros(3, 2, 7, 7)
        q, k, v = q[:1], k[:1], v[:1]
    elif case == "subclass":
        q = q.as_subclass(type("Sub", (torch.Tensor,), {}))
    elif case == "3d":
        q, k, v = q[0], k[0], v[0]
        mask = None

    def forbidden(*args, **kwargs):
        raise AssertionError("SDPA ran")

    monkeypatch.setattr(F, "scaled_dot_product_attention", forbidden)
    if case == "3d":
        with pytest.raises(ValueError):  # repeat_kv unpacks four dimensions, as the original
            attention_function(module, q, k, v, mask, 0.3)
        return
    if case == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, weights = attention_function(module, q, k, v, mask, 0.3)
            expected = llama_eager(module, q, k, v, mask, 0.3)
    else:
        out, weights = attention_function(module, q, k, v, mask, 0.3)
        expected = llama_eager(module, q, k, v, mask, 0.3)
    assert weights is not None
    torch.testing.assert_close(out, expected[0], rtol=0, atol=0)


@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(1, 3),
    kv_heads=st.integers(1, 3),
    groups=st.integers(1, 3),
    q_len=st.integers(1, 9),
    extra_keys=st.integers(0, 5),
    dim=st.sampled_from([4, 8, 16]),
    mask_kind=st.sampled_from(["none", "causal", "random", "per_head"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_property_eager_attention(
    batch, kv_heads, groups, q_len, extra_keys, dim, mask_kind, dtype
):
    k_len = q_len + extra_keys
    module = Attn(groups)
    q, k, v = qkv(
        batch, kv_heads * groups, kv_heads, q_len, k_len, dim, dtype, seed=q_len * 7 + k_len
    )
    generator = torch.Generator().manual_seed(dim + q_len)
    if mask_kind == "none":
        mask = None
    elif mask_kind == "causal":
        mask = causal_mask(batch, q_len, k_len, dtype)
    elif mask_kind == "random":
        mask = torch.randn(batch, 1, q_len, k_len, generator=generator).to(dtype)
    else:
        mask = torch.randn(1, kv_heads * groups, q_len, k_len, generator=generator).to(dtype)
    scaling = dim**-0.5
    assert_same_function(
        lambda q, k, v: attention_function(module, q, k, v, mask, scaling)[0],
        lambda q, k, v: llama_eager(module, q, k, v, mask, scaling)[0],
        [q, k, v],
        scale=4 if dtype == torch.bfloat16 else 1,
    )


def test_reference_is_the_model_spelling():
    module = Attn(3, p=0.2).train()
    q, k, v = qkv()
    mask = causal_mask(2, 7, 7)
    torch.manual_seed(1)
    ours = attention_function_reference(module, q, k, v, mask, 0.3, 0.2)
    torch.manual_seed(1)
    theirs = llama_eager(module, q, k, v, mask, 0.3, 0.2)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_traces_record_the_original_operations():
    module = Attn(3)
    q, k, v = qkv()
    mask = causal_mask(2, 7, 7)
    assert_traces_like_reference(
        lambda q, k, v, m: attention_function(module, q, k, v, m, 0.3),
        lambda q, k, v, m: attention_function_reference(module, q, k, v, m, 0.3),
        [q, k, v, mask],
        fx=False,  # repeat_kv unpacks a Proxy shape: not fx-traceable in the original either
    )
    assert_traces_like_reference(
        lambda q, k, v, m: scaled_attention(q, k, v, m, scale=0.3),
        lambda q, k, v, m: scaled_attention_reference(q, k, v, m, scale=0.3),
        [q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), mask],
    )


# --- scaled_attention: timm and diffusers ---------------------------------------------------


@pytest.mark.parametrize("with_mask", [False, True])
def test_timm_spelling(with_mask):
    q, k, v = qkv(heads=3, kv_heads=3, q_len=10, k_len=10)
    mask = torch.randn(1, 1, 10, 10) if with_mask else None
    drop = nn.Dropout(0.1).eval()
    assert_same_function(
        lambda q, k, v: scaled_attention(q, k, v, mask, scale=0.35, dropout=drop, scale_query=True),
        lambda q, k, v: timm_attention(q, k, v, mask, 0.35, drop),
        [q, k, v],
    )


def timm_self_attn_bias(length, attn, attn_mask=None, is_causal=False):
    """timm 1.0.31's mask helper, written again: SDPA's mask semantics as an additive bias."""
    if is_causal:
        return attn.new_full((length, length), float("-inf")).triu_(1)
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros_like(attn_mask, dtype=attn.dtype)
        bias.masked_fill_(~attn_mask, float("-inf"))
        return bias
    return attn_mask


def timm_attention_with_mask_helper(q, k, v, attn_mask, is_causal, scale, attn_drop):
    length = q.shape[-2]
    q = q * scale
    attn = q @ k.transpose(-2, -1)
    bias = timm_self_attn_bias(length, attn, attn_mask, is_causal)
    attn = attn if bias is None else attn + bias
    attn = attn.softmax(dim=-1)
    attn = attn_drop(attn)
    return attn @ v


@pytest.mark.parametrize("mask", ["none", "float", "bool", "bool-broadcast"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_timm_spelling_with_the_self_attention_mask_helper(mask, is_causal, dtype, monkeypatch):
    """timm 1.0.31: ``resolve_self_attn_mask(N, attn, attn_mask, is_causal)`` then
    ``maybe_add_mask``; the kernel gets the mask, ``is_causal`` and ``N`` and builds the bias."""
    q, k, v = qkv(heads=3, kv_heads=3, q_len=9, k_len=9, dtype=dtype, seed=5)
    generator = torch.Generator().manual_seed(6)
    attn_mask = {
        "none": None,
        "float": torch.randn(2, 1, 9, 9, generator=generator).to(dtype),
        "bool": torch.rand(2, 3, 9, 9, generator=generator) > 0.3,
        "bool-broadcast": torch.rand(2, 1, 1, 9, generator=generator) > 0.3,
    }[mask]
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask[..., 0] = True  # every query sees a key: no NaN row
    drop = nn.Dropout(0.1).eval()

    def kernel(q, k, v):
        return scaled_attention(
            q, k, v, attn_mask, scale=0.35, dropout=drop, scale_query=True,
            self_attn_len=9, is_causal=is_causal,
        )  # fmt: skip

    def reference(q, k, v):
        return timm_attention_with_mask_helper(q, k, v, attn_mask, is_causal, 0.35, drop)

    assert_same_function(kernel, reference, [q, k, v], dtype=dtype)
    # the fused path ran: SDPA is called, the original's softmax is not
    calls = []
    original_sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F,
        "scaled_dot_product_attention",
        lambda *a, **kw: calls.append(1) or original_sdpa(*a, **kw),
    )
    with torch.no_grad():
        kernel(q, k, v)
    assert calls == [1]


def test_timm_mask_helper_rows_that_see_no_key_run_the_original():
    """A boolean mask hiding every key of a row: the original's softmax gives NaN there, and
    so does the kernel (it runs the original)."""
    q, k, v = qkv(heads=3, kv_heads=3, q_len=6, k_len=6, seed=7)
    attn_mask = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    attn_mask[..., 2, :] = False
    drop = nn.Dropout(0.0)
    out = scaled_attention(
        q, k, v, attn_mask, scale=0.4, dropout=drop, scale_query=True, self_attn_len=6
    )
    expected = timm_attention_with_mask_helper(q, k, v, attn_mask, False, 0.4, drop)
    assert torch.equal(out.isnan(), expected.isnan()) and out.isnan().any()
    assert_close(out.nan_to_num(), expected.nan_to_num())


def test_timm_mask_helper_lengths_other_than_n_run_the_original():
    """``N`` is not the scores' length (a caller's choice the kernel cannot check otherwise):
    the original runs, and broadcasts or raises as it would."""
    q, k, v = qkv(heads=2, kv_heads=2, q_len=1, k_len=5, seed=8)
    drop = nn.Dropout(0.0)
    out = scaled_attention(
        q, k, v, None, scale=0.4, dropout=drop, scale_query=True, self_attn_len=5, is_causal=True
    )
    expected = scaled_attention_reference(
        q, k, v, None, scale=0.4, dropout=drop, scale_query=True, self_attn_len=5, is_causal=True
    )
    assert torch.equal(out, expected)


def test_timm_training_dropout_on_cpu_draws_like_the_original():
    q, k, v = qkv(heads=3, kv_heads=3)
    drop = nn.Dropout(0.3).train()
    torch.manual_seed(2)
    out = scaled_attention(q, k, v, None, scale=0.35, dropout=drop, scale_query=True)
    torch.manual_seed(2)
    assert torch.equal(out, timm_attention(q, k, v, None, 0.35, drop))


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("upcast", [False, True])
def test_diffusers_spelling(with_mask, upcast):
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(6, 9, 8, generator=generator)
    k = torch.randn(6, 11, 8, generator=generator)
    v = torch.randn(6, 11, 8, generator=generator)
    mask = torch.randn(6, 1, 11, generator=generator) if with_mask else None

    def original(q, k, v):
        return torch.bmm(diffusers_scores(q, k, mask, 0.3, upcast, upcast), v)

    assert_same_function(
        lambda q, k, v: scaled_attention(
            q,
            k,
            v,
            mask,
            scale=0.3,
            upcast_qk=upcast,
            softmax_dtype=torch.float32 if upcast else None,
        ),
        original,
        [q, k, v],
    )


def test_scaled_attention_unknown_dropout_module_runs_the_original(monkeypatch):
    q, k, v = qkv(heads=2, kv_heads=2)

    class Drop(nn.Module):
        def forward(self, x):
            return x * 0.5

    monkeypatch.setattr(module_of_kernel.F, "scaled_dot_product_attention", None)
    out = scaled_attention(q, k, v, scale=0.3, dropout=Drop())
    assert_close(out, scaled_attention_reference(q, k, v, scale=0.3, dropout=Drop()))


# --- issue 22: the spellings without grouped-query heads, T5's bias, diffusers' module -------


def t5_eager(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_bias=None
):
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if position_bias is not None:
        attn_weights = attn_weights + position_bias
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def clip_eager(module, query, key, value, attention_mask, scaling, dropout=0.0):
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_bert_spelling_eval_and_train(train, with_mask):
    module = Attn().train(train)
    q, k, v = qkv(heads=4, kv_heads=4)
    mask = causal_mask(2, 7, 7, pad=2) if with_mask else None
    torch.manual_seed(5)
    ours = attention_function(module, q, k, v, mask, 0.4, 0.2, repeat_kv=False, softmax_dtype=None)
    torch.manual_seed(5)
    theirs = bert_eager(module, q, k, v, mask, 0.4, 0.2)
    assert_close(ours[0], theirs[0])
    if train:  # dropout on a CPU: the original ran, with its random draws and its weights
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_t5_spelling_with_position_bias(with_mask, with_bias):
    module = Attn()
    q, k, v = qkv(heads=4, kv_heads=4)
    bias = torch.randn(1, 4, 7, 7) if with_bias else None
    mask = causal_mask(2, 7, 7) if with_mask else None

    def kernel(q, k, v):
        return attention_function(
            module, q, k, v, mask, 1.0, repeat_kv=False, softmax_dtype=None, position_bias=bias
        )

    assert_same_function(
        fused_only(kernel),
        lambda q, k, v: t5_eager(module, q, k, v, mask, 1.0, position_bias=bias)[0],
        [q, k, v],
    )


def test_t5_bias_that_needs_a_gradient_on_a_cpu_runs_the_original():
    module = Attn()
    q, k, v = qkv(heads=4, kv_heads=4)
    bias = torch.randn(1, 4, 7, 7, requires_grad=True)
    out, weights = attention_function(
        module, q, k, v, None, 1.0, repeat_kv=False, softmax_dtype=None, position_bias=bias
    )
    assert weights is not None
    assert torch.equal(out, t5_eager(module, q, k, v, None, 1.0, position_bias=bias)[0])


def test_clip_spelling_and_other_than_4d_inputs():
    module = Attn()
    q, k, v = qkv(heads=4, kv_heads=4)
    mask = causal_mask(2, 7, 7)
    assert_same_function(
        fused_only(
            lambda q, k, v: attention_function(
                module, q, k, v, mask, 0.3, repeat_kv=False, transpose_last=True
            )
        ),
        lambda q, k, v: clip_eager(module, q, k, v, mask, 0.3)[0],
        [q, k, v],
    )
    # 3-D inputs: only ``transpose(-1, -2)`` computes; the kernel runs that original
    q3, k3, v3 = (t[0] for t in (q, k, v))
    ours = attention_function(module, q3, k3, v3, None, 0.3, repeat_kv=False, transpose_last=True)
    assert torch.equal(ours[0], clip_eager(module, q3, k3, v3, None, 0.3)[0])


class ScoresModule(nn.Module):
    """A module with a diffusers-style ``get_attention_scores``, written as the processors
    expect it."""

    def __init__(self, scale=0.3, upcast_attention=False, upcast_softmax=False):
        super().__init__()
        self.scale = scale
        self.upcast_attention = upcast_attention
        self.upcast_softmax = upcast_softmax

    def get_attention_scores(self, query, key, attention_mask=None):
        return diffusers_scores(
            query, key, attention_mask, self.scale, self.upcast_attention, self.upcast_softmax
        )


def _bmm_inputs(seed=4, with_mask=True):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(6, 9, 8, generator=generator)
    k = torch.randn(6, 11, 8, generator=generator)
    v = torch.randn(6, 11, 8, generator=generator)
    mask = torch.randn(6, 1, 11, generator=generator) if with_mask else None
    return q, k, v, mask


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("upcast", [False, True])
def test_diffusers_processor_spelling_through_the_module(train, with_mask, upcast):
    attn = ScoresModule(0.3, upcast, upcast).train(train)
    q, k, v, mask = _bmm_inputs(with_mask=with_mask)
    original_method = attn.get_attention_scores

    def kernel(q, k, v):
        return scaled_attention(q, k, v, mask, scores_of=attn)

    assert_same_function(
        kernel,
        lambda q, k, v: torch.bmm(original_method(q, k, mask), v),
        [q, k, v],
    )


def test_diffusers_processor_method_replaced_on_the_instance_runs_it():
    attn = ScoresModule()
    q, k, v, mask = _bmm_inputs()
    seen = []

    def recording(query, key, attention_mask=None):  # an attention-map tool's patch
        probs = diffusers_scores(query, key, attention_mask, 0.3, False, False)
        seen.append(probs)
        return probs

    attn.get_attention_scores = recording
    out = scaled_attention(q, k, v, mask, scores_of=attn)
    assert len(seen) == 1 and torch.equal(out, torch.bmm(seen[0], v))


@pytest.mark.parametrize(
    "change",
    ["hook", "tensor scale", "no flags", "bool mask", "half query upcast"],
)
def test_diffusers_processor_cases_left_to_the_original(change, monkeypatch):
    attn = ScoresModule()
    q, k, v, mask = _bmm_inputs()
    if change == "hook":
        attn.register_forward_hook(lambda *args: None)
    elif change == "tensor scale":
        attn.scale = torch.tensor(0.3)
    elif change == "no flags":
        del attn.upcast_softmax
        attn.get_attention_scores = lambda q, k, m=None: diffusers_scores(q, k, m, 0.3, 0, 0)
    elif change == "bool mask":
        mask = torch.ones(6, 1, 11, dtype=torch.bool)
        attn.get_attention_scores = lambda q, k, m=None: torch.softmax(q @ k.transpose(-1, -2), -1)
    elif change == "half query upcast":
        attn.upcast_attention = True
        q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
        mask = None  # an upcast query and a half mask do not go into one baddbmm
    monkeypatch.setattr(module_of_kernel.F, "scaled_dot_product_attention", None)
    out = scaled_attention(q, k, v, mask, scores_of=attn)
    assert torch.equal(out, torch.bmm(attn.get_attention_scores(q, k, mask), v))


def gpt2_eager(module, query, key, value, attention_mask, scaling, dropout=0.0):
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = attn_weights.type(value.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output.transpose(1, 2), attn_weights


def test_gpt2_spelling_keeps_the_transposed_view():
    module = Attn()
    q, k, v = qkv(heads=4, kv_heads=4)
    mask = causal_mask(2, 7, 7)
    options = {
        "repeat_kv": False,
        "softmax_dtype": None,
        "transpose_last": True,
        "weights_to_value_dtype": True,
        "contiguous": False,
    }
    assert_same_function(
        fused_only(lambda q, k, v: attention_function(module, q, k, v, mask, 0.3, **options)),
        lambda q, k, v: gpt2_eager(module, q, k, v, mask, 0.3)[0],
        [q, k, v],
    )
    out, _ = attention_function(module, q, k, v, mask, 0.3, **options)
    assert out.shape == (2, 7, 4, 8) and not out.is_contiguous()
    # a value of another dtype: the original's cast, computed by the original
    out, weights = attention_function(module, q, k, v.double(), mask, 0.3, **options)
    expected = gpt2_eager(module, q, k, v.double(), mask, 0.3)
    assert torch.equal(out, expected[0]) and torch.equal(weights, expected[1])


def gemma_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, softcap=None):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if softcap is not None:
        attn_weights = attn_weights / softcap
        attn_weights = torch.tanh(attn_weights)
        attn_weights = attn_weights * softcap
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


@pytest.mark.parametrize("mask", [False, True])
def test_gemma_spelling_soft_capped_runs_the_original_and_uncapped_runs_sdpa(mask):
    module = Attn(3)
    q, k, v = qkv(heads=6, kv_heads=2)
    attention_mask = causal_mask(2, 7, 7) if mask else None
    # no cap (Gemma 3 and 4): SDPA, as for Llama
    assert_same_function(
        fused_only(
            lambda q, k, v: attention_function(module, q, k, v, attention_mask, 0.3, softcap=None)
        ),
        lambda q, k, v: gemma_eager(module, q, k, v, attention_mask, 0.3)[0],
        [q, k, v],
    )
    # a cap (Gemma 2): SDPA cannot apply it, so the original runs, its weights returned
    ours = attention_function(module, q, k, v, attention_mask, 0.3, softcap=2.0)
    theirs = gemma_eager(module, q, k, v, attention_mask, 0.3, softcap=2.0)
    assert ours[1] is not None
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    capped = attention_function_reference(module, q, k, v, attention_mask, 0.3, softcap=2.0)
    uncapped = attention_function_reference(module, q, k, v, attention_mask, 0.3)
    assert not torch.allclose(capped[0], uncapped[0])  # the cap is applied, not ignored


def inkling_eager(
    module, query, key, value, attention_mask, scaling, dropout=0.0, position_bias=None
):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if position_bias is not None:
        attn_weights = attn_weights + position_bias
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_grouped_heads_with_an_optional_position_bias(with_bias, with_mask):
    module = Attn(3)
    q, k, v = qkv(heads=6, kv_heads=2)
    bias = torch.randn(1, 6, 7, 7) if with_bias else None
    mask = causal_mask(2, 7, 7) if with_mask else None
    assert_same_function(
        fused_only(
            lambda q, k, v: attention_function(module, q, k, v, mask, 0.3, position_bias=bias)
        ),
        lambda q, k, v: inkling_eager(module, q, k, v, mask, 0.3, position_bias=bias)[0],
        [q, k, v],
    )


def test_scaled_attention_with_a_learned_per_head_scale_runs_the_original():
    # XCiT's / EdgeNeXt's cross-covariance attention: `(q @ k^T) * self.temperature`, a
    # Parameter of shape (heads, 1, 1). SDPA takes a number; the gradient must reach the scale.
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, requires_grad=True) for _ in range(3))
    temperature = nn.Parameter(torch.rand(3, 1, 1) + 0.5)
    expected = ((q @ k.transpose(-2, -1)) * temperature).softmax(dim=-1) @ v
    got = scaled_attention(q, k, v, scale=temperature)
    assert torch.equal(got, expected)
    grads = torch.autograd.grad(got.sum(), (q, k, v, temperature))
    wanted = torch.autograd.grad(expected.sum(), (q, k, v, temperature))
    for ours, theirs in zip(grads, wanted, strict=True):
        assert_close(ours, theirs)
