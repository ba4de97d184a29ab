"""One real (tiny) benchmark run shared by the tests that only inspect its result."""

from __future__ import annotations

import pytest

from adopter.bench import BenchResult, ModelVariant, benchmark_variants
from tests.bench import toy


@pytest.fixture(scope="session")
def toy_result() -> BenchResult:
    """Original vs. kernel-patched toy MLP, both modes, profiler memory; about a second."""
    return benchmark_variants(
        [ModelVariant("original", toy.original), ModelVariant("patched", toy.patched)],
        baseline="original",
        warmup=1,
        repeats=3,
        threads=1,
        memory="profiler",
    )
