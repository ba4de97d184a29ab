"""adopter.kernels.rms_norm against the original RMSNorm spellings."""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from adopter.kernels import rms_norm
from adopter.kernels.rms_norm import RMS_NORM_CASTS, rms_norm_reference
from tests.kernels.conftest import (
    assert_close,
    assert_same_function,
    assert_traces_like_reference,
    saved_bytes,
)

EPS = 1e-6


def own_reference(x, weight, eps, offset, cast):
    """The spellings as the model files write them (independent of the kernel module)."""
    if cast == "weight_dtype":  # T5LayerNorm
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        h = x * torch.rsqrt(variance + eps)
        if weight is None:
            return h
        if weight.dtype in (torch.float16, torch.bfloat16):
            h = h.to(weight.dtype)
        return (weight + offset) * h
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:
        return h.to(dtype)
    if cast == "before_weight":  # LlamaRMSNorm
        return (weight + offset) * h.to(dtype)
    return (h * (offset + weight.float())).type_as(x)  # GemmaRMSNorm


def kernel_of(offset, cast):
    return lambda x, w: rms_norm(x, w, EPS, offset=offset, cast=cast)


def reference_of(offset, cast):
    return lambda x, w: own_reference(x, w, EPS, offset, cast)


@pytest.mark.parametrize("cast", RMS_NORM_CASTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16, None])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_matches_original_spellings(cast, dtype, weight_dtype, offset):
    torch.manual_seed(0)
    x = torch.randn(2, 7, 24, dtype=dtype) * 3
    w = None if weight_dtype is None else torch.randn(24, dtype=weight_dtype)
    assert_same_function(kernel_of(offset, cast), reference_of(offset, cast), [x, w])


@pytest.mark.parametrize("cast", RMS_NORM_CASTS)
def test_forward_is_bit_identical_in_float32(cast):
    torch.manual_seed(1)
    x = torch.randn(4, 33, 96)
    w = torch.randn(96)
    with torch.no_grad():
        assert torch.equal(rms_norm(x, w, EPS, cast=cast), own_reference(x, w, EPS, 0.0, cast))
    out = rms_norm(x, w.requires_grad_(), EPS, cast=cast)
    assert torch.equal(out.detach(), own_reference(x, w, EPS, 0.0, cast).detach())


def test_float64_llama_spelling_keeps_its_float32_detour():
    x = torch.randn(3, 10, dtype=torch.float64)
    w = torch.randn(10, dtype=torch.float64)
    # The original normalises in float32: float32 rounding is what both carry.
    assert_same_function(
        kernel_of(0.0, "before_weight"), reference_of(0.0, "before_weight"), [x, w], torch.float32
    )


@pytest.mark.parametrize("cast", RMS_NORM_CASTS)
def test_saves_only_input_and_inverse_rms(cast):
    x = torch.randn(4, 64, 128, dtype=torch.bfloat16)
    w = torch.randn(128, dtype=torch.bfloat16)
    kernel = saved_bytes(kernel_of(0.0, cast), [x, w])
    original = saved_bytes(reference_of(0.0, cast), [x, w])
    rows = 4 * 64
    assert kernel == rows * 4  # one float32 inverse RMS per row, besides the inputs
    assert original >= x.numel() * 2  # the original keeps at least one full-size activation


def test_matches_transformers_modules():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    torch.manual_seed(2)
    for module, cast in (
        (LlamaRMSNorm(32, eps=1e-5), "before_weight"),
        (T5LayerNorm(32), "weight_dtype"),
    ):
        nn.init.normal_(module.weight)
        for dtype in (torch.float32, torch.bfloat16):
            m = module.to(dtype)
            x = torch.randn(3, 5, 32, dtype=dtype)

            def original(x, w, m=m):
                return m(x)

            def kernel(x, w, m=m, cast=cast):
                return rms_norm(x, m.weight, m.variance_epsilon, cast=cast)

            out_o = original(x.clone().requires_grad_(), None)
            xk = x.clone().requires_grad_()
            out_k = kernel(xk, None)
            assert_close(out_k, out_o)
            m.zero_grad()
            g = torch.randn_like(out_o)
            xo = x.clone().requires_grad_()
            original(xo, None).backward(g)
            grad_w_original = m.weight.grad.clone()
            m.zero_grad()
            xk = x.clone().requires_grad_()
            kernel(xk, None).backward(g)
            assert_close(xk.grad, xo.grad)
            assert_close(m.weight.grad, grad_w_original)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=0, max_size=3),
    hidden=st.integers(1, 70),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    cast=st.sampled_from(RMS_NORM_CASTS),
    offset=st.sampled_from([0.0, 1.0]),
    weighted=st.booleans(),
    eps=st.sampled_from([1e-6, 1e-5, 0.1]),
)
def test_property_shapes_and_dtypes(shape, hidden, dtype, cast, offset, weighted, eps):
    generator = torch.Generator().manual_seed(len(shape) * 100 + hidden)
    x = torch.randn(*shape, hidden, generator=generator).to(dtype)
    w = torch.randn(hidden, generator=generator).to(dtype) if weighted else None
    assert_same_function(
        lambda x, w: rms_norm(x, w, eps, offset=offset, cast=cast),
        lambda x, w: own_reference(x, w, eps, offset, cast),
        [x, w],
    )


@pytest.mark.parametrize("cast", ["before_weight", "after_weight"])
def test_traces_record_the_original_operations(cast):
    x = torch.randn(2, 3, 8)
    w = torch.randn(8)
    assert_traces_like_reference(
        kernel_of(1.0, cast),
        lambda x, w: rms_norm_reference(x, w, EPS, offset=1.0, cast=cast),
        [x, w],
    )


def test_t5_spelling_traces_with_jit():
    x = torch.randn(2, 3, 8)
    w = torch.randn(8)
    assert_traces_like_reference(
        kernel_of(0.0, "weight_dtype"),
        lambda x, w: rms_norm_reference(x, w, EPS, cast="weight_dtype"),
        [x, w],
        fx=False,  # the original's ``weight.dtype in [...]`` is not fx-traceable either
    )


class _Subclass(torch.Tensor):
    pass


@pytest.mark.parametrize(
    "case", ["wrong_weight_shape", "int_input", "subclass", "empty", "fp64_gemma", "fp64_t5"]
)
def test_falls_back_to_the_original(case, monkeypatch):
    module = importlib.import_module("adopter.kernels.rms_norm")  # the function shadows it
    cast = {"fp64_gemma": "after_weight", "fp64_t5": "weight_dtype"}.get(case, "before_weight")
    x = torch.randn(3, 4, 8)
    w = torch.randn(8)
    if case == "wrong_weight_shape":
        w = torch.randn(1, 8)
    elif case == "int_input":
        x = torch.randint(-3, 3, (3, 8))
    elif case == "subclass":
        x = x.as_subclass(_Subclass)
    elif case == "empty":
        x = torch.randn(0, 8)
    else:
        x, w = x.double(), w.double()

    def forbidden(*args, **kwargs):
        raise AssertionError("the fused path ran")

    monkeypatch.setattr(module, "_forward", forbidden)
    out = rms_norm(x, w, EPS, cast=cast)
    torch.testing.assert_close(out, own_reference(x, w, EPS, 0.0, cast), rtol=0, atol=0)


def test_under_autocast():
    torch.manual_seed(3)
    x = torch.randn(2, 5, 16)
    w = torch.randn(16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert_same_function(
            kernel_of(0.0, "before_weight"), reference_of(0.0, "before_weight"), [x.bfloat16(), w]
        )


def test_rejects_unknown_cast():
    with pytest.raises(ValueError, match="cast"):
        rms_norm(torch.randn(2, 4), None, EPS, cast="llama")


# --- the OLMo 2 / Mochi spellings: weight and input multiplied as they are (issue 22) --------


def olmo2_norm(x, weight, eps):
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * h).to(dtype)


def mochi_norm(x, weight, eps):
    dtype = x.dtype
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(variance + eps)
    if weight is not None:
        h = h * weight
    return h.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16, torch.float64, None])
def test_promoted_spellings_match(dtype, weight_dtype):
    torch.manual_seed(2)
    x = torch.randn(2, 7, 24, dtype=dtype) * 3
    w = None if weight_dtype is None else torch.randn(24, dtype=weight_dtype)
    cases = [(mochi_norm, {"input_promoted": True})]
    if w is not None:
        cases.append((olmo2_norm, {}))
    for original, options in cases:
        kernel = rms_norm(x, w, EPS, cast="after_weight", weight_promoted=True, **options)
        expected = original(x, w, EPS)
        assert kernel.dtype == expected.dtype
        assert torch.equal(kernel, expected)
        assert_same_function(
            lambda x, w, o=options: rms_norm(
                x, w, EPS, cast="after_weight", weight_promoted=True, **o
            ),
            lambda x, w, f=original: f(x, w, EPS),
            [x, w],
            # a float64 input still goes through float32: gradients agree to its rounding
            dtype=torch.float32 if dtype == torch.float64 else None,
        )
