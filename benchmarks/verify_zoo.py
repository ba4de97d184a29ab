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

    # `adopter verify --format json` gives one "file" row per file (the verdict that counts:
    # verified only when every patched site ran and matched), "class" rows per check and
    # "site" rows per patched site.
    per_file: dict[str, Counter] = {}
    file_status: dict[str, str] = {}
    sites: dict[str, Counter] = {}
    for row in results:
        name = Path(row["path"]).name
        kind = row.get("kind", "file")
        if kind == "class":
            per_file.setdefault(name, Counter())[row["status"]] += 1
        elif kind == "site":
            sites.setdefault(name, Counter())[row["status"]] += 1
        else:
            file_status[name] = row["status"]
            per_file.setdefault(name, Counter())
    verdicts = Counter(file_status.values())
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
        "A file counts as verified only when every patched site (each `adopter.kernels` call) "
        "ran in a comparison that matched and none was refuted; when comparisons matched but a "
        "site never ran in one, it is not exercised. Verify checks the base model, one head "
        "and every model class whose code holds a site, and flips the boolean/enum options "
        "that guard a site that has not run.\n",
        "| files | verified | refuted | not exercised | not checkable |",
        "|---|---|---|---|---|",
        f"| {len(files)} | {verdicts['verified']} | {verdicts['refuted']} | "
        f"{verdicts['not exercised']} | {verdicts['not checkable']} |",
        "",
        "| file | verdict | checks verified | refuted | not checkable | sites exercised | "
        "sites not exercised | first reason (not verified) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, counts in sorted(per_file.items()):
        status = file_status.get(name, "not checkable")
        reason = next(
            (
                str(r.get("reason", ""))[:160].replace("|", "/")
                for r in results
                if Path(r["path"]).name == name
                and r.get("kind", "file") != "class"
                and r["status"] not in ("verified", "exercised")
            ),
            "",
        )
        site_counts = sites.get(name, Counter())
        lines.append(
            f"| {name} | {status} | {counts['verified']} | {counts['refuted']} | "
            f"{counts['not checkable']} | {site_counts['exercised']} | "
            f"{site_counts['not exercised']} | {reason} |"
        )
    output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {output}: {dict(verdicts)}, {minutes:.1f} min")
    return 1 if verdicts["refuted"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
