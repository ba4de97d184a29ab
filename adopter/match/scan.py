"""Scanning files and directories: extraction plus matching, in parallel over many files."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..dsl.errors import LocatedError
from ..dsl.syntax import Rule
from ..extract.source import SourceError, read_source
from ..extract.structure import analyse_source
from .matcher import Matcher, Site

PARALLEL_THRESHOLD = 8  # files; below it, worker start-up costs more than it saves


@dataclass
class FileResult:
    path: str
    sites: list[Site] = field(default_factory=list)
    error: LocatedError | None = None


@dataclass
class ScanResult:
    files: list[FileResult]
    seconds: float

    @property
    def sites(self) -> list[Site]:
        return [site for result in self.files for site in result.sites if site.applicable]

    @property
    def not_applicable(self) -> list[Site]:
        return [site for result in self.files for site in result.sites if not site.applicable]

    @property
    def errors(self) -> list[LocatedError]:
        return [result.error for result in self.files if result.error is not None]


def collect_python_files(paths: Iterable[str | Path]) -> tuple[list[Path], list[LocatedError]]:
    """Expand directories to their ``*.py`` files (sorted); missing paths become errors."""
    files: list[Path] = []
    errors: list[LocatedError] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*.py") if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            errors.append(SourceError(str(path), 1, 1, "no such file or directory"))
    return files, errors


def scan_source(text: str, path: str, matcher: Matcher) -> list[Site]:
    structure = analyse_source(text, path, matcher.opaque_methods)
    return matcher.match_file(structure)


def scan_one(path: str, matcher: Matcher) -> FileResult:
    try:
        return FileResult(path, scan_source(read_source(path), path, matcher))
    except LocatedError as error:
        return FileResult(path, error=error)
    except RecursionError:
        return FileResult(path, error=SourceError(path, 1, 1, "source nested too deeply"))


_worker_matcher: Matcher | None = None


def _init_worker(rules: list[Rule]) -> None:
    global _worker_matcher
    _worker_matcher = Matcher(rules)


def _scan_in_worker(path: str) -> FileResult:
    assert _worker_matcher is not None
    result = scan_one(path, _worker_matcher)
    for site in result.sites:  # the flow graph stays in the worker; records suffice
        site.flow = None
        site.steps = []
        site.where_steps = []
        site.constructions = {}
        site.bindings = {}
    return result


def scan_paths(
    paths: Iterable[str | Path],
    rules: list[Rule],
    *,
    jobs: int | None = None,
    progress: Callable[[FileResult], None] | None = None,
    keep_details: bool = False,
) -> ScanResult:
    """Scan files and directories. ``keep_details`` keeps the matched steps for rewriting
    (forces a single process)."""
    started = time.perf_counter()
    files, errors = collect_python_files(paths)
    results = [FileResult(error.path, error=error) for error in errors]
    names = [str(p) for p in files]
    workers = jobs if jobs is not None else min(os.cpu_count() or 1, 8)
    if keep_details or workers <= 1 or len(names) < PARALLEL_THRESHOLD:
        matcher = Matcher(rules)
        for name in names:
            result = scan_one(name, matcher)
            results.append(result)
            if progress:
                progress(result)
    else:
        with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(rules,)) as pool:
            for result in pool.map(_scan_in_worker, names, chunksize=4):
                results.append(result)
                if progress:
                    progress(result)
    return ScanResult(results, time.perf_counter() - started)
