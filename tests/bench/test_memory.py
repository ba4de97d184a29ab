"""CPU peak-memory measurement: the fresh-subprocess RSS probe and the profiler method.

The probe tests start real interpreters (2-5 s each): three in all, two of them concurrently,
and only for inference steps - a training step in a child also imports ``torch._dynamo``
(through ``torch.optim``), seconds more per probe. The probe's training path is exercised
in-process by the command-line test.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch

from adopter.bench import MemoryStats, ModelVariant, benchmark_variants, run_memory_probe
from adopter.bench.measure import make_optimizer, make_step, measure_step_memory
from adopter.bench.memory_probe import current_rss, main, peak_rss, probe, reset_peak_rss
from tests.bench import toy

pytestmark = pytest.mark.slow  # see pyproject.toml's markers

MIB = 1 << 20


@pytest.fixture(scope="module")
def rss_result():
    """The same wide model twice at batch 1024, inference, memory from fresh subprocesses."""
    wide = functools.partial(toy.wide, batch=1024)
    return benchmark_variants(
        [ModelVariant("original", wide), ModelVariant("again", wide)],
        baseline="original",
        modes=("inference",),
        warmup=1,
        repeats=2,
        threads=1,
        memory="auto",
        probe_jobs=2,
    )


def test_benchmark_with_rss_memory_fills_in_ratios(rss_result):
    assert rss_result.settings["memory"] == "rss_subprocess"
    base = rss_result.get("original", "inference").memory
    again = rss_result.get("again", "inference").memory
    assert base.method == again.method == "rss_subprocess"
    assert base.absolute_bytes > base.peak_bytes
    assert base.ratio is None
    assert again.ratio == pytest.approx(again.peak_bytes / base.peak_bytes)
    assert 0.8 < again.ratio < 1.25  # same model twice: the measure is repeatable


def test_rss_probe_is_positive_and_grows_with_the_batch(rss_result):
    # One wide layer: the (batch x 4096) float activation dominates. At batch 1024 it is
    # 16 MiB (and the GELU output another 16 MiB), at batch 16 it is 256 KiB.
    small = run_memory_probe(
        ModelVariant("batch16", functools.partial(toy.wide, batch=16)),
        modes=["inference"],
        threads=1,
    )["inference"]
    big = rss_result.get("original", "inference").memory
    assert isinstance(small, MemoryStats), small
    assert small.method == "rss_subprocess"
    assert small.peak_bytes > 0
    assert small.absolute_bytes > small.peak_bytes
    assert big.peak_bytes > 16 * MIB
    assert big.peak_bytes > small.peak_bytes + 12 * MIB, (small, big)


def test_probe_refuses_unpicklable_factories_without_starting_a_process():
    result = run_memory_probe(ModelVariant("local", lambda: toy.original()), modes=["train"])
    assert "cannot be sent to the memory probe" in result["train"]


def test_probe_reports_a_failing_step_in_its_report():
    report = probe({"factory": toy.broken, "modes": ["inference"], "threads": None})
    assert report["modes"]["inference"] == {"error": "step failed: RuntimeError: kaboom"}


def test_rss_helpers_in_process():
    assert current_rss() > 0
    assert reset_peak_rss() in (True, False)
    assert peak_rss() > 0


def test_probe_command_line(capsys):
    # In-process (so no RSS claims here): checks argument handling and both step kinds.
    code = main(["--factory", "tests.bench.toy:original", "--modes", "train", "inference"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    for mode in ("train", "inference"):
        entry = report["modes"][mode]
        assert entry["peak_bytes"] >= 0 and entry["absolute_bytes"] > 0
        assert isinstance(entry["hwm_reset"], bool)
    assert main(["--factory", "tests.bench.toy:nothing_here"]) == 1
    assert "AttributeError" in json.loads(capsys.readouterr().out)["error"]


def test_profiler_peak_counts_the_activation():
    model, (x,) = toy.wide(batch=256)
    model.train()
    optimizer = make_optimizer(model, "sgd")
    step = make_step(model, (x,), {}, "train", optimizer)
    step()
    stats = measure_step_memory(step, "profiler", torch.device("cpu"), optimizer)
    activation = 256 * 4096 * 4
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # At least the fc1 output saved for backward plus all gradients are alive at the peak.
    assert stats.method == "profiler"
    assert stats.peak_bytes >= activation + weights
