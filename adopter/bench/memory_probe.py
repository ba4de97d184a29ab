"""Fresh-process peak-RSS probe: ``python -m adopter.bench.memory_probe``.

Why a separate process: on CPU PyTorch keeps no allocator peak counter, and the resident set
of a long-running benchmark process mixes every variant it built with memory that ``malloc``
cached after earlier steps. A fresh interpreter per variant starts every variant from the same
state. :func:`adopter.bench.measure.run_memory_probe` starts it with
``MALLOC_MMAP_THRESHOLD_=65536`` so that tensor-sized blocks are unmapped when freed and RSS
tracks live memory.

What one measurement is, per mode: build the model and inputs (seeded), one or more warm-up
steps (which also create the optimizer state and, under ``torch.compile``, compile),
``zero_grad(set_to_none=True)`` and ``gc.collect()``, reset the high-water mark by writing
``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0), read the current RSS from
``/proc/self/statm``, run one step, read the high-water mark ``VmHWM`` (see :func:`peak_rss`
for why not ``ru_maxrss``).
``peak_bytes`` is the difference: the step's transient plus retained memory (activations
saved for backward, gradients, temporaries, workspaces), excluding weights, optimizer state
and inputs. ``absolute_bytes`` is the process's peak RSS during the step. Where the
high-water mark cannot be reset (non-Linux), the pre-step reference is the earlier peak, so
only growth beyond it is seen (``hwm_reset: false`` in the output).

Two ways to call it:

* ``--spec FILE --out FILE``: a pickled spec written by ``run_memory_probe`` (the factory may
  be any picklable callable);
* ``--factory package.module:function [--modes train inference] [--device cpu] ...``: for
  people; prints the JSON report.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import resource
import sys
from pathlib import Path
from typing import Any

__all__ = ["current_rss", "main", "measure_rss_step", "peak_rss", "probe", "reset_peak_rss"]


def reset_peak_rss() -> bool:
    """Reset this process's RSS high-water mark to the current RSS; ``False`` if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def current_rss() -> int | None:
    """Resident set size now, in bytes (Linux ``/proc/self/statm``), or ``None``."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            resident_pages = int(handle.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_rss() -> int:
    """Peak resident set size of this process in bytes, since start or the last reset.

    Linux: ``VmHWM`` from ``/proc/self/status``. Not ``getrusage().ru_maxrss``: the kernel
    carries ``ru_maxrss`` across ``exec`` from the forked copy of the parent, so a child of a
    big process (a pytest session, a notebook) reports at least the parent's RSS, and
    ``clear_refs`` does not reset that part. Elsewhere ``ru_maxrss`` is the fallback
    (kilobytes, bytes on macOS).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(value) if sys.platform == "darwin" else int(value) * 1024


def measure_rss_step(step: Any, optimizer: Any = None) -> dict[str, Any]:
    """Peak RSS of one ``step()`` above the RSS just before it (see the module docstring)."""
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    gc.collect()
    hwm_reset = reset_peak_rss()
    before = current_rss() if hwm_reset else None
    if before is None:
        before = peak_rss()
    step()
    peak = peak_rss()
    return {
        "peak_bytes": max(0, peak - before),
        "absolute_bytes": peak,
        "before_bytes": before,
        "hwm_reset": hwm_reset,
    }


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the variant described by ``spec`` and measure each mode's step (runs in-process)."""
    import torch

    from .measure import (
        ModelVariant,
        _as_dtype,
        _compile,
        _describe_error,
        make_optimizer,
        make_step,
        prepare_variant,
    )

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    device = torch.device(spec.get("device", "cpu"))
    dtype = _as_dtype(spec.get("dtype", "float32"))
    modes = list(spec.get("modes", ["train"]))
    variant = ModelVariant(str(spec.get("name", "variant")), spec["factory"])
    model, args, kwargs = prepare_variant(variant, device, dtype, int(spec.get("seed", 0)))
    optimizer = None
    if "train" in modes:
        optimizer = make_optimizer(
            model, spec.get("optimizer", "adamw"), float(spec.get("lr", 1e-6))
        )
    compiling = bool(spec.get("compile", False))
    runner: Any = model
    if compiling:
        runner = _compile(model, spec.get("compile_backend", "inductor"), spec.get("compile_mode"))

    report: dict[str, Any] = {"modes": {}, "pid": os.getpid()}
    for mode in modes:
        model.train(mode == "train")
        step = make_step(runner, args, kwargs, mode, optimizer)
        try:
            for _ in range(max(1, int(spec.get("warmup", 1)))):
                step()
            report["modes"][mode] = measure_rss_step(step, optimizer if mode == "train" else None)
        except Exception as exc:
            report["modes"][mode] = {"error": _describe_error(exc, compiling)}
    return report


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m adopter.bench.memory_probe",
        description="Peak RSS of one training/inference step of a model, in a fresh process.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--spec", type=Path, help="pickled spec written by run_memory_probe")
    source.add_argument("--factory", help="'package.module:function' returning (model, inputs)")
    parser.add_argument("--out", type=Path, help="write the JSON report here (default: stdout)")
    parser.add_argument("--modes", nargs="+", default=["train"], choices=["inference", "train"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--compile-mode", default=None)
    parser.add_argument("--optimizer", default="adamw", choices=["adamw", "adamw-fused", "sgd"])
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    ns = _parse(argv)
    if ns.spec is not None:
        spec = pickle.loads(ns.spec.read_bytes())
    else:
        spec = {
            "factory": ns.factory,
            "name": ns.factory,
            "modes": ns.modes,
            "device": ns.device,
            "dtype": ns.dtype,
            "threads": ns.threads,
            "compile": ns.compile,
            "compile_backend": ns.compile_backend,
            "compile_mode": ns.compile_mode,
            "optimizer": ns.optimizer,
            "warmup": ns.warmup,
            "seed": ns.seed,
        }
    try:
        report = probe(spec)
    except Exception as exc:  # report build failures as data, not as a traceback to parse
        report = {"error": f"{type(exc).__name__}: {exc}", "modes": {}}
    text = json.dumps(report, indent=2)
    if ns.out is not None:
        ns.out.write_text(text, encoding="utf-8")
    else:
        print(text)
    return 0 if "error" not in report else 1


if __name__ == "__main__":
    sys.exit(main())
