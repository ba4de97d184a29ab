"""The example training scripts give the same losses plainly and under ``adopter run`` on the
releases users run today (transformers 5.x, diffusers, timm)."""

from __future__ import annotations

import sys

import pytest

from tests.runtime.example_runs import EXAMPLES, compare_with_and_without_adopter


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_example_gives_the_same_losses_under_adopter_run(example, tmp_path, runtime_cache):
    # runtime_cache (conftest.py): the diffusers and the Llama examples both import
    # transformers, rewritten once for both, as on one user's machine (the first run is cold).
    log = compare_with_and_without_adopter(sys.executable, example, tmp_path, runtime_cache)
    assert "adopter: patched " in log
