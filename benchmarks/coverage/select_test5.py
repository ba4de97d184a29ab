"""The content-blind rule that chose the `test5` files of benchmarks/coverage/ (run and committed
before any of them was read): the same candidates as `test3` and `test4` (per package, files in no
earlier split, sorted by path, no `__init__.py`, at most 1,000 lines), then every k-th starting
at position k // 4, a phase none of `test2` (0), `test3` (k // 2) and `test4` (3k // 4) used,
with k = candidates // wanted.

    python benchmarks/coverage/select_test5.py   # prints the chosen files; needs the wheels fetched
"""

from __future__ import annotations

import sys

from select_test3 import main


def test5_start(step: int) -> int:
    return step // 4


if __name__ == "__main__":
    sys.exit(main(test5_start))
