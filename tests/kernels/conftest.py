"""Shared comparison helpers for the kernel tests: one tolerance table for every kernel.

Import them with ``from tests.kernels.conftest import assert_close, ...``. The tolerances are
float rounding, not approximation: a kernel that computes something else fails them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

# Per dtype: a few ulps of the dtype, scaled for the reductions a kernel reorders.
TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float64: {"rtol": 1e-10, "atol": 1e-10},
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 2e-2},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
}


def tolerance(dtype: torch.dtype, scale: float = 1.0) -> dict[str, float]:
    """``rtol``/``atol`` for comparisons in ``dtype``, widened by ``scale``."""
    base = TOLERANCES[dtype]
    return {key: value * scale for key, value in base.items()}


def assert_close(
    actual: Any, expected: Any, dtype: torch.dtype | None = None, scale: float = 1.0
) -> None:
    """``torch.testing.assert_close`` with the shared tolerance of ``dtype`` (default: the
    expected tensor's dtype); ``None`` must match ``None``, NaN must match NaN (the original's
    ``nan`` results, e.g. a mean over nothing, are part of its semantics). Dtypes must agree."""
    if expected is None or actual is None:
        assert actual is None and expected is None, (actual, expected)
        return
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(
        actual, expected, equal_nan=True, **tolerance(dtype or expected.dtype, scale)
    )


def leaves(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Fresh leaf copies that require grad (``None`` stays ``None``)."""
    return [
        None if t is None else t.detach().clone().requires_grad_(t.is_floating_point())
        for t in tensors
    ]


def outputs_and_grads(
    fn: Callable[..., Any],
    inputs: Sequence[torch.Tensor | None],
    grad_seed: int = 123,
    backward: bool = True,
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
    """Run ``fn`` on fresh leaves of ``inputs`` and backpropagate a seeded random cotangent.

    Returns the outputs (a tensor or a tuple of tensors / ``None``) and the gradients of
    ``inputs``.
    """
    own = leaves(*inputs)
    out = fn(*own)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if backward:
        generator = torch.Generator().manual_seed(grad_seed)
        pairs = [
            (
                o,
                torch.randn(o.shape, generator=generator, dtype=torch.float64).to(
                    o.device, o.dtype
                ),
            )
            for o in outs
            if isinstance(o, torch.Tensor) and o.requires_grad
        ]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    grads = [None if t is None else t.grad for t in own]
    return [None if o is None else o.detach() for o in outs], grads


def assert_same_function(
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    inputs: Sequence[torch.Tensor | None],
    dtype: torch.dtype | None = None,
    scale: float = 1.0,
    backward: bool = True,
) -> None:
    """Outputs and input gradients of ``kernel`` and ``reference`` agree within tolerance."""
    out_k, grad_k = outputs_and_grads(kernel, inputs, backward=backward)
    out_r, grad_r = outputs_and_grads(reference, inputs, backward=backward)
    assert len(out_k) == len(out_r)
    for a, b in zip(out_k, out_r, strict=True):
        assert_close(a, b, dtype, scale)
    for a, b in zip(grad_k, grad_r, strict=True):
        assert_close(a, b, dtype, scale)


class _Wrap(torch.nn.Module):
    """Calls ``fn(*inputs)``: a module ``torch.jit.trace`` and ``torch.fx`` can record."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *inputs: Any) -> Any:
        return self.fn(*inputs)


def jit_node_kinds(fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> list[str]:
    """The operator kinds ``torch.jit.trace`` records for ``fn(*inputs)``."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python values
        traced = torch.jit.trace(_Wrap(fn), tuple(inputs), check_trace=False)
    return [node.kind() for node in traced.graph.nodes()]


def assert_traces_like_reference(
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    inputs: Sequence[torch.Tensor],
    fx: bool = True,
) -> None:
    """Under ``torch.jit.trace`` (with and without grad) and ``torch.fx.symbolic_trace`` the
    kernel records the reference's operations, and the traced module computes its values."""
    expected = jit_node_kinds(reference, inputs)
    assert "prim::PythonOp" not in expected
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            assert jit_node_kinds(kernel, inputs) == expected
    if fx:
        # Traced as functions: fx names one placeholder per parameter of ``kernel``.
        graph_module = torch.fx.symbolic_trace(kernel)
        reference_module = torch.fx.symbolic_trace(reference)
        targets = [n.target for n in graph_module.graph.nodes if n.op != "placeholder"]
        assert targets == [n.target for n in reference_module.graph.nodes if n.op != "placeholder"]
        got, want = graph_module(*inputs), reference(*inputs)
        got = got if isinstance(got, (tuple, list)) else [got]
        want = want if isinstance(want, (tuple, list)) else [want]
        for a, b in zip(got, want, strict=True):
            assert_close(a, b)


def saved_bytes(
    fn: Callable[..., Any],
    inputs: Sequence[torch.Tensor | None],
    exclude: Iterable[torch.Tensor] = (),
) -> int:
    """Bytes of the distinct tensors autograd saves for backward while ``fn`` runs on leaves
    of ``inputs`` (storage counted once, however often it is saved), not counting the inputs
    themselves nor the tensors in ``exclude`` (parameters)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    own = leaves(*inputs)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*own)
    held = [t for t in own if t is not None] + list(exclude)
    inputs_ptrs = {t.untyped_storage().data_ptr() for t in held}
    return sum(size for ptr, size in storages.items() if ptr not in inputs_ptrs)
