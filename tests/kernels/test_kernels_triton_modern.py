"""The Triton paths of rms_norm, the gated kernels and rotary (adopter.kernels._triton_modern).

With ``triton`` installed they run on CPU tensors through Triton's interpreter
(``TRITON_INTERPRET=1``, set before triton is imported, hence a subprocess); on a GPU,
``benchmarks/gpu_check.py`` checks and times them. Without triton only the dispatch and the
fallback after a failing kernel are tested.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from adopter.kernels import _triton_modern, rms_norm
from adopter.kernels.rms_norm import rms_norm_reference

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_tensors_never_take_triton():
    assert not _triton_modern.usable(torch.randn(2))


def test_a_failing_kernel_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(_triton_modern, "_FAILURES", [])
    monkeypatch.setattr(_triton_modern, "usable", lambda t: not _triton_modern._FAILURES)

    def broken(*args, **kwargs):
        raise RuntimeError("no GPU here")

    monkeypatch.setattr(_triton_modern, "rms_forward", broken)
    x, w = torch.randn(3, 8), torch.randn(8)
    with pytest.warns(RuntimeWarning, match="Triton kernel failed"):
        out = rms_norm(x, w, 1e-6)
    assert torch.equal(out, rms_norm_reference(x, w, 1e-6))
    assert len(_triton_modern._FAILURES) == 1
    assert torch.equal(rms_norm(x, w, 1e-6), out)  # no second attempt


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_kernels_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "kernels" / "triton_modern_check.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "triton paths OK" in result.stdout
