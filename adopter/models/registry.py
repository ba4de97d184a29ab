"""Which model libraries have an adapter, found by package name or by a model's name.

Only the library names are known here; an adapter's module (and its library) is imported the
first time it is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache

from .base import ModelAdapter

__all__ = ["ADAPTERS", "LIBRARIES", "adapter_for", "adapter_for_model", "library_of"]

ADAPTERS: dict[str, str] = {
    "timm": "adopter.models.timm:TimmAdapter",
    "diffusers": "adopter.models.diffusers:DiffusersAdapter",
}
"""Library (top-level package) -> ``module:class`` of its adapter."""

LIBRARIES = ("transformers", *ADAPTERS)
"""Every library with an adapter (transformers' is :mod:`adopter.models.transformers`): the
top-level packages a copied model file is looked up in."""


def library_of(module_name: str) -> str | None:
    """The library with an adapter that ``module_name`` belongs to, if any (static)."""
    top = module_name.split(".")[0]
    return top if top in ADAPTERS else None


@cache
def adapter_for(library: str) -> ModelAdapter:
    """The adapter of ``library`` (``KeyError`` when there is none)."""
    module_name, _, class_name = ADAPTERS[library].partition(":")
    adapter = getattr(importlib.import_module(module_name), class_name)()
    assert isinstance(adapter, ModelAdapter)
    return adapter


def adapter_for_model(name: str, libraries: tuple[str, ...] | None = None) -> ModelAdapter | None:
    """The adapter of the first library (of ``libraries``, default all) that is installed and
    has a model called ``name``; imports each library it asks."""
    for library in libraries or tuple(ADAPTERS):
        if importlib.util.find_spec(library) is None:
            continue
        adapter = adapter_for(library)
        if adapter.knows(name):
            return adapter
    return None
