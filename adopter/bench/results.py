"""The data a benchmark run produces, and its lossless JSON form.

Kept free of measurement code so that reports, plots and the ``--only-faster`` selection can be
computed from a saved JSON file on a machine without the models (e.g. CI artefacts from a GPU
runner rendered on a laptop).

Conventions used throughout:

* times are seconds per *step* (one forward for inference; forward + backward + optimizer step
  for training), never per sample;
* ``Speedup.ratio`` is ``baseline median / variant median``: above 1 the variant is faster;
* memory ratios are ``variant peak / baseline peak``: below 1 the variant uses less.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .stats import median, quantile

__all__ = [
    "NOISE_BAND",
    "SCHEMA",
    "WIDE_INTERVAL",
    "BenchResult",
    "MemoryStats",
    "ModeResult",
    "Speedup",
    "TimingStats",
]

SCHEMA = "adopter.bench/1"
NOISE_BAND = 0.05
"""A ratio whose interval reaches below ``1 - NOISE_BAND`` and above ``1 + NOISE_BAND`` cannot
tell a 5% slow-down from a 5% speed-up: too noisy to decide."""
WIDE_INTERVAL = 0.20
"""An interval wider than this fraction of its ratio leaves the size of the effect unknown."""


@dataclass(frozen=True)
class TimingStats:
    """Order statistics of the timed samples of one variant in one mode."""

    times_s: tuple[float, ...]
    median_s: float
    q1_s: float
    q3_s: float
    min_s: float
    max_s: float
    batch_size: int
    throughput: float
    """Samples per second at the median step time (``batch_size / median_s``)."""

    @property
    def iqr_s(self) -> float:
        """Interquartile range: the spread measure reported next to the median."""
        return self.q3_s - self.q1_s

    @classmethod
    def from_times(cls, times_s: list[float] | tuple[float, ...], batch_size: int) -> TimingStats:
        """Summarise raw per-step times (seconds)."""
        if not times_s:
            raise ValueError("no timing samples")
        med = median(times_s)
        return cls(
            times_s=tuple(float(t) for t in times_s),
            median_s=med,
            q1_s=quantile(times_s, 0.25),
            q3_s=quantile(times_s, 0.75),
            min_s=min(times_s),
            max_s=max(times_s),
            batch_size=batch_size,
            throughput=batch_size / med if med > 0 else 0.0,
        )


@dataclass(frozen=True)
class Speedup:
    """How much faster a variant is than the baseline, with a bootstrap confidence interval."""

    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    method: str
    """``paired`` (rounds resampled together) or ``independent`` bootstrap."""

    def noise(self) -> str | None:
        """Why the interval is too wide to rely on (see :data:`NOISE_BAND` and
        :data:`WIDE_INTERVAL`), or ``None`` when it is narrow enough."""
        interval = f"{self.confidence:.0%} interval [{self.ci_low:.2f}, {self.ci_high:.2f}]"
        if self.ci_low < 1 - NOISE_BAND and self.ci_high > 1 + NOISE_BAND:
            band = f"{NOISE_BAND:.0%}"
            return (
                f"{interval} holds both a {band} slow-down and a {band} speed-up: "
                "too noisy to decide"
            )
        width = (self.ci_high - self.ci_low) / self.ratio if self.ratio > 0 else float("inf")
        if width > WIDE_INTERVAL:
            return (
                f"{interval} is {width:.0%} of the ratio wide (over {WIDE_INTERVAL:.0%}): "
                "the size of the effect is uncertain"
            )
        return None


@dataclass(frozen=True)
class MemoryStats:
    """Peak memory of one step, above the level just before the step.

    ``peak_bytes`` excludes what persists across steps (weights, optimizer state, inputs) and
    is what a rewrite can change: activations saved for backward, gradients, temporaries and
    workspaces. ``absolute_bytes`` is the whole-process or whole-device peak for context
    (process RSS, or all live tensors on the device).
    """

    method: str
    """``cuda_allocator``, ``rss_subprocess`` or ``profiler`` (see :mod:`adopter.bench.measure`)."""
    peak_bytes: int
    absolute_bytes: int | None = None
    ratio: float | None = None
    """``peak_bytes / baseline peak_bytes``; ``None`` for the baseline or when unavailable."""


@dataclass
class ModeResult:
    """Everything measured for one variant in one mode (``inference`` or ``train``)."""

    timing: TimingStats | None = None
    speedup: Speedup | None = None
    memory: MemoryStats | None = None
    error: str | None = None
    """Why timing failed (compile error, runtime error); ``timing`` is then ``None``."""
    memory_error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether this variant produced timings in this mode."""
        return self.error is None and self.timing is not None


@dataclass
class BenchResult:
    """A whole benchmark: every variant in every mode, plus how and where it was measured."""

    baseline: str
    modes: tuple[str, ...]
    variants: dict[str, dict[str, ModeResult]]
    """``variants[name][mode]``, in the order the variants were given."""
    settings: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """Variant names, baseline included, in the order given."""
        return list(self.variants)

    @property
    def candidates(self) -> list[str]:
        """Variant names other than the baseline."""
        return [name for name in self.variants if name != self.baseline]

    def get(self, variant: str, mode: str) -> ModeResult:
        """The result of ``variant`` in ``mode`` (an empty result if it was not run)."""
        return self.variants.get(variant, {}).get(mode, ModeResult())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (see :func:`adopter.bench.report.to_json`)."""
        variants: dict[str, Any] = {}
        for name, modes in self.variants.items():
            variants[name] = {}
            for mode, res in modes.items():
                entry: dict[str, Any] = {
                    "timing": None,
                    "speedup": asdict(res.speedup) if res.speedup else None,
                    "memory": asdict(res.memory) if res.memory else None,
                    "error": res.error,
                    "memory_error": res.memory_error,
                    # derived from "speedup" (not read back): why its interval is too wide
                    "noise": res.speedup.noise() if res.speedup and name != self.baseline else None,
                }
                if res.timing is not None:
                    timing = asdict(res.timing)
                    timing["times_s"] = list(res.timing.times_s)
                    timing["iqr_s"] = res.timing.iqr_s
                    entry["timing"] = timing
                variants[name][mode] = entry
        return {
            "schema": SCHEMA,
            "baseline": self.baseline,
            "modes": list(self.modes),
            "settings": dict(self.settings),
            "environment": dict(self.environment),
            "variants": variants,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResult:
        """Rebuild a result from :meth:`to_dict` output (after a JSON round trip)."""
        schema = data.get("schema")
        if schema != SCHEMA:
            raise ValueError(f"unsupported benchmark schema {schema!r} (expected {SCHEMA!r})")
        variants: dict[str, dict[str, ModeResult]] = {}
        for name, modes in data["variants"].items():
            variants[name] = {}
            for mode, entry in modes.items():
                timing = None
                if entry.get("timing") is not None:
                    raw = dict(entry["timing"])
                    raw.pop("iqr_s", None)
                    raw["times_s"] = tuple(raw["times_s"])
                    timing = TimingStats(**raw)
                speedup = Speedup(**entry["speedup"]) if entry.get("speedup") else None
                memory = MemoryStats(**entry["memory"]) if entry.get("memory") else None
                variants[name][mode] = ModeResult(
                    timing=timing,
                    speedup=speedup,
                    memory=memory,
                    error=entry.get("error"),
                    memory_error=entry.get("memory_error"),
                )
        return cls(
            baseline=data["baseline"],
            modes=tuple(data["modes"]),
            variants=variants,
            settings=dict(data.get("settings", {})),
            environment=dict(data.get("environment", {})),
        )
