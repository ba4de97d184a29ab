"""``adopter bench --backends``: time every installed backend of each kernel op on this machine
and record the winners in the table :mod:`adopter.kernels.backends` reads.

For each op (``linear_cross_entropy``, ``rms_norm``, ``add_rms_norm``, ``attention``) and
shape, every backend that is installed, runs on the device and accepts the call is timed beside
the original computation, in interleaved rounds (one step of each per round, in a rotating
order, so a shared machine's load falls on every candidate alike): one step is the forward and, in
``train`` mode, the backward with every input gradient. Reported per candidate: the median
step time, its ratio to the reference (Adopter's own backend where the op has one, else the
original) with a 95% paired-bootstrap interval, and the step's peak tensor memory (profiler
allocation events, above the level before the step). The winner of a shape is the fastest
candidate whose interval against the reference lies wholly above 1; when none does, the
reference stays (:func:`winners`). Winners are written per ``device/dtype/mode/bucket``: each
measured mode has its own (the kernels look up the mode of each call).

Shapes: a model's (``hidden_size``, ``vocab_size``, heads and head size of its default
configuration, ``batch x seq`` tokens) or :func:`default_shapes`.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..kernels import backends as kernel_backends
from ..kernels.add_rms_norm import AddNormCall, NormSpec, add_rms_norm_reference
from ..kernels.add_rms_norm import bucket as add_norm_bucket
from ..kernels.attention_function import AttentionCall, attention_call_reference
from ..kernels.attention_function import bucket as attention_bucket
from ..kernels.cross_entropy import LossCall, linear_cross_entropy_reference
from ..kernels.cross_entropy import bucket as loss_bucket
from ..kernels.rms_norm import NormCall, rms_norm_reference
from ..kernels.rms_norm import bucket as norm_bucket
from .measure import _profiler_peak, _synchronizer
from .stats import bootstrap_ratio_ci, median

__all__ = [
    "BackendRow",
    "Shape",
    "default_shapes",
    "measure_backends",
    "model_shapes",
    "plot_backends",
    "render_backends",
    "winners",
]

# The name the kernels' table and preferences give the unfused computation.
ORIGINAL = kernel_backends.ORIGINAL


@dataclass(frozen=True)
class Shape:
    """One measured call: op, a readable label, and the sizes that build its inputs."""

    op: str
    label: str
    sizes: dict[str, int]


def default_shapes(batch: int = 2, seq: int = 512) -> list[Shape]:
    """A Llama-style width 768 at ``batch x seq`` tokens: the loss at vocab 32,000 and
    128,256, RMSNorm over 768, attention with 12 query / 4 key-value heads of 64."""
    tokens = batch * seq
    return [
        Shape(
            "linear_cross_entropy",
            f"{tokens}x768 -> 32000",
            {"tokens": tokens, "hidden": 768, "vocab": 32000},
        ),
        Shape(
            "linear_cross_entropy",
            f"{tokens}x768 -> 128256",
            {"tokens": tokens, "hidden": 768, "vocab": 128256},
        ),
        *_norm_shapes(batch, seq, 768),
        Shape(
            "attention",
            f"{batch}x12x{seq}x64, 4 kv heads",
            {"batch": batch, "heads": 12, "kv_heads": 4, "seq": seq, "head_dim": 64},
        ),
    ]


def _norm_shapes(batch: int, seq: int, hidden: int) -> list[Shape]:
    """RMSNorm over ``hidden``, alone and after the residual add (a decoder layer's norms)."""
    sizes = {"batch": batch, "seq": seq, "hidden": hidden}
    return [Shape(op, f"{batch}x{seq}x{hidden}", sizes) for op in ("rms_norm", "add_rms_norm")]


def model_shapes(config: Any, batch: int, seq: int) -> list[Shape]:
    """The shapes of a model with configuration ``config`` at ``batch x seq`` tokens (the ops
    its configuration has sizes for)."""
    hidden = getattr(config, "hidden_size", None)
    vocab = getattr(config, "vocab_size", None)
    heads = getattr(config, "num_attention_heads", None)
    shapes: list[Shape] = []
    if not isinstance(hidden, int):
        return shapes
    tokens = batch * seq
    if isinstance(vocab, int):
        shapes.append(
            Shape(
                "linear_cross_entropy",
                f"{tokens}x{hidden} -> {vocab}",
                {"tokens": tokens, "hidden": hidden, "vocab": vocab},
            )
        )
    shapes.extend(_norm_shapes(batch, seq, hidden))
    if isinstance(heads, int) and heads > 0:
        kv = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        shapes.append(
            Shape(
                "attention",
                f"{batch}x{heads}x{seq}x{head_dim}, {kv} kv heads",
                {"batch": batch, "heads": heads, "kv_heads": kv, "seq": seq, "head_dim": head_dim},
            )
        )
    return shapes


# --------------------------------------------------------------------------------------------
# Inputs and steps


@dataclass
class _Case:
    call: Any
    leaves: list[torch.Tensor]
    original: Callable[[], torch.Tensor]
    bucket: str


def _leaf(
    *shape: int, device: torch.device, dtype: torch.dtype, scale: float = 1.0
) -> torch.Tensor:
    return (torch.randn(*shape, device=device) * scale).to(dtype).requires_grad_()


def _case(shape: Shape, device: torch.device, dtype: torch.dtype) -> _Case:
    s = shape.sizes
    if shape.op == "linear_cross_entropy":
        hidden = _leaf(s["tokens"], s["hidden"], device=device, dtype=dtype)
        weight = _leaf(s["vocab"], s["hidden"], device=device, dtype=dtype, scale=0.02)
        targets = torch.randint(0, s["vocab"], (s["tokens"],), device=device)
        targets[:: max(s["tokens"] // 8, 1)] = -100  # a few ignored tokens, as padding gives
        call = LossCall(hidden, weight, None, targets, -100, "mean", None, None, None, None, None)
        return _Case(
            call,
            [hidden, weight],
            lambda: linear_cross_entropy_reference(hidden, weight, None, targets),
            loss_bucket(call),
        )
    if shape.op == "rms_norm":
        x = _leaf(s["batch"], s["seq"], s["hidden"], device=device, dtype=dtype)
        weight = _leaf(s["hidden"], device=device, dtype=dtype)
        call = NormCall(x, weight, 1e-6, 0.0, "before_weight", False)
        return _Case(
            call, [x, weight], lambda: rms_norm_reference(x, weight, 1e-6), norm_bucket(call)
        )
    if shape.op == "add_rms_norm":
        x, residual = (
            _leaf(s["batch"], s["seq"], s["hidden"], device=device, dtype=dtype) for _ in "xr"
        )
        weight = _leaf(s["hidden"], device=device, dtype=dtype)
        call = AddNormCall(x, residual, NormSpec(weight, 1e-6, "before_weight"))
        return _Case(
            call,
            [x, residual, weight],
            lambda: add_rms_norm_reference(
                x, residual, lambda summed: rms_norm_reference(summed, weight, 1e-6)
            ),
            add_norm_bucket(call),
        )
    if shape.op == "attention":
        b, h, kv, n, d = s["batch"], s["heads"], s["kv_heads"], s["seq"], s["head_dim"]
        q = _leaf(b, h, n, d, device=device, dtype=dtype)
        k = _leaf(b, kv, n, d, device=device, dtype=dtype)
        v = _leaf(b, kv, n, d, device=device, dtype=dtype)
        causal = torch.full((n, n), torch.finfo(dtype).min, device=device, dtype=dtype).triu(1)
        call = AttentionCall(q, k, v, causal[None, None], 0.0, d**-0.5, h // kv)
        return _Case(
            call, [q, k, v], lambda: attention_call_reference(call), attention_bucket(call)
        )
    raise ValueError(f"no benchmark inputs for op {shape.op!r}")


def _step(
    compute: Callable[[], Any], leaves: list[torch.Tensor], train: bool
) -> Callable[[], None]:
    def step() -> None:
        if not train:
            with torch.no_grad():
                compute()
            return
        for leaf in leaves:
            leaf.grad = None
        out = compute()
        outs = list(out) if isinstance(out, tuple) else [out]  # add_rms_norm: (normed, sum)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    return step


# --------------------------------------------------------------------------------------------
# Measuring


@dataclass
class BackendRow:
    op: str
    shape: str
    key: str  # the table key: device/dtype/mode/bucket
    mode: str
    backend: str
    median_s: float
    ratio: float  # reference median / this median (> 1: faster than the reference)
    ci: tuple[float, float]
    peak_bytes: int | None
    reference: str
    times: list[float] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "shape": self.shape,
            "key": self.key,
            "mode": self.mode,
            "backend": self.backend,
            "median_ms": self.median_s * 1e3,
            "speedup_vs_reference": self.ratio,
            "ci": list(self.ci),
            "peak_mib": None if self.peak_bytes is None else self.peak_bytes / 2**20,
            "reference": self.reference,
        }


def _candidates(
    shape: Shape, case: _Case, device: torch.device
) -> dict[str, Callable[[], torch.Tensor]]:
    found: dict[str, Callable[[], torch.Tensor]] = {}
    for backend in kernel_backends.backends(shape.op):
        if backend.runs_on(device.type) and backend.accepts(case.call):
            found[backend.name] = lambda backend=backend: backend.run(case.call)
    found[ORIGINAL] = case.original
    return found


def measure_backends(
    shapes: Sequence[Shape],
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    modes: Sequence[str] = ("train",),
    repeats: int = 7,
    warmup: int = 1,
    memory: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[BackendRow]:
    """Time every installed backend of each shape's op, interleaved (module docstring)."""
    dev = torch.device(device)
    sync = _synchronizer(dev)
    rows: list[BackendRow] = []
    for shape in shapes:
        torch.manual_seed(0)
        case = _case(shape, dev, dtype)
        candidates = _candidates(shape, case, dev)
        reference = "adopter" if "adopter" in candidates else ORIGINAL
        for mode in modes:
            key = kernel_backends.table_key(dev.type, dtype, mode, case.bucket)
            steps = {
                name: _step(fn, case.leaves, mode == "train") for name, fn in candidates.items()
            }
            names = list(steps)
            for name in names:  # warm-up
                for _ in range(warmup):
                    steps[name]()
            sync()
            times: dict[str, list[float]] = {name: [] for name in names}
            for round_index in range(repeats):
                shift = round_index % len(names)
                for name in names[shift:] + names[:shift]:
                    sync()
                    started = time.perf_counter()
                    steps[name]()
                    sync()
                    times[name].append(time.perf_counter() - started)
            peaks: dict[str, int | None] = {}
            for name in names:
                gc.collect()
                peaks[name] = _profiler_peak(steps[name], dev, sync) if memory else None
            for name in names:
                ratio = median(times[reference]) / median(times[name])
                low, high = (
                    (1.0, 1.0)
                    if name == reference
                    else bootstrap_ratio_ci(times[reference], times[name], paired=True)
                )
                rows.append(
                    BackendRow(
                        shape.op,
                        shape.label,
                        key,
                        mode,
                        name,
                        median(times[name]),
                        ratio,
                        (low, high),
                        peaks[name],
                        reference,
                        times[name],
                    )
                )
            if progress is not None:
                best = min(names, key=lambda n: median(times[n]))
                progress(f"{shape.op} {shape.label} {mode}: fastest {best}")
        del case, candidates
        gc.collect()
    return rows


def _default(op_name: str, key: str, measured: set[str], reference: str) -> str:
    """The op's safe default for the device and mode of ``key`` among the measured
    candidates."""
    o = kernel_backends.op(op_name)
    device, _dtype, mode, _bucket = key.split("/", 3)
    for name in o.default_order(device, mode):
        if name in measured:
            return name
    return reference


def _costs_no_memory(row: BackendRow, default_peak: int | None) -> bool:
    if row.peak_bytes is None or default_peak is None:
        return True
    return row.peak_bytes <= 1.1 * default_peak


def winners(rows: Sequence[BackendRow]) -> dict[str, dict[str, str]]:
    """Per op and table key (so per mode), the backend to prefer: the fastest candidate whose
    interval against the reference lies wholly above 1 and whose peak memory is at most 10% above
    the safe default's (a measured win that costs no memory), else the safe default (which the
    kernels also choose without a table). ``original`` may win (the op then runs the original
    computation for that bucket)."""
    chosen: dict[str, dict[str, str]] = {}
    groups: dict[tuple[str, str], list[BackendRow]] = {}
    for row in rows:
        groups.setdefault((row.op, row.key), []).append(row)
    for (op_name, key), group in groups.items():
        reference = group[0].reference
        default = _default(op_name, key, {r.backend for r in group}, reference)
        default_peak = next(r.peak_bytes for r in group if r.backend == default)

        clear = [
            r
            for r in group
            if r.backend != reference and r.ci[0] > 1.0 and _costs_no_memory(r, default_peak)
        ]
        if default != reference:  # beating the reference is not enough: beat the default
            default_row = next(r for r in group if r.backend == default)
            clear = [r for r in clear if r.median_s < default_row.median_s]
        best = min(clear, key=lambda r: r.median_s).backend if clear else default
        chosen.setdefault(op_name, {})[key] = best
    return chosen


def record(rows: Sequence[BackendRow], path: Path | None = None) -> Path:
    """Write the winners of ``rows`` into this machine's table (merged with what it holds)."""
    target = path or kernel_backends.table_path()
    merged = {o: dict(per) for o, per in kernel_backends.current_table().items()}
    for op_name, per in winners(rows).items():
        merged.setdefault(op_name, {}).update(per)
    kernel_backends.write_table(merged, [row.to_json() for row in rows], target)
    return target


# --------------------------------------------------------------------------------------------
# Showing


def render_backends(rows: Sequence[BackendRow], chosen: dict[str, dict[str, str]]) -> Any:
    from rich.table import Table

    table = Table(title="kernel backends on this machine")
    for column in (
        "op",
        "shape",
        "mode",
        "backend",
        "median ms",
        "speedup vs ref [95% CI]",
        "peak MiB",
        "chosen",
    ):
        table.add_column(column, justify="right" if column in ("median ms", "peak MiB") else "left")
    for row in rows:
        picked = chosen.get(row.op, {}).get(row.key) == row.backend
        ratio = (
            "reference"
            if row.backend == row.reference
            else f"{row.ratio:.2f}x [{row.ci[0]:.2f}, {row.ci[1]:.2f}]"
        )
        peak = "" if row.peak_bytes is None else f"{row.peak_bytes / 2**20:.1f}"
        table.add_row(
            row.op,
            row.shape,
            row.mode,
            row.backend,
            f"{row.median_s * 1e3:.1f}",
            ratio,
            peak,
            "yes" if picked else "",
        )
    return table


def plot_backends(rows: Sequence[BackendRow], path: Path) -> Path:
    """A PNG: per op and shape, each backend's speedup against the reference (interval bars)
    and its peak memory."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups: dict[tuple[str, str, str], list[BackendRow]] = {}
    for row in rows:
        groups.setdefault((row.op, row.shape, row.mode), []).append(row)
    fig = Figure(figsize=(max(6.0, 2.2 * len(groups)), 7.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax_speed, ax_mem = fig.subplots(2, 1)
    labels: list[str] = []
    x = 0
    for (op_name, shape, mode), group in groups.items():
        for row in group:
            ax_speed.bar(
                x, row.ratio, yerr=[[row.ratio - row.ci[0]], [row.ci[1] - row.ratio]], capsize=3
            )
            ax_mem.bar(x, (row.peak_bytes or 0) / 2**20)
            labels.append(f"{op_name}\n{shape}\n{mode}: {row.backend}")
            x += 1
        x += 1
        labels.append("")
    ticks = list(range(len(labels)))
    for axis in (ax_speed, ax_mem):
        axis.set_xticks(ticks, labels, rotation=90, fontsize=7)
    ax_speed.axhline(1.0, color="black", linewidth=0.8)
    ax_speed.set_ylabel("speedup vs reference")
    ax_mem.set_ylabel("step peak MiB")
    fig.savefig(path, dpi=120)
    return path


def shapes_for_target(target: str | None, batch: int, seq: int) -> list[Shape]:
    """The shapes of a transformers model (its default configuration's sizes; the model is
    not built) at ``batch x seq`` tokens, or :func:`default_shapes` without a target."""
    if target is None:
        return default_shapes()
    from .command import (
        BenchTargetError,
        _import_quietly,
        base_model_class,
        resolve_transformers_target,
    )

    resolved = resolve_transformers_target(target)
    module = _import_quietly(resolved.module_name)
    config = base_model_class(module, None).config_class()
    found = model_shapes(getattr(config, "text_config", None) or config, batch, seq)
    if not found:
        raise BenchTargetError(f"{target}: its configuration names no hidden size")
    return found


def run_backend_bench(
    target: str | None,
    *,
    batch: int,
    seq: int,
    device: str,
    dtype: str,
    modes: Sequence[str],
    repeats: int,
    warmup: int,
    memory: bool,
    table: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[BackendRow], dict[str, dict[str, str]], Path]:
    """Measure, record the winners in this machine's table; ``(rows, winners, table path)``."""
    shapes = shapes_for_target(target, batch, seq)
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    rows = measure_backends(
        shapes,
        device=device,
        dtype=torch_dtype,
        modes=modes,
        repeats=repeats,
        warmup=warmup,
        memory=memory,
        progress=progress,
    )
    path = record(rows, table)
    return rows, winners(rows), path
