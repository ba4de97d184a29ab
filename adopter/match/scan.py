"""Scanning files and directories: extraction plus matching, in parallel over many files."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from ..dsl.errors import LocatedError
from ..dsl.syntax import Rule
from ..extract.source import SourceError, failure_as_error, read_source
from ..extract.structure import analyse_source
from .explain import Miss, NeverStarted, never_started
from .matcher import Matcher, Site

PARALLEL_THRESHOLD = 8  # files; below it, worker start-up costs more than it saves
T = TypeVar("T")


@dataclass
class FileResult:
    path: str
    sites: list[Site] = field(default_factory=list)
    error: LocatedError | None = None
    misses: list[Miss] = field(default_factory=list)  # only when the matcher explains


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

    @property
    def misses(self) -> list[Miss]:
        """Where rules did not fire and why (a scan with ``explain``), in file order."""
        return [miss for result in self.files for miss in result.misses]

    def explained(self) -> tuple[list[Miss], list[NeverStarted]]:
        """The trace a rule author reads: the misses of rules that started somewhere, and one
        line per rule whose first step matched no call in any file read, with the nearest."""
        read = sum(1 for result in self.files if result.error is None)
        return never_started(self.misses, read)


def collect_python_files(paths: Iterable[str | Path]) -> tuple[list[Path], list[LocatedError]]:
    """Expand directories to their ``*.py`` files (sorted); missing paths, empty arguments
    and folders that cannot be listed become errors.

    Every ``*.py`` entry that is not a folder is kept, FIFOs and broken links included: reading
    it reports what is wrong with it, as for a file named on the command line. Symbolic links
    to folders are not followed (as ``Path.rglob`` did): they could form a cycle.
    """
    files: list[Path] = []
    errors: list[LocatedError] = []
    for raw in paths:
        if str(raw) == "":
            errors.append(SourceError("''", 1, 1, "empty path argument (use . for this folder)"))
            continue
        path = Path(raw)
        if path.is_dir():
            found, unlisted = _python_files_under(path)
            files.extend(found)
            errors.extend(unlisted)
        elif path.exists() or path.is_symlink():
            files.append(path)
        else:
            errors.append(SourceError(str(path), 1, 1, "no such file or directory"))
    return files, errors


def _python_files_under(folder: Path) -> tuple[list[Path], list[LocatedError]]:
    errors: list[LocatedError] = []

    def unlisted(error: OSError) -> None:
        where = error.filename if error.filename is not None else str(folder)
        reason = error.strerror or str(error)
        errors.append(SourceError(str(where), 1, 1, f"cannot list folder: {reason}"))

    files = [
        Path(root, name)
        for root, folders, names in os.walk(folder, onerror=unlisted)
        for name in names
        if name.endswith(".py")
    ]
    # os.walk lists a symbolic link to a folder among the folders: never a file to scan.
    return sorted(files), sorted(errors, key=lambda error: error.path)


def scan_source(text: str, path: str, matcher: Matcher) -> list[Site]:
    structure = analyse_source(text, path, matcher.opaque_methods)
    return matcher.match_file(structure)


# Called after matching with (text, path, sites): a later stage's judgement of the sites (the
# CLI's scan passes the rewrite planner's, which marks what apply could not rewrite).
Judge = Callable[[str, str, list[Site]], None]


def scan_one(path: str, matcher: Matcher, judge: Judge | None = None) -> FileResult:
    """Scan one file. Never raises: whatever goes wrong becomes the file's located error, so a
    worker process always returns a record (and the other files are still scanned)."""
    try:
        text = read_source(path)
        sites = scan_source(text, path, matcher)
        if judge is not None:
            judge(text, path, sites)
        return FileResult(path, sites, misses=list(matcher.misses))
    except Exception as error:  # noqa: BLE001 - see the docstring
        return FileResult(path, error=failure_as_error(path, error))


def strip_details(site: Site) -> Site:
    """Drop the analysis graph of a site before it crosses a process boundary."""
    site.flow, site.steps, site.where_steps = None, [], []
    site.constructions, site.bindings, site.instances, site.alternatives = {}, {}, [], []
    site.call = None
    return site


def _scan_light(path: str, matcher: Matcher, judge: Judge | None = None) -> FileResult:
    result = scan_one(path, matcher, judge)
    for site in result.sites:
        strip_details(site)
    return result


_worker: tuple[Matcher, Callable[[str, Matcher], Any]] | None = None


def _init_worker(rules: list[Rule], work: Callable[[str, Matcher], Any], explain: bool) -> None:
    global _worker
    _worker = (Matcher(rules, explain=explain), work)


def _work_in_worker(path: str) -> Any:
    assert _worker is not None
    matcher, work = _worker
    return work(path, matcher)


def map_files(
    names: list[str],
    rules: list[Rule],
    work: Callable[[str, Matcher], T],
    *,
    jobs: int | None,
    progress: Callable[[T], None] | None = None,
    parallel_work: Callable[[str, Matcher], T] | None = None,
    explain: bool = False,
) -> list[T]:
    """Run ``work(path, matcher)`` over files, in worker processes when there are many (each
    builds its matcher once). ``parallel_work``, a module-level function, is what workers run
    (it may drop what need not cross the process boundary). ``explain`` makes the matchers
    keep their match trace."""
    workers = jobs if jobs is not None else min(os.cpu_count() or 1, 8)
    results: list[T] = []
    if workers <= 1 or len(names) < PARALLEL_THRESHOLD:
        matcher = Matcher(rules, explain=explain)
        for name in names:
            results.append(work(name, matcher))
            if progress:
                progress(results[-1])
        return results
    initargs = (rules, parallel_work or work, explain)
    from concurrent.futures import ProcessPoolExecutor  # only multi-file runs pay for it

    # Largest files first, one at a time: the run then ends on small files instead of waiting
    # for one big file a worker took last. Results come back in the order of ``names``.
    order = sorted(range(len(names)), key=lambda i: -_size(names[i]))
    done: dict[int, T] = {}
    with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=initargs) as pool:
        for index, result in zip(
            order, pool.map(_work_in_worker, [names[i] for i in order]), strict=True
        ):
            done[index] = result
            if progress:
                progress(result)
    return [done[i] for i in range(len(names))]


def _size(name: str) -> int:
    try:
        return os.path.getsize(name)
    except OSError:
        return 0


def scan_paths(
    paths: Iterable[str | Path],
    rules: list[Rule],
    *,
    jobs: int | None = None,
    progress: Callable[[FileResult], None] | None = None,
    keep_details: bool = False,
    explain: bool = False,
    judge: Judge | None = None,
) -> ScanResult:
    """Scan files and directories. ``keep_details`` keeps the matched steps for rewriting
    (forces a single process); ``explain`` records, per file, where rules did not fire and why;
    ``judge`` (a module-level function: workers run it) sees each file's sites after matching."""
    started = time.perf_counter()
    files, errors = collect_python_files(paths)
    results = [FileResult(error.path, error=error) for error in errors]
    names = [str(p) for p in files]
    results += map_files(
        names,
        rules,
        partial(scan_one, judge=judge),
        jobs=1 if keep_details else jobs,
        progress=progress,
        parallel_work=partial(_scan_light, judge=judge),
        explain=explain,
    )
    return ScanResult(results, time.perf_counter() - started)
