"""Tests for adopter.kernels._backend and the package surface."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from adopter.kernels import _backend, describe_backends, registry
from adopter.kernels.registry import Role


def test_describe_backends_cpu():
    info = describe_backends("cpu")
    assert info["device"] == "cpu"
    for key in ("triton", "xformers", "flash_attn", *registry.names(Role.KERNEL)):
        assert isinstance(info[key], str) and info[key], key
    for name in registry.names(Role.ATTENTION_FACTORY):
        assert "scaled_dot_product_attention" in info[name]
    assert describe_backends()["device"] in ("cpu", "cuda")


def test_describe_backends_cuda_reports_without_a_gpu(monkeypatch):
    monkeypatch.setattr(_backend, "triton_available", lambda: True)
    info = describe_backends("cuda")
    assert "triton" in info["softmax"] and "torch.compile" in info["dropout_add_layer_norm"]
    monkeypatch.setenv("ADOPTER_KERNELS_TRITON", "0")
    monkeypatch.setenv("ADOPTER_KERNELS_COMPILE", "0")
    info = describe_backends("cuda")
    assert "triton" not in info["softmax"] and "eager" in info["dropout_add_layer_norm"]


def test_switches(monkeypatch):
    cpu = torch.zeros(1)
    assert not _backend.use_triton(cpu)
    monkeypatch.setenv("ADOPTER_KERNELS_COMPILE", "0")
    assert not _backend.should_compile(cpu)
    monkeypatch.setenv("ADOPTER_KERNELS_COMPILE", "1")
    assert _backend.should_compile(cpu)
    monkeypatch.delenv("ADOPTER_KERNELS_COMPILE")
    assert _backend.should_compile(cpu) is False  # auto: CUDA + triton only
    assert _backend.compile_backend() == "inductor"


def test_availability_probes_do_not_fail():
    for probe in (
        _backend.triton_available,
        _backend.xformers_available,
        _backend.flash_attn_available,
    ):
        assert isinstance(probe(), bool)


def test_import_is_side_effect_free():
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys; import adopter.kernels as k; "
        "bad = [m for m in ('triton', 'xformers', 'flash_attn', 'transformers') "
        "if m in sys.modules]; assert not bad, bad; "
        "assert not k._util._CACHE; print('ok')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
