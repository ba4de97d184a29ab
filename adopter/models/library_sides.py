"""Both sides of a check of one of a library's models, built through the library's adapter.

The library builds the model its way (a registry, a configuration); the second side then gets
the classes of the patched text (:func:`~adopter.models.base.adopt_patched_classes`), and the
first those of the given original where that text is not the installed one. The ``self.<flag>``
attributes a site's guards test (:func:`~adopter.models.sites.attribute_flips`) are set alike on
both. What comes out is a :class:`~adopter.models.interface.Subject` for verify to prove.
Worker side only: the builds import torch and the library.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import Any

from .base import ModelAdapter, NotSmallError, adopt_patched_classes
from .common import cast_inputs, error_line, torch_dtype
from .construction import construction_flips
from .interface import BuildSettings, Subject, Unbuildable, prebuilt_first
from .sites import PatchedSite

__all__ = ["LibrarySides", "set_flags"]


def set_flags(model: Any, flags: dict[str, bool]) -> None:
    """Set each of ``flags`` on every submodule of ``model`` that has it as a boolean."""
    for module in model.modules():
        for name, value in flags.items():
            if isinstance(getattr(module, name, None), bool):
                setattr(module, name, value)


class LibrarySides:
    """How to build each side of one model of ``adapter``'s library for a check of the file
    ``module_name``: ``original`` is the module whose classes the first side gets (``None``:
    the installed one, as built), ``patched`` the patched text's module; ``flags`` are set on
    both sides."""

    def __init__(
        self,
        adapter: ModelAdapter,
        module_name: str,
        original: ModuleType | None,
        patched: ModuleType,
        settings: BuildSettings,
    ) -> None:
        self.adapter, self.module_name = adapter, module_name
        self.original, self.patched = original, patched
        self.settings = settings
        self.flags: dict[str, bool] = {}
        self.overrides: dict[str, Any] = {}  # constructor keywords both sides are built with

    def construction_flips(self, remaining: list[PatchedSite]) -> dict[str, Any]:
        """The constructor keywords that build the guarded attributes of ``remaining`` the
        way their sites need (:func:`~adopter.models.construction.construction_flips`)."""
        return construction_flips(remaining, self._patched_text) if self._patched_text else {}

    @functools.cached_property
    def _patched_text(self) -> str:
        """The patched file's text, read once however many models are checked ("": none)."""
        try:
            return Path(self.patched.__file__ or "").read_text(encoding="utf-8")
        except (OSError, TypeError, UnicodeDecodeError):
            return ""

    def build(self, name: str, patched: bool, entry: str = "forward") -> tuple[Any, Any, dict]:
        """One side of model ``name``: the model, its inputs and what made it small."""
        built = self.adapter.build(
            name, seed=self.settings.seed, entry=entry, overrides=self.overrides
        )
        replacement = self.patched if patched else self.original
        if replacement is not None:
            adopt_patched_classes(built.model, self.module_name, replacement)
        set_flags(built.model, self.flags)
        dtype = torch_dtype(self.settings.dtype)
        return built.model.to(dtype), cast_inputs(built.inputs, dtype), built.settings

    def subject(self, name: str, label: str, entry: str = "forward") -> Subject | Unbuildable:
        """Both sides of model ``name`` through ``entry``, verdicts named ``label``. Train mode
        is compared with dropout off only: whether the kernels draw random numbers as the
        original does is read from the sources of the modules a model is built from, and those
        of a library's model are not gathered here."""
        try:
            original, inputs, settings = self.build(name, False, entry)
        except NotSmallError as exc:
            return Unbuildable(f"skipped: {exc}")
        except Exception as exc:
            return Unbuildable(f"could not build it: {error_line(exc)}")
        built = ", ".join(f"{key}={value}" for key, value in settings.items())
        return Subject(
            label,
            f"built with {built or 'the defaults'}",
            prebuilt_first(original, lambda: self.build(name, False, entry)[0]),
            lambda: self.build(name, True, entry)[0],
            inputs,
            dropout_mode=False,
        )

    def unrun_subject(self, name: str) -> Subject | Unbuildable:
        """Both sides of model ``name`` built small without inputs (never run whole): the host
        of part checks (:func:`~adopter.models.parts.parts_to_check`), for a model that builds
        though none of the inputs tried runs it; or why it does not build."""

        def side(patched: bool) -> Any:
            model = self.adapter.build_unrun(name, seed=self.settings.seed)
            replacement = self.patched if patched else self.original
            if replacement is not None:
                adopt_patched_classes(model, self.module_name, replacement)
            return model.to(torch_dtype(self.settings.dtype))

        try:
            original = side(False)
        except Exception as exc:
            return Unbuildable(f"could not build it: {error_line(exc)}")
        return Subject(
            name,
            "built small, its parts run on their own",
            prebuilt_first(original, lambda: side(False)),
            lambda: side(True),
            None,
            dropout_mode=False,
        )

    def entries_reaching(self, name: str, remaining: list[PatchedSite]) -> list[str]:
        """Model ``name``'s entry points besides ``forward`` that may run a site of
        ``remaining``: a method holding one, or another construction that builds a class
        whose code reaches one."""
        methods = {site.function.rpartition(".")[2] for site in remaining}
        hosts = {host for site in remaining for host in site.reached_from}
        reaching = []
        for entry in self.adapter.entries(name):
            built = self.adapter.entry_classes(name, entry, self.module_name)
            if (entry in methods) if built is None else bool(built & hosts):
                reaching.append(entry)
        return reaching
