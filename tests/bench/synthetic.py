"""Hand-made benchmark results, so report and selection logic can be tested without timing."""

from __future__ import annotations

from adopter.bench import BenchResult, MemoryStats, ModeResult, Speedup, TimingStats

Entry = tuple[float, float, float] | str | None
"""``(ratio, ci_low, ci_high)``, an error message, or ``None`` for "not measured"."""


def make_result(
    entries: dict[str, dict[str, Entry]],
    *,
    baseline: str = "original",
    modes: tuple[str, ...] = ("inference", "train"),
    memory: dict[str, dict[str, float]] | None = None,
) -> BenchResult:
    """A result with a 10 ms baseline; ``memory[name][mode]`` is a peak ratio vs. 1 MiB."""
    base_ms = 10e-3
    variants: dict[str, dict[str, ModeResult]] = {baseline: {}}
    for mode in modes:
        variants[baseline][mode] = ModeResult(
            timing=TimingStats.from_times([base_ms] * 3, 8),
            speedup=Speedup(1.0, 1.0, 1.0, 0.95, "paired"),
            memory=MemoryStats("profiler", 1 << 20) if memory else None,
        )
    for name, per_mode in entries.items():
        variants[name] = {}
        for mode in modes:
            entry = per_mode.get(mode)
            res = ModeResult()
            if isinstance(entry, str):
                res.error = entry
            elif entry is not None:
                ratio, low, high = entry
                res.timing = TimingStats.from_times([base_ms / ratio] * 3, 8)
                res.speedup = Speedup(ratio, low, high, 0.95, "paired")
            ratio_mem = (memory or {}).get(name, {}).get(mode)
            if ratio_mem is not None:
                res.memory = MemoryStats("profiler", int(ratio_mem * (1 << 20)), None, ratio_mem)
            variants[name][mode] = res
    return BenchResult(
        baseline=baseline,
        modes=modes,
        variants=variants,
        settings={"confidence": 0.95, "warmup": 1, "repeats": 3, "number": 1},
        environment={"torch": "x", "device": "cpu", "cpu": "test cpu", "threads": 1},
    )
