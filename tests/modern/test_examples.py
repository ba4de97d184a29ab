"""The example training scripts give the same losses plainly and under ``adopter run`` on the
releases users run today (transformers 5.x, diffusers, timm)."""

from __future__ import annotations

import sys

import pytest

from tests.runtime.example_runs import EXAMPLES, compare_with_and_without_adopter


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory):
    # One runtime cache for the three examples, as one user's machine has: the diffusers and the
    # Llama examples both import transformers, rewritten once for both (the first run is cold).
    return tmp_path_factory.mktemp("adopter-cache")


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_example_gives_the_same_losses_under_adopter_run(example, tmp_path, shared_cache):
    log = compare_with_and_without_adopter(sys.executable, example, tmp_path, shared_cache)
    assert "adopter: patched " in log
