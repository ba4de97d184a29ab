"""The import hook: patch modules of chosen packages as they are imported.

A finder at the front of ``sys.meta_path`` answers only for names inside a hooked package: it
asks the finders behind it for the real spec and wraps that spec's loader, so the module is
loaded exactly as it would be and then handed to :func:`adopter.runtime.patching.patch_module`
before the importer gets it back. The wrapper puts the real loader back on the module and its
spec before executing it, so nothing later sees the hook. A failure to patch never fails the
import: the module stays original and the reason is logged.

Only packages named explicitly are hooked (``adopter.patch("transformers")``, ``adopter run
--packages``, ``ADOPTER_PACKAGES``; default transformers, timm, diffusers): user code is never
rewritten unless asked.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

DEFAULT_PACKAGES = ("transformers", "timm", "diffusers")
_IMPORTS = threading.local()  # how deep this thread is in hooked imports


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then patches the module it produced."""

    def __init__(self, loader: Any, after: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        _IMPORTS.depth = getattr(_IMPORTS, "depth", 0) + 1
        try:
            self._loader.exec_module(module)
            self._after(module)
        finally:
            _IMPORTS.depth -= 1
        if _IMPORTS.depth == 0:  # the outermost hooked import is done: one line per package
            from .log import summarise

            summarise()

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...
        return getattr(self._loader, name)


class PackageHook(importlib.abc.MetaPathFinder):
    """One finder for all hooked packages; each package has its own options."""

    def __init__(self, patch_module: Callable[[ModuleType, Any], object]) -> None:
        self._patch_module = patch_module
        self.packages: dict[str, Any] = {}  # package -> options
        self._local = threading.local()

    def options_for(self, name: str) -> Any | None:
        """The options of the innermost hooked package holding ``name``, if any."""
        while name:
            options = self.packages.get(name)
            if options is not None:
                return options
            name = name.rpartition(".")[0]
        return None

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        options = self.options_for(fullname)
        if options is None or getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            spec = self._real_spec(fullname, path, target)
        finally:
            self._local.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        if not (spec.origin or "").endswith(".py"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, lambda module: self._after(module, options))
        return spec

    def _real_spec(self, fullname: str, path: Any, target: Any) -> ModuleSpec | None:
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def _after(self, module: ModuleType, options: Any) -> None:
        try:
            self._patch_module(module, options)
        except Exception as error:  # the import itself must succeed
            from .log import LOGGER

            name, kind = module.__name__, type(error).__name__
            LOGGER.warning("left %s unpatched: %s: %s", name, kind, error)


_HOOK: PackageHook | None = None
_LOCK = threading.Lock()


def install(package: str, options: Any, patch_module: Callable[[ModuleType, Any], object]) -> None:
    """Hook ``package`` (and its subpackages) with ``options``."""
    global _HOOK
    if within(package, "adopter"):  # the patching code itself: would recurse
        raise ValueError("adopter's own modules cannot be patched on import")
    with _LOCK:
        if _HOOK is None:
            _HOOK = PackageHook(patch_module)
        _HOOK.packages[package] = options
        if _HOOK not in sys.meta_path:
            sys.meta_path.insert(0, _HOOK)


def uninstall(package: str | None = None) -> list[str]:
    """Stop hooking ``package`` (all packages when ``None``); returns the packages unhooked."""
    with _LOCK:
        if _HOOK is None:
            return []
        names = (
            list(_HOOK.packages)
            if package is None
            else [p for p in _HOOK.packages if within(p, package)]
        )
        for name in names:
            del _HOOK.packages[name]
        if not _HOOK.packages and _HOOK in sys.meta_path:
            sys.meta_path.remove(_HOOK)
        return names


def hooked_packages() -> list[str]:
    return sorted(_HOOK.packages) if _HOOK is not None else []
