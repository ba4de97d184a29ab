"""Measure Adopter on current third-party model code: the hand-labelled sites of
benchmarks/coverage/ (transformers 5.x, timm, diffusers) against what `adopter scan --rule-set all`
finds in the same files, per package x family x split; then a whole-package pass (scan every .py
file, apply into a scratch copy, compile, apply again) over each package. Writes docs/coverage.md.

    python benchmarks/coverage_benchmark.py [--jobs N] [--tolerance 2] [--no-package-pass]

The wheels come from PyPI at run time into the git-ignored ``.cache/corpus`` (never vendored);
scanning and applying are static: nothing of the scanned packages is imported. The labels were
made by reading the code (benchmarks/coverage/README.md); the `test3` split is held out from
tuning (`test` and `test2` have been looked at). Families that no loaded rule reports yet are shown as "no rule yet".
"""

from __future__ import annotations

import argparse
import json
import os
import py_compile
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from coverage_compare import (  # noqa: E402
    EXISTING_FAMILIES,
    MATCH_KINDS,
    MODERN_FAMILIES,
    PAPER_FAMILIES,
    SPLITS,
    Cell,
    Comparison,
    Label,
    Record,
    compare,
    family_of,
    family_order,
    load_labels,
    percent,
    record_scope,
    split_table,
    tabulate,
    total,
)
from machine import describe_machine, git_revision  # noqa: E402

from adopter.corpus import fetch_wheel  # noqa: E402
from adopter.dsl.errors import LocatedError  # noqa: E402
from adopter.extract.source import read_source  # noqa: E402
from adopter.match.matcher import Matcher  # noqa: E402
from adopter.match.scan import collect_python_files, map_files, scan_source  # noqa: E402
from adopter.rewrite import SiteStatus, rewrite_file  # noqa: E402
from adopter.rules import load_rule_set  # noqa: E402

LABELS = Path(__file__).with_name("coverage")


# --- per-file work, run in worker processes: never lets an exception escape ------------------


@dataclass
class FileScan:
    path: str
    sites: list[tuple[str, str, int, str, str]] = field(default_factory=list)
    not_applicable: int = 0
    rejected: str | None = None  # bad input (syntax error, encoding): reported, not a crash
    crash: str | None = None  # anything else: an internal error of the analysis


def scan_file(path: str, matcher: Matcher) -> FileScan:
    """Sites of one file as (rule id, rule name, line, scope, message)."""
    result = FileScan(path)
    try:
        for site in scan_source(read_source(path), path, matcher):
            if not site.applicable:
                result.not_applicable += 1
                continue
            scope = record_scope(site.cls, site.method)
            result.sites.append((site.rule.id, site.rule.name, site.line, scope, site.message))
    except (LocatedError, RecursionError) as error:
        result.rejected = str(error) or type(error).__name__
    except Exception as error:  # counting crashes (internal errors) is the point of this pass
        result.crash = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    return result


@dataclass
class FileApply:
    path: str
    patched: str | None = None  # the new text when the file changes
    statuses: Counter = field(default_factory=Counter)
    patched_rules: Counter = field(default_factory=Counter)
    rejected: str | None = None
    crash: str | None = None


def apply_file(path: str, matcher: Matcher) -> FileApply:
    result = FileApply(path)
    try:
        rewrite = rewrite_file(path, matcher)
    except Exception as error:  # an internal error of the rewrite: counted, not raised
        result.crash = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        return result
    if rewrite.error:
        result.rejected = rewrite.error
        return result
    for item in rewrite.results:
        result.statuses[item.status] += 1
        if item.status is SiteStatus.PATCHED:
            result.patched_rules[item.site.rule.id] += 1
    if rewrite.changed:
        result.patched = rewrite.patched
    return result


# --- the labelled files -----------------------------------------------------------------------


def package_roots(files) -> dict[str, Path]:
    """Each package's unpacked wheel (fetched once, cached)."""
    roots = {}
    for package, version in sorted({(f.package, f.version) for f in files}):
        roots[package] = fetch_wheel(f"{package}=={version}")
    return roots


def scan_labelled(files, roots, rules, jobs) -> tuple[list[Record], list[FileScan], float]:
    names = [str(roots[f.package] / f.path) for f in files]
    package_of = {str(roots[f.package] / f.path): (f.package, f.path) for f in files}
    started = time.perf_counter()
    scans = map_files(names, rules, scan_file, jobs=jobs)
    seconds = time.perf_counter() - started
    records = []
    for scan in scans:
        package, path = package_of[scan.path]
        for rule, name, line, scope, message in scan.sites:
            records.append(Record(package, path, line, family_of(rule, name), rule, scope, message))
    return records, scans, seconds


# --- the whole-package pass -------------------------------------------------------------------


@dataclass
class PackagePass:
    package: str
    version: str
    files: int = 0
    sites: Counter = field(default_factory=Counter)
    not_applicable: int = 0
    rejected: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    scan_seconds: float = 0.0
    changed_files: int = 0
    statuses: Counter = field(default_factory=Counter)
    patched_rules: Counter = field(default_factory=Counter)
    apply_crashes: list[str] = field(default_factory=list)
    compile_failures: list[str] = field(default_factory=list)
    second_changed: list[str] = field(default_factory=list)
    second_crashes: int = 0
    apply_seconds: float = 0.0
    second_seconds: float = 0.0


def package_pass(package: str, version: str, root: Path, rules, jobs: int) -> PackagePass:
    report = PackagePass(package, version)
    source = root / package
    names = [str(p) for p in collect_python_files([source])[0]]
    report.files = len(names)
    started = time.perf_counter()
    for scan in map_files(names, rules, scan_file, jobs=jobs):
        relative = str(Path(scan.path).relative_to(root))
        report.sites.update(rule for rule, *_ in scan.sites)
        report.not_applicable += scan.not_applicable
        if scan.rejected:
            report.rejected.append(f"{relative}: {scan.rejected}")
        if scan.crash:
            report.crashes.append(f"{relative}: {scan.crash}")
    report.scan_seconds = time.perf_counter() - started

    scratch = Path(tempfile.mkdtemp(prefix=f"adopter-coverage-{package}-"))
    try:
        copy = scratch / package
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        copies = [str(p) for p in collect_python_files([copy])[0]]
        started = time.perf_counter()
        changed = []
        for result in map_files(copies, rules, apply_file, jobs=jobs):
            relative = str(Path(result.path).relative_to(scratch))
            report.statuses.update(result.statuses)
            report.patched_rules.update(result.patched_rules)
            if result.crash:
                report.apply_crashes.append(f"{relative}: {result.crash}")
            if result.patched is not None:
                # a scratch copy nothing else touches: a plain write (newline="" keeps endings)
                Path(result.path).write_text(result.patched, encoding="utf-8", newline="")
                changed.append(result.path)
        report.apply_seconds = time.perf_counter() - started
        report.changed_files = len(changed)
        for number, path in enumerate(changed):
            try:
                py_compile.compile(path, cfile=str(scratch / f"{number}.pyc"), doraise=True)
            except py_compile.PyCompileError as error:
                message = str(error.msg).strip().splitlines()[-1][:200]
                report.compile_failures.append(f"{Path(path).relative_to(scratch)}: {message}")
        started = time.perf_counter()
        for result in map_files(copies, rules, apply_file, jobs=jobs):
            if result.patched is not None:
                report.second_changed.append(str(Path(result.path).relative_to(scratch)))
            report.second_crashes += result.crash is not None
        report.second_seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


# --- the report -------------------------------------------------------------------------------


def code_line(root: Path, path: str, line: int) -> str:
    try:
        text = (root / path).read_text(encoding="utf-8").splitlines()[line - 1].strip()
    except (OSError, IndexError):
        return ""
    return text if len(text) <= 110 else text[:107] + "..."


def cell_row(label: str, cell: Cell, implemented: bool) -> str:
    if not implemented:
        return (
            f"| {label} | {cell.expected} | {cell.expected_static} | no rule yet | - | "
            f"{cell.missed} | - | - | 0.0% | 0.0% | 0.0% |"
        )
    return (
        f"| {label} | {cell.expected} | {cell.expected_static} | {cell.found} | {cell.matched} | "
        f"{cell.missed} | {cell.extra} | {percent(cell.precision)} | {percent(cell.recall)} | "
        f"{percent(cell.static_recall)} | {percent(cell.clear_recall)} |"
    )


CELL_HEADER = (
    "| expected | of which static | found | matched | missed | extra | precision | recall | "
    "recall (static) | recall (clear-cut) |"
)


def render(args, files, labels, rules, comparison: Comparison, roots, scans, scan_seconds, passes):
    split_of = split_table(files)
    cells = tabulate(comparison, split_of)
    implemented = {family_of(rule.id, rule.name) for rule in rules}
    versions = ", ".join(f"{p} {f.version}" for p, f in {f.package: f for f in files}.items())
    packages = list(dict.fromkeys(f.package for f in files))
    out: list[str] = []
    w = out.append
    w(f"# Coverage on current model code ({versions})\n")
    w(
        f"Produced by `python benchmarks/coverage_benchmark.py --jobs {args.jobs}"
        f"{' --no-package-pass' if args.no_package_pass else ''}` at commit `{git_revision()}` "
        f"on {describe_machine()}, {datetime.now(UTC):%Y-%m-%d}. "
        f"Rule set `{args.rule_set}` ({len(rules)} rules: {', '.join(r.id for r in rules)}); "
        f"families with a rule: {', '.join(family_order(implemented)) or 'none'}.\n"
    )
    w(
        f"Labels: `benchmarks/coverage/` — {len(files)} files read by hand "
        f"({', '.join(f'{sum(f.split == s for f in files)} {s}' for s in SPLITS)}), "
        f"{len(labels)} sites; how they were made is in its README. `test6` is the held-out "
        "split: tune on `dev` (and, since 2026-12-03, on the misses of `test`, `test2` and `test3`; "
        "since 2026-12-06 on `test4`'s, since 2026-12-07 on `test5`'s, all of which have been "
        "looked at); `test2` to `test6` were added later, each read before any scan. "
        "A record matches a label of the same file and family on the same "
        f"line, else within {args.tolerance} lines, else in the same class/method or function "
        "(each used once). *Static* sites are those a static tool can see (the `static` column "
        "of sites.tsv); `recall (static)` is measured on them; `recall (clear-cut)` leaves out the "
        "labels marked `[edge]` (test2 and later splits only). Wheels come from PyPI into the "
        "git-ignored cache; nothing is imported.\n"
    )
    w("## Headline\n")
    w("| split | rules | " + CELL_HEADER.lstrip("| "))
    w("|---|---|---|---|---|---|---|---|---|---|---|---|")
    # (name, families, packages or None for all): the last is issue 22's "paper rules in timm
    # and diffusers"
    groups = (
        ("existing (paper.1-9, ext.1-4)", set(EXISTING_FAMILIES), None),
        ("modern families (issue 14)", set(MODERN_FAMILIES), None),
        ("paper rules, timm + diffusers", set(PAPER_FAMILIES), {"timm", "diffusers"}),
    )
    for split in (*SPLITS, "all"):
        for name, members, only in groups:
            cell = total(
                cells,
                lambda p, family, s, members=members, split=split, only=only: (
                    family in members
                    and (split == "all" or s == split)
                    and (only is None or p in only)
                ),
            )
            any_rule = bool(members & implemented)
            w(cell_row(f"{split} | {name}", cell, any_rule))
    w("")
    w("## Per package, family and split\n")
    w("| package | family | split | " + CELL_HEADER.lstrip("| "))
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for package in packages:
        families = family_order({f for p, f, _ in cells if p == package})
        for family in families:
            for split in SPLITS:
                cell = cells.get((package, family, split))
                if cell is None:
                    continue
                w(cell_row(f"{package} | {family} | {split}", cell, family in implemented))
    w("")
    w("Per family, all packages and all splits:\n")
    w("| family | " + CELL_HEADER.lstrip("| "))
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    for family in family_order({f for _, f, _ in cells}):
        cell = total(cells, lambda _p, f, _s, family=family: f == family)
        w(cell_row(family, cell, family in implemented))
    w("")
    kinds = Counter(kind for *_, kind in comparison.matched)
    w(
        "Matches by kind: "
        + ", ".join(f"{kind} {kinds[kind]}" for kind in MATCH_KINDS)
        + " (a `near` or `scope` match means the rule anchors the site on another line than the "
        "label's convention).\n"
    )
    w("## Every miss\n")
    w(
        "Labelled sites no record matched, with the label's note. `not static` sites need run-time "
        "knowledge (the reason follows).\n"
    )
    missed = sorted(comparison.missed, key=lambda x: (x.package, x.family, x.path, x.line))
    for package in packages:
        mine = [label for label in missed if label.package == package]
        w(f"<details><summary>{package}: {len(mine)} missed</summary>\n")
        for label in mine:
            static = "" if label.static else f" — not static: {label.static_reason[3:].strip()}"
            w(
                f"- **{label.family}** `{label.path}:{label.line}` `{label.scope}` "
                f"[{label.split}]{static} — {label.note}"
            )
        w("\n</details>\n")
    w("## Every extra\n")
    w("Records that match no label (a wrong site, or a site the labels lack).\n")
    extra = sorted(comparison.extra, key=lambda x: (x.package, x.path, x.line, x.rule))
    if not extra:
        w("None.\n")
    for record in extra:
        w(
            f"- **{record.family}** (`{record.rule}`) `{record.path}:{record.line}` "
            f"`{record.scope}` [{split_of[(record.package, record.path)]}]: "
            f"`{code_line(roots[record.package], record.path, record.line)}`"
        )
    if extra:
        w("")
    w("## Parts of a labelled site\n")
    w(
        "Records in the scope of a label that another record of the same family matched: the "
        "label counts them as one site with it (rotary: q and k are one label, two rewritten "
        "statements). Counted neither as found nor as extra.\n"
    )
    parts = sorted(comparison.parts, key=lambda x: (x[1].package, x[1].path, x[1].line))
    if not parts:
        w("None.\n")
    for label, record in parts:
        w(
            f"- **{record.family}** (`{record.rule}`) `{record.path}:{record.line}` "
            f"`{record.scope}`, part of the site labelled at line {label.line}: "
            f"`{code_line(roots[record.package], record.path, record.line)}`"
        )
    if parts:
        w("")
    failed = [scan for scan in scans if scan.rejected or scan.crash]
    w(
        f"Scanning the {len(files)} labelled files took {scan_seconds:.2f} s "
        f"({args.jobs} worker processes); "
        + (
            "files with errors: " + "; ".join(f"{s.path}: {s.rejected or s.crash}" for s in failed)
            if failed
            else "no file failed."
        )
        + "\n"
    )
    if passes:
        render_passes(out, passes, args)
    return "\n".join(out) + "\n"


def render_passes(out: list[str], passes: list[PackagePass], args) -> None:
    w = out.append
    w("## Whole-package pass\n")
    w(
        "Every `.py` file of each package: `scan --rule-set "
        f"{args.rule_set}`, then `apply` into a scratch copy (atomic writes), `py_compile` of every "
        "patched file, and a second `apply` that must change nothing. *Rejected* files are bad "
        "input reported as `file:line:col` (e.g. syntax the parser refuses); *crashes* are "
        "internal errors.\n"
    )
    w(
        "| package | files | sites | not applicable | rejected | crashes | scan | files patched | "
        "sites patched | skipped | covered | apply crashes | compile failures | second apply changes | apply | second apply |"
    )
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in passes:
        w(
            f"| {p.package} {p.version} | {p.files} | {sum(p.sites.values())} | {p.not_applicable} | "
            f"{len(p.rejected)} | {len(p.crashes)} | {p.scan_seconds:.1f} s | {p.changed_files} | "
            f"{p.statuses['patched']} | {p.statuses['skipped']} | {p.statuses['covered']} | "
            f"{len(p.apply_crashes)} | {len(p.compile_failures)} | "
            f"{len(p.second_changed)} ({p.second_crashes} crashes) | {p.apply_seconds:.1f} s | "
            f"{p.second_seconds:.1f} s |"
        )
    w("")
    w("Sites per rule (scan) and patched per rule (apply):\n")
    for p in passes:
        found = ", ".join(f"{rule}: {n}" for rule, n in sorted(p.sites.items())) or "none"
        patched = ", ".join(f"{rule}: {n}" for rule, n in sorted(p.patched_rules.items())) or "none"
        w(f"- {p.package}: found {found}; patched {patched}.")
    w("")
    for p in passes:
        problems = (
            [("crash", c) for c in p.crashes]
            + [("apply crash", c) for c in p.apply_crashes]
            + [("does not compile", c) for c in p.compile_failures]
            + [("changed again by the second apply", c) for c in p.second_changed]
            + [("rejected", c) for c in p.rejected]
        )
        if not problems:
            continue
        w(f"<details><summary>{p.package}: problems</summary>\n")
        for kind, text in problems:
            w(f"- {kind}: {text}")
        w("\n</details>\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rule-set", default="all")
    parser.add_argument("--tolerance", type=int, default=2, help="lines a record may be off")
    parser.add_argument(
        "--labels", type=Path, default=LABELS, help="folder of sites.tsv, files.tsv"
    )
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "coverage.md")
    parser.add_argument("--json", type=Path, help="also write the comparison as JSON here")
    parser.add_argument("--no-package-pass", action="store_true", help="labelled files only")
    args = parser.parse_args()

    files, labels = load_labels(args.labels / "sites.tsv", args.labels / "files.tsv")
    rules = load_rule_set(args.rule_set)
    roots = package_roots(files)
    records, scans, scan_seconds = scan_labelled(files, roots, rules, args.jobs)
    comparison = compare(labels, records, args.tolerance)
    passes = []
    if not args.no_package_pass:
        for package, root in roots.items():
            version = next(f.version for f in files if f.package == package)
            passes.append(package_pass(package, version, root, rules, args.jobs))
            p = passes[-1]
            print(
                f"{package}: {p.files} files, {sum(p.sites.values())} sites, "
                f"{len(p.crashes)} crashes, {p.changed_files} patched files, "
                f"{len(p.compile_failures)} compile failures, {len(p.second_changed)} changed again",
                file=sys.stderr,
            )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        render(args, files, labels, rules, comparison, roots, scans, scan_seconds, passes),
        encoding="utf-8",
    )
    if args.json:
        args.json.write_text(json.dumps(comparison_json(comparison), indent=1), encoding="utf-8")
    matched = len(comparison.matched)
    print(
        f"wrote {args.output}: {len(labels)} labelled sites, {len(records)} found, "
        f"{matched} matched, {len(comparison.missed)} missed, {len(comparison.extra)} extra, "
        f"{len(comparison.parts)} parts of a matched site"
    )
    return 0


def comparison_json(comparison: Comparison) -> dict:
    def label(item: Label) -> dict:
        return {
            k: getattr(item, k) for k in ("package", "path", "line", "family", "split", "static")
        }

    def record(item: Record) -> dict:
        return {k: getattr(item, k) for k in ("package", "path", "line", "family", "rule", "scope")}

    return {
        "matched": [
            {"label": label(a), "record": record(b), "kind": kind}
            for a, b, kind in comparison.matched
        ],
        "missed": [label(item) for item in comparison.missed],
        "extra": [record(item) for item in comparison.extra],
        "parts": [{"label": label(a), "record": record(b)} for a, b in comparison.parts],
    }


if __name__ == "__main__":
    sys.exit(main())
