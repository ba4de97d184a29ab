"""Shared by the example training scripts: seeding, the training loop, peak memory, output.

Nothing here knows about Adopter: the examples are plain training scripts, so running them
plainly and under ``adopter run`` compares exactly the same program.

Memory: on CPU PyTorch keeps no allocator peak, so a step's peak is the process's resident-set
high-water mark during the step above the resident set before it (Linux: the mark is reset
through ``/proc/self/clear_refs``). For figures that track tensors rather than malloc's caching,
run with ``MALLOC_MMAP_THRESHOLD_=65536`` (``benchmarks/patch_report.py`` does).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from collections.abc import Callable

import torch


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=5, help="training steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the losses and the peak memory here")
    return parser.parse_args()


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_num_threads(1)  # one reduction order: the same losses run after run


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def train(
    model: torch.nn.Module, loss_of_step: Callable[[int], torch.Tensor], steps: int
) -> tuple[list[float], int | None]:
    """Run ``steps`` AdamW steps; the losses, and the largest peak of a step after the first
    (the first also creates the optimizer state)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    losses: list[float] = []
    peak: int | None = None
    for step in range(steps):
        gc.collect()
        measured = _reset_peak()
        before = _status_bytes("VmRSS")
        loss = loss_of_step(step)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        after = _status_bytes("VmHWM")
        losses.append(float(loss.detach()))
        if step > 0 and measured and before is not None and after is not None:
            peak = max(peak or 0, after - before)
    return losses, peak


def report(losses: list[float], peak: int | None, json_path: str | None) -> None:
    for step, loss in enumerate(losses):
        print(f"step {step} loss {loss:.6f}")
    if peak is not None:
        print(f"peak memory of a training step: {peak / 2**20:.1f} MiB")
    if json_path:
        record = {"losses": losses, "peak_bytes": peak, "pid": os.getpid()}
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
