"""Every site and patched text of a tree, to compare two versions of the analysis.

A change meant to keep results (a faster matcher, a refactor) is checked by dumping the
results at both commits and comparing them: the same sites (rule, line, column, class,
method, status, reason, instances, alternatives) and the same patched text, file by file.

    # at each commit (a git worktree for the older one):
    PYTHONPATH=. python benchmarks/rewrite_dump.py before.json ROOT [ROOT ...] --jobs 2
    python benchmarks/rewrite_dump.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from multiprocessing import Pool
from pathlib import Path
from typing import Any

RULE_SET = "all"


def _results(path: str) -> tuple[str, dict[str, Any]]:
    from adopter.match.matcher import Matcher
    from adopter.rewrite import rewrite_text
    from adopter.rules import load_rule_set

    try:
        text = Path(path).read_text(encoding="utf-8")
        rewrite = rewrite_text(text, path, Matcher(load_rule_set(RULE_SET)))
    except Exception as error:  # recorded: the other side must fail the same way
        return path, {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    sites = [
        [
            result.site.rule.id,
            result.site.line,
            result.site.column,
            result.site.cls,
            result.site.method,
            result.status.value,
            result.reason,
            len(result.site.instances),
            len(result.site.alternatives),
        ]
        for result in rewrite.results
    ]
    patched = rewrite.patched if rewrite.changed else None
    digest = hashlib.sha256(patched.encode()).hexdigest() if patched is not None else None
    return path, {"patched": digest, "sites": sites}


def dump(output: Path, roots: list[str], jobs: int) -> None:
    files = sorted(str(p) for root in roots for p in Path(root).rglob("*.py"))
    results: dict[str, Any] = {}
    with Pool(jobs) as pool:
        for done, (path, result) in enumerate(pool.imap_unordered(_results, files, 8), 1):
            results[path] = result
            if done % 500 == 0 or done == len(files):
                print(f"{done}/{len(files)} files", file=sys.stderr, flush=True)
    output.write_text(json.dumps(results, sort_keys=True))
    sites = sum(len(r.get("sites", ())) for r in results.values())
    patched = sum(bool(r.get("patched")) for r in results.values())
    print(f"{len(results)} files, {sites} sites, {patched} patched files -> {output}")


def compare(before: Path, after: Path) -> int:
    old, new = json.loads(before.read_text()), json.loads(after.read_text())
    differing = sorted(p for p in old.keys() | new.keys() if old.get(p) != new.get(p))
    for path in differing[:20]:
        print(f"{path}:\n  before {old.get(path)}\n  after  {new.get(path)}")
    sites = sum(len(r.get("sites", ())) for r in old.values())
    print(f"{len(differing)} of {len(old.keys() | new.keys())} files differ ({sites} sites before)")
    return 1 if differing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", type=Path)
    parser.add_argument("roots", nargs="*")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.output is None or not args.roots:
        parser.error("give an output file and at least one folder (or --compare A B)")
    dump(args.output, args.roots, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
