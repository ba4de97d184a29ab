"""The content-blind rule that chose the `test4` files of benchmarks/coverage/ (run and committed
before any of them was read): the same candidates as `test3` (per package, files in no earlier
split, sorted by path, no `__init__.py`, at most 1,000 lines), then every k-th starting at
position 3k // 4, a phase neither `test2` (0) nor `test3` (k // 2) used, with
k = candidates // wanted.

    python benchmarks/coverage/select_test4.py   # prints the chosen files; needs the wheels fetched
"""

from __future__ import annotations

import sys

from select_test3 import SAMPLE, candidates, earlier_files

from adopter.corpus import fetch_wheel


def choose(pool: list[str], wanted: int) -> list[str]:
    step = len(pool) // wanted
    return [pool[(3 * step) // 4 + i * step] for i in range(wanted)]


def main() -> int:
    taken = earlier_files()
    for package, version, patterns, wanted in SAMPLE:
        root = fetch_wheel(f"{package}=={version}")
        pool = candidates(root, patterns, taken)
        step = len(pool) // wanted
        print(f"# {package}: {len(pool)} candidates, k = {step}, start {(3 * step) // 4}")
        for path in choose(pool, wanted):
            print(f"{package}\t{version}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
