"""Tests for linear_bias_activation, qkv_projection and linear_batch_norm."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from adopter.kernels import _util as kernel_util
from adopter.kernels import (
    clear_caches,
    linear_batch_norm,
    linear_bias_activation,
    qkv_projection,
)
from adopter.kernels import linear as linear_module
from adopter.kernels._activations import resolve_activation


@pytest.fixture(autouse=True)
def one_gemm_even_under_autograd_on_cpu(monkeypatch):
    """These tests check the concatenated path on the CPU they run on; the CPU preference for
    separate GEMMs under autograd has a test of its own."""
    monkeypatch.setattr(linear_module, "SEPARATE_UNDER_AUTOGRAD", set())


TOL = {
    torch.float64: dict(rtol=1e-10, atol=1e-10),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
}
# The transformers tanh-GELU formulas become the native tanh-GELU kernel: equal up to rounding.
FORMULA_TOL = {
    torch.float64: dict(rtol=1e-9, atol=1e-9),
    torch.float32: TOL[torch.float32],
    torch.bfloat16: TOL[torch.bfloat16],
}


# --- stand-ins for transformers.activations (module path set so they are recognised) ---------


class _TransformersAct(nn.Module):
    pass


class NewGELUActivation(_TransformersAct):
    def forward(self, x):
        return (
            0.5
            * x
            * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        )


class FastGELUActivation(_TransformersAct):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


class QuickGELUActivation(_TransformersAct):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class GELUActivation(_TransformersAct):
    def __init__(self, use_gelu_python=False):
        super().__init__()
        self.act = self._gelu_python if use_gelu_python else F.gelu

    def _gelu_python(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))

    def forward(self, x):
        return self.act(x)


class ClippedGELUActivation(_TransformersAct):
    def __init__(self, min, max):  # noqa: A002 - mirrors transformers' signature
        super().__init__()
        self.min, self.max = min, max

    def forward(self, x):
        return torch.clip(F.gelu(x), self.min, self.max)


class SiLUActivation(_TransformersAct):
    def forward(self, x):
        return F.silu(x)


class ReLUSquaredActivation(_TransformersAct):
    def forward(self, x):
        return torch.square(F.relu(x))


class LinearActivation(_TransformersAct):
    def forward(self, x):
        return x


for _cls in (
    NewGELUActivation,
    FastGELUActivation,
    QuickGELUActivation,
    GELUActivation,
    ClippedGELUActivation,
    SiLUActivation,
    ReLUSquaredActivation,
    LinearActivation,
):
    _cls.__module__ = "transformers.activations"


def activations():
    return [
        ("gelu", nn.GELU()),
        ("gelu_tanh", nn.GELU(approximate="tanh")),
        ("relu", nn.ReLU()),
        ("relu_inplace", nn.ReLU(inplace=True)),
        ("relu6", nn.ReLU6()),
        ("silu", nn.SiLU()),
        ("tanh", nn.Tanh()),
        ("sigmoid", nn.Sigmoid()),
        ("mish", nn.Mish()),
        ("leaky", nn.LeakyReLU(0.1)),
        ("leaky_neg", nn.LeakyReLU(-0.2)),
        ("identity", nn.Identity()),
        ("F.gelu", F.gelu),
        ("F.relu", F.relu),
        ("torch.tanh", torch.tanh),
        ("F.silu", F.silu),
        ("torch.sigmoid", torch.sigmoid),
        ("new_gelu", NewGELUActivation()),
        ("fast_gelu", FastGELUActivation()),
        ("quick_gelu", QuickGELUActivation()),
        ("gelu_tf", GELUActivation()),
        ("gelu_python", GELUActivation(use_gelu_python=True)),
        ("gelu_10", ClippedGELUActivation(-0.1, 0.5)),
        ("silu_tf", SiLUActivation()),
        ("relu2", ReLUSquaredActivation()),
        ("linear", LinearActivation()),
    ]


ACTS = activations()


def make_linear(i, o, bias=True, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(i, o, bias=bias).to(dtype)


def compare_fn(fused_fn, ref_fn, inputs, params, dtype, tol=None, grads=True):
    tol = tol or TOL[dtype]
    outs, all_grads = [], []
    for fn in (fused_fn, ref_fn):
        xs = [x.detach().clone().requires_grad_(grads) for x in inputs]
        for p in params:
            p.grad = None
        out = fn(*xs)
        outs.append(out)
        if grads:
            torch.manual_seed(5)
            flat = out if isinstance(out, tuple) else (out,)
            torch.autograd.backward(list(flat), [torch.randn_like(t) for t in flat])
            all_grads.append([x.grad for x in xs] + [p.grad for p in params])
    a, b = outs
    for u, v in zip(
        a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,), strict=True
    ):
        assert u.shape == v.shape and u.dtype == v.dtype
        torch.testing.assert_close(u, v, **tol)
    if grads:
        for u, v in zip(*all_grads, strict=True):
            torch.testing.assert_close(u, v, **tol)


# --- linear_bias_activation ---------------------------------------------------------------------


@pytest.mark.parametrize("name,act", ACTS, ids=[n for n, _ in ACTS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_activation_matches_and_grads(name, act, dtype):
    lin = make_linear(6, 5, dtype=dtype)
    x = torch.randn(2, 3, 6, dtype=dtype) * 2
    tol = FORMULA_TOL[dtype] if "gelu" in name else None
    compare_fn(
        lambda t: linear_bias_activation(t, lin, act),
        lambda t: act(lin(t)),
        [x],
        list(lin.parameters()),
        dtype,
        tol,
    )
    with torch.no_grad():  # in-place / epilogue paths
        compare_fn(
            lambda t: linear_bias_activation(t, lin, act),
            lambda t: act(lin(t)),
            [x],
            [],
            dtype,
            tol,
            grads=False,
        )


@pytest.mark.parametrize("name,act", ACTS, ids=[n for n, _ in ACTS])
def test_every_listed_activation_is_recognised(name, act):
    assert resolve_activation(act) is not None, name


def test_frozen_weights_input_grad_only():
    lin = make_linear(4, 3)
    lin.requires_grad_(False)
    x = torch.randn(5, 4, dtype=torch.float64)
    for act in (nn.ReLU(), nn.GELU(), nn.Tanh()):
        compare_fn(
            lambda t, a=act: linear_bias_activation(t, lin, a),
            lambda t, a=act: a(lin(t)),
            [x],
            [],
            torch.float64,
        )


@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 3, 4), (2, 0, 4)])
def test_input_ranks_and_no_bias(shape):
    for bias in (True, False):
        lin = make_linear(4, 6, bias=bias)
        x = torch.randn(shape, dtype=torch.float64)
        for act in (nn.ReLU(), NewGELUActivation()):
            compare_fn(
                lambda t, a=act, m=lin: linear_bias_activation(t, m, a),
                lambda t, a=act, m=lin: a(m(t)),
                [x],
                list(lin.parameters()),
                torch.float64,
                FORMULA_TOL[torch.float64],
            )
            with torch.no_grad():
                torch.testing.assert_close(linear_bias_activation(x, lin, act), act(lin(x)))


def test_unrecognised_activation_and_custom_linear_fall_back():
    calls = []

    def custom(t):
        calls.append("act")
        return t * 3

    lin = make_linear(4, 2)
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(linear_bias_activation(x, lin, custom), lin(x) * 3)
    assert calls == ["act"]

    class Doubling(nn.Linear):
        def forward(self, t):
            return super().forward(t) * 2

    torch.manual_seed(0)
    dl = Doubling(4, 2).double()
    torch.testing.assert_close(linear_bias_activation(x, dl, nn.ReLU()), F.relu(dl(x)))
    hooked = nn.Tanh()
    hooked.register_forward_hook(lambda m, i, o: calls.append("hook"))
    torch.testing.assert_close(linear_bias_activation(x, lin, hooked), torch.tanh(lin(x)))
    assert calls[-1] == "hook"


def test_lookalike_activation_outside_transformers_is_not_trusted():
    class NewGELUActivation(nn.Module):  # same name, different module, different maths
        def forward(self, t):
            return t * 10

    assert resolve_activation(NewGELUActivation()) is None
    lin = make_linear(3, 2)
    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(linear_bias_activation(x, lin, NewGELUActivation()), lin(x) * 10)


def test_bfloat16_forward():
    lin = make_linear(16, 8, dtype=torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    for act in (nn.GELU(), nn.ReLU(), NewGELUActivation(), nn.SiLU()):
        torch.testing.assert_close(
            linear_bias_activation(x, lin, act), act(lin(x)), **TOL[torch.bfloat16]
        )
        with torch.no_grad():
            torch.testing.assert_close(
                linear_bias_activation(x, lin, act), act(lin(x)), **TOL[torch.bfloat16]
            )


def test_autocast_keeps_the_original_dtype():
    lin = make_linear(8, 4, dtype=torch.float32)
    x = torch.randn(3, 8)
    for act in (nn.ReLU(), nn.GELU(), NewGELUActivation()):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = linear_bias_activation(x, lin, act)
            ref = act(lin(x))
        assert out.dtype == ref.dtype == torch.bfloat16
        torch.testing.assert_close(out, ref, **TOL[torch.bfloat16])


@settings(max_examples=10, deadline=None)
@given(
    batch=st.lists(st.integers(1, 4), min_size=0, max_size=2),
    i=st.integers(1, 6),
    o=st.integers(1, 6),
    idx=st.integers(0, len(ACTS) - 1),
)
def test_property_shapes(batch, i, o, idx):
    name, act = ACTS[idx]
    lin = make_linear(i, o)
    x = torch.randn(*batch, i, dtype=torch.float64)
    compare_fn(
        lambda t: linear_bias_activation(t, lin, act),
        lambda t: act(lin(t)),
        [x],
        list(lin.parameters()),
        torch.float64,
        FORMULA_TOL[torch.float64],
    )


# --- qkv_projection -----------------------------------------------------------------------------


def make_qkv(dtype=torch.float64, biases=(True, True, True), outs=(6, 6, 6)):
    torch.manual_seed(1)
    return [nn.Linear(5, o, bias=b).to(dtype) for o, b in zip(outs, biases, strict=True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "biases,outs",
    [
        ((True, True, True), (6, 6, 6)),
        ((False, False, False), (4, 4, 4)),
        ((True, False, True), (3, 5, 2)),
    ],
)
def test_qkv_matches_and_grads(dtype, biases, outs):
    q, k, v = make_qkv(dtype, biases, outs)
    params = [p for m in (q, k, v) for p in m.parameters()]
    x = torch.randn(2, 4, 5, dtype=dtype)
    compare_fn(
        lambda t: qkv_projection(t, q, k, v), lambda t: (q(t), k(t), v(t)), [x], params, dtype
    )
    with torch.no_grad():
        compare_fn(
            lambda t: qkv_projection(t, q, k, v),
            lambda t: (q(t), k(t), v(t)),
            [x],
            [],
            dtype,
            grads=False,
        )


@pytest.fixture
def linear_weight_shapes(monkeypatch):
    """The weight shape of every ``F.linear`` call made while the test runs."""
    shapes = []
    real = F.linear

    def spy(*args, **kwargs):
        shapes.append(args[1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "linear", spy)
    return shapes


def test_qkv_single_matmul(linear_weight_shapes):
    q, k, v = make_qkv()
    qkv_projection(torch.randn(3, 5, dtype=torch.float64), q, k, v)
    assert linear_weight_shapes == [torch.Size([18, 5])]


def test_qkv_under_autograd_on_cpu_runs_three_gemms(monkeypatch, linear_weight_shapes):
    monkeypatch.setattr(linear_module, "SEPARATE_UNDER_AUTOGRAD", {"cpu"})
    q, k, v = make_qkv()
    calls = linear_weight_shapes
    x = torch.randn(3, 5, dtype=torch.float64)
    out = qkv_projection(x, q, k, v)
    assert calls == [torch.Size([6, 5])] * 3
    torch.testing.assert_close(out[1], k(x))
    calls.clear()
    with torch.no_grad():
        qkv_projection(x, q, k, v)
    assert calls == [torch.Size([18, 5])]


def test_qkv_cache_reuse_and_invalidation():
    clear_caches()
    q, k, v = make_qkv()
    x = torch.randn(3, 5, dtype=torch.float64)
    built = []
    real_concat = __import__("adopter.kernels.linear", fromlist=["_concat"])._concat

    import adopter.kernels.linear as linear_mod

    def counting(*a):
        built.append(1)
        return real_concat(*a)

    linear_mod._concat = counting
    try:
        with torch.no_grad():
            qkv_projection(x, q, k, v)
            qkv_projection(x, q, k, v)
        assert len(built) == 1
        # An optimizer step changes k's weight: the cache must be rebuilt.
        opt = torch.optim.SGD(k.parameters(), lr=0.5)
        (k(x) ** 2).sum().backward()
        opt.step()
        with torch.no_grad():
            out = qkv_projection(x, q, k, v)
        assert len(built) == 2
        torch.testing.assert_close(out[1], k(x))
        # load_state_dict also invalidates.
        with torch.no_grad():
            v.load_state_dict(
                {
                    "weight": torch.zeros(6, 5, dtype=torch.float64),
                    "bias": torch.ones(6, dtype=torch.float64),
                }
            )
            out = qkv_projection(x, q, k, v)
        assert len(built) == 3 and torch.equal(out[2], torch.ones(3, 6, dtype=torch.float64))
        # .to() moves storage: invalidated through data_ptr.
        q.float().double()
        with torch.no_grad():
            qkv_projection(x, q, k, v)
        assert len(built) == 4
        # Under autograd nothing is cached.
        qkv_projection(x, q, k, v)
        assert len(built) == 5
    finally:
        linear_mod._concat = real_concat
    clear_caches()
    assert kernel_util.cache_size() == 0


def test_qkv_inference_mode_cache_is_not_reused_outside():
    clear_caches()
    lin = make_qkv()
    lin[0].requires_grad_(False)
    for m in lin:
        m.requires_grad_(False)
    x = torch.randn(3, 5, dtype=torch.float64)
    with torch.inference_mode():
        qkv_projection(x, *lin)
    xg = x.clone().requires_grad_()
    out = qkv_projection(xg, *lin)  # must not save an inference tensor for backward
    sum(o.sum() for o in out).backward()
    assert xg.grad is not None


def test_qkv_outputs_allow_inplace_and_view():
    q, k, v = make_qkv()
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    a, b, c = qkv_projection(x, q, k, v)
    a.mul_(2)
    b.view(2, 3, 2, 3)
    (a.sum() + c.sum()).backward()
    assert x.grad is not None


def test_qkv_fallbacks():
    q, k, _ = make_qkv()
    odd = nn.Linear(4, 6).double()  # different in_features
    x = torch.randn(2, 5, dtype=torch.float64)
    with pytest.raises(RuntimeError):
        qkv_projection(x, q, k, odd)  # same error as calling the modules
    calls = []

    class Custom(nn.Linear):
        def forward(self, t):
            calls.append("custom")
            return super().forward(t) + 1

    torch.manual_seed(0)
    custom = Custom(5, 3).double()
    a, b, c = qkv_projection(x, q, k, custom)
    assert calls == ["custom"]
    torch.testing.assert_close(c, custom(x))
    torch.testing.assert_close(a, q(x))
    # Mixed parameter dtypes cannot share one GEMM: each module runs on its own.
    q32, k32, v32 = make_qkv(torch.float32)
    k32.double()
    with pytest.raises(RuntimeError):
        qkv_projection(x.float(), q32, k32, v32)


# --- linear_batch_norm --------------------------------------------------------------------------


def make_lin_bn(dtype=torch.float64, momentum=0.1, affine=True, bias=True, track=True):
    torch.manual_seed(2)
    lin = nn.Linear(6, 4, bias=bias).to(dtype)
    bn = nn.BatchNorm1d(4, momentum=momentum, affine=affine, track_running_stats=track).to(dtype)
    if track:
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2.0)
    if affine:
        nn.init.normal_(bn.weight)
        nn.init.normal_(bn.bias)
    return lin, bn


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_linear_bn_training_updates_stats_identically(momentum, dtype):
    lin, bn = make_lin_bn(dtype, momentum)
    lin2, bn2 = make_lin_bn(dtype, momentum)
    x = torch.randn(8, 6, dtype=dtype)
    for _ in range(3):
        compare_fn(lambda t: linear_batch_norm(t, lin, bn), lambda t: bn2(lin2(t)), [x], [], dtype)
    # compare_fn ran each pair once per iteration: stats must agree.
    torch.testing.assert_close(bn.running_mean, bn2.running_mean)
    torch.testing.assert_close(bn.running_var, bn2.running_var)
    assert bn.num_batches_tracked.item() == bn2.num_batches_tracked.item() == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("affine,bias", [(True, True), (False, False), (True, False)])
def test_linear_bn_eval_folding_with_grads(dtype, affine, bias):
    lin, bn = make_lin_bn(dtype, affine=affine, bias=bias)
    bn.eval()
    params = list(lin.parameters()) + list(bn.parameters())
    x = torch.randn(5, 6, dtype=dtype)
    compare_fn(lambda t: linear_batch_norm(t, lin, bn), lambda t: bn(lin(t)), [x], params, dtype)
    with torch.no_grad():
        compare_fn(
            lambda t: linear_batch_norm(t, lin, bn),
            lambda t: bn(lin(t)),
            [x],
            [],
            dtype,
            grads=False,
        )


def test_linear_bn_eval_is_folded(monkeypatch):
    lin, bn = make_lin_bn()
    bn.eval()
    with monkeypatch.context() as patch:
        patch.setattr(F, "batch_norm", lambda *a, **k: pytest.fail("BN must be folded"))
        with torch.no_grad():
            linear_batch_norm(torch.randn(3, 6, dtype=torch.float64), lin, bn)
    calls = []
    real = F.batch_norm
    monkeypatch.setattr(F, "batch_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    linear_batch_norm(torch.randn(3, 6, dtype=torch.float64), lin, bn)
    assert calls == [1]


def test_linear_bn_cache_invalidation_after_optimizer_step():
    clear_caches()
    lin, bn = make_lin_bn()
    x = torch.randn(5, 6, dtype=torch.float64)
    opt = torch.optim.SGD(list(lin.parameters()) + list(bn.parameters()), lr=0.1)
    for _ in range(3):
        bn.train()
        loss = linear_batch_norm(x, lin, bn).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        bn.eval()
        with torch.no_grad():
            fused = linear_batch_norm(x, lin, bn)
            again = linear_batch_norm(x, lin, bn)
            torch.testing.assert_close(fused, bn(lin(x)))
            assert torch.equal(fused, again)


def test_linear_bn_fallback_shapes_and_modes():
    lin, bn = make_lin_bn()
    x3 = torch.randn(2, 4, 6, dtype=torch.float64)
    bn3 = nn.BatchNorm1d(4).double().eval()
    torch.testing.assert_close(linear_batch_norm(x3, lin, bn3), bn3(lin(x3)))
    _, bn_batch = make_lin_bn(track=False)
    bn_batch.eval()  # no running stats: uses batch statistics even in eval
    x = torch.randn(5, 6, dtype=torch.float64)
    torch.testing.assert_close(linear_batch_norm(x, lin, bn_batch), bn_batch(lin(x)))
    bn.train()
    with pytest.raises(ValueError):  # same error as the original for a single sample
        linear_batch_norm(torch.randn(1, 6, dtype=torch.float64), lin, bn)


def test_linear_bn_bfloat16_forward():
    lin, bn = make_lin_bn(torch.bfloat16)
    bn.eval()
    x = torch.randn(4, 6, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(linear_batch_norm(x, lin, bn), bn(lin(x)), **TOL[torch.bfloat16])
