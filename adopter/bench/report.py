"""Present benchmark results: a rich table for people, JSON for machines, a PNG for the docs.

Everything here works from a :class:`~adopter.bench.results.BenchResult` alone (live or loaded
from JSON), so a GPU run's JSON can be rendered anywhere. matplotlib is imported only inside
:func:`plot`, and through its object API with the Agg canvas: no pyplot global state, no
display needed, and a user's interactive backend is left alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from .results import BenchResult, ModeResult

__all__ = [
    "SpeedupVerdict",
    "format_bytes",
    "format_seconds",
    "from_json",
    "noise_warnings",
    "plot",
    "render_table",
    "speedup_verdict",
    "to_json",
]

_MODE_COLORS = {"inference": "#4C72B0", "train": "#DD8452"}


def to_json(result: BenchResult) -> dict[str, Any]:
    """The result as a JSON-serialisable dict (schema ``adopter.bench/1``; raw samples kept)."""
    return result.to_dict()


def from_json(data: Mapping[str, Any]) -> BenchResult:
    """Rebuild a result from :func:`to_json` output."""
    return BenchResult.from_dict(dict(data))


def format_seconds(seconds: float) -> str:
    """Compact human time: ``812.4 µs``, ``3.21 ms``, ``1.204 s``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


def format_bytes(count: float) -> str:
    """Compact human size in binary units (``512 B``, ``3.4 MiB``)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024.0 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024.0
    return f"{value:.1f} GiB"  # pragma: no cover - loop always returns


class SpeedupVerdict(StrEnum):
    """Which side of ``threshold`` a speedup's confidence interval lies on."""

    FASTER = "faster"
    """The whole interval at or above the threshold (and the ratio above it)."""
    SLOWER = "slower"
    """The whole interval below the threshold."""
    NOISE = "noise"
    """The interval straddles the threshold."""
    NOT_MEASURED = "n/a"
    """No speedup: the variant failed or is the baseline."""


def speedup_verdict(res: ModeResult, threshold: float = 1.0) -> SpeedupVerdict:
    """``faster`` / ``slower`` when the whole confidence interval is on one side, else ``noise``.

    Used for colouring; the decision used by ``apply --only-faster`` is
    :func:`adopter.bench.selection.faster_variants`.
    """
    if res.speedup is None:
        return SpeedupVerdict.NOT_MEASURED
    if res.speedup.ci_low >= threshold and res.speedup.ratio > threshold:
        return SpeedupVerdict.FASTER
    if res.speedup.ci_high < threshold:
        return SpeedupVerdict.SLOWER
    return SpeedupVerdict.NOISE


_VERDICT_STYLES = {SpeedupVerdict.FASTER: "bold green", SpeedupVerdict.SLOWER: "bold red"}


def noise_warnings(result: BenchResult) -> list[str]:
    """One line per speed-up whose interval is too wide to rely on (:meth:`Speedup.noise`)."""
    warnings = []
    for mode in result.modes:
        for name in result.candidates:
            speedup = result.get(name, mode).speedup
            reason = speedup.noise() if speedup is not None else None
            if reason:
                warnings.append(
                    f"{name}, {mode}: {reason}; rerun with more --repeats on a quieter machine"
                )
    return warnings


def against_compiled_lines(result: BenchResult) -> list[str]:
    """``bench --compile``: each compiled variant against the compiled original (the table's
    ratios are against the eager original), one line per variant and mode."""
    lines: list[str] = []
    confidence = result.settings.get("confidence", 0.95)
    for name, per_mode in (result.settings.get("against_compiled") or {}).items():
        for mode, cell in per_mode.items():
            memory = cell.get("memory_ratio")
            change = f", peak memory {(memory - 1) * 100:+.1f}%" if memory is not None else ""
            lines.append(
                f"{name}, {mode}: {cell['speedup']:.2f}x against {cell['against']!r} "
                f"({confidence:.0%} CI [{cell['ci_low']:.2f}, {cell['ci_high']:.2f}]){change}"
            )
    return lines


def _caption(result: BenchResult) -> str:
    env, cfg = result.environment, result.settings
    device = str(env.get("device", cfg.get("device", "?")))
    if env.get("gpu"):
        device += f" ({env['gpu']})"
    compiled = "eager"
    if cfg.get("compile"):
        compiled = f"torch.compile[{cfg.get('compile_backend')}"
        compiled += f", {cfg['compile_mode']}]" if cfg.get("compile_mode") else "]"
        if len(cfg.get("compiled_variants") or ()) < len(result.names):
            compiled = f"eager and {compiled} (the '+ compile' rows)"
    parts = [
        f"torch {env.get('torch', '?')}",
        device,
        str(env.get("cpu", "?")),
        f"{env.get('threads', '?')} threads",
        str(cfg.get("dtype", "?")),
        compiled,
        f"warm-up {cfg.get('warmup', '?')}, {cfg.get('repeats', '?')} rounds"
        f" x {cfg.get('number', 1)} step(s), interleaved",
        f"batch {cfg.get('batch_size', '?')}",
        f"memory: {cfg.get('memory') or 'not measured'}",
    ]
    return " · ".join(parts)


def _speedup_cells(res: ModeResult, is_baseline: bool) -> tuple[Text, Text]:
    if res.speedup is None:
        return Text("-", style="dim"), Text("")
    if is_baseline:
        return Text("1.00x (base)", style="dim"), Text("")
    sp = res.speedup
    style = _VERDICT_STYLES.get(speedup_verdict(res), "yellow")
    interval = f"[{sp.ci_low:.2f}, {sp.ci_high:.2f}]" + (" noisy" if sp.noise() else "")
    return Text(f"{sp.ratio:.2f}x", style=style), Text(interval, style=style)


def _memory_cells(res: ModeResult, is_baseline: bool) -> tuple[Text, Text]:
    if res.memory is None:
        return Text("-", style="dim"), Text("")
    peak = Text(format_bytes(res.memory.peak_bytes))
    if is_baseline or res.memory.ratio is None:
        return peak, Text("")
    change = (res.memory.ratio - 1.0) * 100.0
    style = "green" if change < 0 else ("red" if change > 0 else "")
    return peak, Text(f"{change:+.1f}%", style=style)


def render_table(result: BenchResult) -> Table:
    """One row per (mode, variant): median, IQR, throughput, speedup with CI, memory.

    Speedup is ``baseline median / variant median`` (above 1 = faster), green when the whole
    confidence interval is at or above 1, red when it is below 1, yellow when it straddles 1.
    Memory is the step's peak above the pre-step level and its change against the baseline.
    """
    confidence = result.settings.get("confidence", 0.95)
    table = Table(  # Text, not str: names and settings may contain "[...]" (rich markup)
        title=Text(f"adopter bench: speed and memory against {result.baseline!r}"),
        caption=Text(_caption(result)),
        caption_justify="left",
    )
    table.add_column("Variant", style="bold")
    table.add_column("Mode")
    table.add_column("Median / step", justify="right")
    table.add_column("IQR", justify="right")
    table.add_column("Throughput", justify="right")
    table.add_column("Speedup", justify="right")
    table.add_column(f"{confidence:.0%} CI", justify="right")
    table.add_column("Peak memory", justify="right")
    table.add_column("Memory", justify="right")
    notes = any(
        res.error or res.memory_error
        for per_mode in result.variants.values()
        for res in per_mode.values()
    )
    if notes:
        table.add_column("Note", style="dim", overflow="fold", max_width=60)

    for index, mode in enumerate(result.modes):
        if index:
            table.add_section()
        for name in result.names:
            res = result.get(name, mode)
            is_base = name == result.baseline
            if res.timing is not None:
                timing = [
                    Text(format_seconds(res.timing.median_s)),
                    Text(format_seconds(res.timing.iqr_s), style="dim"),
                    Text(f"{res.timing.throughput:,.1f}/s"),
                ]
            else:
                timing = [Text("failed", style="bold red"), Text(""), Text("")]
            row = [Text(name), Text(mode), *timing]
            row.extend(_speedup_cells(res, is_base))
            row.extend(_memory_cells(res, is_base))
            if notes:
                row.append(Text(res.error or res.memory_error or ""))
            table.add_row(*row)
    return table


def _bar_entries(results: Mapping[str, BenchResult]) -> list[tuple[str, BenchResult, str]]:
    entries = []
    for model, result in results.items():
        candidates = result.candidates
        for variant in candidates:
            label = model if len(candidates) == 1 else f"{model}\n{variant}"
            entries.append((label, result, variant))
    return entries


def plot(results: Mapping[str, BenchResult], path: Path | str, *, title: str | None = None) -> Path:
    """Write a PNG bar chart: speedup (with CI error bars) and memory change, per model.

    ``results`` maps a model name to its benchmark; every non-baseline variant of a model gets
    its own group of bars (one bar per mode). Top panel: speedup against the model's baseline
    (line at 1 = no change). Bottom panel: change of the step's peak memory in percent (line
    at 0), or a note when memory was not measured. Returns ``path``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    entries = _bar_entries(results)
    if not entries:
        raise ValueError("nothing to plot: no model has a variant besides its baseline")
    modes: list[str] = []
    for result in results.values():
        modes.extend(m for m in result.modes if m not in modes)

    width = 0.8 / max(len(modes), 1)
    fig = Figure(figsize=(max(6.0, 1.1 * len(entries) + 2.0), 7.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax_speed, ax_mem = fig.subplots(2, 1, sharex=True)
    xs = list(range(len(entries)))
    any_memory = False
    for k, mode in enumerate(modes):
        offset = (k - (len(modes) - 1) / 2) * width
        color = _MODE_COLORS.get(mode)
        speeds, lows, highs, mems = [], [], [], []
        for x, (_, result, variant) in zip(xs, entries):
            res = result.get(variant, mode)
            if res.error:
                ax_speed.text(
                    x + offset, 1.0, "failed", rotation=90, ha="center", va="bottom",
                    fontsize=7, color="#C44E52",
                )  # fmt: skip
            sp = res.speedup
            speeds.append(sp.ratio if sp else math.nan)
            lows.append(sp.ratio - sp.ci_low if sp else 0.0)
            highs.append(sp.ci_high - sp.ratio if sp else 0.0)
            ratio = res.memory.ratio if res.memory is not None else None
            mems.append((ratio - 1.0) * 100.0 if ratio is not None else math.nan)
            any_memory = any_memory or ratio is not None
        positions = [x + offset for x in xs]
        bars = ax_speed.bar(
            positions, speeds, width, yerr=[lows, highs], capsize=3, color=color, label=mode
        )
        ax_speed.bar_label(bars, labels=[_fmt(v, "{:.2f}x") for v in speeds], fontsize=7)
        mem_bars = ax_mem.bar(positions, mems, width, color=color, label=mode)
        ax_mem.bar_label(mem_bars, labels=[_fmt(v, "{:+.1f}%") for v in mems], fontsize=7)

    for ax in (ax_speed, ax_mem):  # let margins apply at the bars' zero edge too
        ax.use_sticky_edges = False
        ax.margins(y=0.12)
    ax_speed.set_ylim(bottom=0.0)
    ax_speed.axhline(1.0, color="black", linewidth=0.8)
    ax_speed.set_ylabel("speedup vs. original (x)")
    confidence = next(iter(results.values())).settings.get("confidence", 0.95)
    ax_speed.set_title(title or f"Speedup (median ratio, {confidence:.0%} bootstrap CI)")
    ax_speed.legend(loc="best", fontsize=8)
    ax_mem.axhline(0.0, color="black", linewidth=0.8)
    ax_mem.set_ylabel("peak memory change (%)")
    ax_mem.set_title("Step peak memory vs. original (lower is better)")
    if not any_memory:
        ax_mem.text(
            0.5, 0.5, "memory not measured", transform=ax_mem.transAxes, ha="center", va="center"
        )
    ax_mem.set_xticks(xs, [label for label, _, _ in entries], fontsize=8)
    if len(entries) > 6:
        for tick in ax_mem.get_xticklabels():
            tick.set_rotation(30)
            tick.set_horizontalalignment("right")

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, format="png")
    return out


def _fmt(value: float, pattern: str) -> str:
    return "" if math.isnan(value) else pattern.format(value)
