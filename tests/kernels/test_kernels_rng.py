"""Which kernels draw random numbers like the code they replace."""

from __future__ import annotations

import pytest

from adopter.kernels.rng import kernels_used, rng_mismatch_reason


def test_kernel_names_are_found_only_in_adopter_sources() -> None:
    source = "from adopter.kernels import dropout_add_layer_norm, softmax as sm\n"
    assert kernels_used([source]) == ({"dropout_add_layer_norm", "softmax"}, set())
    assert kernels_used(["def softmax(x): ..."]) == (set(), set())
    assert kernels_used(["import adopter.kernels\nadopter.kernels.fancy_new(x)"])[1] == {
        "fancy_new"
    }


def test_rng_free_and_cpu_identical_kernels_allow_the_dropout_comparison(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ADOPTER_KERNELS_COMPILE", raising=False)
    source = "from adopter.kernels import dropout_add_layer_norm, linear_bias_activation"
    assert rng_mismatch_reason([source], "cpu") is None
    assert rng_mismatch_reason(["plain torch code"], "cpu") is None
    assert "cuda" in (rng_mismatch_reason([source], "cuda") or "")
    monkeypatch.setenv("ADOPTER_KERNELS_COMPILE", "1")
    assert "torch.compile" in (rng_mismatch_reason([source], "cpu") or "")


def test_attention_and_unknown_kernels_skip_it() -> None:
    attention = "import adopter.kernels\nX = adopter.kernels.fused_t5_attention(X)"
    assert "fused_t5_attention" in (rng_mismatch_reason([attention], "cpu") or "")
    unknown = "from adopter.kernels import (\n    brand_new_kernel,\n)"
    assert "brand_new_kernel" in (rng_mismatch_reason([unknown], "cpu") or "")


def test_modern_kernels_keep_the_comparison_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ADOPTER_KERNELS_COMPILE", raising=False)
    source = (
        "from adopter.kernels import rms_norm, gated_mlp, apply_rotary, causal_lm_loss\n"
        "from adopter.kernels import attention_function, conv_bn_act\n"
    )
    assert rng_mismatch_reason([source], "cpu") is None
    assert "attention_function" in (rng_mismatch_reason([source], "cuda") or "")
