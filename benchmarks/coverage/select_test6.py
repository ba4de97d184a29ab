"""The content-blind rule that chose the `test6` files of benchmarks/coverage/ (run and committed
before any of them was read): the same candidates as `test3` to `test5` (per package, files in no
earlier split, sorted by path, no `__init__.py`, at most 1,000 lines), then every k-th starting
at position k // 8, a phase none of the earlier splits used (0, k // 4, k // 2, 3k // 4), with
k = candidates // wanted. More transformers files than before (12 of 20), because the modern
families this split measures sit mostly there (test5 held 46 modern sites in 20 files).

    python benchmarks/coverage/select_test6.py   # prints the chosen files; needs the wheels fetched
"""

from __future__ import annotations

import sys

from select_test3 import main

SAMPLE = (
    ("transformers", "5.24.0", ("transformers/models/*/modeling_*.py",), 12),
    ("timm", "1.0.31", ("timm/models/*.py", "timm/layers/*.py"), 4),
    ("diffusers", "0.42.1", ("diffusers/models/**/*.py",), 4),
)


def test6_start(step: int) -> int:
    return step // 8


if __name__ == "__main__":
    sys.exit(main(test6_start, SAMPLE))
