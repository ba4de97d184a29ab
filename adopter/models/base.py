"""What a model library's adapter answers, for ``verify`` and ``bench``: which of the library's
models use a given file, and how to build a small one with inputs that run.

An adapter holds the knowledge of one library (timm's registry, diffusers' configurations) and
nothing of the proof: ``verify`` builds each model twice through the adapter, gives the second
copy the classes of the patched file (:func:`adopt_patched_classes`) and compares the two.
Adapters import their library only inside their methods, so importing this package needs
neither torch nor the library; those methods run where model code may run (the verify worker,
a benchmark), never in a process that only scans.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "MAX_FALLBACK_PARAMETERS",
    "MAX_SMALL_PARAMETERS",
    "BuiltModel",
    "ModelAdapter",
    "ModelCandidate",
    "ModelSurvey",
    "NotSmallError",
    "adopt_patched_classes",
    "built_modules",
    "defined_names",
    "entry_point",
    "library_objects",
    "mentions",
    "modules_naming",
    "worth_building",
]

MAX_SMALL_PARAMETERS = 30_000_000
"""Above this a model is not "small": a CPU comparison of it (about ten forward and backward
passes per side) takes minutes. Adapters skip such a model, naming its size."""


MAX_FALLBACK_PARAMETERS = 120_000_000
"""A class that no small model builds is checked through the smallest model that does, up to
this size (an adapter admits such a model by name, :attr:`ModelCandidate.max_parameters`)."""


class NotSmallError(ValueError):
    """The model cannot be made small enough to check or benchmark by default."""


@dataclass(frozen=True)
class ModelCandidate:
    """A model of a library that may run the code of a file: its name as the library gives it
    (``resnet18``, ``UNet2DConditionModel``), why it is a candidate, and the most parameters
    it may have to be built (more than the small limit only for the smallest builder of a class
    no small model builds)."""

    name: str
    reason: str
    max_parameters: int = MAX_SMALL_PARAMETERS


@dataclass(frozen=True)
class ModelSurvey:
    """What a cheap look at a model found: the classes of one module it builds, its size."""

    classes: frozenset[str]
    parameters: int


@dataclass
class BuiltModel:
    """A built model, its inputs (a tuple of positional or a dict of keyword arguments), and
    what was chosen to make it small (``{"img_size": 112}``), for reports."""

    model: Any
    inputs: Any
    settings: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class ModelAdapter(Protocol):
    """One model library, seen from ``verify`` and ``bench``."""

    library: str
    """The top-level package name (``timm``)."""

    def owns(self, module_name: str) -> bool:
        """Whether ``module_name`` is a module of this library."""
        ...

    def knows(self, name: str) -> bool:
        """Whether ``name`` names a model of this library (``resnet50``)."""
        ...

    def candidates(self, module_name: str, names: set[str]) -> list[ModelCandidate]:
        """The library's models that may run code of ``module_name``, those most likely to
        and smallest first; ``names`` are the classes and functions of the module whose code
        matters (the patched ones)."""
        ...

    def survey(self, name: str, module_name: str) -> ModelSurvey | None:
        """Which classes of ``module_name`` model ``name`` builds and how large it is, found
        cheaply (no weights allocated); ``None`` when that cannot be told without building."""
        ...

    def build(
        self,
        name: str,
        *,
        seed: int = 0,
        full_size: bool = False,
        entry: str = "forward",
        overrides: Mapping[str, Any] | None = None,
    ) -> BuiltModel:
        """Model ``name``, small unless ``full_size``, with inputs that run; raises
        :class:`NotSmallError` when it cannot be made small. ``entry``: one of :meth:`entries`,
        the method the built model's call runs or the other construction built.
        ``overrides``: keywords its construction is given on top of the small setting's."""
        ...

    def build_unrun(self, name: str, *, seed: int = 0) -> Any:
        """Model ``name`` built small as :meth:`build` builds it, but without inputs and never
        run: a host of parts to check on their own where no inputs of the whole run. Raises
        what keeps it from being built small."""
        ...

    def part_inputs(self, part: Any, seed: int) -> Iterator[tuple[str, Any]]:
        """Inputs for a part of one of the library's models taken on its own, made the way the
        library's conventions say (a timestep embedder takes timesteps, not a feature map),
        each with how it is shaped: tried after the shapes its first layers suggest."""
        ...

    def entries(self, name: str) -> list[str]:
        """Ways into model ``name`` besides ``forward`` that run its layers on the same inputs:
        methods (timm's ``forward_intermediates``) and other constructions of it (timm's
        ``features_only``): code only they reach is reached through them."""
        ...

    def entry_classes(self, name: str, entry: str, module_name: str) -> frozenset[str] | None:
        """For an ``entry`` that builds model ``name`` another way, the classes of
        ``module_name`` that build holds (found cheaply, as :meth:`survey` does); ``None`` for
        an entry that is a method of the model as ``forward`` builds it."""
        ...

    def keeping_registries(self) -> AbstractContextManager[None]:
        """While loading a patched copy of a library module: whatever the copy registers
        (timm's ``@register_model``) is undone, so the library keeps building the original."""
        ...


_DEFINITION = re.compile(r"^(?:class|def)\s+([A-Za-z_]\w*)", re.MULTILINE)


def defined_names(text: str) -> set[str]:
    """The top-level classes and functions a module's text defines (a cheap static look)."""
    return set(_DEFINITION.findall(text))


def mentions(text: str, names: set[str]) -> bool:
    """Whether ``text`` names one of ``names`` as a whole word (one pattern for all names: the
    timm survey asks this of every line of every model file)."""
    if not names:
        return False
    return re.search(rf"\b(?:{'|'.join(map(re.escape, sorted(names)))})\b", text) is not None


def modules_naming(
    texts: dict[str, str], own: str, names: set[str], has_models: Callable[[str], bool]
) -> tuple[set[str], set[str]]:
    """The modules of ``texts`` (``key -> text``, ``own`` left out) whose text names one of
    ``names``, and the others that name a helper defined in such a module that has no models
    of its own (``has_models(key)`` false): one step through helpers, read statically."""
    direct = {key for key, text in texts.items() if key != own and mentions(text, names)}
    helper_names = {
        name for key in direct if not has_models(key) for name in defined_names(texts[key])
    }
    if not helper_names:
        return direct, set()
    reached = {
        key
        for key, text in texts.items()
        if key not in direct and key != own and mentions(text, helper_names)
    }
    return direct, reached


def library_objects(model: Any, packages: tuple[str, ...]) -> Iterator[Any]:
    """Every submodule of ``model``, and the plain objects its submodules hold whose class is
    one of ``packages``' (diffusers' attention processors live in an attribute, not as a
    submodule)."""
    import torch
    from torch import nn

    for module in model.modules():
        yield module
        for value in vars(module).values():
            if isinstance(value, (nn.Module, torch.Tensor, dict, list, tuple, str)):
                continue
            if type(value).__module__.split(".")[0] in packages:
                yield value


def built_modules(adapter: ModelAdapter, name: str, *, full_size: bool, seed: int) -> list[str]:
    """The library modules whose classes model ``name`` builds. Built on the meta device (no
    weights allocated, so even the full size costs nothing) and, where the model cannot be
    built there, for real."""
    import torch

    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            model = adapter.build(name, seed=seed, full_size=full_size).model
    except Exception:
        model = adapter.build(name, seed=seed, full_size=full_size).model
    found = {type(obj).__module__ for obj in library_objects(model, (adapter.library,))}
    return sorted(found - {"builtins"})


def entry_point(model: Any, method: str) -> Any:
    """``model`` wrapped so that calling it calls ``model.<method>``; the wrapper's parameters
    are the model's (under ``model.``), so both sides of a comparison wrap alike."""
    from torch import nn

    class EntryPoint(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.model = inner

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.model, method)(*args, **kwargs)

    return EntryPoint(model)


def _patched_class(cls: type, patched_module: ModuleType, made: dict[type, type]) -> type | None:
    """``cls``'s counterpart for ``patched_module``: a class whose methods are those of the
    patched module's class of the same name, with ``cls`` behind them (so ``isinstance``
    against the original still holds). ``None`` where the module has no such class."""
    if "." in cls.__qualname__:
        return None  # a nested class is not looked up by name
    rewritten = getattr(patched_module, cls.__qualname__, None)
    if not isinstance(rewritten, type) or rewritten is cls:
        return None
    if cls not in made:
        made[cls] = _behind(rewritten, cls)(
            cls.__name__, (rewritten, cls), {"__module__": patched_module.__name__}
        )
    return made[cls]


def _behind(rewritten: type, cls: type) -> type:
    """A metaclass (of ``cls``'s kind) whose classes look methods up in ``rewritten`` and its
    bases first and in ``cls`` only after them. With the plain order (``rewritten``, ``cls``,
    their common bases) a ``super()`` call in a rewritten method reaches the original's
    override of the same method before the base's: ``ChannelsLastNorm.forward`` would
    permute twice around ``LayerNorm.forward``, and the patched model fail where the
    original runs."""

    class Behind(type(cls)):  # type: ignore[misc]
        def mro(self) -> list[type]:
            first = list(rewritten.__mro__)
            rest = [base for base in cls.__mro__ if base not in first]
            return [self, *first[:-1], *rest, first[-1]]

    return Behind


def adopt_patched_classes(model: Any, module_name: str, patched_module: ModuleType) -> set[str]:
    """Give every object of ``model`` whose class the module ``module_name`` defines the class
    of the same name from ``patched_module`` (a patched copy of that module's text, or the text
    the caller means by the original where it differs from the installed one); return the
    names of the classes swapped.

    Construction already ran the original code, so parameters, buffers and ``state_dict``
    keys are the original's; only the methods change, which is what a rewrite changes. The
    model is built the library's way (a registry, a configuration) and then adopted, which
    works however deep in the library the file's classes are used.
    """
    packages = (module_name.split(".")[0],)
    made: dict[type, type] = {}
    swapped: set[str] = set()
    for obj in list(library_objects(model, packages)):
        cls = type(obj)
        if cls.__module__ != module_name:
            continue
        patched = _patched_class(cls, patched_module, made)
        if patched is not None:
            obj.__class__ = patched
            swapped.add(cls.__name__)
    return swapped


def worth_building(
    adapter: ModelAdapter, candidate: ModelCandidate, module_name: str, hosts: set[str]
) -> tuple[bool, str]:
    """Whether to build ``candidate`` for a check of ``module_name``, and why: its survey shows
    it building one of ``hosts`` (the classes whose code reaches a site still to run; none: any
    model of the module will do) within the candidate's size, or it cannot be surveyed (then
    only building it tells)."""
    survey = adapter.survey(candidate.name, module_name)
    if survey is None:
        return True, "could not be surveyed"
    if survey.parameters > candidate.max_parameters:
        return False, ""
    if hosts and not survey.classes & hosts:
        return False, ""
    return True, f"builds {', '.join(sorted(survey.classes & hosts)) or 'the module'}"
