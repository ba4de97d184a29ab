"""Fixtures for the runtime tests: a small model package of our own, written into tmp_path and
imported from there, a private cache folder per test, and everything unpatched afterwards."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import adopter.runtime as runtime
from adopter.runtime import patching


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch) -> Iterator[Path]:
    folder = tmp_path / "cache"
    monkeypatch.setenv("ADOPTER_CACHE_DIR", str(folder))
    for name in (
        "ADOPTER_PACKAGES",
        "ADOPTER_RULES",
        "ADOPTER_SELECT",
        "ADOPTER_EXCLUDE",
        "ADOPTER_VERIFY",
    ):
        monkeypatch.delenv(name, raising=False)
    yield folder
    runtime.unpatch()
    patching._CACHES.clear()


@pytest.fixture
def make_package(tmp_path) -> Iterator[Callable[..., Path]]:
    """``make_package("pkg", {"blocks.py": source})``: a package importable as ``pkg``."""
    root = tmp_path / "site"
    created: list[str] = []

    def make(name: str, files: dict[str, str]) -> Path:
        package = root / name
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").touch()
        for filename, source in files.items():
            (package / filename).write_text(textwrap.dedent(source).lstrip(), encoding="utf-8")
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        created.append(name)
        importlib.invalidate_caches()
        return package

    yield make
    if str(root) in sys.path:
        sys.path.remove(str(root))
    for name in created:
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]
