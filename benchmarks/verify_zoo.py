"""Verify the rewrites on a transformers release other than the benchmark's: every modeling file
that `adopter apply` would change is checked by `adopter verify` in an environment where that
release is installed; writes docs/verification-<version>.md.

    python3 -m venv /tmp/v446
    /tmp/v446/bin/pip install torch==2.13.0 transformers==4.46.3 -e '.[torch]'
    python benchmarks/verify_zoo.py --version 4.46.3 --adopter /tmp/v446/bin/adopter

The corpus is fetched from PyPI into the git-ignored cache like the scan benchmark's; the
model code is imported only by `adopter verify`, in its own subprocesses.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine  # noqa: E402

from adopter.corpus import fetch_wheel  # noqa: E402


def changed_files(models: Path) -> list[Path]:
    """Modeling files in which `adopter apply` patches at least one site."""
    out = subprocess.run(
        [sys.executable, "-m", "adopter", "apply", str(models), "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    records = json.loads(out)
    return sorted({Path(r["path"]) for r in records if r.get("status") == "patched"})


def verify(adopter: str, path: Path, timeout: float) -> list[dict]:
    command = [adopter, "verify", str(path), "--timeout", str(timeout), "--format", "json"]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout + 60, check=False
        )
        return json.loads(done.stdout)
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as error:
        return [{"path": str(path), "status": "not checkable", "reason": repr(error)[:200]}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True, help="transformers release, e.g. 4.46.3")
    parser.add_argument("--adopter", required=True, help="`adopter` of that environment")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per file")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    output = args.output or ROOT / "docs" / f"verification-{args.version}.md"

    models = fetch_wheel(f"transformers=={args.version}") / "transformers" / "models"
    files = changed_files(models)
    started = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = [
            r
            for rows in pool.map(lambda p: verify(args.adopter, p, args.timeout), files)
            for r in rows
        ]
    minutes = (time.perf_counter() - started) / 60

    per_file: dict[str, Counter] = {}
    for row in results:
        per_file.setdefault(Path(row["path"]).name, Counter())[row["status"]] += 1
    verdicts = Counter()
    for counts in per_file.values():
        if counts["refuted"]:
            verdicts["refuted"] += 1
        elif counts["verified"]:
            verdicts["verified"] += 1
        else:
            verdicts["not checkable"] += 1
    lines = [
        f"# Verification on transformers {args.version}\n",
        f"Produced by `python benchmarks/verify_zoo.py --version {args.version} --adopter "
        f"ADOPTER` (ADOPTER: the `adopter` of an environment with `transformers=={args.version}` "
        f"and `torch==2.13.0` installed) on {describe_machine()}; {minutes:.1f} min with "
        f"{args.jobs} jobs. Every modeling file the nine paper rules change ({len(files)} files) "
        "is checked by `adopter verify`: the original and the patched model are built from the "
        "same small configuration, the original's weights load strictly into the patch, and "
        "outputs and gradients are compared in eval, train and (where the kernels draw random "
        "numbers like the original) train-with-dropout mode.\n",
        "A file counts as verified when at least one of its model classes was checked and none "
        "was refuted.\n",
        "| files | verified | refuted | not checkable |",
        "|---|---|---|---|",
        f"| {len(files)} | {verdicts['verified']} | {verdicts['refuted']} | "
        f"{verdicts['not checkable']} |",
        "",
        "| file | classes verified | refuted | not checkable | first reason not checkable |",
        "|---|---|---|---|---|",
    ]
    for name, counts in sorted(per_file.items()):
        reason = next(
            (
                str(r.get("reason", ""))[:120].replace("|", "/")
                for r in results
                if Path(r["path"]).name == name and r["status"] == "not checkable"
            ),
            "",
        )
        lines.append(
            f"| {name} | {counts['verified']} | {counts['refuted']} | "
            f"{counts['not checkable']} | {reason} |"
        )
    output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {output}: {dict(verdicts)}, {minutes:.1f} min")
    return 1 if verdicts["refuted"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
