"""Tests for adopter.kernels.softmax (ATen path everywhere, Triton path via the interpreter)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from adopter.kernels import softmax

TOL = {
    torch.float64: dict(rtol=1e-12, atol=1e-12),
    torch.float32: dict(rtol=1e-6, atol=1e-6),
    torch.bfloat16: dict(rtol=2e-2, atol=1e-2),
    torch.float16: dict(rtol=2e-3, atol=1e-3),
}


def check(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> None:
    a = x.detach().clone().requires_grad_()
    b = x.detach().clone().requires_grad_()
    out = softmax(a, dim, dtype)
    ref = F.softmax(b, dim, dtype=dtype)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, **TOL[ref.dtype])
    cot = torch.randn_like(ref)
    out.backward(cot)
    ref.backward(cot)
    assert a.grad.dtype == b.grad.dtype == x.dtype
    torch.testing.assert_close(a.grad, b.grad, **TOL[x.dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "shape,dim",
    [((5,), 0), ((3, 7), -1), ((3, 7), 0), ((2, 3, 4, 9), -1), ((2, 3, 4, 9), 1), ((4, 1), -1)],
)
def test_matches_functional(dtype, shape, dim):
    torch.manual_seed(0)
    check(torch.randn(shape, dtype=dtype) * 3, dim)


@pytest.mark.parametrize(
    "src,dst",
    [
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float64),
        (torch.float64, torch.float32),
    ],
)
def test_dtype_argument(src, dst):
    torch.manual_seed(1)
    check(torch.randn(4, 6, dtype=src), -1, dst)


def test_bfloat16_forward_and_non_contiguous_input():
    x = torch.randn(6, 10, dtype=torch.bfloat16)
    torch.testing.assert_close(softmax(x, -1), F.softmax(x, -1), **TOL[torch.bfloat16])
    xt = torch.randn(8, 5, dtype=torch.float64).t()
    check(xt, -1)


def test_masked_rows_and_infinities():
    x = torch.tensor([[0.0, -float("inf"), 1.0], [-float("inf")] * 3])
    torch.testing.assert_close(softmax(x), F.softmax(x, -1), equal_nan=True)


def test_dim_none_delegates_to_legacy_behaviour():
    x = torch.randn(2, 3)
    with pytest.warns(UserWarning):
        out = softmax(x, None)
    torch.testing.assert_close(out, F.softmax(x, dim=1))


def test_is_not_an_alias_of_functional_softmax(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("F.softmax must not be called on the fast path")

    monkeypatch.setattr(F, "softmax", boom)
    x = torch.randn(3, 4)
    torch.testing.assert_close(softmax(x, -1), torch.exp(x) / torch.exp(x).sum(-1, keepdim=True))


@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data())
def test_property_shapes(shape, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    check(torch.randn(shape, dtype=torch.float64), dim)


# --- Triton kernels, exercised on CPU through TRITON_INTERPRET=1 when triton is installed ---

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton not installed"
)


_INTERPRETED_CHECK = """
import torch, torch.nn.functional as F
from adopter.kernels import _triton_softmax

TOL = {torch.float32: dict(rtol=1e-6, atol=1e-6), torch.bfloat16: dict(rtol=2e-2, atol=1e-2),
       torch.float16: dict(rtol=2e-3, atol=1e-3)}
ks = _triton_softmax.build_kernels()
cases = [(torch.float32, torch.float32, 7), (torch.float32, torch.float32, 64),
         (torch.bfloat16, torch.float32, 33), (torch.float16, torch.float16, 5),
         (torch.bfloat16, torch.bfloat16, 16), (torch.float16, torch.float32, 1)]
for src, dst, cols in cases:
    torch.manual_seed(cols)
    x = (torch.randn(3, 4, cols) * 4).to(src)
    assert _triton_softmax.supported(x, -1, dst)
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    out = _triton_softmax.triton_softmax(a, dst, ks)
    ref = F.softmax(b, -1, dtype=dst)
    assert out.dtype == dst
    torch.testing.assert_close(out, ref, **TOL[dst])
    cot = torch.randn_like(ref)
    out.backward(cot)
    ref.backward(cot)
    assert a.grad.dtype == src
    torch.testing.assert_close(a.grad, b.grad, **TOL[src])
print("ok", len(cases))
"""


@needs_triton
def test_triton_kernel_interpreted():
    """Run the Triton forward/backward kernels on CPU through Triton's interpreter.

    A subprocess is used because TRITON_INTERPRET must be set before ``triton.language`` is
    first imported (other tests may import it through torch.compile).
    """
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, "-c", _INTERPRETED_CHECK],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok", "6"]


def test_triton_support_predicate():
    from adopter.kernels import _triton_softmax

    x = torch.randn(4, 8)
    assert _triton_softmax.supported(x, -1, torch.float32)
    assert _triton_softmax.supported(x, 1, torch.float32)
    assert not _triton_softmax.supported(x, 0, torch.float32)
    assert not _triton_softmax.supported(x.t(), -1, torch.float32)
    assert not _triton_softmax.supported(x.double(), -1, torch.float64)
    assert not _triton_softmax.supported(torch.randn(2, 20000), -1, torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "src,dst",
    [(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, None)],
)
def test_cuda(src, dst):
    check(torch.randn(64, 300, device="cuda", dtype=src), -1, dst)
