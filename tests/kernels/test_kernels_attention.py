"""Tests for the fused attention class factories.

The reference modules below are small, self-contained re-implementations of the eager attention
of BertSelfAttention, T5Attention and GPT2Attention as of transformers 4.34 (same attribute
names, forward signatures and return tuples), written for these tests so that transformers is
not needed.
"""

from __future__ import annotations

import copy
import math
import pickle
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from adopter.kernels import attention as attention_module
from adopter.kernels import fused_bert_self_attention, fused_gpt2_attention, fused_t5_attention


@pytest.fixture(autouse=True)
def fused_path_even_where_cpu_prefers_the_original(monkeypatch):
    """These tests check the fused math on the CPU they run on; the CPU preference for the
    original code (dropout, a mask that needs a gradient) has tests of its own below."""
    monkeypatch.setattr(attention_module, "ORIGINAL_WHEN_UNFUSED_ON_CPU", False)


@pytest.fixture
def cpu_prefers_the_original(monkeypatch):
    monkeypatch.setattr(attention_module, "ORIGINAL_WHEN_UNFUSED_ON_CPU", True)


# ---------------------------------------------------------------------------------------------
# Reference modules
# ---------------------------------------------------------------------------------------------


class BertSelfAttention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        dropout: float = 0.0,
        position_embedding_type: str = "absolute",
        is_decoder: bool = False,
        max_position_embeddings: int = 32,
    ) -> None:
        super().__init__()
        self.num_attention_heads = num_heads
        self.attention_head_size = hidden_size // num_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(hidden_size, self.all_head_size)
        self.key = nn.Linear(hidden_size, self.all_head_size)
        self.value = nn.Linear(hidden_size, self.all_head_size)
        self.dropout = nn.Dropout(dropout)
        self.position_embedding_type = position_embedding_type
        if position_embedding_type in ("relative_key", "relative_key_query"):
            self.max_position_embeddings = max_position_embeddings
            self.distance_embedding = nn.Embedding(
                2 * max_position_embeddings - 1, self.attention_head_size
            )
        self.is_decoder = is_decoder

    def transpose_for_scores(self, x):
        x = x.view(x.size()[:-1] + (self.num_attention_heads, self.attention_head_size))
        return x.permute(0, 2, 1, 3)

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        head_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        past_key_value=None,
        output_attentions=False,
    ):
        q_mixed = self.query(hidden_states)
        cross = encoder_hidden_states is not None
        if cross and past_key_value is not None:
            k, v = past_key_value[0], past_key_value[1]
            attention_mask = encoder_attention_mask
        elif cross:
            k = self.transpose_for_scores(self.key(encoder_hidden_states))
            v = self.transpose_for_scores(self.value(encoder_hidden_states))
            attention_mask = encoder_attention_mask
        elif past_key_value is not None:
            k = torch.cat(
                [past_key_value[0], self.transpose_for_scores(self.key(hidden_states))], dim=2
            )
            v = torch.cat(
                [past_key_value[1], self.transpose_for_scores(self.value(hidden_states))], dim=2
            )
        else:
            k = self.transpose_for_scores(self.key(hidden_states))
            v = self.transpose_for_scores(self.value(hidden_states))
        q = self.transpose_for_scores(q_mixed)
        use_cache = past_key_value is not None
        if self.is_decoder:
            past_key_value = (k, v)
        scores = q @ k.transpose(-1, -2)
        if self.position_embedding_type in ("relative_key", "relative_key_query"):
            lq, lk = q.shape[2], k.shape[2]
            dev = hidden_states.device
            if use_cache:
                left = torch.tensor(lk - 1, dtype=torch.long, device=dev).view(-1, 1)
            else:
                left = torch.arange(lq, dtype=torch.long, device=dev).view(-1, 1)
            right = torch.arange(lk, dtype=torch.long, device=dev).view(1, -1)
            emb = self.distance_embedding(left - right + self.max_position_embeddings - 1)
            emb = emb.to(q.dtype)
            scores = scores + torch.einsum("bhld,lrd->bhlr", q, emb)
            if self.position_embedding_type == "relative_key_query":
                scores = scores + torch.einsum("bhrd,lrd->bhlr", k, emb)
        scores = scores / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = self.dropout(F.softmax(scores, dim=-1))
        if head_mask is not None:
            probs = probs * head_mask
        ctx = (probs @ v).permute(0, 2, 1, 3).contiguous()
        ctx = ctx.view(ctx.size()[:-2] + (self.all_head_size,))
        out = (ctx, probs) if output_attentions else (ctx,)
        if self.is_decoder:
            out = out + (past_key_value,)
        return out


def _prune_linear(layer: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    w = layer.weight.index_select(dim, index).detach().clone()
    b = None
    if layer.bias is not None:
        b = layer.bias.detach().clone() if dim == 1 else layer.bias[index].detach().clone()
    new = nn.Linear(w.shape[1], w.shape[0], bias=b is not None).to(w.dtype)
    with torch.no_grad():
        new.weight.copy_(w)
        if b is not None:
            new.bias.copy_(b)
    return new


class T5Attention(nn.Module):
    def __init__(
        self,
        d_model: int,
        d_kv: int,
        num_heads: int,
        dropout: float = 0.0,
        is_decoder: bool = False,
        has_relative_attention_bias: bool = False,
        num_buckets: int = 8,
        max_distance: int = 20,
    ) -> None:
        super().__init__()
        self.is_decoder = is_decoder
        self.has_relative_attention_bias = has_relative_attention_bias
        self.relative_attention_num_buckets = num_buckets
        self.relative_attention_max_distance = max_distance
        self.d_model = d_model
        self.key_value_proj_dim = d_kv
        self.n_heads = num_heads
        self.dropout = dropout
        self.inner_dim = num_heads * d_kv
        self.q = nn.Linear(d_model, self.inner_dim, bias=False)
        self.k = nn.Linear(d_model, self.inner_dim, bias=False)
        self.v = nn.Linear(d_model, self.inner_dim, bias=False)
        self.o = nn.Linear(self.inner_dim, d_model, bias=False)
        if has_relative_attention_bias:
            self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)
        self.pruned_heads = set()
        self.gradient_checkpointing = False

    def prune_heads(self, heads):
        heads = set(heads) - self.pruned_heads
        keep = torch.ones(self.n_heads, self.key_value_proj_dim)
        for h in heads:
            h = h - sum(1 for p in self.pruned_heads if p < h)
            keep[h] = 0
        index = torch.arange(len(keep.view(-1)))[keep.view(-1).eq(1)]
        self.q = _prune_linear(self.q, index, 0)
        self.k = _prune_linear(self.k, index, 0)
        self.v = _prune_linear(self.v, index, 0)
        self.o = _prune_linear(self.o, index, 1)
        self.n_heads -= len(heads)
        self.inner_dim = self.key_value_proj_dim * self.n_heads
        self.pruned_heads |= heads

    @staticmethod
    def _relative_position_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128):
        buckets = 0
        if bidirectional:
            num_buckets //= 2
            buckets = buckets + (rel > 0).to(torch.long) * num_buckets
            rel = rel.abs()
        else:
            rel = -torch.min(rel, torch.zeros_like(rel))
        exact = num_buckets // 2
        small = rel < exact
        large = exact + (
            torch.log(rel.float() / exact) / math.log(max_distance / exact) * (num_buckets - exact)
        ).to(torch.long)
        large = torch.min(large, torch.full_like(large, num_buckets - 1))
        return buckets + torch.where(small, rel, large)

    def compute_bias(self, query_length, key_length, device=None):
        if device is None:
            device = self.relative_attention_bias.weight.device
        ctx = torch.arange(query_length, dtype=torch.long, device=device)[:, None]
        mem = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
        bucket = self._relative_position_bucket(
            mem - ctx,
            bidirectional=not self.is_decoder,
            num_buckets=self.relative_attention_num_buckets,
            max_distance=self.relative_attention_max_distance,
        )
        return self.relative_attention_bias(bucket).permute([2, 0, 1]).unsqueeze(0)

    def forward(
        self,
        hidden_states,
        mask=None,
        key_value_states=None,
        position_bias=None,
        past_key_value=None,
        layer_head_mask=None,
        query_length=None,
        use_cache=False,
        output_attentions=False,
    ):
        bsz, seq = hidden_states.shape[:2]
        real_len = seq
        if past_key_value is not None:
            assert len(past_key_value) == 2
            real_len += past_key_value[0].shape[2] if query_length is None else query_length
        key_len = real_len if key_value_states is None else key_value_states.shape[1]

        def shape(s):
            return s.view(bsz, -1, self.n_heads, self.key_value_proj_dim).transpose(1, 2)

        def project(h, proj, kv, past):
            if kv is None:
                h = shape(proj(h))
            elif past is None:
                h = shape(proj(kv))
            if past is not None:
                if kv is None:
                    h = torch.cat([past, h], dim=2)
                elif past.shape[2] != kv.shape[1]:
                    h = shape(proj(kv))
                else:
                    h = past
            return h

        q = shape(self.q(hidden_states))
        k = project(
            hidden_states,
            self.k,
            key_value_states,
            past_key_value[0] if past_key_value is not None else None,
        )
        v = project(
            hidden_states,
            self.v,
            key_value_states,
            past_key_value[1] if past_key_value is not None else None,
        )
        scores = q @ k.transpose(3, 2)
        if position_bias is None:
            if not self.has_relative_attention_bias:
                position_bias = torch.zeros(
                    (1, self.n_heads, real_len, key_len), device=scores.device, dtype=scores.dtype
                )
                if self.gradient_checkpointing and self.training:
                    position_bias.requires_grad = True
            else:
                position_bias = self.compute_bias(real_len, key_len, device=scores.device)
            if past_key_value is not None:
                position_bias = position_bias[:, :, -hidden_states.size(1) :, :]
            if mask is not None:
                position_bias = position_bias + mask
        if self.pruned_heads:
            keep = torch.ones(position_bias.shape[1])
            keep[list(self.pruned_heads)] = 0
            bias_masked = position_bias[:, keep.bool()]
        else:
            bias_masked = position_bias
        scores += bias_masked
        weights = F.softmax(scores.float(), dim=-1).type_as(scores)
        weights = F.dropout(weights, p=self.dropout, training=self.training)
        if layer_head_mask is not None:
            weights = weights * layer_head_mask
        out = (weights @ v).transpose(1, 2).contiguous().view(bsz, -1, self.inner_dim)
        out = self.o(out)
        present = (k, v) if (self.is_decoder and use_cache) else None
        outputs = (out, present, position_bias)
        if output_attentions:
            outputs = outputs + (weights,)
        return outputs


class Conv1D(nn.Module):
    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        out = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return out.view(x.size()[:-1] + (self.nf,))


class GPT2Attention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        max_positions: int = 32,
        attn_pdrop: float = 0.0,
        resid_pdrop: float = 0.0,
        scale_attn_weights: bool = True,
        scale_attn_by_inverse_layer_idx: bool = False,
        reorder_and_upcast_attn: bool = False,
        is_cross_attention: bool = False,
        layer_idx: int | None = None,
    ) -> None:
        super().__init__()
        self.register_buffer(
            "bias",
            torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool)).view(
                1, 1, max_positions, max_positions
            ),
            persistent=False,
        )
        self.register_buffer("masked_bias", torch.tensor(-1e4), persistent=False)
        self.embed_dim = hidden_size
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.split_size = hidden_size
        self.scale_attn_weights = scale_attn_weights
        self.is_cross_attention = is_cross_attention
        self.scale_attn_by_inverse_layer_idx = scale_attn_by_inverse_layer_idx
        self.layer_idx = layer_idx
        self.reorder_and_upcast_attn = reorder_and_upcast_attn
        if is_cross_attention:
            self.c_attn = Conv1D(2 * hidden_size, hidden_size)
            self.q_attn = Conv1D(hidden_size, hidden_size)
        else:
            self.c_attn = Conv1D(3 * hidden_size, hidden_size)
        self.c_proj = Conv1D(hidden_size, hidden_size)
        self.attn_dropout = nn.Dropout(attn_pdrop)
        self.resid_dropout = nn.Dropout(resid_pdrop)
        self.pruned_heads = set()

    def _causal(self, w, q_len, k_len):
        causal = self.bias[:, :, k_len - q_len : k_len, :k_len]
        low = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype).to(w.device)
        return torch.where(causal, w, low)

    def _attn(self, query, key, value, attention_mask=None, head_mask=None):
        w = query @ key.transpose(-1, -2)
        if self.scale_attn_weights:
            w = w / torch.full([], value.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        if self.scale_attn_by_inverse_layer_idx:
            w = w / float(self.layer_idx + 1)
        if not self.is_cross_attention:
            w = self._causal(w, query.size(-2), key.size(-2))
        if attention_mask is not None:
            w = w + attention_mask
        w = F.softmax(w, dim=-1).type(value.dtype)
        w = self.attn_dropout(w)
        if head_mask is not None:
            w = w * head_mask
        return w @ value, w

    def _upcast_and_reordered_attn(self, query, key, value, attention_mask=None, head_mask=None):
        b, h, lq, d = query.size()
        lk = key.size(-2)
        factor = 1.0
        if self.scale_attn_weights:
            factor /= float(value.size(-1)) ** 0.5
        if self.scale_attn_by_inverse_layer_idx:
            factor /= float(self.layer_idx + 1)
        with torch.autocast(device_type=query.device.type, enabled=False):
            q = query.reshape(-1, lq, d).float()
            k = key.transpose(-1, -2).reshape(-1, d, lk).float()
            w = torch.bmm(q, k).mul(factor).reshape(b, h, lq, lk)
        if not self.is_cross_attention:
            w = self._causal(w, lq, lk)
        if attention_mask is not None:
            w = w + attention_mask
        w = F.softmax(w, dim=-1).type(value.dtype)
        w = self.attn_dropout(w)
        if head_mask is not None:
            w = w * head_mask
        return w @ value, w

    def _split_heads(self, tensor, num_heads, head_size):
        return tensor.view(tensor.size()[:-1] + (num_heads, head_size)).permute(0, 2, 1, 3)

    def _merge_heads(self, tensor, num_heads, head_size):
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        return tensor.view(tensor.size()[:-2] + (num_heads * head_size,))

    def forward(
        self,
        hidden_states,
        layer_past=None,
        attention_mask=None,
        head_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        use_cache=False,
        output_attentions=False,
    ):
        if encoder_hidden_states is not None:
            if not hasattr(self, "q_attn"):
                raise ValueError("cross attention needs q_attn")
            query = self.q_attn(hidden_states)
            key, value = self.c_attn(encoder_hidden_states).split(self.split_size, dim=2)
            attention_mask = encoder_attention_mask
        else:
            query, key, value = self.c_attn(hidden_states).split(self.split_size, dim=2)
        query = self._split_heads(query, self.num_heads, self.head_dim)
        key = self._split_heads(key, self.num_heads, self.head_dim)
        value = self._split_heads(value, self.num_heads, self.head_dim)
        if layer_past is not None:
            key = torch.cat((layer_past[0], key), dim=-2)
            value = torch.cat((layer_past[1], value), dim=-2)
        present = (key, value) if use_cache is True else None
        if self.reorder_and_upcast_attn:
            out, w = self._upcast_and_reordered_attn(query, key, value, attention_mask, head_mask)
        else:
            out, w = self._attn(query, key, value, attention_mask, head_mask)
        out = self.resid_dropout(self.c_proj(self._merge_heads(out, self.num_heads, self.head_dim)))
        outputs = (out, present)
        if output_attentions:
            outputs += (w,)
        return outputs


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

TOL = {
    torch.float64: dict(rtol=1e-9, atol=1e-10),
    torch.float32: dict(rtol=1e-4, atol=2e-5),
    torch.bfloat16: dict(rtol=5e-2, atol=5e-2),
}


# T5 runs its softmax in float32 even for float64 models (``softmax(scores.float())``), so a
# float64 comparison is only as tight as float32 rounding allows.
T5_TOL = {
    torch.float64: dict(rtol=1e-5, atol=1e-6),
    torch.float32: TOL[torch.float32],
    torch.bfloat16: TOL[torch.bfloat16],
}


def make_pair(ref_cls, factory, *args, dtype=torch.float64, seed=0, **kwargs):
    torch.manual_seed(seed)
    ref = ref_cls(*args, **kwargs).to(dtype)
    fused_cls = factory(ref_cls)
    fused = fused_cls(*args, **kwargs).to(dtype)
    assert list(fused.state_dict()) == list(ref.state_dict())
    fused.load_state_dict(ref.state_dict(), strict=True)
    for name, buf in ref.named_buffers():
        dict(fused.named_buffers())[name].copy_(buf)
    return ref, fused


def leaf(t):
    return None if t is None else t.detach().clone().requires_grad_(t.is_floating_point())


def flat_tensors(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in flat_tensors(o)]
    return []


def assert_same_structure(a, b):
    if isinstance(a, (tuple, list)):
        assert isinstance(b, type(a)) and len(a) == len(b), (a, b)
        for x, y in zip(a, b, strict=True):
            assert_same_structure(x, y)
    else:
        assert (a is None) == (b is None)


def compare(ref, fused, args: dict, dtype=torch.float64, grads=True, tol=None):
    """Run both modules on cloned leaf inputs; compare outputs, input grads and param grads."""
    tol = tol or TOL[dtype]
    runs = []
    for mod in (ref, fused):
        mod.zero_grad(set_to_none=True)
        kw = {}
        for k, v in args.items():
            if isinstance(v, torch.Tensor):
                kw[k] = leaf(v)
            elif isinstance(v, tuple):
                kw[k] = tuple(leaf(t) for t in v)
            else:
                kw[k] = v
        out = mod(**kw)
        runs.append((out, kw))
    (out_r, kw_r), (out_f, kw_f) = runs
    assert_same_structure(out_r, out_f)
    tr, tf = flat_tensors(out_r), flat_tensors(out_f)
    for a, b in zip(tr, tf, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(b, a, **tol)
    if not grads:
        return out_r, out_f
    torch.manual_seed(123)
    cots = [torch.randn_like(t) for t in tr]
    for outs in (tr, tf):
        pairs = [(o, c) for o, c in zip(outs, cots, strict=True) if o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [c for _, c in pairs])
    for k in kw_r:
        a, b = kw_r[k], kw_f[k]
        for x, y in zip(flat_tensors(a), flat_tensors(b), strict=True):
            if x.grad is not None or y.grad is not None:
                torch.testing.assert_close(y.grad, x.grad, **tol, msg=f"grad of {k}")
    pr, pf = dict(ref.named_parameters()), dict(fused.named_parameters())
    for name, p in pr.items():
        if p.grad is None:
            assert pf[name].grad is None or pf[name].grad.abs().max() == 0, name
        else:
            torch.testing.assert_close(pf[name].grad, p.grad, **tol, msg=f"grad of {name}")
    return out_r, out_f


def compare_t5(ref, fused, args, dtype=torch.float64, grads=True):
    return compare(ref, fused, args, dtype, grads=grads, tol=T5_TOL[dtype])


@contextmanager
def sdpa_spy():
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    F.scaled_dot_product_attention = spy
    try:
        yield calls
    finally:
        F.scaled_dot_product_attention = real


def padding_mask(batch, length, dtype, pad_last=1):
    keep = torch.ones(batch, length, dtype=dtype)
    if pad_last:
        keep[0, -pad_last:] = 0
    return ((1.0 - keep) * torch.finfo(dtype).min)[:, None, None, :]


def causal_mask(batch, q_len, k_len, dtype):
    allowed = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
    m = torch.zeros(q_len, k_len, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return m.expand(batch, 1, q_len, k_len).clone()


# ---------------------------------------------------------------------------------------------
# Factory mechanics
# ---------------------------------------------------------------------------------------------


def test_factories_cache_and_keep_identity():
    a = fused_bert_self_attention(BertSelfAttention)
    assert a is fused_bert_self_attention(BertSelfAttention)
    assert fused_bert_self_attention(a) is a
    assert issubclass(a, BertSelfAttention) and a.__name__ == "FusedBertSelfAttention"
    assert fused_t5_attention(T5Attention) is fused_t5_attention(T5Attention)
    assert fused_gpt2_attention(GPT2Attention) is not fused_t5_attention(T5Attention)
    with pytest.raises(TypeError):
        fused_bert_self_attention(object)


@pytest.mark.parametrize(
    "factory,cls,args",
    [
        (fused_bert_self_attention, BertSelfAttention, (8, 2)),
        (fused_t5_attention, T5Attention, (8, 4, 2)),
        (fused_gpt2_attention, GPT2Attention, (8, 2)),
    ],
)
def test_pickle_and_deepcopy(factory, cls, args):
    torch.manual_seed(0)
    mod = factory(cls)(*args)
    for clone in (pickle.loads(pickle.dumps(mod)), copy.deepcopy(mod)):
        assert type(clone) is cls  # the base class: a pickle names no Adopter code
        for (n1, p1), (n2, p2) in zip(
            mod.state_dict().items(), clone.state_dict().items(), strict=True
        ):
            assert n1 == n2 and torch.equal(p1, p2)


# ---------------------------------------------------------------------------------------------
# BERT
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_bert_encoder(dtype, train, with_mask):
    ref, fused = make_pair(BertSelfAttention, fused_bert_self_attention, 16, 4, dtype=dtype)
    ref.train(train)
    fused.train(train)
    torch.manual_seed(1)
    h = torch.randn(3, 5, 16, dtype=dtype)
    mask = padding_mask(3, 5, dtype, pad_last=2) if with_mask else None
    with sdpa_spy() as calls:
        compare(ref, fused, dict(hidden_states=h, attention_mask=mask), dtype)
    assert len(calls) == 1 and calls[0]["dropout_p"] == 0.0


def test_bert_dropout_in_training_runs_the_original_code_on_cpu(cpu_prefers_the_original):
    # CPU SDPA has no dropout kernel (it would run its slower math path): keep the original.
    ref, fused = make_pair(BertSelfAttention, fused_bert_self_attention, 16, 4, dropout=0.25)
    ref.train()
    fused.train()
    h = torch.randn(2, 4, 16, dtype=torch.float64)
    torch.manual_seed(3)
    want = ref(h)[0]
    torch.manual_seed(3)
    with sdpa_spy() as calls:
        out = fused(h)[0]
    assert calls == []
    torch.testing.assert_close(out, want)
    fused.eval()
    ref.eval()
    with sdpa_spy() as calls:
        compare(ref, fused, dict(hidden_states=h))
    assert calls[0]["dropout_p"] == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bert_decoder_with_past(dtype):
    ref, fused = make_pair(
        BertSelfAttention, fused_bert_self_attention, 12, 3, is_decoder=True, dtype=dtype
    )
    torch.manual_seed(2)
    h = torch.randn(2, 4, 12, dtype=dtype)
    out_r, out_f = compare(
        ref, fused, dict(hidden_states=h, attention_mask=causal_mask(2, 4, 4, dtype)), dtype
    )
    assert len(out_f) == 2 and len(out_f[1]) == 2
    past = tuple(t.detach() for t in out_r[1])
    step = torch.randn(2, 1, 12, dtype=dtype)
    with sdpa_spy() as calls:
        compare(
            ref,
            fused,
            dict(
                hidden_states=step, attention_mask=causal_mask(2, 1, 5, dtype), past_key_value=past
            ),
            dtype,
        )
    assert len(calls) == 1
    # Multi-token continuation without a mask.
    compare(
        ref,
        fused,
        dict(hidden_states=torch.randn(2, 3, 12, dtype=dtype), past_key_value=past),
        dtype,
    )


def test_bert_cross_attention_with_and_without_cache():
    ref, fused = make_pair(BertSelfAttention, fused_bert_self_attention, 12, 2, is_decoder=True)
    torch.manual_seed(3)
    h = torch.randn(2, 3, 12, dtype=torch.float64)
    enc = torch.randn(2, 6, 12, dtype=torch.float64)
    enc_mask = padding_mask(2, 6, torch.float64, pad_last=3)
    self_mask = padding_mask(2, 3, torch.float64)  # must be ignored for cross attention
    with sdpa_spy() as calls:
        out_r, _ = compare(
            ref,
            fused,
            dict(
                hidden_states=h,
                attention_mask=self_mask,
                encoder_hidden_states=enc,
                encoder_attention_mask=enc_mask,
            ),
        )
        cached_kv = tuple(t.detach() for t in out_r[1])
        compare(
            ref,
            fused,
            dict(
                hidden_states=h[:, :1],
                encoder_hidden_states=enc,
                encoder_attention_mask=enc_mask,
                past_key_value=cached_kv,
            ),
        )
    assert len(calls) == 2


@pytest.mark.parametrize(
    "case",
    [
        "output_attentions",
        "head_mask",
        "relative_key",
        "relative_key_query",
        "bool_mask",
        "mask_dtype",
    ],
)
def test_bert_fallbacks_match_original_exactly(case):
    pet = case if case.startswith("relative") else "absolute"
    ref, fused = make_pair(
        BertSelfAttention, fused_bert_self_attention, 8, 2, position_embedding_type=pet
    )
    torch.manual_seed(4)
    h = torch.randn(2, 5, 8, dtype=torch.float64)
    kwargs = {}
    if case == "output_attentions":
        kwargs["output_attentions"] = True
    elif case == "head_mask":
        kwargs["head_mask"] = torch.tensor([1.0, 0.0], dtype=torch.float64)[None, :, None, None]
    elif case == "bool_mask":
        kwargs["attention_mask"] = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    elif case == "mask_dtype":
        kwargs["attention_mask"] = padding_mask(2, 5, torch.float32)
    with sdpa_spy() as calls:
        out_f = fused(h, **kwargs)
    out_r = ref(h, **kwargs)
    assert not calls
    assert len(out_f) == len(out_r)
    for a, b in zip(out_r, out_f, strict=True):
        assert torch.equal(a, b)


def test_bert_bfloat16_forward():
    ref, fused = make_pair(
        BertSelfAttention, fused_bert_self_attention, 32, 4, dtype=torch.bfloat16
    )
    h = torch.randn(2, 7, 32, dtype=torch.bfloat16)
    mask = padding_mask(2, 7, torch.bfloat16, pad_last=3)
    with torch.no_grad():
        compare(ref, fused, dict(hidden_states=h, attention_mask=mask), torch.bfloat16, grads=False)


def test_bert_under_cpu_autocast():
    ref, fused = make_pair(BertSelfAttention, fused_bert_self_attention, 16, 2, dtype=torch.float32)
    h = torch.randn(2, 5, 16)
    mask = padding_mask(2, 5, torch.float32, pad_last=2)  # float32 mask, bf16 activations
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), sdpa_spy() as calls:
        out_f = fused(h, attention_mask=mask)[0]
        out_r = ref(h, attention_mask=mask)[0]
    assert len(calls) == 1 and out_f.dtype == out_r.dtype == torch.bfloat16
    torch.testing.assert_close(out_f, out_r, **TOL[torch.bfloat16])


@settings(max_examples=8, deadline=None)
@given(
    batch=st.integers(1, 3),
    seq=st.integers(1, 6),
    heads=st.integers(1, 3),
    head_dim=st.integers(1, 5),
    pad=st.integers(0, 3),
)
def test_bert_shapes_property(batch, seq, heads, head_dim, pad):
    ref, fused = make_pair(BertSelfAttention, fused_bert_self_attention, heads * head_dim, heads)
    h = torch.randn(batch, seq, heads * head_dim, dtype=torch.float64)
    mask = padding_mask(batch, seq, torch.float64, pad_last=min(pad, seq - 1))
    compare(ref, fused, dict(hidden_states=h, attention_mask=mask))


# ---------------------------------------------------------------------------------------------
# T5
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("train", [False, True])
def test_t5_encoder_relative_bias(dtype, train):
    ref, fused = make_pair(
        T5Attention, fused_t5_attention, 16, 4, 3, dtype=dtype, has_relative_attention_bias=True
    )
    ref.train(train)
    fused.train(train)
    torch.manual_seed(5)
    h = torch.randn(2, 6, 16, dtype=dtype)
    mask = padding_mask(2, 6, dtype, pad_last=2)
    with sdpa_spy() as calls:
        out_r, out_f = compare_t5(ref, fused, dict(hidden_states=h, mask=mask), dtype)
    assert len(calls) == 1 and calls[0]["scale"] == 1.0 and calls[0]["dropout_p"] == 0.0
    assert out_f[1] is None
    # A following layer (no relative bias of its own) reuses the returned position_bias.
    ref2, fused2 = make_pair(T5Attention, fused_t5_attention, 16, 4, 3, dtype=dtype, seed=9)
    compare_t5(
        ref2, fused2, dict(hidden_states=h, mask=mask, position_bias=out_r[2].detach()), dtype
    )


def test_t5_bias_that_needs_a_gradient_runs_the_original_code_on_cpu(cpu_prefers_the_original):
    # CPU SDPA cannot differentiate through the mask in a fused kernel: keep the original.
    ref, fused = make_pair(
        T5Attention, fused_t5_attention, 16, 4, 3, has_relative_attention_bias=True
    )
    ref.train()
    fused.train()
    h = torch.randn(2, 6, 16, dtype=torch.float64)
    with sdpa_spy() as calls:
        compare_t5(ref, fused, dict(hidden_states=h))
    assert calls == []
    with torch.no_grad(), sdpa_spy() as calls:
        fused.eval()
        fused(h)
    assert len(calls) == 1
    # A later layer receives the bias from the first: it needs a gradient too.
    ref2, fused2 = make_pair(T5Attention, fused_t5_attention, 16, 4, 3, seed=9)
    bias = torch.randn(1, 3, 6, 6, dtype=torch.float64, requires_grad=True)
    with sdpa_spy() as calls:
        compare_t5(ref2, fused2, dict(hidden_states=h, position_bias=bias))
    assert calls == []


def test_t5_dropout_in_training_runs_the_original_code_on_cpu(cpu_prefers_the_original):
    _, fused = make_pair(T5Attention, fused_t5_attention, 8, 4, 2, dropout=0.3)
    fused.train()
    with sdpa_spy() as calls:
        fused(torch.randn(1, 3, 8, dtype=torch.float64))
    assert calls == []
    fused.eval()
    with sdpa_spy() as calls:
        fused(torch.randn(1, 3, 8, dtype=torch.float64))
    assert calls[0]["dropout_p"] == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_t5_decoder_incremental(dtype):
    ref, fused = make_pair(
        T5Attention,
        fused_t5_attention,
        12,
        4,
        3,
        dtype=dtype,
        is_decoder=True,
        has_relative_attention_bias=True,
    )
    torch.manual_seed(6)
    h = torch.randn(2, 4, 12, dtype=dtype)
    out_r, out_f = compare_t5(
        ref, fused, dict(hidden_states=h, mask=causal_mask(2, 4, 4, dtype), use_cache=True), dtype
    )
    assert out_f[1] is not None
    past = tuple(t.detach() for t in out_r[1])
    step = torch.randn(2, 1, 12, dtype=dtype)
    with sdpa_spy() as calls:
        compare_t5(
            ref,
            fused,
            dict(
                hidden_states=step,
                mask=padding_mask(2, 5, dtype, 0),
                past_key_value=past,
                use_cache=True,
            ),
            dtype,
        )
        compare_t5(
            ref,
            fused,
            dict(hidden_states=step, past_key_value=past, query_length=4, use_cache=False),
            dtype,
        )
    assert len(calls) == 2


def test_t5_cross_attention_cache_and_prefix_tuning():
    ref, fused = make_pair(T5Attention, fused_t5_attention, 12, 4, 3, is_decoder=True)
    torch.manual_seed(7)
    h = torch.randn(2, 2, 12, dtype=torch.float64)
    enc = torch.randn(2, 5, 12, dtype=torch.float64)
    enc_mask = padding_mask(2, 5, torch.float64, pad_last=2)
    out_r, _ = compare_t5(
        ref, fused, dict(hidden_states=h, mask=enc_mask, key_value_states=enc, use_cache=True)
    )
    past = tuple(t.detach() for t in out_r[1])
    compare_t5(
        ref,
        fused,
        dict(
            hidden_states=h[:, :1],
            mask=enc_mask,
            key_value_states=enc,
            past_key_value=past,
            use_cache=True,
            query_length=2,
        ),
    )
    # Cached cross keys of a different length (prefix tuning): keys are re-projected.
    short = tuple(t[:, :, :3].detach() for t in past)
    compare_t5(
        ref,
        fused,
        dict(
            hidden_states=h,
            key_value_states=enc,
            past_key_value=short,
            use_cache=True,
            query_length=3,
        ),
    )


def test_t5_pruned_heads():
    ref, fused = make_pair(
        T5Attention, fused_t5_attention, 12, 3, 4, has_relative_attention_bias=True
    )
    ref.prune_heads({1, 3})
    fused.prune_heads({1, 3})
    fused.load_state_dict(ref.state_dict(), strict=True)
    h = torch.randn(2, 5, 12, dtype=torch.float64)
    with sdpa_spy() as calls:
        compare_t5(ref, fused, dict(hidden_states=h, mask=padding_mask(2, 5, torch.float64)))
    assert len(calls) == 1


def test_t5_gradient_checkpointing_bias_requires_grad():
    ref, fused = make_pair(T5Attention, fused_t5_attention, 8, 4, 2)
    for m in (ref, fused):
        m.gradient_checkpointing = True
        m.train()
    h = torch.randn(1, 3, 8, dtype=torch.float64)
    out_r, out_f = compare_t5(ref, fused, dict(hidden_states=h))
    assert out_f[2].requires_grad and out_r[2].requires_grad


@pytest.mark.parametrize("case", ["output_attentions", "layer_head_mask", "bool_mask"])
def test_t5_fallbacks_match_original_exactly(case):
    ref, fused = make_pair(
        T5Attention, fused_t5_attention, 8, 4, 2, has_relative_attention_bias=True
    )
    h = torch.randn(2, 3, 8, dtype=torch.float64)
    kwargs = {}
    if case == "output_attentions":
        kwargs["output_attentions"] = True
    elif case == "layer_head_mask":
        kwargs["layer_head_mask"] = torch.tensor([0.0, 1.0], dtype=torch.float64)[
            None, :, None, None
        ]
    else:
        kwargs["mask"] = torch.zeros(2, 1, 1, 3, dtype=torch.bool)
    with sdpa_spy() as calls:
        out_f = fused(h, **kwargs)
    out_r = ref(h, **kwargs)
    assert not calls
    for a, b in zip(out_r, out_f, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


def test_t5_bfloat16_forward():
    ref, fused = make_pair(
        T5Attention,
        fused_t5_attention,
        32,
        8,
        4,
        dtype=torch.bfloat16,
        has_relative_attention_bias=True,
    )
    h = torch.randn(2, 6, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        compare_t5(
            ref,
            fused,
            dict(hidden_states=h, mask=padding_mask(2, 6, torch.bfloat16)),
            torch.bfloat16,
            grads=False,
        )


# ---------------------------------------------------------------------------------------------
# GPT-2
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("train", [False, True])
def test_gpt2_causal_uses_is_causal(dtype, train):
    ref, fused = make_pair(GPT2Attention, fused_gpt2_attention, 16, 4, dtype=dtype)
    ref.train(train)
    fused.train(train)
    h = torch.randn(2, 7, 16, dtype=dtype)
    with sdpa_spy() as calls:
        _, out_f = compare(ref, fused, dict(hidden_states=h), dtype)
    assert calls[0]["is_causal"] is True and calls[0]["attn_mask"] is None
    assert out_f[1] is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpt2_right_padding_mask(dtype):
    ref, fused = make_pair(GPT2Attention, fused_gpt2_attention, 16, 4, dtype=dtype)
    h = torch.randn(2, 6, 16, dtype=dtype)
    with sdpa_spy() as calls:
        compare(
            ref, fused, dict(hidden_states=h, attention_mask=padding_mask(2, 6, dtype, 2)), dtype
        )
    assert calls[0]["is_causal"] is False and calls[0]["attn_mask"].dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpt2_left_padding_fully_masked_rows(dtype):
    """Rows whose visible keys are all padding: the original spreads them over *all* keys and
    its ``where`` stops the gradient of the hidden ones, so such a batch runs the original
    code - outputs and gradients agree for every row, padding rows included."""
    ref, fused = make_pair(GPT2Attention, fused_gpt2_attention, 16, 4, dtype=dtype)
    h = torch.randn(2, 6, 16, dtype=dtype)
    keep = torch.ones(2, 6, dtype=dtype)
    keep[0, :2] = 0
    mask = ((1.0 - keep) * torch.finfo(dtype).min)[:, None, None, :]
    with sdpa_spy() as calls:
        compare(ref, fused, dict(hidden_states=h, attention_mask=mask), dtype)
    assert calls == []
    keep[0, :2] = 1
    keep[0, -2:] = 0  # right padding: every query sees a real key, the fused path runs
    mask = ((1.0 - keep) * torch.finfo(dtype).min)[:, None, None, :]
    with sdpa_spy() as calls:
        compare(ref, fused, dict(hidden_states=h, attention_mask=mask), dtype)
    assert len(calls) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpt2_layer_past_and_use_cache(dtype):
    ref, fused = make_pair(GPT2Attention, fused_gpt2_attention, 12, 3, dtype=dtype)
    h = torch.randn(2, 4, 12, dtype=dtype)
    out_r, out_f = compare(ref, fused, dict(hidden_states=h, use_cache=True), dtype)
    assert out_f[1] is not None
    past = tuple(t.detach() for t in out_r[1])
    with sdpa_spy() as calls:
        compare(
            ref,
            fused,
            dict(hidden_states=torch.randn(2, 1, 12, dtype=dtype), layer_past=past, use_cache=True),
            dtype,
        )
        compare(
            ref,
            fused,
            dict(
                hidden_states=torch.randn(2, 3, 12, dtype=dtype),
                layer_past=past,
                attention_mask=padding_mask(2, 7, dtype),
            ),
            dtype,
        )
    assert calls[0]["attn_mask"].dtype == torch.bool and len(calls) == 2


def test_gpt2_cross_attention():
    ref, fused = make_pair(GPT2Attention, fused_gpt2_attention, 12, 2, is_cross_attention=True)
    h = torch.randn(2, 3, 12, dtype=torch.float64)
    enc = torch.randn(2, 5, 12, dtype=torch.float64)
    with sdpa_spy() as calls:
        compare(
            ref,
            fused,
            dict(
                hidden_states=h,
                encoder_hidden_states=enc,
                encoder_attention_mask=padding_mask(2, 5, torch.float64, 2),
                attention_mask=padding_mask(2, 3, torch.float64),
            ),
        )
    assert len(calls) == 1 and calls[0]["is_causal"] is False


@pytest.mark.parametrize("scale_weights,inverse_idx", [(False, False), (True, True), (False, True)])
def test_gpt2_scaling_options(scale_weights, inverse_idx):
    ref, fused = make_pair(
        GPT2Attention,
        fused_gpt2_attention,
        8,
        2,
        scale_attn_weights=scale_weights,
        scale_attn_by_inverse_layer_idx=inverse_idx,
        layer_idx=2,
    )
    with sdpa_spy() as calls:
        compare(ref, fused, dict(hidden_states=torch.randn(2, 5, 8, dtype=torch.float64)))
    expected = (1 / math.sqrt(4) if scale_weights else 1.0) / (3.0 if inverse_idx else 1.0)
    assert calls[0]["scale"] == pytest.approx(expected)


def test_gpt2_modified_causal_buffer_is_honoured():
    ref, fused = make_pair(GPT2Attention, fused_gpt2_attention, 8, 2)
    for m in (ref, fused):  # local attention window of 2
        m.bias.copy_(m.bias & ~torch.ones_like(m.bias).tril(-2))
    with sdpa_spy() as calls:
        compare(ref, fused, dict(hidden_states=torch.randn(2, 6, 8, dtype=torch.float64)))
    assert calls[0]["is_causal"] is False and calls[0]["attn_mask"].dtype == torch.bool


@pytest.mark.parametrize(
    "case", ["output_attentions", "head_mask", "reorder_and_upcast", "too_long"]
)
def test_gpt2_fallbacks_match_original_exactly(case):
    ref, fused = make_pair(
        GPT2Attention,
        fused_gpt2_attention,
        8,
        2,
        max_positions=6,
        reorder_and_upcast_attn=case == "reorder_and_upcast",
    )
    h = torch.randn(2, 4 if case != "too_long" else 8, 8, dtype=torch.float64)
    kwargs = {}
    if case == "output_attentions":
        kwargs["output_attentions"] = True
    elif case == "head_mask":
        kwargs["head_mask"] = torch.tensor([1.0, 0.5], dtype=torch.float64)[None, :, None, None]
    if case == "too_long":
        with sdpa_spy() as calls, pytest.raises(RuntimeError):
            fused(h)
        assert not calls
        return
    with sdpa_spy() as calls:
        out_f = fused(h, **kwargs)
    out_r = ref(h, **kwargs)
    assert not calls
    for a, b in zip(out_r, out_f, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


def test_gpt2_bfloat16_forward():
    ref, fused = make_pair(GPT2Attention, fused_gpt2_attention, 32, 4, dtype=torch.bfloat16)
    h = torch.randn(2, 9, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        compare(ref, fused, dict(hidden_states=h), torch.bfloat16, grads=False)
        compare(
            ref,
            fused,
            dict(hidden_states=h, attention_mask=padding_mask(2, 9, torch.bfloat16, 3)),
            torch.bfloat16,
            grads=False,
        )


@settings(max_examples=8, deadline=None)
@given(
    batch=st.integers(1, 3),
    seq=st.integers(1, 7),
    past=st.integers(0, 3),
    heads=st.integers(1, 3),
    head_dim=st.integers(1, 4),
    masked=st.booleans(),
)
def test_gpt2_shapes_property(batch, seq, past, heads, head_dim, masked):
    hidden = heads * head_dim
    ref, fused = make_pair(GPT2Attention, fused_gpt2_attention, hidden, heads)
    h = torch.randn(batch, seq, hidden, dtype=torch.float64)
    layer_past = None
    if past:
        layer_past = (
            torch.randn(batch, heads, past, head_dim, dtype=torch.float64),
            torch.randn(batch, heads, past, head_dim, dtype=torch.float64),
        )
    mask = padding_mask(batch, seq + past, torch.float64) if masked else None
    with sdpa_spy() as calls:
        compare(
            ref,
            fused,
            dict(hidden_states=h, layer_past=layer_past, attention_mask=mask, use_cache=True),
        )
    # padding_mask pads the last key of row 0: with a single key, that query sees only
    # padding and the original code runs (its where() stops gradients an additive mask would not)
    sees_only_padding = masked and seq + past == 1
    assert len(calls) == (0 if sees_only_padding else 1)


def test_a_forward_with_parameters_the_kernel_does_not_know_keeps_the_original_class():
    class NewerT5Attention(T5Attention):
        def forward(
            self,
            hidden_states,
            mask=None,
            key_value_states=None,
            position_bias=None,
            past_key_value=None,
            layer_head_mask=None,
            query_length=None,
            use_cache=False,
            output_attentions=False,
            cache_position=None,
        ):
            return super().forward(
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

    with pytest.warns(RuntimeWarning, match="cache_position"):
        built = fused_t5_attention(NewerT5Attention)
    assert built is NewerT5Attention
    assert fused_t5_attention(NewerT5Attention) is NewerT5Attention  # decided once


def test_an_all_zero_mask_is_dropped_and_the_answer_follows_the_tensor():
    drop = attention_module._without_zero_mask
    zeros = torch.zeros(2, 1, 1, 5)
    assert drop(zeros) is None
    zeros[1, ..., -1] = torch.finfo(torch.float32).min  # padding written in place
    assert drop(zeros) is zeros
    assert drop(torch.zeros(2, 1, 1, 5)) is None  # another tensor, checked anew
    wanted = torch.zeros(2, 1, 1, 5, requires_grad=True)
    assert drop(wanted) is wanted  # its gradient is asked for
    with torch.no_grad():
        assert drop(wanted) is None
    boolean = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    assert drop(boolean) is boolean
    assert drop(None) is None
