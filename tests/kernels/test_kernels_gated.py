"""adopter.kernels gated_mlp / gated_activation / gated_activation_chunked."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from adopter.kernels import gated_activation, gated_activation_chunked, gated_mlp
from adopter.kernels.gated import pure_activation
from tests.kernels.conftest import (
    assert_close,
    assert_same_function,
    assert_traces_like_reference,
    saved_bytes,
)


def _transformers_act(name):
    from transformers.activations import ACT2FN

    return ACT2FN[name]


ACTIVATIONS = {
    "nn.SiLU": nn.SiLU,
    "F.silu": lambda: F.silu,
    "nn.GELU": nn.GELU,
    "nn.GELU(tanh)": lambda: nn.GELU(approximate="tanh"),
    "partial(F.gelu, tanh)": lambda: functools.partial(F.gelu, approximate="tanh"),
    "nn.ReLU(inplace)": lambda: nn.ReLU(inplace=True),
    "nn.SiLU(inplace)": lambda: nn.SiLU(inplace=True),
    "ACT2FN[silu]": lambda: _transformers_act("silu"),
    "ACT2FN[gelu_new]": lambda: _transformers_act("gelu_new"),
    "ACT2FN[gelu_pytorch_tanh]": lambda: _transformers_act("gelu_pytorch_tanh"),
    "ACT2FN[quick_gelu]": lambda: _transformers_act("quick_gelu"),
    "ACT2FN[relu2]": lambda: _transformers_act("relu2"),
    "ACT2FN[linear]": lambda: _transformers_act("linear"),
    "torch.tanh": lambda: torch.tanh,
}


class Mlp(nn.Module):
    """LlamaMLP as transformers writes it, with an optional kernel forward."""

    def __init__(self, act, hidden=12, inner=20, bias=False, fused=False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)
        self.act_fn = act
        self.fused = fused

    def forward(self, x):
        if self.fused:
            return gated_mlp(x, self.gate_proj, self.up_proj, self.down_proj, self.act_fn)
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def compare_modules(original, fused, x, dtype=None):
    """Outputs, input gradients and parameter gradients of two copies of one module."""
    results = []
    for module in (original, fused):
        xx = x.detach().clone().requires_grad_()
        out = module(xx)
        out.backward(torch.ones_like(out) * 0.5 + torch.arange(out.shape[-1], dtype=out.dtype))
        results.append((out.detach(), xx.grad, {n: p.grad for n, p in module.named_parameters()}))
    (out_o, gx_o, gp_o), (out_f, gx_f, gp_f) = results
    assert_close(out_f, out_o, dtype)
    assert_close(gx_f, gx_o, dtype)
    for name in gp_o:
        assert_close(gp_f[name], gp_o[name], dtype)


def pair(act, dtype=torch.float32, **kwargs):
    torch.manual_seed(0)
    original = Mlp(act, **kwargs).to(dtype)
    fused = copy.deepcopy(original)
    fused.fused = True
    return original, fused


@pytest.mark.parametrize("name", list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [False, True])
def test_gated_mlp_matches_original(name, bias):
    original, fused = pair(ACTIVATIONS[name](), bias=bias)
    compare_modules(original, fused, torch.randn(3, 5, 12))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gated_mlp_half_precision(dtype):
    original, fused = pair(nn.SiLU(), dtype=dtype, bias=True)
    compare_modules(original, fused, torch.randn(2, 4, 12, dtype=dtype))


def test_gated_mlp_forward_is_bit_identical():
    original, fused = pair(nn.SiLU())
    x = torch.randn(4, 9, 12)
    assert torch.equal(original(x), fused(x))
    with torch.no_grad():
        assert torch.equal(original(x), fused(x))


def test_gated_mlp_keeps_gate_and_up_only():
    original, fused = pair(nn.SiLU(), hidden=16, inner=64)
    x = torch.randn(2, 8, 16)
    inner_bytes = 2 * 8 * 64 * 4
    kept_original = saved_bytes(original, [x], original.parameters())
    kept_fused = saved_bytes(fused, [x], fused.parameters())
    assert kept_original == 4 * inner_bytes  # gate, act(gate), up, product
    assert kept_fused == 2 * inner_bytes  # gate and up


def test_gated_activation_keeps_no_activation_output():
    gate, up = torch.randn(4, 32), torch.randn(4, 32)
    assert saved_bytes(lambda g, u: gated_activation(g, u, nn.GELU()), [gate, up]) == 0
    assert saved_bytes(lambda g, u: nn.GELU()(g) * u, [gate, up]) == 4 * 32 * 4


@pytest.mark.parametrize(
    "name", ["nn.SiLU", "nn.GELU(tanh)", "ACT2FN[gelu_new]", "nn.ReLU(inplace)"]
)
def test_gated_activation_matches(name):
    act = ACTIVATIONS[name]()
    reference_act = copy.deepcopy(act)
    if isinstance(reference_act, nn.ReLU):
        reference_act = nn.ReLU()  # the reference must not overwrite its saved input

    assert_same_function(
        lambda g, u: gated_activation(g, u, act),
        lambda g, u: reference_act(g) * u,
        [torch.randn(3, 7, 10), torch.randn(3, 7, 10)],
    )


@pytest.mark.parametrize("gate", ["first", "second"])
@pytest.mark.parametrize("dim", [-1, 1])
def test_chunked_matches(gate, dim):
    def reference(x):
        a, b = x.chunk(2, dim)
        return F.silu(a) * b if gate == "first" else a * F.silu(b)

    assert_same_function(
        lambda x: gated_activation_chunked(x, nn.SiLU(), gate=gate, dim=dim),
        reference,
        [torch.randn(3, 8, 10)],
    )
    x = torch.randn(3, 8, 10)
    assert saved_bytes(lambda x: gated_activation_chunked(x, F.silu, gate=gate, dim=dim), [x]) == 0


def test_chunked_odd_size_behaves_like_the_original():
    x = torch.randn(2, 5)
    with pytest.raises(RuntimeError) as original:
        a, g = x.chunk(2, -1)
        _ = a * F.silu(g)
    with pytest.raises(RuntimeError) as kernel:
        gated_activation_chunked(x, F.silu)
    assert type(kernel.value) is type(original.value)


@settings(max_examples=30, deadline=None)
@given(
    lead=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    hidden=st.integers(1, 9),
    inner=st.integers(1, 17),
    bias=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    name=st.sampled_from(["nn.SiLU", "nn.GELU", "ACT2FN[gelu_pytorch_tanh]", "torch.tanh"]),
)
def test_property_gated_mlp(lead, hidden, inner, bias, dtype, name):
    original, fused = pair(ACTIVATIONS[name](), dtype=dtype, hidden=hidden, inner=inner, bias=bias)
    generator = torch.Generator().manual_seed(hidden * 31 + inner)
    compare_modules(original, fused, torch.randn(*lead, hidden, generator=generator).to(dtype))


class _Scaled(nn.Module):
    """An activation the kernel does not know."""

    def forward(self, x):
        return torch.sigmoid(x) * 3


@pytest.mark.parametrize("act", [_Scaled(), nn.PReLU(), lambda x: F.silu(x) + 1])
def test_unknown_or_parametric_activations_run_the_original(act):
    assert pure_activation(act) is None
    original, fused = pair(act)
    compare_modules(original, fused, torch.randn(2, 3, 12))
    if isinstance(act, nn.PReLU):
        assert fused.act_fn.weight.grad is not None


def test_hooked_modules_keep_their_hooks():
    original, fused = pair(nn.SiLU())
    calls = []
    for module in (original, fused):
        module.down_proj.register_forward_hook(lambda m, i, o: calls.append(1))
        module.act_fn.register_forward_hook(lambda m, i, o: calls.append(2))
    compare_modules(original, fused, torch.randn(2, 3, 12))
    assert calls == [2, 1, 2, 1]


def test_activation_called_with_hooks_is_not_recomputed():
    act = nn.GELU()
    act.register_forward_hook(lambda m, i, o: None)
    assert pure_activation(act) is None


def test_gated_mlp_under_autocast():
    original, fused = pair(nn.SiLU(), bias=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compare_modules(original, fused, torch.randn(2, 3, 12), torch.bfloat16)


def test_traces_record_the_original_operations():
    original, fused = pair(nn.SiLU(), bias=True)
    x = torch.randn(2, 3, 12)
    assert_traces_like_reference(fused, original, [x])
    assert_traces_like_reference(
        lambda x: gated_activation_chunked(x, F.silu),
        lambda x: (lambda a, g: a * F.silu(g))(*x.chunk(2, -1)),
        [x],
        fx=False,  # fx cannot unpack a Proxy into two chunks, in the original either
    )
    assert_traces_like_reference(
        lambda g, u: gated_activation(g, u, F.gelu), lambda g, u: F.gelu(g) * u, [x, x]
    )


def test_rejects_unknown_gate_name():
    with pytest.raises(ValueError, match="gate"):
        gated_activation_chunked(torch.randn(2, 4), F.silu, gate="left")


class ChunkedMlp(nn.Module):
    """Phi-3's MLP: one gate/up projection, ``chunk``, the activation on one half, down."""

    def __init__(self, act, halves="first", dim=-1, bias=False, down=True, fused=False):
        super().__init__()
        self.gate_up_proj = nn.Linear(12, 40, bias=bias)
        self.down_proj = nn.Linear(20, 12, bias=bias) if down else None
        self.act_fn = act
        self.halves, self.dim, self.fused = halves, dim, fused

    def forward(self, x):
        both = self.gate_up_proj(x)
        if self.fused:
            return gated_mlp(
                both, None, None, self.down_proj, self.act_fn, halves=self.halves, dim=self.dim
            )
        first, second = both.chunk(2, dim=self.dim)
        if self.halves == "first":
            product = second * self.act_fn(first)
        else:
            product = first * self.act_fn(second)
        return product if self.down_proj is None else self.down_proj(product)


class ProductMlp(Mlp):
    """T5's gated block up to the product (a dropout follows before the down projection)."""

    def forward(self, x):
        if self.fused:
            return gated_mlp(x, self.gate_proj, self.up_proj, None, self.act_fn)
        return self.act_fn(self.gate_proj(x)) * self.up_proj(x)


@pytest.mark.parametrize("halves", ["first", "second"])
@pytest.mark.parametrize("down", [True, False])
@pytest.mark.parametrize("name", ["nn.SiLU", "nn.GELU(tanh)", "ACT2FN[gelu_new]"])
@pytest.mark.parametrize("bias", [False, True])
def test_gated_mlp_chunked_matches_original(halves, down, name, bias):
    torch.manual_seed(0)
    original = ChunkedMlp(ACTIVATIONS[name](), halves=halves, bias=bias, down=down)
    fused = copy.deepcopy(original)
    fused.fused = True
    x = torch.randn(3, 5, 12)
    compare_modules(original, fused, x)  # training, with gradients
    assert torch.equal(original(x), fused(x))
    original.eval()
    fused.eval()
    with torch.no_grad():
        assert torch.equal(original(x), fused(x))


def test_gated_mlp_chunked_keeps_the_projection_output_only():
    torch.manual_seed(0)
    original = ChunkedMlp(nn.SiLU())
    fused = copy.deepcopy(original)
    fused.fused = True
    x = torch.randn(2, 8, 12)
    inner_bytes = 2 * 8 * 20 * 4
    kept_original = saved_bytes(original, [x], original.parameters())
    kept_fused = saved_bytes(fused, [x], fused.parameters())
    assert kept_fused < kept_original
    assert kept_fused == 2 * inner_bytes  # the two halves: the projection's output


def test_gated_mlp_chunked_odd_width_and_unknown_activation_run_the_original():
    torch.manual_seed(0)
    both = torch.randn(2, 7)
    with pytest.raises(RuntimeError):
        a, b = both.chunk(2, dim=-1)
        _ = F.silu(a) * b  # 4 and 3 columns: the original fails, so does the kernel
    with pytest.raises(RuntimeError):
        gated_mlp(both, None, None, None, F.silu, halves="first")
    scaled = _Scaled()
    x = torch.randn(2, 8)
    a, b = x.chunk(2, dim=-1)
    assert torch.equal(gated_mlp(x, None, None, None, scaled, halves="first"), scaled(a) * b)
    with pytest.raises(ValueError):
        gated_mlp(x, None, None, None, F.silu, halves="middle")


@pytest.mark.parametrize("name", ["nn.SiLU", "ACT2FN[gelu_new]", "nn.ReLU(inplace)"])
@pytest.mark.parametrize("bias", [False, True])
def test_gated_mlp_product_only_matches_original(name, bias):
    torch.manual_seed(0)
    original = ProductMlp(ACTIVATIONS[name](), bias=bias)
    fused = copy.deepcopy(original)
    fused.fused = True
    x = torch.randn(3, 5, 12)
    compare_modules(original, fused, x)
    with torch.no_grad():
        assert torch.equal(original(x), fused(x))


class ScaledGateMlp(nn.Module):
    """Falcon-H1's MLP: the gate projection scaled before the activation, the output after."""

    def __init__(self, gate_multiplier, down_multiplier, fused=False, down=True):
        super().__init__()
        self.gate_proj = nn.Linear(12, 20)
        self.up_proj = nn.Linear(12, 20)
        self.down_proj = nn.Linear(20, 12)
        self.act_fn = nn.SiLU()
        self.gate_multiplier, self.down_multiplier = gate_multiplier, down_multiplier
        self.fused, self.down = fused, down

    def forward(self, x):
        if self.fused and self.down:
            y = gated_mlp(
                x,
                self.gate_proj,
                self.up_proj,
                self.down_proj,
                self.act_fn,
                gate_scale=self.gate_multiplier,
            )
            return y * self.down_multiplier
        if self.fused:
            y = gated_mlp(
                x, self.gate_proj, self.up_proj, None, self.act_fn, gate_scale=self.gate_multiplier
            )
        else:
            y = self.up_proj(x) * self.act_fn(self.gate_proj(x) * self.gate_multiplier)
        return self.down_proj(y) * self.down_multiplier


@pytest.mark.parametrize("down", [True, False])
@pytest.mark.parametrize("multiplier", [0.75, torch.tensor(1.5)])
def test_gated_mlp_scaled_gate_matches_original(down, multiplier):
    torch.manual_seed(0)
    original = ScaledGateMlp(multiplier, 0.5)
    fused = copy.deepcopy(original)
    fused.fused, fused.down = True, down
    x = torch.randn(3, 5, 12)
    compare_modules(original, fused, x)
    with torch.no_grad():
        assert torch.equal(original(x), fused(x))


def test_gated_mlp_scaled_gate_is_not_for_halves():
    with pytest.raises(TypeError):
        gated_mlp(torch.randn(2, 8), None, None, None, F.silu, halves="first", gate_scale=2.0)
