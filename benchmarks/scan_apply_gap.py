"""Does apply patch what scan reports? One corpus folder, one rule set: the sites ``scan``
reports (and how many it marks not rewritable, by reason), what ``apply`` does with them
(patched, covered, skipped, by reason), and every site where the two disagree: scan calls it
rewritable and apply skips it, or scan marks it not rewritable and apply patches it.

With ``--write-check`` the corpus is copied to a scratch folder, patched there as
``apply --write`` patches it, every changed file compiled, and apply run a second time (it must
change nothing). Nothing scanned is imported.

    PYTHONPATH=. nice -n 10 .venv/bin/python benchmarks/scan_apply_gap.py \\
        .venv/lib/python3.11/site-packages/transformers/models --rule-set all --write-check
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from adopter.cli import load_rules
from adopter.match.scan import scan_paths
from adopter.rewrite import SiteStatus, SkipReason, WriteStatus, rewrite_paths, write_rewrites
from adopter.rewrite.judge import mark_unwritable

# Line numbers and names in a reason make every site its own class; these turn a reason into
# the class it belongs to, so the largest causes stand out.
_LINES = re.compile(r"\blines? \d+(?:-\d+)?(?:(?:, | and )\d+(?:-\d+)?)*")
_QUOTED = re.compile(r"'[^']*'|`[^`]*`")


def reason_class(reason: str) -> str:
    return _QUOTED.sub("'…'", _LINES.sub("line N", reason)).strip()


def _where(root: Path, path: str, line: int, rule: str) -> str:
    try:
        shown = Path(path).relative_to(root)
    except ValueError:
        shown = Path(path)
    return f"{shown}:{line} {rule}"


def measure(root: Path, rule_set: str, jobs: int | None, select: str | None) -> dict:
    rules = load_rules(None, rule_set, select)
    started = time.perf_counter()
    scanned = scan_paths([root], rules, jobs=jobs, judge=mark_unwritable)
    scan_seconds = time.perf_counter() - started
    started = time.perf_counter()
    applied = rewrite_paths([root], rules, jobs=jobs)
    apply_seconds = time.perf_counter() - started

    scan_sites = [site for site in scanned.sites if site.applicable]
    not_rewritable = [site for site in scan_sites if not site.rewritable]
    # A site is known by rule, file and (original) line: apply's later rounds map their lines
    # back to the original text, and their columns may move.
    by_key: dict[tuple[str, str, int], list] = {}
    for site in scan_sites:
        by_key.setdefault((site.rule.id, site.path, site.line), []).append(site)
    statuses = Counter(result.status.value for result in applied.results)
    # transformers 5.x modular sources are left by policy: the modeling file generated from
    # each, which is what runs, holds the same sites and is patched
    modular = [r for r in applied.results if r.skip is SkipReason.MODULAR_POLICY]
    skipped = [
        r
        for r in applied.results
        if r.status is SiteStatus.SKIPPED and r.skip is not SkipReason.MODULAR_POLICY
    ]
    disagreements: list[str] = []
    seen: Counter[tuple[str, str, int]] = Counter()
    for result in applied.results:
        key = (result.site.rule.id, result.site.path, result.site.line)
        candidates = by_key.get(key, [])
        index = seen[key]
        seen[key] += 1
        where = _where(root, result.site.path, result.site.line, result.site.rule.id)
        if index >= len(candidates):
            if result.status is SiteStatus.SKIPPED:
                disagreements.append(f"{where}: apply skipped a site scan did not report")
            continue
        site = candidates[index]
        if result.status is SiteStatus.SKIPPED and site.rewritable:
            disagreements.append(f"{where}: scan says rewritable, apply skips: {result.reason}")
        elif result.status is not SiteStatus.SKIPPED and not site.rewritable:
            disagreements.append(
                f"{where}: scan says not rewritable ({site.rewrite_reason}), apply "
                f"{result.status.value}"
            )
    for key, sites in by_key.items():
        for site in sites[seen[key] :]:
            where = _where(root, site.path, site.line, site.rule.id)
            disagreements.append(f"{where}: scan reported a site apply gave no result for")
    return {
        "corpus": str(root),
        "rule_set": rule_set,
        "select": select,
        "files": len(applied.files),
        "scan_sites": len(scan_sites),
        "scan_not_rewritable": len(not_rewritable),
        "scan_not_rewritable_by_reason": Counter(
            reason_class(site.rewrite_reason) for site in not_rewritable
        ).most_common(),
        "apply": dict(statuses),
        "modular_policy": len(modular),
        "unwritten": len(skipped),
        "apply_skipped_by_reason": Counter(
            f"{r.site.rule.id} {r.skip.value if r.skip else '?'}: {reason_class(r.reason)}"
            for r in skipped
        ).most_common(),
        "apply_skipped_sites": sorted(
            f"{_where(root, r.site.path, r.site.line, r.site.rule.id)}: {r.reason}" for r in skipped
        ),
        "modular_policy_sites": sorted(
            _where(root, r.site.path, r.site.line, r.site.rule.id) for r in modular
        ),
        "disagreements": disagreements,
        "errors": list(scanned.errors) + list(applied.errors),
        "scan_seconds": round(scan_seconds, 1),
        "apply_seconds": round(apply_seconds, 1),
    }


def write_check(root: Path, rule_set: str, jobs: int | None, select: str | None) -> dict:
    """Patch a scratch copy as ``apply --write`` would; compile; apply again."""
    rules = load_rules(None, rule_set, select)
    scratch = Path(tempfile.mkdtemp(prefix="adopter-gap-"))
    try:
        copy = scratch / root.name
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        result = rewrite_paths([copy], rules, jobs=jobs)
        failures = [
            o for o in write_rewrites(result.changed) if o.status is not WriteStatus.WRITTEN
        ]
        compile_failures = []
        for rewrite in result.changed:
            text = Path(rewrite.path).read_text(encoding="utf-8")
            try:
                compile(text, rewrite.path, "exec", dont_inherit=True)
            except SyntaxError as error:
                compile_failures.append(f"{rewrite.path}: {error.msg} ({error.lineno})")
        again = rewrite_paths([copy], rules, jobs=jobs)
        return {
            "changed_files": len(result.changed),
            "write_failures": [str(o) for o in failures],
            "compile_failures": compile_failures,
            "second_apply_changes": [str(Path(r.path).relative_to(copy)) for r in again.changed],
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path, help="a folder of model sources")
    parser.add_argument("--rule-set", default="all")
    parser.add_argument("--select", default=None)
    parser.add_argument("--jobs", "-j", type=int, default=None)
    parser.add_argument("--write-check", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the full report here")
    parser.add_argument("--sites", action="store_true", help="list every skipped site")
    args = parser.parse_args(argv)
    report = measure(args.corpus, args.rule_set, args.jobs, args.select)
    if args.write_check:
        report["write_check"] = write_check(args.corpus, args.rule_set, args.jobs, args.select)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    apply = report["apply"]
    unwritten, modular = report["unwritten"], report["modular_policy"]
    counted = report["scan_sites"] - modular
    share = unwritten / counted if counted else 0.0
    print(
        f"{report['corpus']} --rule-set {report['rule_set']}: {report['files']} files; "
        f"scan {report['scan_sites']} sites, {report['scan_not_rewritable']} not rewritable "
        f"({report['scan_seconds']} s); apply {apply.get('patched', 0)} patched, "
        f"{apply.get('covered', 0)} covered, {apply.get('skipped', 0)} skipped: {modular} in "
        f"modular sources (policy), {unwritten} unwritten = {share:.2%} of the {counted} "
        f"other sites ({report['apply_seconds']} s); "
        f"{len(report['disagreements'])} disagreements"
    )
    print("unwritten sites by rule and reason (modular policy left out):")
    for reason, count in report["apply_skipped_by_reason"]:
        print(f"  {count:4d}  {reason}")
    if args.sites:
        print("unwritten sites:")
        for line in report["apply_skipped_sites"]:
            print(f"  {line}")
    for line in report["disagreements"]:
        print(f"DISAGREE {line}")
    for error in report["errors"]:
        print(f"ERROR {error}")
    if "write_check" in report:
        check = report["write_check"]
        print(
            f"write check: {check['changed_files']} files written, "
            f"{len(check['write_failures'])} write failures, "
            f"{len(check['compile_failures'])} do not compile, "
            f"second apply changes {len(check['second_apply_changes'])} files"
        )
        for line in check["write_failures"] + check["compile_failures"]:
            print(f"  {line}")
        for line in check["second_apply_changes"]:
            print(f"  second apply changes {line}")
    failed = report["disagreements"] or report["errors"]
    if "write_check" in report:
        check = report["write_check"]
        failed = failed or any(
            check[k] for k in ("write_failures", "compile_failures", "second_apply_changes")
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
