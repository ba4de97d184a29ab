"""The one syntax of a model factory, shared by ``adopter verify`` and ``adopter bench``.

A factory is ``package.module:function`` or ``path/to/file.py:function``. The function takes no
arguments and returns ``(model, inputs)``: an ``nn.Module`` and its example inputs, a tuple of
positional arguments or a dict of keyword arguments. A module name is imported with the current
folder on the import path (appended, so it never shadows an installed module); a file is loaded
from its path under a name of its own, with its folder on the import path for its own imports.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .loading import exec_file

FACTORY_HELP = (
    "module:function or path/to/file.py:function; the function takes no arguments and returns "
    "(model, inputs): an nn.Module and a tuple of positional inputs or a dict of keyword "
    "inputs. Modules are imported with the current folder on the import path."
)

_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class FactoryRef:
    """A parsed factory: exactly one of ``module`` and ``path`` is set."""

    function: str
    """The function's name in its module (``build``, or dotted: ``Zoo.build``)."""
    module: str | None = None
    path: str | None = None
    """The resolved path of a factory given as a file."""

    @property
    def label(self) -> str:
        return f"{self.module or self.path}:{self.function}"


def parse_factory(spec: str) -> FactoryRef:
    """Parse ``module:function`` or ``path/to/file.py:function``; ``ValueError`` says what is
    wrong (a file must exist as a regular file; names must be Python identifiers)."""
    target, separator, function = spec.rpartition(":")
    form = "module:function or path/to/file.py:function"
    if not separator or not target or not function:
        raise ValueError(f"a factory is {form}, got {spec!r}")
    if not _DOTTED.fullmatch(function):
        raise ValueError(f"factory {spec!r}: {function!r} is not a function name")
    if target.endswith(".py") or "/" in target or os.sep in target:
        path = Path(target).expanduser()
        if not path.is_file():
            raise ValueError(f"factory {spec!r}: no such file {target}")
        return FactoryRef(function, path=str(path.resolve()))
    if not _DOTTED.fullmatch(target):
        raise ValueError(f"factory {spec!r}: {target!r} is neither a module name nor a .py file")
    return FactoryRef(function, module=target)


def make_importable(ref: FactoryRef) -> None:
    """Put on ``sys.path`` what importing ``ref`` needs: the current folder for a module name
    (as ``python -m`` would; a console script's path lacks it), the file's folder for a file."""
    folder = str(Path(ref.path).parent) if ref.path is not None else os.getcwd()
    if ref.path is None and "" in sys.path:
        return
    if folder not in sys.path:
        sys.path.append(folder)


def load_factory(ref: FactoryRef, alias: str) -> tuple[Any, ModuleType]:
    """Import ``ref`` and return ``(function, its module)``; a file is executed as module
    ``alias`` (registered in ``sys.modules`` first: ``@dataclass`` and pickling look it up)."""
    make_importable(ref)
    if ref.path is not None:
        module = exec_file(alias, ref.path)
    else:
        module = importlib.import_module(ref.module or "")
    obj: Any = module
    for part in ref.function.split("."):
        obj = getattr(obj, part)
    return obj, module


def resolve_factory(spec: str, alias: str) -> tuple[Any, ModuleType]:
    """``module:function`` or ``path/to/file.py:function`` -> (function, module), the module
    loaded under ``alias`` where it is a file (so both sides of a pair can be loaded)."""
    return load_factory(parse_factory(spec), alias)
