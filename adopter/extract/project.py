"""Helpers in other files of the package on disk, read statically.

A model file builds layers through factories defined elsewhere in its package: timm's
``create_conv2d`` (``layers/create_conv2d.py``) returns an ``nn.Conv2d`` (or a same-padding /
mixed / conditional variant), ``get_norm_layer(nn.BatchNorm2d)`` hands back the class it is
given, diffusers' blocks derive from a ``ModelMixin`` that is an ``nn.Module``. When an import
names a file of the same package tree (a relative import, or an absolute one that starts with
the package's own name), that file is parsed (never imported) and the definition is looked up,
following re-exports through ``__init__.py`` files. Each file is parsed once per process; what a
factory returns is summarised once per argument pattern.

Sites stay where the user edits: a construction found through a factory is reported at the
factory *call* in the scanned file.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .names import ImportTable
from .source import SourceError, decode_source, parse_source, read_source_bytes

MAX_REEXPORT_DEPTH = 4


@dataclass
class ModuleSource:
    """One parsed file of the package: its imports and top-level definitions."""

    path: Path
    imports: ImportTable
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    values: dict[str, ast.expr] = field(default_factory=dict)  # NAME = expression
    digest: str = ""  # sha256 of the bytes parsed


# The files of the package an analysis read, while one is recorded: path -> sha256 of the bytes
# it used (None: looked for and absent, or unreadable). The runtime cache stores this with a
# rewrite, so an edit to a helper in another file invalidates the rewrite of the file using it.
_READS: ContextVar[dict[str, str | None] | None] = ContextVar("adopter_project_reads", default=None)


@contextlib.contextmanager
def recording_reads() -> Iterator[dict[str, str | None]]:
    """Record the package files the analysis reads inside the block (see :data:`_READS`)."""
    reads: dict[str, str | None] = {}
    token = _READS.set(reads)
    try:
        yield reads
    finally:
        _READS.reset(token)


def _note_read(path: Path, digest: str | None) -> None:
    reads = _READS.get()
    if reads is not None:
        reads.setdefault(str(path), digest)


def file_digest(path: str | Path) -> str | None:
    """sha256 of a file's bytes; ``None`` when it cannot be read (absent, a folder, ...)."""
    try:
        return hashlib.sha256(read_source_bytes(path)).hexdigest()
    except SourceError:
        return None


def load_module(path: Path) -> ModuleSource | None:
    """Parse a file of the package (``None`` when it cannot be read or parsed). Parsed once
    per version of the file: an edited file (new size, time or inode) is parsed again."""
    try:
        info = os.stat(path)
        signature = (info.st_mtime_ns, info.st_size, info.st_ino)
    except OSError:
        signature = None
    module = _load_module(path, signature)
    _note_read(path, module.digest if module is not None else file_digest(path))
    return module


@lru_cache(maxsize=512)
def _load_module(path: Path, signature: tuple[int, int, int] | None) -> ModuleSource | None:
    try:
        data = read_source_bytes(path)
        tree = parse_source(decode_source(data, str(path)), str(path))
    except (SourceError, RecursionError):
        return None
    module = ModuleSource(path=path, imports=ImportTable(), digest=hashlib.sha256(data).hexdigest())
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module.imports.add(node)
        elif isinstance(node, ast.FunctionDef):
            module.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            module.classes[node.name] = node
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            if isinstance(node.targets[0], ast.Name):
                module.values[node.targets[0].id] = node.value
        elif isinstance(node, (ast.If, ast.Try)):
            pending.extend(node.body)
            pending.extend(getattr(node, "orelse", []))
            for handler in getattr(node, "handlers", []):
                pending.extend(handler.body)
    return module


@lru_cache(maxsize=256)
def package_root(directory: Path) -> Path | None:
    """The directory that holds the top package of ``directory`` (``None`` outside one)."""
    if not (directory / "__init__.py").is_file():
        return None
    top = directory
    while (top.parent / "__init__.py").is_file():
        top = top.parent
    return top.parent


@dataclass(frozen=True)
class Definition:
    """A top-level function, class or value of a file of the package."""

    module: ModuleSource
    node: ast.AST
    name: str


class Project:
    """Resolves the names one file imports to definitions in other files of its package."""

    def __init__(self, path: str) -> None:
        file = Path(path)
        self.file = file.resolve() if file.is_file() else None
        self.root = package_root(self.file.parent) if self.file is not None else None

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def module_file(self, current: Path, level: int, module: str) -> Path | None:
        """The file an ``import`` from ``current`` names, when it is inside the package."""
        if self.root is None:
            return None
        if level:
            base = current.parent
            for _ in range(level - 1):
                base = base.parent
        else:
            top = module.split(".")[0]
            if not (self.root / top / "__init__.py").is_file():
                return None
            base = self.root
        parts = [part for part in module.split(".") if part]
        target = base.joinpath(*parts) if parts else base
        try:
            target.relative_to(self.root)
        except ValueError:
            return None
        if (target / "__init__.py").is_file():
            return target / "__init__.py"
        candidate = target.with_suffix(".py")
        if candidate.is_file():
            return candidate
        _note_read(candidate, None)  # a file created here later would change what is found
        return None

    def lookup(self, imports: ImportTable, current: Path, name: str) -> Definition | None:
        """The definition behind a name that ``current`` imports with ``from x import name``."""
        origin = imports.origins.get(name)
        if origin is None:
            return None
        level, module, imported = origin
        return self._find(current, level, module, imported, 0)

    def _find(
        self, current: Path, level: int, module: str, name: str, depth: int
    ) -> Definition | None:
        if depth > MAX_REEXPORT_DEPTH:
            return None
        path = self.module_file(current, level, module)
        source = load_module(path) if path is not None else None
        if source is None:
            # ``from .layers import create_conv2d`` may name a submodule and a function of it
            return None
        for table in (source.functions, source.classes, source.values):
            if name in table:
                return Definition(source, table[name], name)
        origin = source.imports.origins.get(name)
        if origin is not None:  # re-exported: ``from .create_conv2d import create_conv2d``
            return self._find(source.path, origin[0], origin[1], origin[2], depth + 1)
        return None

    def lookup_in(self, module: ModuleSource, name: str) -> Definition | None:
        """A name as seen from another file of the package (its own definition or import)."""
        for table in (module.functions, module.classes, module.values):
            if name in table:
                return Definition(module, table[name], name)
        origin = module.imports.origins.get(name)
        if origin is None:
            return None
        return self._find(module.path, origin[0], origin[1], origin[2], 0)


@lru_cache(maxsize=256)
def project_for(path: str) -> Project:
    return Project(path)
