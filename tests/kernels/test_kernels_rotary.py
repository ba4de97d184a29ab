"""adopter.kernels rotary / apply_rotary / apply_rotary_complex against the original spellings."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adopter.kernels import apply_rotary, apply_rotary_complex, rotary, rotary_complex
from adopter.kernels.rotary import (
    apply_rotary_complex_reference,
    rotary_complex_reference,
    rotary_reference,
)
from tests.kernels.conftest import assert_same_function, assert_traces_like_reference, saved_bytes

# --- the spellings as the model files write them --------------------------------------------


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def llama_apply(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def phi_apply(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
    k_embed = torch.cat([(k_rot * cos) + (rotate_half(k_rot) * sin), k_pass], dim=-1)
    return q_embed, k_embed


def cohere_apply(q, k, cos, sin, unsqueeze_dim=1):
    dtype = q.dtype
    q, k = q.float(), k.float()
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_every_two(q) * sin)
    k_embed = (k * cos) + (rotate_every_two(k) * sin)
    return q_embed.to(dtype=dtype), k_embed.to(dtype=dtype)


def rotate_every_two(x):
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def gptj_apply(tensor, sin, cos):
    sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
    cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
    return (tensor * cos) + (rotate_every_two(tensor) * sin)


def llama4_apply(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    xq_out = torch.view_as_real(xq_ * freqs_cis[:, :, None, :]).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis[:, :, None, :]).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def cos_sin(batch, seq, dim, dtype=torch.float32, base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    positions = torch.arange(seq, dtype=torch.float)[None].expand(batch, -1)
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def qk(batch=2, heads=3, kv_heads=1, seq=5, dim=8, dtype=torch.float32):
    generator = torch.Generator().manual_seed(batch * heads + seq * dim)
    q = torch.randn(batch, heads, seq, dim, generator=generator).to(dtype)
    k = torch.randn(batch, kv_heads, seq, dim, generator=generator).to(dtype)
    return q, k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_llama_form_is_bit_identical(dtype):
    q, k = qk(dtype=dtype)
    cos, sin = cos_sin(2, 5, 8, dtype)
    kernel = apply_rotary(q, k, cos, sin)
    original = llama_apply(q, k, cos, sin)
    for a, b in zip(kernel, original, strict=True):
        assert a.dtype == b.dtype
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_form_gradients_are_bit_identical(dtype):
    q, k = qk(dtype=dtype)
    cos, sin = cos_sin(2, 5, 8, dtype)
    grads = []
    for fn in (apply_rotary, llama_apply):
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        out_q, out_k = fn(qq, kk, cos, sin)
        torch.autograd.backward([out_q, out_k], [torch.ones_like(out_q) * 0.3, out_k.detach()])
        grads.append((qq.grad, kk.grad))
    assert torch.equal(grads[0][0], grads[1][0])
    assert torch.equal(grads[0][1], grads[1][1])


def test_mixed_dtypes_promote_like_the_original():
    q, k = qk(dtype=torch.bfloat16)
    cos, sin = cos_sin(2, 5, 8, torch.float32)
    assert_same_function(
        lambda q, k: apply_rotary(q, k, cos, sin), lambda q, k: llama_apply(q, k, cos, sin), [q, k]
    )


@pytest.mark.parametrize("rotary_dim", [2, 4, 6])
def test_partial_rotary(rotary_dim):
    q, k = qk(dim=10)
    cos, sin = cos_sin(2, 5, rotary_dim)
    assert_same_function(
        lambda q, k: apply_rotary(q, k, cos, sin, partial=True),
        lambda q, k: phi_apply(q, k, cos, sin),
        [q, k],
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interleaved_upcast_cohere(dtype):
    q, k = qk(dtype=dtype)
    full_cos, full_sin = cos_sin(2, 5, 8, dtype)
    cos = full_cos[..., :4].repeat_interleave(2, -1)  # one angle per pair, as Cohere builds it
    sin = full_sin[..., :4].repeat_interleave(2, -1)
    assert_same_function(
        lambda q, k: apply_rotary(q, k, cos, sin, interleaved=True, upcast=True),
        lambda q, k: cohere_apply(q, k, cos, sin),
        [q, k],
    )


def test_gptj_single_tensor():
    q = torch.randn(2, 5, 3, 8)  # (batch, seq, heads, dim) as GPT-J rotates it
    sincos = torch.randn(2, 5, 8)
    sin, cos = sincos[..., :4], sincos[..., 4:]

    def kernel(x):
        c = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
        s = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
        return rotary(x, c, s, interleaved=True)

    assert_same_function(kernel, lambda x: gptj_apply(x, sin, cos), [q])
    with torch.no_grad():
        assert torch.equal(kernel(q), gptj_apply(q, sin, cos))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_complex_form(dtype):
    q = torch.randn(2, 5, 3, 8).to(dtype)
    k = torch.randn(2, 5, 1, 8).to(dtype)
    angles = torch.randn(2, 5, 4)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    assert_same_function(
        lambda q, k: apply_rotary_complex(q, k, freqs_cis[:, :, None, :]),
        lambda q, k: llama4_apply(q, k, freqs_cis),
        [q, k],
    )


def diffusers_complex_apply(x, freqs_cis):
    x_rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.unsqueeze(1)
    x_out = torch.view_as_real(x_rotated * freqs_cis).flatten(3)
    return x_out.type_as(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_complex_form_one_tensor(dtype):
    x = torch.randn(2, 5, 3, 8).to(dtype)  # (batch, seq, heads, head_dim), freqs per (seq, pair)
    angles = torch.randn(5, 4)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    assert_same_function(
        lambda x: rotary_complex(x, freqs_cis.unsqueeze(1)),
        lambda x: diffusers_complex_apply(x, freqs_cis),
        [x],
    )


def test_complex_form_hands_back_what_it_does_not_handle():
    x = torch.randn(2, 5, 8)  # 3-D: the reference runs
    angles = torch.randn(5, 4)
    freqs = torch.polar(torch.ones_like(angles), angles)
    assert torch.equal(rotary_complex(x, freqs), rotary_complex_reference(x, freqs))
    wide = torch.polar(torch.ones(2, 3, 5, 4), torch.randn(2, 3, 5, 4))
    small = torch.randn(1, 3, 5, 8)  # freqs would broadcast x to a larger shape
    assert torch.equal(rotary_complex(small, wide), rotary_complex_reference(small, wide))


def test_keeps_only_the_angles():
    q, k = qk(seq=64, dim=32)
    cos, sin = cos_sin(2, 64, 32)
    assert saved_bytes(lambda q, k: apply_rotary(q, k, cos, sin), [q, k]) == 2 * cos.numel() * 4


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    heads=st.integers(1, 3),
    seq=st.integers(1, 6),
    half=st.integers(1, 6),
    extra=st.sampled_from([0, 0, 2, 3]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    interleaved=st.booleans(),
    upcast=st.booleans(),
    unsqueeze_dim=st.sampled_from([1, 2]),
)
def test_property_layouts(
    batch, heads, seq, half, extra, dtype, interleaved, upcast, unsqueeze_dim
):
    dim = 2 * half + extra
    generator = torch.Generator().manual_seed(batch + 7 * heads + 31 * seq + 101 * dim)
    if unsqueeze_dim == 1:
        shape = (batch, heads, seq, dim)
    else:
        shape = (batch, seq, heads, dim)
    q = torch.randn(*shape, generator=generator).to(dtype)
    k = torch.randn(*shape, generator=generator).to(dtype)
    cos = torch.randn(batch, seq, 2 * half, generator=generator).to(dtype)
    sin = torch.randn(batch, seq, 2 * half, generator=generator).to(dtype)

    options = {"interleaved": interleaved, "upcast": upcast, "partial": extra > 0}

    def reference(q, k):
        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return tuple(rotary_reference(t, c, s, **options) for t in (q, k))

    assert_same_function(
        lambda q, k: apply_rotary(q, k, cos, sin, unsqueeze_dim, **options),
        reference,
        [q, k],
    )


def test_reference_matches_the_model_spellings():
    q, k = qk()
    cos, sin = cos_sin(2, 5, 8)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    assert torch.equal(rotary_reference(q, c, s), llama_apply(q, k, cos, sin)[0])
    angles = torch.randn(2, 5, 4)
    freqs = torch.polar(torch.ones_like(angles), angles)
    qq, kk = torch.randn(2, 5, 3, 8), torch.randn(2, 5, 3, 8)
    for a, b in zip(
        apply_rotary_complex_reference(qq, kk, freqs[:, :, None, :]),
        llama4_apply(qq, kk, freqs),
        strict=True,
    ):
        assert torch.equal(a, b)


def test_traces_record_the_original_operations():
    q, k = qk()
    cos, sin = cos_sin(2, 5, 8)
    assert_traces_like_reference(
        lambda q, k, c, s: apply_rotary(q, k, c, s),
        lambda q, k, c, s: llama_apply(q, k, c, s),
        [q, k, cos, sin],
    )
    angles = torch.randn(2, 5, 1, 4)
    freqs = torch.polar(torch.ones_like(angles), angles)
    qq, kk = torch.randn(2, 5, 3, 8), torch.randn(2, 5, 3, 8)
    assert_traces_like_reference(
        lambda q, k, f: apply_rotary_complex(q, k, f),
        apply_rotary_complex_reference,
        [qq, kk, freqs],
        fx=False,  # view_as_complex of a Proxy reshape: not fx-traceable in the original either
    )


@pytest.mark.parametrize(
    "case", ["angles_need_grad", "broadcast_grows_x", "odd_width", "subclass", "narrow_not_partial"]
)
def test_falls_back_to_the_original(case, monkeypatch):
    import importlib

    module = importlib.import_module("adopter.kernels.rotary")

    def forbidden(*args, **kwargs):
        raise AssertionError("the fused path ran")

    monkeypatch.setattr(module, "_rotate", forbidden)
    q, k = qk()
    cos, sin = cos_sin(2, 5, 8)
    if case == "angles_need_grad":
        cos = cos.requires_grad_()
    elif case == "broadcast_grows_x":
        q = q[:1]
        k = k[:1]
    elif case == "odd_width":
        cos, sin = cos[..., :1], sin[..., :1]  # broadcasts over the head in the original
    elif case == "narrow_not_partial":
        cos, sin = cos[..., :4], sin[..., :4]
        with pytest.raises(RuntimeError):  # the full-width spelling cannot broadcast it
            apply_rotary(q, k, cos, sin)
        return
    else:
        subclass = type("Sub", (torch.Tensor,), {})
        q, k = q.as_subclass(subclass), k.as_subclass(subclass)
    kernel = apply_rotary(q, k, cos, sin)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    expected = (rotary_reference(q, c, s), rotary_reference(k, c, s))
    for a, b in zip(kernel, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# --- the per-pair, de-interleaved and float32-result spellings (issue 22) ---------------------


def gpt_oss_rotate(x, cos, sin):  # halves chunked, one angle per pair
    first_half, second_half = torch.chunk(x, 2, dim=-1)
    return torch.cat(
        (first_half * cos - second_half * sin, second_half * cos + first_half * sin), -1
    )


def deepseek_interleave(x, cos, sin):  # even/odd elements rotated, written as halves
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def mochi_rotate(x, freqs_cos, freqs_sin):  # even/odd in float32, each cast back, re-interleaved
    x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()
    cos = (x_even * freqs_cos - x_odd * freqs_sin).to(x.dtype)
    sin = (x_even * freqs_sin + x_odd * freqs_cos).to(x.dtype)
    return torch.stack([cos, sin], dim=-1).flatten(-2)


def modernbert_rotate(x, cos, sin):  # in float32, the result kept in float32
    return (x.float() * cos) + (rotate_half(x.float()) * sin)


PER_PAIR_FORMS = [
    (gpt_oss_rotate, {"per_pair": True}),
    (deepseek_interleave, {"interleaved": True, "per_pair": True, "deinterleave": True}),
    (mochi_rotate, {"interleaved": True, "per_pair": True, "upcast": True}),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("angle_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("original", "options"), PER_PAIR_FORMS)
def test_per_pair_forms_are_bit_identical(original, options, dtype, angle_dtype):
    q, _ = qk(dtype=dtype)
    cos, sin = (t[:, None, :, :4] for t in cos_sin(2, 5, 8, angle_dtype))
    kernel = rotary(q, cos, sin, **options)
    expected = original(q, cos, sin)
    assert kernel.dtype == expected.dtype
    assert torch.equal(kernel, expected)
    assert torch.equal(rotary_reference(q, cos, sin, **options), expected)
    assert_same_function(
        lambda x: rotary(x, cos, sin, **options), lambda x: original(x, cos, sin), [q]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_float32_result_is_kept(dtype):
    q, _ = qk(dtype=dtype)
    cos, sin = (t[:, None] for t in cos_sin(2, 5, 8, torch.bfloat16))
    kernel = rotary(q, cos, sin, upcast=True, cast_back=False)
    expected = modernbert_rotate(q, cos, sin)
    assert kernel.dtype == expected.dtype == torch.float32
    assert torch.equal(kernel, expected)
    assert_same_function(
        lambda x: rotary(x, cos, sin, upcast=True, cast_back=False),
        lambda x: modernbert_rotate(x, cos, sin),
        [q],
    )


def test_per_pair_partial_rotary_passes_the_rest_through():
    q, _ = qk(dim=10)
    cos, sin = (t[:, None, :, :2] for t in cos_sin(2, 5, 4))
    expected = torch.cat([gpt_oss_rotate(q[..., :4], cos, sin), q[..., 4:]], dim=-1)
    assert torch.equal(rotary(q, cos, sin, per_pair=True, partial=True), expected)


def test_deinterleave_needs_per_pair_interleaved_angles():
    q, _ = qk()
    cos, sin = (t[:, None] for t in cos_sin(2, 5, 8))
    # per-element angles with deinterleave: no spelling computes that, so the reference runs
    out = rotary(q, cos, sin, interleaved=True, deinterleave=True)
    assert torch.equal(out, rotary_reference(q, cos, sin, interleaved=True, deinterleave=True))
