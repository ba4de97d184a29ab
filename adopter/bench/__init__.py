"""``adopter bench``: measure what a rewrite buys - step time, throughput, peak memory.

:func:`benchmark_variants` times named model variants (the original and one or more patched
versions, e.g. one per rule for ablation) interleaved, on identical weights and inputs;
:mod:`~adopter.bench.report` renders the result as a table, JSON or a PNG chart, and
:func:`faster_variants` decides which variants ``apply --only-faster`` keeps. Importing this
package imports ``torch`` and ``rich``; matplotlib only when plotting.
"""

from .measure import (
    MEMORY_METHODS,
    MODES,
    CheckpointMismatchError,
    ModelVariant,
    VariantBuildError,
    benchmark_variants,
    derive_loss,
    environment_info,
    run_memory_probe,
)
from .report import from_json, plot, render_table, to_json
from .results import BenchResult, MemoryStats, ModeResult, Speedup, TimingStats
from .selection import Decision, decide, faster_variants

__all__ = [
    "MEMORY_METHODS",
    "MODES",
    "BenchResult",
    "CheckpointMismatchError",
    "Decision",
    "MemoryStats",
    "ModeResult",
    "ModelVariant",
    "Speedup",
    "TimingStats",
    "VariantBuildError",
    "benchmark_variants",
    "decide",
    "derive_loss",
    "environment_info",
    "faster_variants",
    "from_json",
    "plot",
    "render_table",
    "run_memory_probe",
    "to_json",
]
