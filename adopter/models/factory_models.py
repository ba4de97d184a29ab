"""The models a pair of factories builds, and the code of the user's that they may run.

A factory returns ``(model, inputs)`` (:mod:`.factories`); both of a pair are called under one
seed and cast to the check's dtype. A patched model's kernel calls may sit in any module of
the user's that its code uses, not only in the patched factory's file: the sites of a pair are
the kernel calls in every loaded module of the user's (not adopter's, torch's or the original
factory's) that calls ``adopter.kernels``, narrowed to those the patched model's code holds.
Worker side only: building imports torch.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ..dsl.declared import KERNEL_PACKAGE
from .common import cast_inputs, module_sources, seed_everything, torch_dtype
from .sites import PatchedSite, find_sites

__all__ = ["build_seeded", "dropout_texts", "sites_in", "sites_used_by", "user_modules"]


def build_seeded(factory: Any, seed: int, dtype: str) -> tuple[Any, Any]:
    """``factory()``'s model and inputs, called under ``seed`` and cast to ``dtype``."""
    seed_everything(seed)
    model, inputs = factory()
    chosen = torch_dtype(dtype)
    return model.to(chosen), cast_inputs(inputs, chosen)


def user_modules(patched_module: ModuleType, original_fn: Any) -> list[ModuleType]:
    """The patched factory's module and every other loaded module of the user's (not the
    original factory's, not adopter's or torch's) that calls ``adopter.kernels``."""
    original_module = sys.modules.get(getattr(original_fn, "__module__", "") or "")
    chosen: list[ModuleType] = [patched_module]
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if module is original_module or module in chosen:
            continue
        if name.split(".")[0] in ("adopter", "torch") or not getattr(module, "__file__", None):
            continue
        if _calls_kernels(module):
            chosen.append(module)
    return chosen


def _calls_kernels(module: ModuleType) -> bool:
    return any(
        callable(v) and (getattr(v, "__module__", "") or "").startswith(KERNEL_PACKAGE)
        for v in list(vars(module).values())
    )


def sites_in(modules: list[ModuleType]) -> list[PatchedSite]:
    """The kernel calls in the modules' files; functions named with their file where there
    is more than one file."""
    sites: list[PatchedSite] = []
    seen: set[str] = set()
    for module in modules:
        file = getattr(module, "__file__", None)
        if not file or file in seen or not file.endswith(".py"):
            continue
        seen.add(file)
        try:
            found = find_sites(Path(file).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for site in found:
            site.file = file
            if len(seen) > 1:
                site.function = f"{Path(file).name}:{site.function}"
        sites += found
    return sites


def sites_used_by(model: Any, sites: list[PatchedSite]) -> list[PatchedSite]:
    """The sites that ``model``'s code holds: those in its (sub)modules' classes and their
    bases, and module-level functions whose name that code mentions. A factory file may define
    other patched variants that this model never uses."""
    classes = {c for m in model.modules() for c in type(m).__mro__ if c.__module__ != "builtins"}
    names = {c.__name__ for c in classes}
    texts = []
    for cls in classes:
        try:
            texts.append(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
    mentioned = "\n".join(texts)
    return [
        site
        for site in sites
        if site.cls in names
        or (site.cls is None and site.function.split(":")[-1].split(".")[0] in mentioned)
    ]


def dropout_texts(patched: Any, patched_module: ModuleType) -> list[str]:
    """The sources whose kernels decide whether dropout can be compared in train mode."""
    patched_file = getattr(patched_module, "__file__", None)
    extra = [Path(patched_file).read_text(encoding="utf-8")] if patched_file else []
    return module_sources(patched, extra)
