"""The LM-head loss under torch.compile (Inductor): the compiled original, the compiled kernel
on each backend that compiles (ours as a torch.library op, torch's chunked op) and the eager
kernel; interleaved training steps, profiler peak memory, 2x512 tokens of width 768, float32,
one thread.

    PYTHONPATH=$PWD python benchmarks/compile_loss_memory.py 32000   # the vocabulary
    PYTHONPATH=$PWD python benchmarks/compile_loss_memory.py 128256 96   # also rows per chunk 96
"""

import gc
import json
import sys
import time

import torch
from torch import nn

sys.path.insert(0, ".")
from adopter import kernels
from adopter.bench.measure import _profiler_peak
from adopter.bench.stats import bootstrap_ratio_ci, median
from adopter.kernels import backends
from adopter.kernels.cross_entropy import OP, causal_lm_loss_reference

torch.set_num_threads(1)
torch.manual_seed(0)
V = int(sys.argv[1]) if len(sys.argv) > 1 else 32000
H, B, S = 768, 2, 512
head = nn.Linear(H, V, bias=False)
hidden = torch.randn(B, S, H, requires_grad=True)
labels = torch.randint(0, V, (B, S))


def orig(h, targets):
    return causal_lm_loss_reference(h, head, targets, V)


def kern(h, targets):
    return kernels.causal_lm_loss(h, head, targets, V)


def on_backend(name):
    def fn(h, targets):
        return kern(h, targets)

    compiled = torch.compile(fn, fullgraph=True)

    def run(h, targets):
        # The preference is read at trace time and guarded on, so it holds for every call.
        with backends.prefer(OP, name):
            return compiled(h, targets)

    return run


variants = {
    "original compiled": torch.compile(orig, fullgraph=True),
    "kernel compiled, adopter op": on_backend("adopter"),
    "kernel compiled, torch op": on_backend("torch"),
    "kernel eager": kern,
}
if len(sys.argv) > 2:  # a chunk size to compare with the default's (rows of logits per chunk)
    ROWS = int(sys.argv[2])

    def kern_rows(h, targets):
        return kernels.causal_lm_loss(h, head, targets, V, chunk_size=ROWS)

    rows_compiled = torch.compile(kern_rows, fullgraph=True)

    def torch_rows(h, targets):
        with backends.prefer(OP, "torch"):
            return rows_compiled(h, targets)

    variants[f"kernel compiled, torch op, {ROWS} rows per chunk"] = torch_rows


def step(fn):
    def run():
        head.weight.grad = None
        hidden.grad = None
        fn(hidden, labels).backward()

    return run


steps = {n: step(f) for n, f in variants.items()}
t0 = time.perf_counter()
for s in steps.values():
    s()
    s()
print("compile+warmup s", time.perf_counter() - t0, flush=True)
times = {n: [] for n in steps}
for r in range(5):
    names = list(steps)
    names = names[r % len(names) :] + names[: r % len(names)]
    for n in names:
        t = time.perf_counter()
        steps[n]()
        times[n].append(time.perf_counter() - t)
peaks = {}
for n in steps:
    gc.collect()
    peaks[n] = _profiler_peak(steps[n], torch.device("cpu"), lambda: None)
base = times["original compiled"]
out = {}
for n in steps:
    lo, hi = bootstrap_ratio_ci(base, times[n], paired=True) if n != "original compiled" else (1, 1)
    out[n] = {
        "median_ms": median(times[n]) * 1e3,
        "speedup_vs_compiled_original": median(base) / median(times[n]),
        "ci": [lo, hi],
        "peak_mib": peaks[n] / 2**20,
    }
    print(n, json.dumps(out[n]), flush=True)
print(json.dumps(out, indent=1))
