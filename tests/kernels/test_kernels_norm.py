"""Tests for adopter.kernels.dropout_add_layer_norm."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from adopter.kernels import dropout_add_layer_norm
from adopter.kernels import norm as norm_module

TOL = {
    torch.float64: dict(rtol=1e-10, atol=1e-10),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.bfloat16: dict(rtol=2e-2, atol=3e-2),
}


def run_both(h, r, dropout, ln, dtype, seed=0, grads=True, **kwargs):
    """Compare fused vs ``ln(dropout(h) + r)`` with the same RNG seed: values and grads."""
    results = []
    for fused in (True, False):
        hh = h.detach().clone().requires_grad_()
        rr = r.detach().clone().requires_grad_()
        ln.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        if fused:
            out = dropout_add_layer_norm(hh, rr, dropout, ln, **kwargs)
        else:
            dropped = (
                F.dropout(hh, dropout, kwargs.get("training", ln.training))
                if isinstance(dropout, float)
                else dropout(hh)
            )
            out = ln(dropped + rr)
        grads_ = []
        if grads:
            torch.manual_seed(99)
            out.backward(torch.randn_like(out))
            grads_ = [hh.grad, rr.grad] + [p.grad for p in ln.parameters()]
        results.append((out, grads_))
    (out_f, g_f), (out_r, g_r) = results
    assert out_f.dtype == out_r.dtype
    torch.testing.assert_close(out_f, out_r, **TOL[dtype])
    for a, b in zip(g_f, g_r, strict=True):
        torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("train", [False, True])
def test_layer_norm_with_dropout_module(dtype, p, train):
    torch.manual_seed(0)
    ln = nn.LayerNorm(12).to(dtype)
    nn.init.normal_(ln.weight)
    nn.init.normal_(ln.bias)
    drop = nn.Dropout(p)
    ln.train(train)
    drop.train(train)
    h = torch.randn(3, 5, 12, dtype=dtype)
    r = torch.randn(3, 5, 12, dtype=dtype)
    # On CPU the keep-mask draw is identical to nn.Dropout's, so even p > 0 matches exactly.
    run_both(h, r, drop, ln, dtype, seed=7)


@pytest.mark.parametrize("variant", ["no_bias", "no_affine", "multi_dim", "rms", "rms_no_weight"])
def test_norm_variants(variant):
    dtype = torch.float64
    if variant == "no_bias":
        ln = nn.LayerNorm(8, bias=False)
    elif variant == "no_affine":
        ln = nn.LayerNorm(8, elementwise_affine=False)
    elif variant == "multi_dim":
        ln = nn.LayerNorm((4, 8), eps=1e-3)
    elif variant == "rms":
        ln = nn.RMSNorm(8, eps=1e-6)
    else:
        ln = nn.RMSNorm(8, elementwise_affine=False)
    ln = ln.to(dtype).train()
    h = torch.randn(2, 4, 8, dtype=dtype)
    r = torch.randn(2, 4, 8, dtype=dtype)
    run_both(h, r, nn.Dropout(0.2), ln, dtype, seed=3)


def test_float_probability_and_training_flag():
    ln = nn.LayerNorm(6).double()
    h = torch.randn(4, 6, dtype=torch.float64)
    r = torch.randn(4, 6, dtype=torch.float64)
    run_both(h, r, 0.3, ln, torch.float64, seed=5, training=True)
    run_both(h, r, 0.3, ln, torch.float64, seed=5, training=False)
    ln.eval()  # training defaults to the norm module's flag
    out = dropout_add_layer_norm(h, r, 0.3, ln)
    torch.testing.assert_close(out, ln(h + r))
    with pytest.raises(ValueError):
        dropout_add_layer_norm(h, r, 1.5, ln)


def test_p_one_and_identity_and_none():
    ln = nn.LayerNorm(6).double()
    h = torch.randn(4, 6, dtype=torch.float64)
    r = torch.randn(4, 6, dtype=torch.float64)
    run_both(h, r, nn.Dropout(1.0), ln, torch.float64)
    run_both(h, r, nn.Identity(), ln, torch.float64)
    torch.testing.assert_close(dropout_add_layer_norm(h, r, None, ln), ln(h + r))


def test_eval_never_touches_the_rng():
    ln = nn.LayerNorm(6)
    drop = nn.Dropout(0.4).eval()
    state = torch.get_rng_state()
    dropout_add_layer_norm(torch.randn(2, 6), torch.randn(2, 6), drop, ln)
    torch.manual_seed(0)
    torch.set_rng_state(state)
    a = torch.rand(3)
    torch.set_rng_state(state)
    dropout_add_layer_norm(torch.zeros(2, 6), torch.zeros(2, 6), drop, ln)
    assert torch.equal(torch.rand(3), a)


def test_broadcast_residual_and_mixed_dtypes():
    ln = nn.LayerNorm(8).double()
    h = torch.randn(2, 3, 8, dtype=torch.float64)
    r = torch.randn(8, dtype=torch.float64)
    run_both(h, r, nn.Dropout(0.25), ln, torch.float64, seed=11)
    h32 = torch.randn(2, 3, 8)
    run_both(
        h32, torch.randn(2, 3, 8, dtype=torch.float64), nn.Dropout(0.5), ln, torch.float64, seed=12
    )


def test_no_grad_path_writes_into_mask_buffer():
    ln = nn.LayerNorm(8)
    drop = nn.Dropout(0.5)
    h, r = torch.randn(4, 8), torch.randn(4, 8)
    h0, r0 = h.clone(), r.clone()
    with torch.no_grad():
        torch.manual_seed(1)
        fused = dropout_add_layer_norm(h, r, drop, ln)
        torch.manual_seed(1)
        ref = ln(drop(h) + r)
    torch.testing.assert_close(fused, ref)
    assert h.equal(h0) and r.equal(r0) and not fused.requires_grad


def test_unrecognised_modules_are_called():
    calls = []

    class CustomNorm(nn.Module):
        def forward(self, x):
            calls.append("norm")
            return x * 2

    class CustomDropout(nn.Module):
        def forward(self, x):
            calls.append("dropout")
            return x + 1

    h, r = torch.randn(2, 4), torch.randn(2, 4)
    out = dropout_add_layer_norm(h, r, CustomDropout(), CustomNorm())
    torch.testing.assert_close(out, (h + 1 + r) * 2)
    assert calls == ["dropout", "norm"]
    ln = nn.LayerNorm(4)
    ln.register_forward_hook(lambda m, i, o: calls.append("hook"))
    dropout_add_layer_norm(h, r, nn.Dropout(0.0), ln)
    assert calls[-1] == "hook"


def test_bfloat16_forward():
    ln = nn.LayerNorm(16).to(torch.bfloat16)
    h = torch.randn(4, 16, dtype=torch.bfloat16)
    r = torch.randn(4, 16, dtype=torch.bfloat16)
    run_both(h, r, nn.Dropout(0.5), ln, torch.bfloat16, seed=2, grads=False)
    ln.eval()
    run_both(h, r, nn.Dropout(0.5).eval(), ln, torch.bfloat16, grads=False)


@settings(max_examples=10, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    p=st.sampled_from([0.0, 0.3]),
    seed=st.integers(0, 100),
)
def test_property_shapes(shape, p, seed):
    ln = nn.LayerNorm(shape[-1]).double()
    h = torch.randn(shape, dtype=torch.float64)
    r = torch.randn(shape, dtype=torch.float64)
    run_both(h, r, nn.Dropout(p), ln, torch.float64, seed=seed)


def test_compiled_path(monkeypatch):
    """The torch.compile route (used by default on CUDA+Triton) gives the eager result."""
    monkeypatch.setenv("ADOPTER_KERNELS_COMPILE", "1")
    monkeypatch.setenv("ADOPTER_KERNELS_COMPILE_BACKEND", "eager")
    monkeypatch.setattr(norm_module, "_compiled", {})
    ln = nn.LayerNorm(8).double()
    h = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 8, dtype=torch.float64)
    out = dropout_add_layer_norm(h, r, nn.Dropout(0.0), ln)
    assert "eager" in norm_module._compiled
    torch.testing.assert_close(out, ln(h + r))
    out.sum().backward()
    assert h.grad is not None


def test_compile_failure_falls_back(monkeypatch):
    monkeypatch.setenv("ADOPTER_KERNELS_COMPILE", "1")
    monkeypatch.setenv("ADOPTER_KERNELS_COMPILE_BACKEND", "no_such_backend_xyz")
    monkeypatch.setattr(norm_module, "_compile_broken", [])
    ln = nn.LayerNorm(8)
    h, r = torch.randn(3, 8), torch.randn(3, 8)
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        out = dropout_add_layer_norm(h, r, nn.Dropout(0.0), ln)
    torch.testing.assert_close(out, ln(h + r))
    assert norm_module._compile_broken == ["no_such_backend_xyz"]
    dropout_add_layer_norm(h, r, nn.Dropout(0.0), ln)  # no second warning / retry
