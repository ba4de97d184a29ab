"""Where a model file came from, found without importing anything: the installed module it is
a copy of, and the pristine text a patched file was made from.

A folder of model files copied out of a package (``cp -r .../<library>/models my_models``) has no
package above it, so its relative imports (``from ..layers import Mlp``) cannot run as they
stand; it runs as the package it came from instead: the installed file of the same name
whose path shares the longest tail with the copy's, among the libraries verify knows. A file
that ``apply --write`` already patched is compared with its pristine text: the installed
module's, else the text git has at ``HEAD``.

Also the module a file runs as (:func:`module_of`): its package tree's dotted name, or, for a
copy outside any library's tree, the installed module it is a copy of. Read by verify's parent
process, which imports no model code.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .registry import LIBRARIES

__all__ = [
    "Origin",
    "find_origin",
    "git_head_text",
    "module_name_for",
    "module_of",
    "pristine_of",
    "root_for",
]


@dataclass(frozen=True)
class Origin:
    """The installed module a file is (a copy of): its dotted name and its file."""

    module_name: str
    path: Path


def _package_roots(library: str, search: Sequence[str]) -> list[Path]:
    roots = []
    for entry in search:
        root = Path(entry or ".") / library
        if (root / "__init__.py").is_file():
            roots.append(root.resolve())
    return roots


@cache
def _files_by_name(root: Path) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for file in root.rglob("*.py"):
        found.setdefault(file.name, []).append(file)
    return found


def _module_name(path: Path, root: Path) -> str:
    relative = path.relative_to(root.parent).with_suffix("")
    return ".".join(relative.parts)


def _shared_tail(a: Path, b: Path) -> int:
    count = 0
    for left, right in zip(reversed(a.parts), reversed(b.parts)):
        if left != right:
            break
        count += 1
    return count


def find_origin(path: Path, search: Sequence[str] | None = None) -> Origin | None:
    """The installed module ``path`` is a copy of (or is), by file name and path tail; ``None``
    when no library installed on ``search`` (default ``sys.path``) has a file of that name."""
    resolved = path.resolve()
    found: list[tuple[int, Path, Path]] = []
    for library in LIBRARIES:
        for root in _package_roots(library, search if search is not None else sys.path):
            for candidate in _files_by_name(root).get(resolved.name, []):
                found.append((_shared_tail(candidate, resolved), candidate, root))
    if not found:
        return None
    longest = max(tail for tail, _, _ in found)
    tied = [(candidate, root) for tail, candidate, root in found if tail == longest]
    if len(tied) > 1:  # one file name in two libraries: the closer text
        lines = set(_text(resolved).splitlines())
        tied.sort(key=lambda pair: -len(lines & set(_text(pair[0]).splitlines())))
    candidate, root = tied[0]
    return Origin(_module_name(candidate, root), candidate)


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def git_head_text(path: Path) -> str | None:
    """The text git has for ``path`` at ``HEAD``, if ``path`` is tracked in a repository."""
    try:
        done = subprocess.run(
            ["git", "-C", str(path.parent), "show", f"HEAD:./{path.name}"],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    try:
        return done.stdout.decode("utf-8")
    except UnicodeDecodeError:
        return None


def module_name_for(path: Path) -> tuple[str, Path]:
    """The dotted module name of ``path`` and the directory it is importable from.

    Walks up while the directory is a package (has ``__init__.py``): for
    ``.../site-packages/<library>/models/bert/modeling_bert.py`` and equally for the unpacked
    wheel ``.cache/corpus/<version>/<library>/models/bert/modeling_bert.py`` this gives
    ``<library>.models.bert.modeling_bert``; the worker then imports the installed package of
    that name (and only falls back to the given directory when nothing is installed).
    """
    path = path.resolve()
    parts = [path.stem]
    directory = path.parent
    while (directory / "__init__.py").exists():
        parts.append(directory.name)
        directory = directory.parent
    return ".".join(reversed(parts)), directory


def root_for(path: Path, module_name: str) -> Path | None:
    """The import root that makes ``path`` the module ``module_name``, if the path fits."""
    parts = module_name.split(".")
    resolved = path.resolve()
    if resolved.stem != parts[-1]:
        return None
    root = resolved.parent
    for part in reversed(parts[:-1]):
        if root.name != part:
            return None
        root = root.parent
    return root


def module_of(path: Path, given: str | None) -> tuple[str, Path | None]:
    """The module ``path`` runs as, and the import root to add for it: its package tree's
    name, or, for a copy outside any library's tree, the installed module it is a copy of."""
    if given is not None:
        return given, root_for(path, given)
    module_name, root = module_name_for(path)
    if module_name.split(".")[0] not in LIBRARIES:
        origin = find_origin(path)
        if origin is not None:
            return origin.module_name, None
    return module_name, root


def pristine_of(
    path: Path, text: str, patched: Callable[[str], bool]
) -> tuple[Path, str, str] | None:
    """For a file that is ``patched`` (its text calls kernels): ``(original file, original text,
    module name)`` of its pristine source, the installed module's where that is not patched,
    else git's ``HEAD``; ``None`` when neither is found (or both are patched too)."""
    origin = find_origin(path)
    if origin is not None and origin.path.resolve() != path.resolve():
        installed = origin.path.read_text(encoding="utf-8")
        if installed != text and not patched(installed):
            return origin.path, installed, origin.module_name
    head = git_head_text(path)
    if head is not None and head != text and not patched(head):
        module_name = origin.module_name if origin is not None else path.stem
        return path, head, module_name
    return None
