"""The apply half of the benchmark: patch the 199 files in a scratch copy, check that every
patched file parses, compiles and imports inside a copy of the installed transformers package,
and that a second apply changes nothing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from adopter.rewrite import SiteStatus, WriteStatus, rewrite_paths, write_rewrites

IMPORT_TIMEOUT = 1200  # seconds for importing all patched modules in one subprocess

# Runs in a child process: the patched package is first on sys.path; nothing of it is imported
# into the benchmark process itself.
_IMPORT_PROBE = r"""
import importlib, json, sys, traceback
results = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
        results[name] = None
    except BaseException as error:
        results[name] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
print(json.dumps(results))
"""


@dataclass
class ApplyReport:
    files: int = 0
    patched_sites: int = 0
    covered: list[tuple[str, int, str, str]] = field(default_factory=list)
    skipped: list[tuple[str, int, str, str]] = field(default_factory=list)  # path, line, rule, why
    changed_files: int = 0
    compiled: int = 0
    compile_failures: list[str] = field(default_factory=list)
    second_run_changes: int = 0
    seconds: float = 0.0
    second_seconds: float = 0.0
    imported: int = 0
    import_failures: dict[str, str] = field(default_factory=dict)
    import_seconds: float = 0.0
    import_skipped: str = ""
    patched_by_rule: Counter = field(default_factory=Counter)


def installed_transformers() -> Path | None:
    """Location of the installed transformers package, found without importing it."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.util as u; s = u.find_spec('transformers'); "
            "print(s.submodule_search_locations[0] if s else '')",
        ],
        capture_output=True,
        text=True,
    )
    location = probe.stdout.strip()
    return Path(location) if location else None


def package_copy(installed: Path, scratch: Path) -> Path:
    """A symlink farm of a transformers package: patched files are written over the links."""
    target = scratch / "site" / "transformers"
    installed = installed.resolve()  # links must not depend on the working directory
    for folder, _, files in os.walk(installed):
        relative = Path(folder).relative_to(installed)
        if "__pycache__" in relative.parts:
            continue
        (target / relative).mkdir(parents=True, exist_ok=True)
        for name in files:
            if name.endswith(".pyc"):
                continue
            (target / relative / name).symlink_to(Path(folder) / name)
    return target


def run_apply(paths: dict[str, Path], rules, jobs: int, import_check: bool) -> ApplyReport:
    report = ApplyReport(files=len(paths))
    scratch = Path(tempfile.mkdtemp(prefix="adopter-apply-"))
    try:
        copies: dict[str, Path] = {}
        for model, path in paths.items():
            copy = scratch / "models" / model / path.name
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
            copies[model] = copy
        started = time.perf_counter()
        result = rewrite_paths([str(p) for p in copies.values()], rules, jobs=jobs)
        for outcome in write_rewrites(result.changed):  # as `apply --write` writes
            if outcome.status is not WriteStatus.WRITTEN:
                raise RuntimeError(f"apply could not write a scratch copy: {outcome}")
        report.seconds = time.perf_counter() - started
        report.changed_files = len(result.changed)
        for item in result.results:
            where = (
                Path(item.site.path).parent.name,
                item.site.line,
                item.site.rule.id,
                item.reason,
            )
            if item.status is SiteStatus.PATCHED:
                report.patched_sites += 1
                report.patched_by_rule[item.site.rule.id] += 1
            elif item.status is SiteStatus.COVERED:
                report.covered.append(where)
            else:
                report.skipped.append(
                    (
                        Path(item.site.path).parent.name,
                        item.site.line,
                        item.site.rule.id,
                        item.reason,
                    )
                )
        for copy in copies.values():
            text = copy.read_text(encoding="utf-8")
            try:
                compile(text, str(copy), "exec", dont_inherit=True)
                report.compiled += 1
            except SyntaxError as error:
                report.compile_failures.append(f"{copy.parent.name}: {error.msg} ({error.lineno})")
        started = time.perf_counter()
        again = rewrite_paths([str(p) for p in copies.values()], rules, jobs=jobs)
        report.second_seconds = time.perf_counter() - started
        report.second_run_changes = len(again.changed)
        if import_check:
            check_imports(copies, scratch, report)
        else:
            report.import_skipped = "not run (--no-import-check)"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def check_imports(copies: dict[str, Path], scratch: Path, report: ApplyReport) -> None:
    """Import each patched module inside a copy of its own transformers package: the installed
    4.34.0, or for a model newer than that (owlv2) the release the benchmark took it from."""
    installed = installed_transformers()
    if installed is None:
        report.import_skipped = "transformers is not installed (pip install -e '.[test]')"
        return
    groups: dict[Path, list[tuple[str, Path]]] = {}
    for model, copy in copies.items():
        root = (
            installed
            if (installed / "models" / model).is_dir()
            else (_original_dir(model).parents[1])
        )
        groups.setdefault(root, []).append((model, copy))
    started = time.perf_counter()
    for number, (root, members) in enumerate(sorted(groups.items())):
        package = package_copy(root, scratch / f"package-{number}")
        modules = []
        for model, copy in members:
            target = package / "models" / model / copy.name
            if target.exists() or target.is_symlink():
                target.unlink()
            shutil.copyfile(copy, target)
            modules.append(f"transformers.models.{model}.{copy.stem}")
        env = {
            **os.environ,
            "PYTHONPATH": str(package.parent),
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
        }
        completed = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE, json.dumps(modules)],
            capture_output=True,
            text=True,
            env=env,
            timeout=IMPORT_TIMEOUT,
            cwd=scratch,
        )
        if completed.returncode != 0:
            report.import_skipped = f"import probe failed: {completed.stderr.strip()[-300:]}"
            return
        outcome = json.loads(completed.stdout.strip().splitlines()[-1])
        for name, error in outcome.items():
            if error is None:
                report.imported += 1
            else:
                report.import_failures[name] = error
    report.import_seconds = time.perf_counter() - started


_ORIGINAL_DIRS: dict[str, Path] = {}


def _original_dir(model: str) -> Path:
    return _ORIGINAL_DIRS[model]


def register_original_dirs(paths: dict[str, Path]) -> None:
    for model, path in paths.items():
        _ORIGINAL_DIRS[model] = path.parent


def _reason_class(reason: str) -> str:
    reason = re.sub(r"lines \d+(?:(?:, |-)\d+)*", "lines N", reason)
    return re.sub(r"line \d+", "line N", re.sub(r"`[^`]*`", "`...`", reason))


def render(report: ApplyReport, jobs: int) -> list[str]:
    out: list[str] = []
    w = out.append
    w("## Apply: patching the benchmark\n")
    w(
        f"Every site the scan finds is rewritten in a scratch copy of the {report.files} files "
        f"(`adopter apply --write`, {jobs} worker processes). The patched files are then compiled, "
        "imported inside a copy of the installed `transformers==4.34.0` package (a subprocess; "
        "`owlv2`, first released in 4.35.0, inside a copy of that release), and patched "
        "again to check that nothing is left to do.\n"
    )
    total = report.patched_sites + len(report.skipped) + len(report.covered)
    share = 100 * report.patched_sites / max(1, total)
    handled = 100 * (report.patched_sites + len(report.covered)) / max(1, total)
    w("| measure | value |")
    w("|---|---|")
    w(f"| sites found by the scan | {total} |")
    w(f"| sites patched | {report.patched_sites} ({share:.1f}%) |")
    w(
        f"| sites covered by an enclosing rewrite (e.g. a softmax inside an attention class that "
        f"paper.1-3 replace) | {len(report.covered)} |"
    )
    w(f"| patched or covered | {handled:.1f}% |")
    w(f"| sites skipped (with a reason) | {len(report.skipped)} |")
    w(f"| files changed | {report.changed_files} of {report.files} |")
    w(f"| patched files that parse and compile | {report.compiled} of {report.files} |")
    if report.import_skipped:
        w(f"| patched modules that import | {report.import_skipped} |")
    else:
        w(
            f"| patched modules that import | {report.imported} of {report.files} "
            f"({report.import_seconds:.0f} s) |"
        )
    w(f"| files changed by a second apply | {report.second_run_changes} |")
    w(f"| wall time, apply (scan + synthesis + atomic writes) | {report.seconds:.2f} s |")
    w(f"| wall time, second apply | {report.second_seconds:.2f} s |")
    w("")
    w(
        "Patched sites per rule: "
        + ", ".join(f"{rule}: {count}" for rule, count in sorted(report.patched_by_rule.items()))
        + ".\n"
    )
    if report.compile_failures:
        w("**Files that do not compile:** " + "; ".join(report.compile_failures) + "\n")
    if report.import_failures:
        w("**Modules that do not import:**\n")
        for name, error in sorted(report.import_failures.items()):
            w(f"- `{name}`: {error}")
        w("")
    w("### Skipped sites\n")
    reasons = Counter(_reason_class(reason) for *_, reason in report.skipped)
    w("| reason | sites |")
    w("|---|---|")
    for reason, count in reasons.most_common():
        w(f"| {reason} | {count} |")
    w("")
    w("<details><summary>Every skipped or covered site</summary>\n")
    for model, line, rule, reason in sorted(report.skipped + report.covered):
        w(f"- `{model}:{line}` {rule}: {reason}")
    w("\n</details>\n")
    return out
