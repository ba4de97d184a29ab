"""diffusers: the model classes (``ModelMixin`` subclasses) that may use a file, each built
small from its ``__init__`` defaults, with inputs from its ``forward`` signature.

Which classes: those the file defines, then those of every ``diffusers.models`` module whose
text names one of the file's patched classes or functions, then (one step further) of those
naming a helper module's functions that name them (``get_down_block`` builds
``CrossAttnDownBlock2D``, which builds ``ResnetBlock2D``).

Small: :mod:`.diffusers_shrink` gives settings that divide every width by one factor (so
heads x head dimension, rotary axes and norm groups stay related), cut depths, and fill the
arguments without defaults; the first few that build on the meta device within
:data:`~adopter.models.base.MAX_SMALL_PARAMETERS` are tried for real. Inputs:
:mod:`.diffusers_inputs` makes them from the ``forward`` signature and the configuration in
a few layouts of the sample (a latent image, a short video, tokens, a 1-D signal) and fits
their widths to the layers that take them. What does not run in any is reported with the
model's error, not guessed further.
"""

from __future__ import annotations

import functools
import importlib
import re
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .base import (
    MAX_SMALL_PARAMETERS,
    BuiltModel,
    ModelCandidate,
    ModelSurvey,
    NotSmallError,
    entry_point,
    library_objects,
    mentions,
    modules_naming,
)
from .common import call_model, error_line
from .diffusers_blocks import split_variant, variant_config, variant_names
from .diffusers_inputs import LAYOUTS, Layout, fit_inputs, make_inputs
from .diffusers_shrink import Setting, init_defaults, settings_for
from .surveys import (
    SurveyStore,
    module_survey,
    stored_look,
    survey_budget,
    surveyed_candidates,
)

__all__ = ["DiffusersAdapter", "make_inputs", "small_config"]

MAX_CANDIDATES = 30
SURVEY_BUDGET = 250
"""Fresh meta-device builds one file's candidate search may make (a count: the same choice on a
loaded machine as on a quiet one)."""
CHOICES_PER_CLASS = 3
"""Surveyed classes that build a patched class before the search for it stops."""
SETTINGS_TO_RUN = 3
"""Small settings that built on the meta device a model is run at before it is given up."""
SHRINK_VERSION = 2
"""Bumped when the small settings change, so surveys made at other sizes are not reused."""


VARIANTS_PER_BLOCK = 2
"""Models built with a block no default configuration uses, per such block."""
MAX_VARIANTS = 8
_CLASS_NAME = re.compile(r"^class\s+(\w+)", re.MULTILINE)
_CLASS = re.compile(r"^class\s+(\w+)\(([^)]*)\)", re.MULTILINE)
"""A top-level class definition and its bases' text."""


def small_config(cls: type) -> dict[str, Any]:
    """The keyword arguments of the first small setting of ``cls`` (see
    :func:`~adopter.models.diffusers_shrink.settings_for`)."""
    return settings_for(cls)[0].config


def _module_text(module_name: str) -> str:
    """The source text of an installed module, read without importing it ("" if none)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ""
    return Path(spec.origin).read_text(encoding="utf-8")


class DiffusersAdapter:
    """The :class:`~adopter.models.base.ModelAdapter` of diffusers."""

    library = "diffusers"

    def owns(self, module_name: str) -> bool:
        return module_name == "diffusers" or module_name.startswith("diffusers.")

    def _class(self, name: str) -> type | None:
        """A model class by its name (``UNet2DConditionModel``) or ``module:Class``, or of a
        variant of one (``module:Class[up_block_types=SkipUpBlock2D]``)."""
        module_name, _, class_name = split_variant(name)[0].rpartition(":")
        try:
            module = importlib.import_module(module_name or "diffusers")
            found = getattr(module, class_name, None)
        except Exception:
            return None
        from diffusers import ModelMixin

        return found if isinstance(found, type) and issubclass(found, ModelMixin) else None

    def knows(self, name: str) -> bool:
        return self._class(name) is not None

    # -- which models ------------------------------------------------------------------------
    @functools.cache  # noqa: B019 - one adapter per process
    def _texts(self) -> dict[str, str]:
        """The text of every module of diffusers that may define or use a model: models
        live in ``diffusers.models`` and in pipelines' own modules
        (``pipelines/flux/modeling_flux.py``). Package ``__init__`` files and ``utils``
        (whose dummy objects name every class) only re-export names, so they are left out."""
        import diffusers

        root = Path(diffusers.__file__).parent
        return {
            ".".join(("diffusers", *path.relative_to(root).with_suffix("").parts)): path.read_text(
                encoding="utf-8"
            )
            for path in sorted(root.rglob("*.py"))
            if not {"__pycache__", "utils"} & set(path.relative_to(root).parts)
            and path.name != "__init__.py"
        }

    @functools.cache  # noqa: B019 - one adapter per process
    def _model_names(self) -> frozenset[str]:
        """The names of diffusers' model classes, read statically: ``ModelMixin`` and every
        class whose bases name one of them (``class AudioLDM2UNet2DConditionModel(
        UNet2DConditionModel)``), to a fixed point."""
        bases: dict[str, set[str]] = {}  # one name, several definitions (dummy objects)
        for text in self._texts().values():
            for name, listed in _CLASS.findall(text):
                bases.setdefault(name, set()).update(re.findall(r"\w+", listed))
        models = {"ModelMixin"}
        while True:
            grown = {name for name, named in bases.items() if named & models} | models
            if grown == models:
                return frozenset(models - {"ModelMixin"})
            models = grown

    def _model_classes(self, module_name: str, text: str) -> list[str]:
        """``module:Class`` of the model classes a module's text defines."""
        models = self._model_names()
        return [f"{module_name}:{name}" for name, _ in _CLASS.findall(text) if name in models]

    def candidates(self, module_name: str, names: set[str]) -> list[ModelCandidate]:
        """The model classes to check ``module_name``'s ``names`` through: a small covering set
        of those that a meta-device build at the small configuration shows building the file's
        patched classes (attention processors included), then the others that build them,
        smallest first; classes that could not be surveyed after those. The text of
        ``diffusers.models`` says which classes may (:meth:`_ranked`)."""
        own_text = _module_text(module_name)
        ranked = self._ranked(module_name, names)
        order, builds = surveyed_candidates(
            ranked,
            own_text,
            names,
            self._meta_look,
            self._store(),
            module_name,
            budget=survey_budget(SURVEY_BUDGET),
            choices=CHOICES_PER_CLASS,
            max_parameters=MAX_SMALL_PARAMETERS,
        )
        if builds is not None:
            surveyed = sum(1 for model, _ in order if model in builds)
            variants = self._variants(module_name, names, own_text, ranked, builds)
            order = [*order[:surveyed], *variants, *order[surveyed:]]
        return [ModelCandidate(model, why) for model, why in order[:MAX_CANDIDATES]]

    def _variants(
        self,
        module_name: str,
        names: set[str],
        own_text: str,
        ranked: list[tuple[str, str]],
        builds: Any,
    ) -> list[tuple[str, str]]:
        """Variants (:mod:`.diffusers_blocks`) for the patched classes no surveyed default
        configuration builds, of the surveyed models that build some class of the file (so
        use its factories): at most :data:`VARIANTS_PER_BLOCK` per class, smallest first."""
        defined = set(_CLASS_NAME.findall(own_text))
        missing = (names & defined) - set().union(*builds.values())
        store = self._store()
        users: list[tuple[int, str]] = []
        for model, _ in ranked:
            look = self._meta_look(model) if model in store else None
            if look and module_name in look[0] and look[1] <= MAX_SMALL_PARAMETERS:
                users.append((look[1], model))
        found: list[tuple[str, str]] = []
        for block in sorted(missing):
            made = [
                variant
                for _, model in sorted(users)
                if (cls := self._class(model)) is not None
                for variant in variant_names(model, init_defaults(cls), {block}, own_text)
            ]
            found += [
                (v, f"built with {block}, which no default configuration uses")
                for v in made[:VARIANTS_PER_BLOCK]
            ]
        return found[:MAX_VARIANTS]

    def _ranked(self, module_name: str, names: set[str]) -> list[tuple[str, str]]:
        """Model classes that may build ``names``, with why: those the file defines, then those
        of modules naming them, then of modules reaching them through a helper."""
        texts = self._texts()
        chosen: dict[str, str] = {}
        own = texts.get(module_name)
        if own is not None:
            for model in self._model_classes(module_name, own):
                chosen.setdefault(model, f"defined in {module_name}")
        direct, reached = modules_naming(
            texts, module_name, names, lambda m: bool(self._model_classes(m, texts[m]))
        )
        if own is not None and not self._model_classes(module_name, own):
            # the file's own factories (``get_up_block``) reach its classes by name too
            factories = set(re.findall(r"^def\s+(\w+)", own, re.MULTILINE))
            reached |= {
                m for m, text in texts.items() if m != module_name and mentions(text, factories)
            } - direct
        for modules, why in ((direct, "names"), (reached, "builds through a helper that names")):
            for module in sorted(modules):
                for model in self._model_classes(module, texts[module]):
                    chosen.setdefault(model, f"its module {why} {', '.join(sorted(names))[:80]}")
        return list(chosen.items())

    @functools.cache  # noqa: B019 - one adapter per process
    def _store(self) -> SurveyStore:
        import diffusers

        return SurveyStore("diffusers", f"{diffusers.__version__}-s{SHRINK_VERSION}")

    def survey(self, name: str, module_name: str) -> ModelSurvey | None:
        return module_survey(self._meta_look, name, module_name)

    def _meta_look(self, name: str) -> tuple[dict[str, list[str]], int] | None:
        """Model class ``name`` built at its small configuration on the meta device (no
        weights allocated): the diffusers classes it builds per module (its attention
        processors included) and its parameter count; ``None`` where it cannot be built so.
        Kept in the survey store, so each class is built once per diffusers version."""
        return stored_look(self._store(), name, self._meta_build)

    def _meta_build(self, name: str) -> dict[str, Any] | None:
        try:
            viable = self._viable(name)
        except Exception:  # no small setting builds: the check will say why
            return None
        if not viable:
            return None
        _, model = viable[0]
        by_module: dict[str, set[str]] = {}
        for obj in library_objects(model, ("diffusers",)):
            by_module.setdefault(type(obj).__module__, set()).add(type(obj).__name__)
        return {
            "modules": {module: sorted(classes) for module, classes in by_module.items()},
            "parameters": sum(p.numel() for p in model.parameters()),
        }

    @functools.cache  # noqa: B019 - one adapter per process
    def _viable(self, name: str) -> list[tuple[Setting, Any]]:
        """The settings of model ``name`` that build on the meta device (no weights) within
        :data:`MAX_SMALL_PARAMETERS`, the first :data:`SETTINGS_TO_RUN`, with the first's
        model; raises what stopped the first setting where none does."""
        cls = self._class(name)
        if cls is None:
            raise ValueError(f"no diffusers model class {name!r}")
        import torch

        viable: list[tuple[Setting, Any]] = []
        first: Exception | None = None
        blocks = variant_config(init_defaults(cls), split_variant(name)[1])
        for setting in settings_for(cls):
            setting = Setting(setting.label, {**setting.config, **blocks})
            try:
                with warnings.catch_warnings(), torch.device("meta"):
                    warnings.simplefilter("ignore")
                    model = cls(**setting.config)
            except Exception as exc:  # the class's own complaint about this setting
                first = first or exc
                continue
            size = sum(p.numel() for p in model.parameters())
            if size > MAX_SMALL_PARAMETERS:
                first = first or NotSmallError(
                    f"{name} has {size:,} parameters at its smallest setting that builds "
                    f"({setting.label})"
                )
                continue
            viable.append((setting, model if not viable else None))
            if len(viable) >= SETTINGS_TO_RUN:
                break
        if not viable and first is not None:
            raise first
        return viable

    # -- building ----------------------------------------------------------------------------
    @functools.cache  # noqa: B019 - one adapter per process
    def _small(self, name: str) -> tuple[Setting, Layout]:
        """The small setting and input layout that ran once: the first of the viable settings
        (:meth:`_viable`) with the first layout of the sample whose fitted inputs run. Raises
        the first error (of the most promising setting and layout) where none runs."""
        import torch

        failures: list[tuple[Exception, str, str]] = []
        for setting, _ in self._viable(name):
            model = self._construct(name, setting, seed=0).eval()
            for layout in LAYOUTS:
                try:
                    with torch.no_grad():
                        _, fitted = fit_inputs(model, 0, layout, call_model)
                    return setting, fitted
                except Exception as exc:  # the model's own error, reported if none runs
                    failures.append((exc, setting.label, layout.label))
        if not failures:
            raise ValueError(f"no small setting of {name} builds")
        raise DoesNotRun(_failure_text(failures))

    def _construct(
        self,
        name: str,
        setting: Setting | None,
        *,
        seed: int,
        overrides: Mapping[str, Any] | None = None,
    ) -> Any:
        import torch

        cls = self._class(name)
        if cls is None:
            raise ValueError(f"no diffusers model class {name!r}")
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = setting.config if setting is not None else {}
            return cls(**{**config, **(overrides or {})})

    def build(
        self,
        name: str,
        *,
        seed: int = 0,
        full_size: bool = False,
        entry: str = "forward",
        overrides: Mapping[str, Any] | None = None,
    ) -> BuiltModel:
        # raises what keeps it from running small, once
        setting, layout = self._small(name)
        given = dict(overrides or {})
        if full_size:  # the layout of the small run; its fitted widths are the small ones
            model = self._construct(name, None, seed=seed, overrides=given)
            inputs = make_inputs(model, seed, Layout(layout.kind, layout.frames))
            settings: dict[str, Any] = {**given, "layout": layout.label}
        else:
            model = self._construct(name, setting, seed=seed, overrides=given)
            inputs = make_inputs(model, seed, layout)
            settings = {**setting.config, **given, "layout": layout.label}
        if entry != "forward":
            model = entry_point(model, entry)
        return BuiltModel(model, inputs, settings)

    def build_unrun(self, name: str, *, seed: int = 0) -> Any:
        """The first small setting that builds on the meta device (:meth:`_viable`), built for
        real: its inputs need not run (a model whose forward takes what only its pipeline makes
        still holds attention and feed-forward parts that take plain tensors)."""
        viable = self._viable(name)
        if not viable:
            raise ValueError(f"no small setting of {name} builds")
        return self._construct(name, viable[0][0], seed=seed)

    def part_inputs(self, part: Any, seed: int) -> Iterator[tuple[str, Any]]:
        """The inputs a model of the part's ``forward`` signature would get, by the role each
        argument's name says (a timestep embedder's ``t``), in each layout of the sample."""
        for layout in LAYOUTS:
            try:
                inputs = make_inputs(part, seed, layout)
            except ValueError:  # an argument no role makes: no layout will
                return
            shapes = ", ".join(
                f"{key}={'x'.join(map(str, value.shape))}"
                for key, value in inputs.items()
                if hasattr(value, "shape")
            )
            yield f"{shapes} ({layout.label}, by role)", inputs

    def entries(self, name: str) -> list[str]:
        return []

    def entry_classes(self, name: str, entry: str, module_name: str) -> frozenset[str] | None:
        return None  # no entries besides forward

    def keeping_registries(self) -> Any:
        """diffusers registers nothing when a module is loaded."""
        import contextlib

        return contextlib.nullcontext()


class DoesNotRun(RuntimeError):
    """No small setting of a model runs on any layout of its inputs."""


def _failure_text(failures: list[tuple[Exception, str, str]]) -> str:
    """The errors of the runs tried (error, setting, layout): the first setting's, each error
    once with the layouts it came at, then how many runs at other settings failed."""
    first = failures[0][1]
    shown: dict[str, list[str]] = {}
    for exc, setting, layout in failures:
        if setting == first:
            shown.setdefault(error_line(exc)[:160], []).append(layout)
    parts = [f"{text} (at {first}: {', '.join(at)})" for text, at in shown.items()]
    rest = sum(1 for _, setting, _ in failures if setting != first)
    more = f"; {rest} run(s) at other settings failed too" if rest else ""
    return "; ".join(parts) + more
