"""Measure original vs. patched models: step time, throughput and peak memory.

The API knows nothing about transformers or the rewriter: a :class:`ModelVariant` is a name and
a factory returning ``(model, inputs)``. :func:`benchmark_variants` builds every variant once,
gives all of them the baseline's weights and inputs, and times them *interleaved* so that
drifting machine load (other processes, thermal or frequency changes) hits every variant alike.

What one step is
    ``inference``: ``model.eval()`` and one forward under ``torch.no_grad()``. (``no_grad``
    rather than ``inference_mode``: kernels may cache derived weights created during inference
    steps, and inference tensors would then be unusable in the later training steps.)

    ``train``: ``model.train()``, ``optimizer.zero_grad(set_to_none=True)``, forward, a loss,
    ``backward()`` and ``optimizer.step()``. The loss is the model's own ``.loss`` when it
    returns one, else the mean square of its first floating output (``last_hidden_state``,
    ``logits``, first tuple element...), computed in float32; the square keeps the gradient
    dependent on the output (a plain sum would send a constant gradient of ones back). The
    optimizer is AdamW (or SGD) with a tiny learning rate. Each variant has its own optimizer
    and its weights drift apart over the run; that is harmless for timing (the arithmetic does
    not depend on the values) and it is why the weights are only shared at build time.

How time is measured
    ``warmup`` untimed steps per variant and mode (at least one under ``compile=True``: the
    first call compiles), then ``repeats`` rounds; in each round every variant takes one sample
    in a freshly shuffled order. A sample is ``number`` consecutive steps timed with
    ``time.perf_counter`` (device synchronised before and after on accelerators), divided by
    ``number``. The garbage collector is paused while timing. Per variant the median, quartiles,
    min and max are reported, and the speedup ``median(baseline) / median(variant)`` with a
    seeded paired-bootstrap confidence interval (rounds resampled together, see
    :func:`adopter.bench.stats.bootstrap_ratio_ci`).

How memory is measured (optional, after the timing)
    Every method reports the peak of one step *above the level just before that step*, after a
    warm-up step and ``zero_grad(set_to_none=True)``. Weights, optimizer state and inputs are
    therefore excluded; activations kept for backward, gradients, temporaries and kernel
    workspaces are included - the part a rewrite changes.

    ``cuda_allocator`` (default on CUDA): ``torch.cuda.max_memory_allocated`` after
    ``reset_peak_memory_stats``, minus ``memory_allocated`` before the step. Exact bytes of
    tensors, in-process.

    ``rss_subprocess`` (default on CPU): each variant runs in a fresh interpreter
    (``python -m adopter.bench.memory_probe``) that builds it, takes a warm-up step, resets the
    kernel's resident-set high-water mark (``/proc/self/clear_refs``, Linux), and reads it
    (``VmHWM``) after one more step, minus the RSS just before that step. (The peak RSS
    ``getrusage`` reports is unusable in a child: Linux carries it over from the forked parent
    across ``exec``, and it cannot be reset.) The
    CPU allocator has no peak counter, and RSS in the benchmark process itself would be
    polluted by the other variants and by memory that ``malloc`` keeps cached after earlier
    steps; a fresh process per variant gives every variant the same clean start, and the probe
    sets ``MALLOC_MMAP_THRESHOLD_`` so that tensor-sized blocks are returned to the OS on free
    and RSS follows live memory. RSS counts *all* memory the step touches (oneDNN scratch
    space, compiled-code buffers, allocator overhead), which is what an out-of-memory kill
    sees; granularity is one page, and ratios are withheld when the baseline's step peak is
    under :data:`RSS_RESOLUTION` (4 MiB). It costs an interpreter start (~2-5 s) per variant.

    ``profiler``: ``torch.profiler`` with ``profile_memory=True`` records every allocation and
    free of the device's allocator during one step; the peak of their running sum is the
    step's peak of live tensor bytes. Exact and cheap (in-process), but it counts tensors only
    and relies on the profiler's event tree, which is not a stable public API.

Failures
    A variant whose step (or ``torch.compile``) raises is reported in its ``ModeResult.error``
    instead of aborting the benchmark. A variant whose ``state_dict`` does not match the
    baseline's raises :class:`CheckpointMismatchError`: comparing different weights would make
    the numbers meaningless.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import pickle
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..kernels.backends import cpu_model
from .results import BenchResult, MemoryStats, ModeResult, Speedup, TimingStats
from .stats import bootstrap_ratio_ci

__all__ = [
    "MEMORY_METHODS",
    "MODES",
    "OPTIMIZERS",
    "CheckpointMismatchError",
    "Factory",
    "ModelVariant",
    "TrainOnly",
    "VariantBuildError",
    "benchmark_variants",
    "check_compatible",
    "check_optimizer",
    "check_rounds",
    "derive_loss",
    "environment_info",
    "make_optimizer",
    "make_step",
    "measure_step_memory",
    "prepare_variant",
    "resolve_factory",
    "run_memory_probe",
]

MODES = ("inference", "train")
MEMORY_METHODS = ("cuda_allocator", "rss_subprocess", "profiler")
OPTIMIZERS = ("adamw", "adamw-fused", "sgd")
"""The training step's optimizers (:func:`make_optimizer`; ``adamw_fused`` is also accepted)."""
RSS_RESOLUTION = 4 << 20
"""Smallest baseline step peak (bytes) for which RSS-based memory ratios are reported.

RSS moves in pages and with allocator and interpreter noise of up to a few MiB (a small
UNet2DConditionModel's inference step measured 1.3 MiB for the original and 0 B for the patch);
below this a ratio ("-100%") would be noise presented as a result.
"""
_MEMORY_ALIASES = {"cuda": "cuda_allocator", "rss": "rss_subprocess", "profile": "profiler"}

Factory = Callable[[], tuple[nn.Module, Any]]
"""A no-argument callable returning ``(model, inputs)``.

``inputs`` is a tuple of positional arguments (a single tensor is accepted too) or a dict of
keyword arguments for ``model(...)``; a keyword value wrapped in :class:`TrainOnly` (a language
model's ``labels``) is passed to training steps only. For the CPU memory probe the factory
must be picklable: a module-level function, a ``functools.partial`` of one with picklable
arguments, or a ``"package.module:function"`` string.
"""

Args = tuple[Any, ...]
Kwargs = dict[str, Any]
Step = Callable[[], None]


@dataclass(frozen=True)
class TrainOnly:
    """A keyword input that only training steps take, such as a language model's ``labels``.

    A training step with labels is what a training loop runs (and the only step in which a
    kernel that takes over the loss runs at all); an inference step computes no loss, so it gets
    the same inputs without this one.
    """

    value: Any


def _for_mode(kwargs: Kwargs, mode: str) -> Kwargs:
    """``kwargs`` as a step in ``mode`` passes them: :class:`TrainOnly` values unwrapped in
    training, left out otherwise."""
    if mode == "train":
        return {k: v.value if isinstance(v, TrainOnly) else v for k, v in kwargs.items()}
    return {k: v for k, v in kwargs.items() if not isinstance(v, TrainOnly)}


class CheckpointMismatchError(ValueError):
    """A variant's ``state_dict`` keys or shapes differ from the baseline's."""


class VariantBuildError(RuntimeError):
    """A variant's factory raised or returned something other than ``(nn.Module, inputs)``."""


@dataclass(frozen=True)
class ModelVariant:
    """One model to benchmark: a display name and how to build it with its inputs."""

    name: str
    factory: Factory | str
    # Under ``torch.compile`` or not, whatever the run's ``compile`` says (``None``: as the run
    # says). ``bench --compile`` times eager and compiled variants of one model in one run.
    compiled: bool | None = None

    def build(self) -> tuple[nn.Module, Any]:
        """Call the factory and check the shape of what it returns."""
        factory = resolve_factory(self.factory) if isinstance(self.factory, str) else self.factory
        try:
            built = factory()
        except Exception as exc:
            raise VariantBuildError(f"variant {self.name!r}: factory raised {exc!r}") from exc
        if not isinstance(built, tuple) or len(built) != 2 or not isinstance(built[0], nn.Module):
            raise VariantBuildError(
                f"variant {self.name!r}: factory must return (nn.Module, inputs), "
                f"got {type(built).__name__}"
            )
        return built


def resolve_factory(spec: str) -> Factory:
    """Import ``"package.module:function"`` or ``"path/to/file.py:function"`` (the syntax of
    :func:`adopter.models.factories.parse_factory`; the function may be a dotted path)."""
    from ..models.factories import load_factory, parse_factory

    ref = parse_factory(spec)
    alias = f"_adopter_factory_{Path(ref.path).stem}" if ref.path else ""
    obj, _ = load_factory(ref, alias)
    if not callable(obj):
        raise TypeError(f"{spec!r} is not callable")
    return obj


# ----------------------------------------------------------------------------------------------
# inputs, loss, steps


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return value


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _split_inputs(inputs: Any) -> tuple[Args, Kwargs]:
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    raise TypeError(
        f"inputs must be a tensor, a tuple of positional arguments or a dict of keyword "
        f"arguments, got {type(inputs).__name__}"
    )


def _move(obj: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """Move tensors to ``device``, floating ones also to ``dtype`` (ids and masks keep theirs)."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            return obj.to(device=device, dtype=dtype)
        return obj.to(device=device)
    if isinstance(obj, TrainOnly):
        return TrainOnly(_move(obj.value, device, dtype))
    if isinstance(obj, Mapping):
        return {k: _move(v, device, dtype) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(_move(v, device, dtype) for v in obj)
    return obj


def _tensors(args: Args, kwargs: Kwargs) -> Iterable[tuple[str, torch.Tensor]]:
    for i, value in enumerate(args):
        if isinstance(value, torch.Tensor):
            yield f"args[{i}]", value
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            yield key, value


def _batch_size(args: Args, kwargs: Kwargs) -> int:
    """The leading dimension of the first input tensor (1 when there is none)."""
    for _, tensor in _tensors(args, kwargs):
        if tensor.dim() >= 1:
            return int(tensor.shape[0])
    return 1


def _first_float_tensor(output: Any, depth: int = 0) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    if depth > 4 or output is None:
        return None
    for attr in ("last_hidden_state", "logits"):
        value = getattr(output, attr, None)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    if isinstance(output, Mapping):
        items: Iterable[Any] = output.values()
    elif isinstance(output, (tuple, list)):
        items = output
    else:
        return None
    for item in items:
        found = _first_float_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def derive_loss(output: Any) -> torch.Tensor:
    """A scalar to call ``backward()`` on, from whatever the model returned.

    The model's own ``loss`` (attribute or mapping key) is used when it is a tensor; otherwise
    the float32 mean square of the first floating tensor found in the output.
    """
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.is_floating_point():
        return loss if loss.dim() == 0 else loss.mean()
    tensor = _first_float_tensor(output)
    if tensor is None:
        raise TypeError(
            f"cannot derive a loss: the model returned {type(output).__name__} without a "
            "floating-point tensor"
        )
    return tensor.float().pow(2).mean()


def make_optimizer(
    model: nn.Module, name: str = "adamw", lr: float = 1e-6
) -> torch.optim.Optimizer:
    """The optimizer of the training step; a tiny ``lr`` keeps weights (and timings) stable."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    key = name.lower()
    if key == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if key in ("adamw-fused", "adamw_fused"):
        # One fused kernel over all parameters: on CPU the per-tensor AdamW loop otherwise
        # takes a third of a small transformer's training step, diluting what a rewrite changes.
        return torch.optim.AdamW(params, lr=lr, fused=True)
    if key == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r} (use 'adamw', 'adamw-fused' or 'sgd')")


def make_step(
    runner: Callable[..., Any],
    args: Args,
    kwargs: Kwargs,
    mode: str,
    optimizer: torch.optim.Optimizer | None = None,
) -> Step:
    """One benchmark step of ``runner`` (the model or its compiled wrapper) in ``mode``.

    The caller sets ``model.train()`` / ``model.eval()``; the step only runs the computation.
    """
    kwargs = _for_mode(kwargs, mode)
    if mode == "inference":

        def inference_step() -> None:
            with torch.no_grad():
                runner(*args, **kwargs)

        return inference_step
    if mode == "train":
        if optimizer is None:
            raise ValueError("a training step needs an optimizer")

        def train_step() -> None:
            optimizer.zero_grad(set_to_none=True)
            loss = derive_loss(runner(*args, **kwargs))
            loss.backward()
            optimizer.step()

        return train_step
    raise ValueError(f"unknown mode {mode!r} (use one of {MODES})")


def prepare_variant(
    variant: ModelVariant, device: torch.device, dtype: torch.dtype, seed: int
) -> tuple[nn.Module, Args, Kwargs]:
    """Build ``variant`` under ``torch.manual_seed(seed)`` and move model and inputs."""
    torch.manual_seed(seed)
    model, inputs = variant.build()
    if dtype.is_floating_point:
        model = model.to(device=device, dtype=dtype)
    else:
        model = model.to(device=device)
    args, kwargs = _split_inputs(inputs)
    return model, _move(args, device, dtype), _move(kwargs, device, dtype)


def check_compatible(
    reference: Mapping[str, torch.Tensor], model: nn.Module, *, variant: str, baseline: str
) -> None:
    """Raise :class:`CheckpointMismatchError` unless ``model`` can load ``reference`` strictly."""
    own = model.state_dict()
    only_base = sorted(set(reference) - set(own))
    only_variant = sorted(set(own) - set(reference))
    shapes = [
        f"{key}: {tuple(reference[key].shape)} vs {tuple(own[key].shape)}"
        for key in reference
        if key in own and reference[key].shape != own[key].shape
    ]
    problems = []
    for label, items in (
        ("only in the baseline", only_base),
        ("only in the variant", only_variant),
        ("with different shapes", shapes),
    ):
        if items:
            shown = ", ".join(items[:5]) + (
                f", ... ({len(items) - 5} more)" if len(items) > 5 else ""
            )
            problems.append(f"{len(items)} key(s) {label}: {shown}")
    if problems:
        raise CheckpointMismatchError(
            f"variant {variant!r} is not checkpoint-compatible with baseline {baseline!r}: "
            + "; ".join(problems)
            + ". A rewrite must keep parameter and buffer names and shapes so that the same "
            "weights load into both models."
        )


def _input_signature(args: Args, kwargs: Kwargs) -> list[tuple[str, str]]:
    def describe(value: Any) -> str:
        if isinstance(value, TrainOnly):
            return f"train only: {describe(value.value)}"
        if isinstance(value, torch.Tensor):
            return f"tensor{tuple(value.shape)} {_dtype_name(value.dtype)}"
        if value is None or isinstance(value, (bool, int, float, str)):
            return f"{type(value).__name__} {value!r:.60}"
        return type(value).__name__  # objects: their repr may carry an address

    return [(f"args[{i}]", describe(v)) for i, v in enumerate(args)] + [
        (key, describe(v)) for key, v in kwargs.items()
    ]


def _check_same_inputs(
    reference: tuple[Args, Kwargs], own: tuple[Args, Kwargs], variant: str, baseline: str
) -> None:
    """Refuse variants whose factory builds differently shaped inputs than the baseline's.

    Timing feeds every variant the baseline's inputs, but the memory probe rebuilds each
    variant from its own factory; a mismatch would silently compare different workloads.
    """
    ref_sig, own_sig = _input_signature(*reference), _input_signature(*own)
    if ref_sig != own_sig:
        raise ValueError(
            f"variant {variant!r} builds different inputs than baseline {baseline!r}: "
            f"{own_sig} vs {ref_sig}; every variant's factory must build the same inputs"
        )


def _load_weights(
    reference: Mapping[str, torch.Tensor], model: nn.Module, *, variant: str, baseline: str
) -> None:
    check_compatible(reference, model, variant=variant, baseline=baseline)
    try:
        model.load_state_dict(reference, strict=True)
    except RuntimeError as exc:
        raise CheckpointMismatchError(
            f"variant {variant!r} cannot load the weights of baseline {baseline!r}: {exc}"
        ) from exc


# ----------------------------------------------------------------------------------------------
# devices, errors, environment


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cpu":
        return lambda: None
    backend = getattr(torch, device.type, None)
    sync = getattr(backend, "synchronize", None)
    if sync is None:
        return lambda: None
    return lambda: sync(device)


def _describe_error(exc: BaseException, compiling: bool) -> str:
    module = type(exc).__module__ or ""
    from_compiler = module.startswith(("torch._dynamo", "torch._inductor"))
    prefix = "torch.compile failed" if compiling and from_compiler else "step failed"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if first.endswith(":") and len(lines) > 1:  # "backend='x' raised:\nRuntimeError: why"
        first = f"{first} {lines[1]}"
    text = f"{prefix}: {type(exc).__name__}: {first}".rstrip(": ")
    return text if len(text) <= 500 else text[:497] + "..."


def environment_info(device: str | torch.device = "cpu") -> dict[str, Any]:
    """Where a benchmark ran: versions, CPU, threads, device and kernel backends."""
    dev = torch.device(device)
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": str(dev),
        "gpu": None,
        "cuda": torch.version.cuda,
    }
    if dev.type == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(dev)
    try:
        from adopter.kernels import describe_backends

        info["kernels"] = describe_backends(dev)
    except Exception as exc:  # reporting must not fail because of a kernel backend probe
        info["kernels"] = {"error": repr(exc)}
    return info


# ----------------------------------------------------------------------------------------------
# memory


def speedup_of(
    base: TimingStats,
    own: TimingStats,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Speedup:
    """Median speedup of ``own`` over ``base`` with its bootstrap interval: paired (rounds
    resampled together) when both have one sample per round, independent otherwise."""
    paired = len(base.times_s) == len(own.times_s)
    low, high = bootstrap_ratio_ci(
        base.times_s,
        own.times_s,
        paired=paired,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )
    return Speedup(
        ratio=base.median_s / own.median_s,
        ci_low=low,
        ci_high=high,
        confidence=confidence,
        method="paired" if paired else "independent",
    )


def _resolve_memory_method(memory: str | None, device: torch.device) -> str | None:
    if memory is None:
        return None
    key = memory.lower()
    if key == "auto":
        return "cuda_allocator" if device.type == "cuda" else "rss_subprocess"
    key = _MEMORY_ALIASES.get(key, key)
    if key not in MEMORY_METHODS:
        raise ValueError(
            f"unknown memory method {memory!r} (use auto, {', '.join(MEMORY_METHODS)})"
        )
    if key == "cuda_allocator" and device.type != "cuda":
        raise ValueError("the cuda_allocator memory method needs a CUDA device")
    return key


def _profiler_peak(step: Step, device: torch.device, sync: Callable[[], None]) -> int:
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, profile_memory=True) as prof:
        step()
        sync()
    allocations = []
    pending = list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        node = pending.pop()
        pending.extend(node.children)
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            if fields.device.type == device.type:
                allocations.append((node.start_time_ns, int(fields.alloc_size)))
    allocations.sort(key=lambda item: item[0])
    live = peak = 0
    for _, size in allocations:
        live += size
        peak = max(peak, live)
    return peak


def measure_step_memory(
    step: Step,
    method: str,
    device: torch.device,
    optimizer: torch.optim.Optimizer | None = None,
) -> MemoryStats:
    """Peak memory of one call of ``step`` above the level before it, in this process.

    For ``cuda_allocator`` and ``profiler``; the ``rss_subprocess`` method runs in
    :mod:`adopter.bench.memory_probe`. Call after at least one warm-up step.
    """
    sync = _synchronizer(device)
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    gc.collect()
    sync()
    if method == "cuda_allocator":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        sync()
        peak = torch.cuda.max_memory_allocated(device)
        return MemoryStats(method, max(0, peak - before), peak)
    if method == "profiler":
        return MemoryStats(method, _profiler_peak(step, device, sync), None)
    raise ValueError(f"method {method!r} is not measured in-process")


def run_memory_probe(
    variant: ModelVariant,
    *,
    modes: Sequence[str] = ("train",),
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    compile: bool = False,
    compile_backend: str | Callable[..., Any] = "inductor",
    compile_mode: str | None = None,
    threads: int | None = None,
    optimizer: str = "adamw",
    lr: float = 1e-6,
    warmup: int = 1,
    seed: int = 0,
    timeout: float = 600.0,
) -> dict[str, MemoryStats | str]:
    """Measure ``variant``'s step peak RSS in a fresh ``python -m adopter.bench.memory_probe``.

    Returns, per mode, :class:`MemoryStats` (method ``rss_subprocess``) or an error string.
    The variant's factory is pickled to the child, which rebuilds model and inputs itself under
    ``torch.manual_seed(seed)``; the child inherits this process's ``sys.path``.
    """
    spec = {
        "factory": variant.factory,
        "name": variant.name,
        "modes": list(modes),
        "device": str(torch.device(device)),
        "dtype": _dtype_name(_as_dtype(dtype)),
        "compile": compile,
        "compile_backend": compile_backend,
        "compile_mode": compile_mode,
        "threads": threads if threads is not None else torch.get_num_threads(),
        "optimizer": optimizer,
        "lr": lr,
        "warmup": max(warmup, 1),
        "seed": seed,
    }
    try:
        payload = pickle.dumps(spec)
    except Exception as exc:
        message = (
            f"factory of {variant.name!r} cannot be sent to the memory probe ({exc!r}); use a "
            "module-level function, a functools.partial of one, or a 'module:function' string"
        )
        return dict.fromkeys(modes, message)

    env = dict(os.environ)
    # Fixed threshold: blocks above 64 KiB are mmap-ed and unmapped on free, so RSS follows
    # live memory instead of malloc's cache (glibc; ignored elsewhere).
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    paths = [p or os.getcwd() for p in sys.path]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)

    with tempfile.TemporaryDirectory(prefix="adopter-memprobe-") as tmp:
        spec_path = Path(tmp) / "spec.pkl"
        out_path = Path(tmp) / "result.json"
        spec_path.write_bytes(payload)
        command = [
            sys.executable,
            "-m",
            "adopter.bench.memory_probe",
            "--spec",
            str(spec_path),
            "--out",
            str(out_path),
        ]
        try:
            proc = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return dict.fromkeys(modes, f"memory probe timed out after {timeout:g} s")
        if not out_path.exists():
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
            return dict.fromkeys(
                modes, f"memory probe exited with {proc.returncode}: {' | '.join(tail)}"
            )
        report = json.loads(out_path.read_text(encoding="utf-8"))

    results: dict[str, MemoryStats | str] = {}
    for mode in modes:
        entry = report.get("modes", {}).get(mode)
        if entry is None:
            results[mode] = report.get("error") or "memory probe returned nothing"
        elif entry.get("error"):
            results[mode] = str(entry["error"])
        else:
            results[mode] = MemoryStats(
                "rss_subprocess", int(entry["peak_bytes"]), int(entry["absolute_bytes"])
            )
    return results


# ----------------------------------------------------------------------------------------------
# the benchmark


@dataclass
class _Prepared:
    variant: ModelVariant
    model: nn.Module
    runner: Callable[..., Any]
    optimizer: torch.optim.Optimizer | None
    steps: dict[str, Step]


@dataclass(frozen=True)
class _Run:
    """The options of one :func:`benchmark_variants` call that its steps share."""

    names: list[str]
    """Variant names in the order given (results and reports keep this order)."""
    modes: tuple[str, ...]
    device: torch.device
    dtype: torch.dtype
    compile: bool
    compile_backend: str | Callable[..., Any]
    compile_mode: str | None
    optimizer: str
    lr: float
    seed: int
    say: Callable[[str], None]


def _compile_limits(graphs: int) -> contextlib.AbstractContextManager[Any]:
    """Raise dynamo's recompile limit for the run.

    Variants of one model share classes and code objects, and every (variant, mode) pair may
    need its own graph; past the default limit of 8 dynamo silently falls back to eager, which
    would make "compiled" numbers eager ones.
    """
    config = torch._dynamo.config
    wanted = max(getattr(config, "recompile_limit", 8), 4 * graphs + 8)
    return config.patch(recompile_limit=wanted)


def _backend_name(backend: str | Callable[..., Any]) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))


def _compile(
    model: nn.Module, backend: str | Callable[..., Any], mode: str | None
) -> Callable[..., Any]:
    kwargs: dict[str, Any] = {"backend": backend}
    if mode is not None:
        kwargs["mode"] = mode
    return torch.compile(model, **kwargs)


def benchmark_variants(
    variants: Sequence[ModelVariant],
    *,
    baseline: str,
    modes: Sequence[str] = MODES,
    warmup: int = 3,
    repeats: int = 20,
    number: int = 1,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    compile: bool = False,
    compile_backend: str | Callable[..., Any] = "inductor",
    compile_mode: str | None = None,
    threads: int | None = None,
    memory: str | None = None,
    optimizer: str = "adamw",
    lr: float = 1e-6,
    batch_size: int | None = None,
    seed: int = 0,
    confidence: float = 0.95,
    resamples: int = 2000,
    probe_timeout: float = 600.0,
    probe_jobs: int = 1,
    progress: Callable[[str], None] | None = None,
) -> BenchResult:
    """Time (and optionally measure the memory of) every variant against ``baseline``.

    Args:
        variants: the models; names must be unique and include ``baseline``. Per-rule
            ablation is simply more variants (e.g. one per rule, named by rule id).
        baseline: the name of the reference variant (the original model).
        modes: any of ``"inference"`` and ``"train"``, measured in this order.
        warmup: untimed steps per variant and mode before timing (compilation happens here).
        repeats: timed rounds; each variant takes one sample per round, in shuffled order.
        number: steps per sample (raise it for models whose step takes microseconds).
        device, dtype: where and in which floating dtype models and float inputs live.
        compile: wrap every variant in ``torch.compile(backend=compile_backend,
            mode=compile_mode)``; failures are reported per variant and mode.
        threads: ``torch.set_num_threads`` for the run (restored afterwards).
        memory: ``None`` (skip), ``"auto"`` (CUDA allocator on CUDA, fresh-subprocess RSS on
            CPU), ``"cuda_allocator"``, ``"rss_subprocess"`` or ``"profiler"``.
        optimizer, lr: the training step's optimizer (``adamw``, ``adamw-fused`` or ``sgd``).
        batch_size: samples per step for throughput; default: leading dim of the first input.
        seed: seeds model/input construction, the round order and the bootstrap.
        confidence, resamples: the bootstrap interval of the speedup.
        probe_timeout: seconds allowed per memory-probe subprocess.
        probe_jobs: memory-probe subprocesses run at once (they run after the timing, so
            they cannot disturb it; keep 1 when several copies of the model may not fit).
        progress: called with short status messages (for a CLI progress display).

    Raises:
        CheckpointMismatchError: a variant cannot load the baseline's ``state_dict`` strictly.
        ValueError: bad arguments, or a variant's factory builds inputs of other shapes or
            dtypes than the baseline's (timing uses the baseline's inputs for all variants;
            the memory probe rebuilds each variant's own).
        VariantBuildError: a factory failed.
    """
    names = [v.name for v in variants]
    modes = _check_arguments(names, baseline, modes, warmup=warmup, repeats=repeats, number=number)
    dev = torch.device(device)
    dt = _as_dtype(dtype)
    method = _resolve_memory_method(memory, dev)
    run = _Run(
        names=names,
        modes=modes,
        device=dev,
        dtype=dt,
        compile=compile,
        compile_backend=compile_backend,
        compile_mode=compile_mode,
        optimizer=optimizer,
        lr=lr,
        seed=seed,
        say=progress or (lambda _message: None),
    )

    compiling = any(_compiled(variant, compile) for variant in variants)
    with _run_settings(threads, compile=compiling, graphs=len(variants) * len(modes)):
        prepared, args, kwargs = _build_variants(variants, baseline, run)
        errors = _make_steps(prepared, run, args, kwargs)
        samples_per_step = batch_size if batch_size is not None else _batch_size(args, kwargs)
        warmup_steps = max(warmup, 1) if compiling else warmup  # the first call compiles
        times = _time_interleaved(
            prepared, run, errors, warmup=warmup_steps, repeats=repeats, number=number
        )
        memories: dict[str, dict[str, MemoryStats | str]] = {name: {} for name in names}
        if method is not None:
            memories = _measure_memory(
                prepared, run, errors, method=method, timeout=probe_timeout, jobs=probe_jobs
            )
        environment = environment_info(dev)  # inside: it records the thread count of the run

    variants_out = _summarise(
        names,
        modes,
        baseline,
        times,
        errors,
        memories,
        samples_per_step,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )
    settings = {
        "warmup": warmup,
        "repeats": repeats,
        "number": number,
        "device": str(dev),
        "dtype": _dtype_name(dt),
        "compile": compile,
        "compile_backend": _backend_name(compile_backend) if compiling else None,
        "compile_mode": compile_mode if compiling else None,
        "compiled_variants": [v.name for v in variants if _compiled(v, compile)],
        "threads": threads,
        "memory": method,
        "optimizer": optimizer,
        "lr": lr,
        "batch_size": samples_per_step,
        "input_shapes": {key: list(t.shape) for key, t in _tensors(args, kwargs)},
        "seed": seed,
        "confidence": confidence,
        "resamples": resamples,
        "inference_context": "torch.no_grad",
        "loss": "model .loss if returned, else float32 mean square of the first float output",
    }
    return BenchResult(
        baseline=baseline,
        modes=modes,
        variants=variants_out,
        settings=settings,
        environment=environment,
    )


def _check_arguments(
    names: list[str],
    baseline: str,
    modes: Sequence[str],
    *,
    warmup: int,
    repeats: int,
    number: int,
) -> tuple[str, ...]:
    """Reject what cannot be benchmarked; return the modes as a tuple."""
    if len(set(names)) != len(names):
        raise ValueError(f"variant names must be unique, got {names}")
    if baseline not in names:
        raise ValueError(f"baseline {baseline!r} is not among the variants {names}")
    return check_rounds(modes, warmup=warmup, repeats=repeats, number=number)


def check_rounds(
    modes: Sequence[str], *, warmup: int, repeats: int, number: int = 1
) -> tuple[str, ...]:
    """The modes as a tuple, after rejecting an unknown mode or round counts that cannot be
    run (shared by :func:`benchmark_variants` and :class:`~adopter.bench.options.BenchOptions`)."""
    modes = tuple(modes)
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (use {MODES})")
    if repeats < 1 or warmup < 0 or number < 1:
        raise ValueError("need repeats >= 1, warmup >= 0 and number >= 1")
    return modes


def check_optimizer(name: str) -> None:
    """Reject an optimizer :func:`make_optimizer` does not know, before anything is built."""
    if name.lower() not in (*OPTIMIZERS, "adamw_fused"):
        raise ValueError(f"unknown optimizer {name!r} (use {', '.join(map(repr, OPTIMIZERS))})")


@contextlib.contextmanager
def _run_settings(threads: int | None, *, compile: bool, graphs: int) -> Iterator[None]:
    """``threads`` torch threads and, when compiling, room for ``graphs`` graphs (see
    :func:`_compile_limits`) for the duration of a run; the previous values come back after."""
    with contextlib.ExitStack() as restore:
        if threads is not None:
            restore.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(threads)
        if compile:
            restore.enter_context(_compile_limits(graphs))
        yield


def _build_variants(
    variants: Sequence[ModelVariant], baseline: str, run: _Run
) -> tuple[dict[str, _Prepared], Args, Kwargs]:
    """Build every variant, the baseline first, and give all of them the baseline's weights.

    Returns the prepared variants and the baseline's inputs, which every variant is timed on
    (each variant's own inputs must match them in shape and dtype).
    """
    ordered = sorted(variants, key=lambda v: v.name != baseline)  # baseline built first
    prepared: dict[str, _Prepared] = {}
    reference: dict[str, torch.Tensor] | None = None
    args: Args = ()
    kwargs: Kwargs = {}
    for variant in ordered:
        run.say(f"building {variant.name}")
        model, v_args, v_kwargs = prepare_variant(variant, run.device, run.dtype, run.seed)
        if reference is None:
            reference = model.state_dict()
            args, kwargs = v_args, v_kwargs  # every variant gets the baseline's inputs
        else:
            _load_weights(reference, model, variant=variant.name, baseline=baseline)
            _check_same_inputs((args, kwargs), (v_args, v_kwargs), variant.name, baseline)
        prepared[variant.name] = _Prepared(variant, model, model, None, {})
    return prepared, args, kwargs


def _make_steps(
    prepared: dict[str, _Prepared], run: _Run, args: Args, kwargs: Kwargs
) -> dict[str, dict[str, str]]:
    """Give every prepared variant its optimizer, compiled runner and one step per mode.

    Returns the errors so far, ``errors[name][mode]``: a variant that fails to compile gets its
    error in every mode (its steps then fail too and are never timed).
    """
    modes = run.modes
    errors: dict[str, dict[str, str]] = {name: {} for name in run.names}
    for name, prep in prepared.items():
        if "train" in modes:
            prep.optimizer = make_optimizer(prep.model, run.optimizer, run.lr)
        if _compiled(prep.variant, run.compile):
            try:
                prep.runner = _compile(prep.model, run.compile_backend, run.compile_mode)
            except Exception as exc:
                for mode in modes:
                    errors[name][mode] = _describe_error(exc, compiling=True)
        for mode in modes:
            prep.steps[mode] = make_step(prep.runner, args, kwargs, mode, prep.optimizer)
    return errors


def _compiled(variant: ModelVariant, run_compiles: bool) -> bool:
    return run_compiles if variant.compiled is None else variant.compiled


def _time_interleaved(
    prepared: dict[str, _Prepared],
    run: _Run,
    errors: dict[str, dict[str, str]],
    *,
    warmup: int,
    repeats: int,
    number: int,
) -> dict[str, dict[str, list[float]]]:
    """Warm up, then take ``repeats`` rounds of one sample per live variant, shuffled."""
    names, modes, say = run.names, run.modes, run.say
    sync = _synchronizer(run.device)
    rng = random.Random(run.seed)
    times: dict[str, dict[str, list[float]]] = {n: {m: [] for m in modes} for n in names}

    def attempt(name: str, mode: str) -> float | None:
        step = prepared[name].steps[mode]
        try:
            sync()
            start = time.perf_counter()
            for _ in range(number):
                step()
            sync()
            return (time.perf_counter() - start) / number
        except Exception as exc:
            errors[name][mode] = _describe_error(
                exc, _compiled(prepared[name].variant, run.compile)
            )
            return None

    for mode in modes:
        for prep in prepared.values():
            prep.model.train(mode == "train")
        say(f"{mode}: warm-up")
        for _ in range(warmup):
            order = [n for n in names if mode not in errors[n]]
            rng.shuffle(order)
            for name in order:
                attempt(name, mode)
        gc.collect()
        gc_enabled = gc.isenabled()
        gc.disable()
        try:
            for round_index in range(repeats):
                say(f"{mode}: round {round_index + 1}/{repeats}")
                order = [n for n in names if mode not in errors[n]]
                rng.shuffle(order)
                for name in order:
                    elapsed = attempt(name, mode)
                    if elapsed is not None:
                        times[name][mode].append(elapsed)
        finally:
            if gc_enabled:
                gc.enable()
    return times


def _measure_memory(
    prepared: dict[str, _Prepared],
    run: _Run,
    errors: dict[str, dict[str, str]],
    *,
    method: str,
    timeout: float,
    jobs: int,
) -> dict[str, dict[str, MemoryStats | str]]:
    """The memory of every variant's step in every mode that ran, measured with ``method``:
    in this process, or in one fresh process per variant (``rss_subprocess``)."""
    names, modes, say = run.names, run.modes, run.say
    out: dict[str, dict[str, MemoryStats | str]] = {name: {} for name in names}
    probes: dict[str, list[str]] = {}
    for name in names:
        prep = prepared[name]
        wanted = [m for m in modes if m not in errors[name]]
        for mode in modes:
            if mode in errors[name]:
                out[name][mode] = "not measured: the step failed"
        if not wanted:
            continue
        if method == "rss_subprocess":
            probes[name] = wanted
            continue
        say(f"memory: {name}")
        for mode in wanted:
            prep.model.train(mode == "train")
            opt = prep.optimizer if mode == "train" else None
            try:
                prep.steps[mode]()  # re-warm in this mode (the timing ended in another mode)
                out[name][mode] = measure_step_memory(prep.steps[mode], method, run.device, opt)
            except Exception as exc:
                out[name][mode] = f"memory measurement failed: {type(exc).__name__}: {exc}"
    if probes:
        say(f"memory: {len(probes)} probe process(es), {max(1, jobs)} at a time")
        threads = torch.get_num_threads()

        def probe(name: str) -> dict[str, MemoryStats | str]:
            return run_memory_probe(
                prepared[name].variant,
                modes=probes[name],
                device=run.device,
                dtype=run.dtype,
                compile=_compiled(prepared[name].variant, run.compile),
                compile_backend=run.compile_backend,
                compile_mode=run.compile_mode,
                threads=threads,
                optimizer=run.optimizer,
                lr=run.lr,
                seed=run.seed,
                timeout=timeout,
            )

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for name, measured in zip(probes, pool.map(probe, probes)):
                out[name].update(measured)
    return out


def _summarise(
    names: list[str],
    modes: tuple[str, ...],
    baseline: str,
    times: dict[str, dict[str, list[float]]],
    errors: dict[str, dict[str, str]],
    memories: dict[str, dict[str, MemoryStats | str]],
    samples_per_step: int,
    *,
    confidence: float,
    resamples: int,
    seed: int,
) -> dict[str, dict[str, ModeResult]]:
    out: dict[str, dict[str, ModeResult]] = {}
    for name in names:
        out[name] = {}
        for mode in modes:
            res = ModeResult()
            if mode in errors[name]:
                res.error = errors[name][mode]
            elif times[name][mode]:
                res.timing = TimingStats.from_times(times[name][mode], samples_per_step)
            memory = memories.get(name, {}).get(mode)
            if isinstance(memory, MemoryStats):
                res.memory = memory
            elif isinstance(memory, str):
                res.memory_error = memory
            out[name][mode] = res

    for mode in modes:
        base = out[baseline][mode]
        for name in names:
            res = out[name][mode]
            if base.timing is not None and res.timing is not None:
                res.speedup = speedup_of(
                    base.timing, res.timing, confidence=confidence, resamples=resamples, seed=seed
                )
            if base.memory is not None and res.memory is not None and name != baseline:
                if base.memory.method != res.memory.method:
                    continue
                if (
                    base.memory.method == "rss_subprocess"
                    and base.memory.peak_bytes < RSS_RESOLUTION
                ):
                    res.memory_error = (
                        f"no memory ratio: the baseline's step peak is below the "
                        f"{RSS_RESOLUTION >> 20} MiB that RSS resolves; use --memory profiler"
                    )
                elif base.memory.peak_bytes > 0:
                    res.memory = MemoryStats(
                        res.memory.method,
                        res.memory.peak_bytes,
                        res.memory.absolute_bytes,
                        res.memory.peak_bytes / base.memory.peak_bytes,
                    )
    return out
