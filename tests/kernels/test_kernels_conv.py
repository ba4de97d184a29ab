"""Tests for adopter.kernels.conv_batch_norm."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from adopter.kernels import _fold, clear_caches, conv_batch_norm

TOL = {
    torch.float64: dict(rtol=1e-9, atol=1e-10),
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.bfloat16: dict(rtol=5e-2, atol=5e-2),
}

CONVS = {
    1: (nn.Conv1d, nn.BatchNorm1d),
    2: (nn.Conv2d, nn.BatchNorm2d),
    3: (nn.Conv3d, nn.BatchNorm3d),
}


def make(dims=2, dtype=torch.float64, seed=0, bias=True, affine=True, momentum=0.1, **conv_kw):
    torch.manual_seed(seed)
    conv_cls, bn_cls = CONVS[dims]
    conv = conv_cls(4, 6, 3, bias=bias, **conv_kw).to(dtype)
    bn = bn_cls(6, affine=affine, momentum=momentum).to(dtype)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2.0)
    if affine:
        nn.init.normal_(bn.weight)
        nn.init.normal_(bn.bias)
    return conv, bn


def inputs(dims, dtype, batch=2, size=7):
    return torch.randn(batch, 4, *([size] * dims), dtype=dtype)


def run(conv, bn, x, fused, cot_seed=3):
    conv.zero_grad(set_to_none=True)
    bn.zero_grad(set_to_none=True)
    xx = x.detach().clone().requires_grad_()
    out = conv_batch_norm(xx, conv, bn) if fused else bn(conv(xx))
    torch.manual_seed(cot_seed)
    out.backward(torch.randn_like(out))
    grads = [xx.grad] + [p.grad for p in (*conv.parameters(), *bn.parameters())]
    return out.detach(), grads


def assert_match(a, b, dtype):
    torch.testing.assert_close(a[0], b[0], **TOL[dtype])
    for u, v in zip(a[1], b[1], strict=True):
        torch.testing.assert_close(u, v, **TOL[dtype])


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("affine,bias", [(True, True), (False, False), (True, False)])
def test_eval_folding_outputs_and_grads(dims, dtype, affine, bias):
    conv, bn = make(dims, dtype, bias=bias, affine=affine)
    bn.eval()
    x = inputs(dims, dtype, size=5 if dims == 3 else 7)
    assert_match(run(conv, bn, x, True), run(conv, bn, x, False), dtype)
    with torch.no_grad():
        torch.testing.assert_close(conv_batch_norm(x, conv, bn), bn(conv(x)), **TOL[dtype])


@pytest.mark.parametrize(
    "kw",
    [
        dict(stride=2, padding=1),
        dict(groups=2, padding=2, dilation=2),
        dict(padding=1, padding_mode="reflect"),
        dict(padding=1, padding_mode="circular"),
    ],
)
def test_conv_options(kw):
    conv, bn = make(2, **kw)
    bn.eval()
    x = inputs(2, torch.float64, size=8)
    assert_match(run(conv, bn, x, True), run(conv, bn, x, False), torch.float64)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("dims", [1, 2])
def test_training_updates_running_stats_identically(momentum, dims):
    conv_a, bn_a = make(dims, momentum=momentum)
    conv_b, bn_b = make(dims, momentum=momentum)
    for step in range(3):
        x = inputs(dims, torch.float64, batch=3) + step
        assert_match(run(conv_a, bn_a, x, True), run(conv_b, bn_b, x, False), torch.float64)
    for name, buf in bn_a.named_buffers():
        assert torch.equal(buf, dict(bn_b.named_buffers())[name]), name
    assert bn_a.num_batches_tracked.item() == 3


def test_eval_is_really_folded(monkeypatch):
    conv, bn = make()
    bn.eval()
    with monkeypatch.context() as patch:
        patch.setattr(F, "batch_norm", lambda *a, **k: pytest.fail("BN must be folded"))
        with torch.no_grad():
            conv_batch_norm(inputs(2, torch.float64), conv, bn)
    # Under autograd the fold would not pay off: the two modules run as they are.
    calls = []
    real = F.batch_norm
    monkeypatch.setattr(F, "batch_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    conv_batch_norm(inputs(2, torch.float64), conv, bn)
    assert calls == [1]


def test_cache_reuse_and_invalidation(monkeypatch):
    clear_caches()
    conv, bn = make()
    x = inputs(2, torch.float64)
    builds = []
    real = _fold._fold

    def counting(*args):
        builds.append(1)
        return real(*args)

    monkeypatch.setattr(_fold, "_fold", counting)
    opt = torch.optim.SGD(list(conv.parameters()) + list(bn.parameters()), lr=0.05)
    expected_builds = 0
    for _ in range(2):
        bn.eval()
        with torch.no_grad():
            first = conv_batch_norm(x, conv, bn)
            second = conv_batch_norm(x, conv, bn)
        expected_builds += 1
        assert len(builds) == expected_builds and torch.equal(first, second)
        torch.testing.assert_close(first, bn(conv(x)), **TOL[torch.float64])
        # A training step changes weights (optimizer) and running stats (BN update).
        bn.train()
        loss = conv_batch_norm(x, conv, bn).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    # Running stats alone changing (in-place buffer update) also invalidates.
    bn.eval()
    with torch.no_grad():
        conv_batch_norm(x, conv, bn)
        bn.running_var.mul_(2.0)
        out = conv_batch_norm(x, conv, bn)
    torch.testing.assert_close(out, bn(conv(x)), **TOL[torch.float64])
    # eps is part of the key.
    bn.eps = 0.5
    with torch.no_grad():
        torch.testing.assert_close(conv_batch_norm(x, conv, bn), bn(conv(x)), **TOL[torch.float64])


def test_a_stored_fold_is_reused_only_while_the_modules_hold_the_same_unchanged_tensors():
    """The stored fold skips the foldability checks, so every way a module can come to hold
    other values must miss it: a new parameter or buffer, new data under the same parameter,
    an in-place update, eval mode left, grad mode on with a trainable norm, a parametrised
    weight."""
    clear_caches()
    conv, bn = make()
    bn.eval()
    x = inputs(2, torch.float64)

    def agrees() -> None:
        torch.testing.assert_close(conv_batch_norm(x, conv, bn), bn(conv(x)), **TOL[torch.float64])

    with torch.no_grad():
        conv_batch_norm(x, conv, bn)
        assert _fold.cached_fold(conv, bn) is not None
        conv.weight = nn.Parameter(conv.weight * 2)
        assert _fold.cached_fold(conv, bn) is None
        agrees()
        bn.running_mean = bn.running_mean + 1
        agrees()
        bn.bias.data = torch.zeros(6, dtype=torch.float64)
        agrees()
        bn.running_var.add_(1.0)
        agrees()
        bn.train()
        assert _fold.cached_fold(conv, bn) is None
        bn.eval()
    conv_batch_norm(x, conv, bn)  # grad mode on: the trainable norm's fold is recomputed
    assert _fold.cached_fold(conv, bn) is None
    out = conv_batch_norm(x, conv, bn)
    assert out.requires_grad
    torch.nn.utils.parametrize.register_parametrization(conv, "weight", _Doubled())
    with torch.no_grad():
        agrees()
        assert _fold.cached_fold(conv, bn) is None


class _Doubled(nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * 2


def test_grad_mode_recomputes_fold_and_gradients_flow():
    conv, bn = make()
    bn.eval()
    x = inputs(2, torch.float64)
    with torch.no_grad():
        conv_batch_norm(x, conv, bn)  # populate the cache
    assert_match(run(conv, bn, x, True), run(conv, bn, x, False), torch.float64)
    assert bn.weight.grad is not None and conv.weight.grad is not None


def test_inference_mode_cache_not_used_for_autograd():
    conv, bn = make()
    bn.eval()
    conv.requires_grad_(False)
    bn.requires_grad_(False)
    x = inputs(2, torch.float64)
    with torch.inference_mode():
        conv_batch_norm(x, conv, bn)
    xx = x.clone().requires_grad_()
    conv_batch_norm(xx, conv, bn).sum().backward()
    assert xx.grad is not None


def test_fallbacks():
    calls = []
    conv, _ = make(1)
    unbatched = torch.randn(4, 9, dtype=torch.float64)  # conv output (6, 7): BN sees N=6, C=7
    bn_unbatched = nn.BatchNorm1d(7).double().eval()
    bn_unbatched.running_var.fill_(2.0)
    torch.testing.assert_close(
        conv_batch_norm(unbatched, conv, bn_unbatched), bn_unbatched(conv(unbatched))
    )
    conv2, bn2 = make(2)
    bn2.eval()
    bn2.register_forward_hook(lambda *a: calls.append("hook"))
    x = inputs(2, torch.float64)
    torch.testing.assert_close(conv_batch_norm(x, conv2, bn2), bn2(conv2(x)))
    assert calls == ["hook", "hook"]
    wrong = nn.BatchNorm1d(6).double().eval()
    with pytest.raises(ValueError):  # same error the original raises
        conv_batch_norm(x, conv2, wrong)
    transposed = nn.ConvTranspose2d(4, 6, 3).double()
    _, bn3 = make(2)
    bn3.eval()
    torch.testing.assert_close(conv_batch_norm(x, transposed, bn3), bn3(transposed(x)))


def test_bfloat16_forward_and_mixed_precision_stats():
    conv, bn = make(2, torch.bfloat16)
    bn.eval()
    x = inputs(2, torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(conv_batch_norm(x, conv, bn), bn(conv(x)), **TOL[torch.bfloat16])
    bn.float()  # half-precision conv with fp32 BatchNorm, as F.batch_norm allows
    with torch.no_grad():
        torch.testing.assert_close(conv_batch_norm(x, conv, bn), bn(conv(x)), **TOL[torch.bfloat16])


@settings(max_examples=8, deadline=None)
@given(dims=st.integers(1, 2), batch=st.integers(1, 3), size=st.integers(3, 6), train=st.booleans())
def test_property_shapes(dims, batch, size, train):
    conv_a, bn_a = make(dims)
    conv_b, bn_b = make(dims)
    bn_a.train(train)
    bn_b.train(train)
    if train and batch * (size - 2) ** dims < 2:
        return
    x = inputs(dims, torch.float64, batch=batch, size=size)
    assert_match(run(conv_a, bn_a, x, True), run(conv_b, bn_b, x, False), torch.float64)


def test_under_compile_the_compiler_gets_the_unfolded_modules(monkeypatch):
    """A compiled graph cannot cache the fold; recomputing it per call would cost more than
    the batch-norm pass it saves, so the traced code is the original's."""
    folds = []
    real = _fold.folded_weight_bias

    def counted(*args, **kwargs):
        folds.append(torch.compiler.is_compiling())
        return real(*args, **kwargs)

    import adopter.kernels.conv as conv_module

    monkeypatch.setattr(conv_module, "folded_weight_bias", counted)
    conv, bn = make(2, torch.float32)
    conv.eval(), bn.eval()
    x = inputs(2, torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: conv_batch_norm(t, conv, bn), backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), bn(conv(x)), **TOL[torch.float32])
        assert folds == []
        conv_batch_norm(x, conv, bn)  # eager: folded
    assert folds == [False]
