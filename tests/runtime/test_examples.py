"""The Llama example gives the same losses plainly and under ``adopter run`` on the transformers
4.34 of the test environment; tests/modern/test_examples.py runs all three examples on
transformers 5.x, diffusers and timm."""

from __future__ import annotations

import sys

import pytest

from tests.runtime.example_runs import compare_with_and_without_adopter

pytestmark = pytest.mark.slow  # see pyproject.toml's markers


def test_the_llama_example_on_the_test_environment(tmp_path):
    pytest.importorskip("transformers")
    log = compare_with_and_without_adopter(sys.executable, "train_tiny_llama.py", tmp_path)
    assert "adopter: patched transformers.models.llama.modeling_llama" in log
