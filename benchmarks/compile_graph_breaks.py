"""Graph breaks per kernel under ``torch.compile``: the kernel's call beside the original code.

For every case of ``tests/kernels/test_compile_graph_breaks.py`` (every kernel of the registry,
several spellings for some), ``torch._dynamo.explain`` counts the graph breaks of the original
computation and of the kernel's call, without autograd (inference) and with it (training);
the counts are summed over each kernel's cases and printed as a Markdown table (docs/kernels.md).

    PYTHONPATH=$PWD python benchmarks/compile_graph_breaks.py
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import torch._dynamo as dynamo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kernels.test_compile_graph_breaks import CASES, _breaks  # noqa: E402


def main() -> None:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for case in CASES:
        row = totals[case.kernel]
        row[0] += 1
        fused, original = case.pair()
        inputs = case.inputs()
        for column, grad in ((1, False), (3, True)):
            row[column] += _breaks(original, inputs, grad)[0]
            row[column + 1] += _breaks(fused, inputs, grad)[0]
    dynamo.reset()
    print(
        "| kernel | cases | inference: original | inference: kernel | training: original "
        "| training: kernel |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for kernel in sorted(totals):
        cases, *counts = totals[kernel]
        print(f"| `{kernel}` | {cases} | " + " | ".join(str(n) for n in counts) + " |")


if __name__ == "__main__":
    main()
