"""``apply`` over files: scan, plan, rewrite, and (optionally) write atomically."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ..dsl.errors import LocatedError
from ..dsl.syntax import Rule
from ..extract.source import SourceError, parse_source, read_source
from ..extract.structure import FileAnalysis
from ..match.matcher import Matcher
from ..match.scan import collect_python_files, map_files, strip_details
from .apply import FileRewrite, SiteResult, rewrite_source


def rewrite_text(text: str, path: str, matcher: Matcher, *, modular: bool = False) -> FileRewrite:
    """The patched text of one file (parsed once; never imported). ``modular``: patch
    transformers' ``modular_*.py`` sources rather than the ``modeling_*.py`` generated from
    them (the default patches what runs)."""
    tree = parse_source(text, path)
    structure = FileAnalysis(tree, path, matcher.opaque_methods, text).analyse()
    return rewrite_source(text, path, matcher.match_file(structure), tree, modular=modular)


def rewrite_file(path: str, matcher: Matcher, modular: bool = False) -> FileRewrite:
    try:
        return rewrite_text(read_source(path), path, matcher, modular=modular)
    except LocatedError as error:
        return FileRewrite(path, "", "", error=str(error))
    except RecursionError:
        return FileRewrite(path, "", "", error=f"{path}:1:1: source nested too deeply")


def _rewrite_light(path: str, matcher: Matcher, modular: bool = False) -> FileRewrite:
    rewrite = rewrite_file(path, matcher, modular)
    for result in rewrite.results:
        strip_details(result.site)
    return rewrite


@dataclass
class ApplyResult:
    files: list[FileRewrite]
    seconds: float
    errors: list[str] = field(default_factory=list)

    @property
    def results(self) -> list[SiteResult]:
        return [result for rewrite in self.files for result in rewrite.results]

    @property
    def changed(self) -> list[FileRewrite]:
        return [rewrite for rewrite in self.files if rewrite.error is None and rewrite.changed]


def rewrite_paths(
    paths: Iterable[str | Path],
    rules: list[Rule],
    *,
    jobs: int | None = None,
    progress: Callable[[FileRewrite], None] | None = None,
    modular: bool = False,
) -> ApplyResult:
    started = time.perf_counter()
    files, missing = collect_python_files(paths)
    errors = [str(error) for error in missing]
    names = [str(p) for p in files]
    rewrites = map_files(
        names,
        rules,
        partial(rewrite_file, modular=modular),
        jobs=jobs,
        progress=progress,
        parallel_work=partial(_rewrite_light, modular=modular),
    )
    errors += [rewrite.error for rewrite in rewrites if rewrite.error]
    return ApplyResult(rewrites, time.perf_counter() - started, errors)


def write_atomically(path: str | Path, text: str) -> None:
    """Replace a file's content all at once: a temporary file in the same folder, flushed,
    then renamed over the original (keeping its permissions). A failure leaves it untouched."""
    target = Path(path)
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
    handle, temporary = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".adopter", dir=target.parent
    )
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


__all__ = [
    "ApplyResult",
    "FileRewrite",
    "SiteResult",
    "SourceError",
    "rewrite_file",
    "rewrite_paths",
    "rewrite_text",
    "write_atomically",
]
