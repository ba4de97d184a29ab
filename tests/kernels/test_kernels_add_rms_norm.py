"""adopter.kernels.add_rms_norm against the unfused add + RMSNorm module call."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

from adopter.kernels import add_rms_norm, backends, rms_norm
from tests.kernels.conftest import assert_close, saved_bytes

module = importlib.import_module("adopter.kernels.add_rms_norm")


class LlamaNorm(nn.Module):
    """The transformers Llama RMSNorm, with other local names and a docstring (neither counts)."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width))
        self.variance_epsilon = eps

    def forward(self, hs: torch.Tensor) -> torch.Tensor:
        """Normalise."""
        dt = hs.dtype
        hs = hs.to(torch.float32)
        var = hs.pow(2).mean(-1, keepdim=True)
        hs = hs * torch.rsqrt(var + self.variance_epsilon)
        return self.weight * hs.to(dt)


class WeightFirstNorm(LlamaNorm):
    """OLMo-Hybrid's spelling, eps under another attribute name."""

    def __init__(self, width: int, eps: float = 1e-5) -> None:
        super().__init__(width)
        del self.variance_epsilon
        self.eps = eps

    def forward(self, hs: torch.Tensor) -> torch.Tensor:
        dt = hs.dtype
        hs = hs.to(torch.float32)
        var = hs.pow(2).mean(-1, keepdim=True)
        hs = hs * torch.rsqrt(var + self.eps)
        return (self.weight * hs).to(dt)


class PatchedNorm(LlamaNorm):
    """What ``apply`` writes for LlamaNorm under modern.1."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)


class OtherAxisNorm(LlamaNorm):
    """One constant differs (the mean over dimension -2): not the spelling."""

    def forward(self, hs: torch.Tensor) -> torch.Tensor:
        dt = hs.dtype
        hs = hs.to(torch.float32)
        var = hs.pow(2).mean(-2, keepdim=True)
        hs = hs * torch.rsqrt(var + self.variance_epsilon)
        return self.weight * hs.to(dt)


class GemmaNorm(LlamaNorm):
    """``(1 + weight)`` through a helper: not recognised, so called as it is."""

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self._norm(x.float()) * (1.0 + self.weight.float())).type_as(x)


def _unfused(a: torch.Tensor, b: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, ...]:
    hidden = a + b  # the decoder layer: the add, the alias, the norm
    residual = hidden
    return norm(hidden), residual


def _run(fn, a, b, norm, seed: int = 3):
    """Outputs and the gradients of a, b and the norm weight for a loss using both outputs."""
    a, b = (t.detach().clone().requires_grad_() for t in (a, b))
    norm.zero_grad(set_to_none=True)
    normed, summed = fn(a, b, norm)
    g = torch.Generator().manual_seed(seed)
    loss = (normed.float() * torch.randn(normed.shape, generator=g)).sum()
    loss = loss + (summed.float() * torch.randn(summed.shape, generator=g)).sum()
    loss.backward()
    weight = getattr(norm, "weight", None)
    return normed.detach(), summed.detach(), a.grad, b.grad, None if weight is None else weight.grad


@pytest.mark.parametrize("norm_class", [LlamaNorm, WeightFirstNorm, PatchedNorm])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_recognised_spellings_match_the_unfused_code(norm_class, dtype):
    torch.manual_seed(0)
    norm = norm_class(24).to(dtype)
    a, b = (torch.randn(2, 5, 24, dtype=dtype) * 2 for _ in range(2))
    assert module._recognise(norm) is not None
    with backends.recording() as log:
        got = _run(add_rms_norm, a, b, norm)
    assert log == [("add_rms_norm", "adopter")]
    want = _run(_unfused, a, b, norm)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])  # forward: bit-equal
    for g, w in zip(got[2:], want[2:], strict=True):
        assert_close(g, w, dtype, scale=4.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stock_rms_norm_runs_its_own_op_on_the_sum(dtype):
    norm = nn.RMSNorm(16).to(dtype)
    a, b = torch.randn(3, 16, dtype=dtype), torch.randn(3, 16, dtype=dtype)
    spec = module._recognise(norm)
    assert spec is not None and spec.cast == "torch"
    got, want = _run(add_rms_norm, a, b, norm), _run(_unfused, a, b, norm)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def _hooked() -> nn.Module:
    norm = LlamaNorm(8)
    norm.register_forward_hook(lambda *_: None)
    return norm


@pytest.mark.parametrize(
    "make",
    [
        lambda: OtherAxisNorm(8),
        lambda: GemmaNorm(8),
        lambda: nn.LayerNorm(8),
        _hooked,
        lambda: nn.RMSNorm((2, 4)),  # two normalised dimensions
    ],
    ids=["other-constant", "gemma", "layer-norm", "hooked", "two-dimensions"],
)
def test_other_norms_are_called_on_the_sum(make):
    norm = make()
    a, b = torch.randn(4, 2, 4).reshape(4, 8), torch.randn(4, 8)
    if isinstance(norm, nn.RMSNorm):
        a, b = a.reshape(4, 2, 4), b.reshape(4, 2, 4)
    with backends.recording() as log:
        got = _run(add_rms_norm, a, b, norm)
    assert log == [("add_rms_norm", "original")]  # the original code ran
    want = _run(_unfused, a, b, norm)
    for g, w in zip(got, want, strict=True):
        assert (g is None and w is None) or torch.equal(g, w)


def test_a_module_reading_another_torch_is_not_recognised():
    """The instructions are the spelling's, but ``torch`` in its namespace is not torch."""
    namespace: dict = {}
    exec(  # noqa: S102 - a forward compiled in a namespace of our own
        # the import makes ``torch.rsqrt`` an attribute load, as in a model file (CPython
        # compiles a method call on an imported module's name that way)
        "import torch\n"
        "def forward(self, hs):\n"
        "    dt = hs.dtype\n"
        "    hs = hs.to(torch.float32)\n"
        "    var = hs.pow(2).mean(-1, keepdim=True)\n"
        "    hs = hs * torch.rsqrt(var + self.variance_epsilon)\n"
        "    return self.weight * hs.to(dt)\n",
        namespace,
    )
    namespace["torch"] = type("FakeTorch", (), {"float32": torch.float32})
    shadowed = type("Shadowed", (LlamaNorm,), {"forward": namespace["forward"]})(8)
    assert module._match_code(shadowed.forward.__code__) is not None  # same instructions
    assert module._recognise(shadowed) is None


@pytest.mark.parametrize(
    "a, b",
    [
        (torch.randn(2, 8), torch.randn(8)),  # broadcast
        (torch.randn(2, 8), torch.randn(2, 8, dtype=torch.float64)),  # promotion
    ],
    ids=["broadcast", "mixed-dtype"],
)
def test_addends_of_other_shapes_or_dtypes_run_the_original(a, b):
    norm = LlamaNorm(8)
    with backends.recording() as log:
        normed, summed = add_rms_norm(a, b, norm)
    assert log == [("add_rms_norm", "original")]
    assert torch.equal(summed, a + b) and torch.equal(normed, norm(a + b))


def test_no_grad_forward_and_a_string_eps():
    norm = LlamaNorm(8)
    a, b = torch.randn(3, 8), torch.randn(3, 8)
    with torch.no_grad():
        normed, summed = add_rms_norm(a, b, norm)
        assert torch.equal(normed, norm(a + b)) and torch.equal(summed, a + b)
    norm.variance_epsilon = "1e-6"  # type: ignore[assignment]
    assert module._recognise(norm) is None


def test_only_one_output_used_and_gradients_of_inputs_only():
    """The sum's gradient may be absent (only the norm is used), and the weight frozen."""
    norm = LlamaNorm(8).requires_grad_(False)
    a = torch.randn(3, 8, requires_grad=True)
    b = torch.randn(3, 8)
    normed, _ = add_rms_norm(a, b, norm)
    normed.sum().backward()
    want_a = a.detach().clone().requires_grad_()
    norm(want_a + b).sum().backward()
    assert_close(a.grad, want_a.grad, torch.float32)
    a.grad = None
    _, summed = add_rms_norm(a, b, norm)
    summed.sum().backward()
    assert torch.equal(a.grad, torch.ones_like(a))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keeps_the_sum_and_the_inverse_rms_only(dtype):
    norm = LlamaNorm(256).to(dtype)
    a, b = torch.randn(4, 64, 256, dtype=dtype), torch.randn(4, 64, 256, dtype=dtype)
    fused = saved_bytes(lambda x, y: add_rms_norm(x, y, norm), [a, b], [norm.weight])
    unfused = saved_bytes(lambda x, y: _unfused(x, y, norm), [a, b], [norm.weight])
    size = a.numel() * a.element_size()
    rows = a.numel() // a.shape[-1] * 4
    assert fused == size + rows  # the sum and one float32 per row
    # the original keeps the float32 sum (a copy of it in half precision) and the normalised
    # activation as well
    assert unfused >= fused + size


def test_compiled_call_runs_the_original_code():
    norm = LlamaNorm(8)
    compiled = torch.compile(lambda x, y: add_rms_norm(x, y, norm), backend="eager", fullgraph=True)
    a, b = torch.randn(2, 8), torch.randn(2, 8)
    normed, summed = compiled(a, b)
    assert torch.equal(summed, a + b)
    assert_close(normed, norm(a + b), torch.float32)
