"""Where a training step's peak memory is: forward + backward, or the optimizer's update.

    MALLOC_MMAP_THRESHOLD_=65536 PYTHONPATH=. MODERN_PYTHON benchmarks/step_phase_memory.py \\
        llama_128k --optimizer adamw adamw-fused

For each model of ``benchmarks/modern_models.py`` (original and patched with ``--rules``) and
each optimizer, in a fresh process each (this script starts them): two warm-up steps, then with
the gradients set to ``None`` the resident set is read, and the peak above it measured over the
forward + backward, then over ``optimizer.step()`` (the gradients still held). ``adopter bench``
measures the whole step the same way (``adopter.bench.memory_probe``); this splits it, to show
which phase sets the peak once a rule has removed the loss's logits. MODERN_PYTHON: an
environment with torch 2.13, transformers 5.24.0, timm 1.0.31 and diffusers 0.42.1.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def measure(model_name: str, rules: str | None, optimizer_name: str) -> dict[str, float]:
    """Peak MiB above the gradient-free RSS of each phase of one training step (this process)."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from modern_models import factory

    from adopter.bench.measure import make_optimizer
    from adopter.bench.memory_probe import current_rss, peak_rss, reset_peak_rss

    torch.set_num_threads(1)
    model, inputs = factory(model_name, rules)()
    model.train()
    optimizer = make_optimizer(model, optimizer_name)

    def forward_backward() -> None:
        model(**inputs).loss.backward()

    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        forward_backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if not reset_peak_rss():
        raise SystemExit("needs Linux: the resident-set high-water mark cannot be reset")
    base = current_rss()
    forward_backward()
    after_backward = peak_rss()
    reset_peak_rss()
    optimizer.step()
    after_step = peak_rss()
    return {
        "forward_backward_mib": (after_backward - base) / MIB,
        "optimizer_step_mib": (after_step - base) / MIB,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--rules", default="all", help="rule set of the patched side")
    parser.add_argument("--optimizer", nargs="+", default=["adamw", "adamw-fused"])
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "RULES", "OPTIMIZER"))
    args = parser.parse_args()
    if args.child:
        model, rules, optimizer = args.child
        print(json.dumps(measure(model, None if rules == "-" else rules, optimizer)))
        return 0
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    print("| model | side | optimizer | forward + backward | optimizer step |")
    print("|---|---|---|---|---|")
    for model in args.models:
        for optimizer in args.optimizer:
            for side, rules in (("original", "-"), ("patched", args.rules)):
                command = [sys.executable, __file__, model, "--child", model, rules, optimizer]
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                found = json.loads(out.stdout.strip().splitlines()[-1])
                print(
                    f"| {model} | {side} | {optimizer} | {found['forward_backward_mib']:,.0f} MiB "
                    f"| {found['optimizer_step_mib']:,.0f} MiB |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
