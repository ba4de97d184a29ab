"""``adopter bench``: measure what a rewrite buys - step time, throughput, peak memory.

:func:`run_bench` rewrites a model's source with the rules and benchmarks original against
patched (and per-rule) variants, as its :class:`BenchOptions` say; :func:`only_faster_rules`
picks the rules that pay off for ``apply --only-faster``. Underneath, :func:`benchmark_variants`
times named model variants (the original and one or more patched versions, e.g. one per rule
for ablation) interleaved, on identical weights and inputs;
:mod:`~adopter.bench.report` renders the result as a table, JSON or a PNG chart, and
:func:`faster_variants` decides which variants ``apply --only-faster`` keeps. Importing this
package imports ``torch`` and ``rich``; matplotlib only when plotting.
"""

from .command import BenchTargetError, NoSiteError, only_faster_rules, run_bench
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
from .options import BenchOptions
from .report import from_json, plot, render_table, to_json
from .results import BenchResult, MemoryStats, ModeResult, Speedup, TimingStats
from .selection import Decision, decide, faster_variants

__all__ = [
    "MEMORY_METHODS",
    "MODES",
    "BenchOptions",
    "BenchResult",
    "BenchTargetError",
    "CheckpointMismatchError",
    "Decision",
    "MemoryStats",
    "ModeResult",
    "ModelVariant",
    "NoSiteError",
    "Speedup",
    "TimingStats",
    "VariantBuildError",
    "benchmark_variants",
    "decide",
    "derive_loss",
    "environment_info",
    "faster_variants",
    "from_json",
    "only_faster_rules",
    "plot",
    "render_table",
    "run_bench",
    "run_memory_probe",
    "to_json",
]
