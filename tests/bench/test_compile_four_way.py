"""``bench --compile``: original and patched, eager and compiled, timed in one interleaved run,
with each compiled variant also set against the compiled original. Structure, never speed: the
compiler is Dynamo's ``eager`` backend here (a real compile is a benchmark's cost)."""

from __future__ import annotations

import torch

import adopter.bench.measure as measure
from adopter.bench.command import (
    COMPILED,
    BenchOptions,
    against_compiled,
    eager_and_compiled,
    run_bench,
)
from adopter.bench.measure import ModelVariant
from adopter.bench.report import against_compiled_lines, render_table
from tests.bench import toy


def _recording_compiler(monkeypatch) -> list[torch.nn.Module]:
    compiled: list[torch.nn.Module] = []

    def compile_with_eager_backend(model, backend, mode):
        compiled.append(model)
        return torch.compile(model, backend="eager")

    monkeypatch.setattr(measure, "_compile", compile_with_eager_backend)
    return compiled


def test_each_variant_is_eager_and_compiled_once():
    variants = eager_and_compiled(
        [ModelVariant("original", toy.original), ModelVariant("patched", toy.patched)]
    )
    assert [(v.name, v.compiled) for v in variants] == [
        ("original", False),
        ("patched", False),
        (f"original{COMPILED}", True),
        (f"patched{COMPILED}", True),
    ]


def test_one_run_reports_all_four_and_the_compiled_comparison(monkeypatch):
    compiled = _recording_compiler(monkeypatch)
    result = run_bench(
        options=BenchOptions(
            factory="tests.bench.toy:original",
            patched_factory="tests.bench.toy:patched",
            compile=True,
            modes=("inference", "train"),
            warmup=1,
            repeats=3,
            memory="profiler",
            threads=1,
        )
    )
    assert result.names == ["original", "patched", "original + compile", "patched + compile"]
    assert len(compiled) == 2  # the two "+ compile" variants, not the eager ones
    assert result.settings["compiled_variants"] == ["original + compile", "patched + compile"]
    for name in result.names:
        for mode in result.modes:
            assert result.get(name, mode).ok, result.get(name, mode).error
    # every ratio of the table is against the eager original, from the same rounds
    rounds = {len(result.get(n, "train").timing.times_s) for n in result.names}
    assert rounds == {3}
    comparison = result.settings["against_compiled"]
    assert list(comparison) == ["patched + compile"]
    cell = comparison["patched + compile"]["train"]
    assert cell["against"] == "original + compile"
    base = result.get("original + compile", "train").timing.median_s
    own = result.get("patched + compile", "train").timing.median_s
    assert abs(cell["speedup"] - base / own) < 1e-12
    assert cell["ci_low"] <= cell["speedup"] <= cell["ci_high"]
    peaks = [
        result.get(n, "train").memory.peak_bytes
        for n in ("original + compile", "patched + compile")
    ]
    assert cell["memory_ratio"] == peaks[1] / peaks[0]
    lines = against_compiled_lines(result)
    assert len(lines) == 2 and lines[0].startswith("patched + compile, inference: ")
    caption = str(render_table(result).caption)
    assert "eager and torch.compile[inductor] (the '+ compile' rows)" in caption


def test_without_compile_nothing_is_compiled(monkeypatch):
    compiled = _recording_compiler(monkeypatch)
    result = run_bench(
        options=BenchOptions(
            factory="tests.bench.toy:original",
            patched_factory="tests.bench.toy:patched",
            modes=("inference",),
            warmup=0,
            repeats=2,
            memory=None,
            threads=1,
        )
    )
    assert result.names == ["original", "patched"] and compiled == []
    assert "against_compiled" not in result.settings
    assert against_compiled(result) == {}
