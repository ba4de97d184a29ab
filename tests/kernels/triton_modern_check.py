"""Run by test_kernels_triton_modern.py under TRITON_INTERPRET=1: the Triton paths of
rms_norm, the gated kernels and rotary on CPU tensors, against the eager kernels' references."""

# ruff: noqa: B023 - every lambda below is called within its own loop iteration

from __future__ import annotations

import copy
import sys

import torch
from torch import nn

sys.path.insert(0, ".")
from adopter.kernels import _triton_modern, apply_rotary, apply_rotary_complex, gated_mlp, rms_norm
from adopter.kernels.rms_norm import rms_norm_reference
from adopter.kernels.rotary import apply_rotary_complex_reference, rotary_reference
from tests.kernels.conftest import assert_same_function

_triton_modern.usable = lambda tensor: True  # CPU tensors run through the interpreter
calls = []
for name in ("rms_forward", "rms_backward", "gate_forward", "gate_backward", "rotary"):
    original = getattr(_triton_modern, name)

    def spy(*args, _original=original, _name=name, **kwargs):
        calls.append(_name)
        return _original(*args, **kwargs)

    setattr(_triton_modern, name, spy)

for dtype in (torch.float32, torch.bfloat16):
    for cast in ("before_weight", "after_weight"):
        for weighted in (True, False):
            for offset in (0.0, 1.0):
                x = torch.randn(3, 5, 40).to(dtype)
                w = torch.randn(40).to(dtype) if weighted else None
                assert_same_function(
                    lambda x, w: rms_norm(x, w, 1e-6, offset=offset, cast=cast),
                    lambda x, w: rms_norm_reference(x, w, 1e-6, offset=offset, cast=cast),
                    [x, w],
                    scale=2,
                )

for act in (nn.SiLU(), nn.GELU(), nn.GELU(approximate="tanh"), nn.ReLU()):
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        gate, up, down = (
            nn.Linear(12, 20).to(dtype),
            nn.Linear(12, 20).to(dtype),
            nn.Linear(20, 12).to(dtype),
        )
        x = torch.randn(2, 7, 12).to(dtype)
        assert_same_function(
            lambda x: gated_mlp(x, gate, up, down, act),
            lambda x: down(copy.deepcopy(act)(gate(x)) * up(x)),
            [x],
            scale=4,
        )

for dtype in (torch.float32, torch.bfloat16):
    q = torch.randn(2, 3, 5, 10).to(dtype)
    k = torch.randn(2, 1, 5, 10).to(dtype)
    for interleaved in (False, True):
        for partial, width in ((False, 10), (True, 6)):
            for upcast in (False, True):
                cos = torch.randn(2, 5, width).to(dtype)
                sin = torch.randn(2, 5, width).to(dtype)
                options = {"interleaved": interleaved, "upcast": upcast, "partial": partial}
                assert_same_function(
                    lambda q, k: apply_rotary(q, k, cos, sin, **options),
                    lambda q, k: tuple(
                        rotary_reference(t, cos.unsqueeze(1), sin.unsqueeze(1), **options)
                        for t in (q, k)
                    ),
                    [q, k],
                    scale=4,
                )
    angles = torch.randn(2, 5, 1, 5)
    freqs = torch.polar(torch.ones_like(angles), angles)
    qq, kk = torch.randn(2, 5, 3, 10).to(dtype), torch.randn(2, 5, 2, 10).to(dtype)
    assert_same_function(
        lambda q, k: apply_rotary_complex(q, k, freqs),
        lambda q, k: apply_rotary_complex_reference(q, k, freqs),
        [qq, kk],
        scale=4,
    )

assert not _triton_modern._FAILURES, _triton_modern._FAILURES
assert {"rms_forward", "rms_backward", "gate_forward", "gate_backward", "rotary"} <= set(calls)
print("triton paths OK", len(calls), "kernel calls")
