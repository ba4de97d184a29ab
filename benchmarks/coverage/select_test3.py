"""The content-blind rule that chose the `test3` files of benchmarks/coverage/ (run before any of
them was read): per package, the candidate files not in any earlier split (`dev`, `test`,
`test2`), sorted by path, `__init__.py` left out, at most 1,000 lines (a size cap so that the
sample fits a reading session; line counts only, nothing of the content), then every k-th
starting at position k // 2 (a different phase from `test2`, which started at 0) with
k = candidates // wanted.

    python benchmarks/coverage/select_test3.py   # prints the chosen files; needs the wheels fetched
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from adopter.corpus import fetch_wheel  # noqa: E402

MAX_LINES = 1000
# (package, version, glob patterns under the unpacked wheel, how many files)
SAMPLE = (
    ("transformers", "5.24.0", ("transformers/models/*/modeling_*.py",), 10),
    ("timm", "1.0.31", ("timm/models/*.py", "timm/layers/*.py"), 5),
    ("diffusers", "0.42.1", ("diffusers/models/**/*.py",), 5),
)


def earlier_files() -> set[str]:
    """Every path already in files.tsv, whatever its split."""
    table = Path(__file__).with_name("files.tsv")
    with table.open(encoding="utf-8", newline="") as handle:
        lines = [line for line in handle if line.strip() and not line.startswith("#")]
    rows = csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    return {row["path"] for row in rows}


def candidates(root: Path, patterns: tuple[str, ...], taken: set[str]) -> list[str]:
    found = {str(p.relative_to(root)) for pattern in patterns for p in root.glob(pattern)}
    kept = []
    for path in sorted(found):
        if path in taken or path.endswith("__init__.py"):
            continue
        with (root / path).open(encoding="utf-8") as handle:
            if sum(1 for _ in handle) <= MAX_LINES:
                kept.append(path)
    return kept


def test3_start(step: int) -> int:
    return step // 2


def choose(pool: list[str], wanted: int, start=test3_start) -> list[str]:
    step = len(pool) // wanted
    return [pool[start(step) + i * step] for i in range(wanted)]


def main(start=test3_start, sample=SAMPLE) -> int:
    """Print the chosen files; ``start(k)`` is the first position (the split's phase)."""
    taken = earlier_files()
    for package, version, patterns, wanted in sample:
        root = fetch_wheel(f"{package}=={version}")
        pool = candidates(root, patterns, taken)
        step = len(pool) // wanted
        print(f"# {package}: {len(pool)} candidates, k = {step}, start {start(step)}")
        for path in choose(pool, wanted, start):
            print(f"{package}\t{version}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
