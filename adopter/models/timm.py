"""timm: every registered model (``timm.list_models()``) whose code may use a file, built with
``timm.create_model(name, pretrained=False)`` at a small image size and with a small head.

Which models use a file is decided by what they build. Timm's text says which models may:
a ``timm.models.<name>`` module's own registered models, those of every model module whose
text names one of the file's patched classes or functions, and (one step further) of those
naming a helper module's functions that name them (``create_attn`` builds ``GlobalContext``).
Each candidate is then built on the meta device (no weights allocated) and the classes it
builds recorded (kept on disk, :mod:`adopter.models.surveys`); the models checked are a small
covering set of those that build the file's patched classes (``GlobalResponseNormMlp`` is
reached through a ConvNeXt-V2, ``SwiGLU`` through a model whose registration asks for it).
The text only orders the survey: models whose registering function names a patched class
(``mlp_layer=GatedMlp``) or passes a keyword written next to one (``use_grn`` in
``GlobalResponseNormMlp if use_grn else Mlp``) are surveyed first.

Small: timm's smallest registered variants are small already (a few million parameters);
what makes a check slow is the image, so a model whose input size is free gets 64 x 64 pixels
and one whose size is fixed is rebuilt for 112 x 112 (``img_size``) where it accepts that;
otherwise its default size. Each choice is tried on the meta device first (shapes only).
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .base import (
    MAX_FALLBACK_PARAMETERS,
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
from .surveys import (
    SurveyStore,
    module_survey,
    stored_look,
    survey_budget,
    surveyed_candidates,
)

__all__ = [
    "TimmAdapter",
    "choosing_keywords",
    "literal_size",
    "registration_bodies",
    "static_rank",
]

BATCH = 2
SMALL_CLASSES = 10
FEATURES = "features_only"  # the entry that builds the model as a feature extractor
STANDALONE = ":"  # "timm.layers.coord_attn:CoordAttn": a class built on its own, by no model
FREE_SIZE = 64
FIXED_SIZE = 112
MAX_CANDIDATES = 40
SURVEY_BUDGET = 250
"""Fresh meta-device builds one file's candidate search may make (what earlier workers surveyed
is read from the :class:`~adopter.models.surveys.SurveyStore` for free): a count, not seconds, so
a loaded machine picks the same models as a quiet one (about 50 s on 2 quiet cores; the first
builder of timm's ``GlobalResponseNormMlp`` is the 100th model surveyed for ``layers.mlp``)."""
CHOICES_PER_CLASS = 3
"""Surveyed models that build a class before the search for it stops: others to fall back on
when the first does not run small, and a choice of sizes."""
_NEAR = 3
"""Lines above a mention of a class whose keywords count as choosing it (``if swiglu_mlp:``
above ``SwiGLU(...)``)."""
_ANY_MODEL = "a registered model"
_KEYWORDS = frozenset(__import__("keyword").kwlist) | {"self", "cls", "kwargs", "args"}


def _registry() -> Any:
    from timm.models import _registry

    return _registry


def _models_dir() -> Path:
    import timm.models

    return Path(timm.models.__file__).parent


_BODY = re.compile(r"^def (\w+)\(.*?(?=^[^\s)]|\Z)", re.MULTILINE | re.DOTALL)


def _key(module_name: str) -> str:
    """``timm.models.resnet`` -> ``models.resnet`` (the key of :meth:`TimmAdapter._texts`)."""
    parts = module_name.split(".")
    return ".".join(parts[-2:]) if len(parts) >= 3 else ""


def registration_bodies(text: str) -> dict[str, str]:
    """Each top-level function of a model module's text and its source (a registered model's
    function holds the arguments that choose its layers: ``mlp_layer=SwiGLU``)."""
    return {match.group(1): match.group(0) for match in _BODY.finditer(text)}


def choosing_keywords(text: str, names: set[str]) -> set[str]:
    """Identifiers on and just above the lines of ``text`` that name one of ``names``
    (``use_grn`` in ``partial(GlobalResponseNormMlp if use_grn else Mlp)``): the arguments a
    registered model may pass to be built with those classes."""
    lines = text.splitlines()
    found: set[str] = set()
    for index, line in enumerate(lines):
        if mentions(line, names):
            for near in lines[max(0, index - _NEAR) : index + 1]:
                found.update(re.findall(r"[A-Za-z_]\w*", near.split("#")[0]))
    return found - names - _KEYWORDS


def static_rank(body: str, names: set[str], keywords: set[str]) -> tuple[int, int]:
    """How strongly a registered model's function points at ``names``: whether it names one
    (``mlp_layer=GatedMlp``), and how many of the choosing ``keywords`` it passes."""
    direct = int(mentions(body, names))
    passed = {word for word in re.findall(r"\b([A-Za-z_]\w*)\s*=(?!=)", body)} & keywords
    return direct, len(passed)


def literal_size(body: str) -> int:
    """The sum of the integer literals a registered model's function passes (widths, depths,
    patch sizes): a static stand-in for its size, so smaller configurations are surveyed
    first (the survey then measures the real size)."""
    code = re.sub(r'"""[\s\S]*?"""|#[^\n]*', "", body)  # docstrings say "ResNet-18"
    return sum(int(number) for number in re.findall(r"(?<![\w.])\d+(?![\w.])", code))


class TimmAdapter:
    """The :class:`~adopter.models.base.ModelAdapter` of timm."""

    library = "timm"

    def __init__(self) -> None:
        self._admitted: set[str] = set()  # models above the small limit that a check may build

    def owns(self, module_name: str) -> bool:
        return module_name == "timm" or module_name.startswith("timm.")

    def knows(self, name: str) -> bool:
        import timm

        return bool(timm.is_model(name))

    # -- which models ------------------------------------------------------------------------
    def _module_models(self, short: str) -> list[str]:
        return sorted(_registry()._module_to_models.get(short, ()))

    @functools.cache  # noqa: B019 - one adapter per process (the registry's)
    def _texts(self) -> dict[str, str]:
        """Each module of ``timm.models`` and ``timm.layers``: ``short name -> text``."""
        found = {}
        for folder in (_models_dir(), _models_dir().parent / "layers"):
            for path in sorted(folder.glob("*.py")):
                found[f"{folder.name}.{path.stem}"] = path.read_text(encoding="utf-8")
        return found

    def candidates(self, module_name: str, names: set[str]) -> list[ModelCandidate]:
        """The models to check ``module_name``'s ``names`` through: a small covering set of the
        models a meta-device survey shows building the file's patched classes, then the other
        models that build them, smallest first; models that could not be surveyed after those.
        Which models are surveyed first is read from timm's text (:meth:`_ranked`)."""
        order, builds = surveyed_candidates(
            self._ranked(module_name, names),
            self._texts().get(_key(module_name), ""),
            names,
            self._meta_look,
            self._store(),
            module_name,
            budget=survey_budget(SURVEY_BUDGET),
            choices=CHOICES_PER_CLASS,
            max_parameters=MAX_SMALL_PARAMETERS,
            fallback_parameters=MAX_FALLBACK_PARAMETERS,
        )
        # A model only the registry-wide look proposed is kept when its survey shows it
        # building a patched class: unsurveyed, it is no evidence of anything.
        if builds is not None:
            order = [(m, why) for m, why in order if m in builds or why != _ANY_MODEL]
        # The smallest builder of a class no small model builds may be built above the limit.
        for model in builds or ():
            survey = self.survey(model, module_name)
            if survey is not None and survey.parameters > MAX_SMALL_PARAMETERS:
                self._admitted.add(model)
        found = [
            ModelCandidate(model, why, self._limit(model)) for model, why in order[:MAX_CANDIDATES]
        ]
        if builds is None or builds:  # nothing to survey for, or a surveyed builder
            return found or self._standalone_candidates(module_name, names)
        # No surveyed model builds a patched class: the classes on their own come first. Models
        # the survey's budget left unsurveyed follow; a warm survey store (where every look is
        # free) has ruled them out already, a cold one has not, and the verdict must not
        # depend on which this machine has.
        return self._standalone_candidates(module_name, names) + found

    def _standalone_candidates(self, module_name: str, names: set[str]) -> list[ModelCandidate]:
        """Where no registered model builds the file's classes (layers timm ships for users'
        own models: ``CoordAttn``, ``SimPool2d``), each module class of ``names`` the file
        defines, to be built on its own (:func:`~adopter.models.parts.standalone_part`)."""
        import importlib

        from torch import nn

        module = importlib.import_module(module_name)
        return [
            ModelCandidate(f"{module_name}{STANDALONE}{name}", "no registered model builds it")
            for name in sorted(names)
            if isinstance(cls := getattr(module, name, None), type)
            and issubclass(cls, nn.Module)
            and cls.__module__ == module_name
        ]

    def _limit(self, name: str) -> int:
        return MAX_FALLBACK_PARAMETERS if name in self._admitted else MAX_SMALL_PARAMETERS

    def _ranked(self, module_name: str, names: set[str]) -> list[tuple[str, str]]:
        """Every registered model that may build ``names``, with why, in the order to survey
        them: those whose registering function names one of the classes, then those passing
        the keywords that choose them, the file's own models, models of modules naming them,
        then of modules reaching them through a helper, then all others; the smaller
        configurations first."""
        texts = self._texts()
        direct, reached = self._modules_naming(module_name, names)
        groups = [(_key(module_name), 0, f"registered in {module_name}")]
        for keys, level, why in ((direct, 1, "names"), (reached, 2, "reaches through a helper")):
            listed = ", ".join(sorted(names))[:80]
            groups += [(key, level, f"its module {why} {listed}") for key in sorted(keys)]
        ranked: dict[str, tuple[tuple[int, int, int, int, str], str]] = {}
        for key, level, why in groups:
            if not key.startswith("models."):
                continue
            text = texts.get(key, "")
            bodies, keywords = registration_bodies(text), choosing_keywords(text, names)
            for model in self._module_models(key.split(".")[1]):
                body = bodies.get(model, "")
                hit, passed = static_rank(body, names, keywords)
                rank = (-hit, -min(passed, 1), level, literal_size(body), model)
                if model not in ranked or rank < ranked[model][0]:
                    ranked[model] = (rank, why)
        # Then every other registered model: a file's class may be reached through more than
        # one helper (``LambdaLayer``: ``create_attn`` -> byobnet's blocks -> byoanet's models);
        # the survey, which stops once every class has builders, tells.
        registry, bodies_of = _registry(), {}
        for model in sorted(set(registry._model_to_module) - set(ranked)):
            key = f"models.{registry._model_to_module[model]}"
            if key not in bodies_of:
                bodies_of[key] = registration_bodies(texts.get(key, ""))
            size = literal_size(bodies_of[key].get(model, ""))
            ranked[model] = ((0, 0, 3, size, model), _ANY_MODEL)
        return [(model, why) for model, (_, why) in sorted(ranked.items(), key=lambda i: i[1])]

    def _modules_naming(self, module_name: str, names: set[str]) -> tuple[set[str], set[str]]:
        """The other modules whose text names one of ``names``, and those that name a helper
        defined in such a module that registers no model (one step through helpers)."""
        return modules_naming(
            self._texts(),
            _key(module_name),
            names,
            lambda key: bool(self._module_models(key.split(".")[1])),
        )

    @functools.cache  # noqa: B019 - one adapter per process (the registry's)
    def _store(self) -> SurveyStore:
        import timm

        return SurveyStore("timm", timm.__version__)

    def survey(self, name: str, module_name: str) -> ModelSurvey | None:
        if STANDALONE in name:  # a class built on its own: it builds that class
            owner, _, cls = name.partition(STANDALONE)
            return ModelSurvey(frozenset({cls} if owner == module_name else ()), 0)
        return module_survey(self._meta_look, name, module_name)

    def _meta_look(self, name: str) -> tuple[dict[str, list[str]], int] | None:
        """Model ``name`` with a small head, built on the meta device: the timm classes it
        builds per module, and its parameter count; ``None`` where it cannot be built so.
        Kept in the survey store, so each model is built once per timm version."""
        return stored_look(self._store(), name, self._meta_build)

    def _meta_build(self, name: str, extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
        import torch

        try:
            with warnings.catch_warnings(), torch.device("meta"):
                warnings.simplefilter("ignore")
                model = self._create(name, {"num_classes": SMALL_CLASSES, **(extra or {})})
        except Exception:
            return None
        by_module: dict[str, set[str]] = {}
        for obj in library_objects(model, ("timm",)):
            by_module.setdefault(type(obj).__module__, set()).add(type(obj).__name__)
        return {
            "modules": {module: sorted(classes) for module, classes in by_module.items()},
            "parameters": sum(p.numel() for p in model.parameters()),
        }

    # -- building ----------------------------------------------------------------------------
    def _create(self, name: str, kwargs: dict[str, Any]) -> Any:
        import timm

        return timm.create_model(name, pretrained=False, **kwargs)

    def _default_size(self, name: str) -> tuple[int, int, bool]:
        import timm

        cfg = timm.get_pretrained_cfg(name)
        size = tuple(getattr(cfg, "input_size", None) or (3, 224, 224))
        return int(size[1]), int(size[2]), bool(getattr(cfg, "fixed_input_size", False))

    def _choices(self, name: str, full_size: bool) -> list[tuple[dict[str, Any], int, int]]:
        height, width, fixed = self._default_size(name)
        if full_size:
            return [({}, height, width)]
        head = {"num_classes": SMALL_CLASSES}
        small = [(head, FREE_SIZE, FREE_SIZE)] if not fixed else []
        if fixed and max(height, width) > FIXED_SIZE:
            small.append(({**head, "img_size": FIXED_SIZE}, FIXED_SIZE, FIXED_SIZE))
        return [*small, (head, height, width)]

    def _runs(self, name: str, kwargs: dict[str, Any], height: int, width: int) -> bool:
        """Whether the model takes ``(B, 3, height, width)``: on the meta device where its
        code allows, else for real (it is small)."""
        import torch

        for device in ("meta", "cpu"):
            try:
                with warnings.catch_warnings(), torch.device(device), torch.no_grad():
                    warnings.simplefilter("ignore")
                    model = self._create(name, kwargs).eval()
                    model(torch.zeros(1, 3, height, width))
                return True
            except NotImplementedError:
                continue  # an operation the meta device lacks: try it for real
            except Exception:
                if device == "cpu":
                    return False
        return False

    @functools.cache  # noqa: B019 - one adapter per process (the registry's)
    def _setting(self, name: str, full_size: bool) -> tuple[dict[str, Any], int, int]:
        """The keyword arguments and image size ``name`` is built with."""
        survey = self.survey(name, "")
        if not full_size and survey is not None and survey.parameters > self._limit(name):
            raise NotSmallError(
                f"{name} has {survey.parameters:,} parameters even with a small head; "
                "timm has no smaller setting of it"
            )
        choices = self._choices(name, full_size)
        chosen = next((c for c in choices if full_size or self._runs(name, *c)), None)
        if chosen is None:
            raise NotSmallError(f"{name} runs at none of the sizes tried ({choices})")
        return chosen

    def build(
        self,
        name: str,
        *,
        seed: int = 0,
        full_size: bool = False,
        entry: str = "forward",
        overrides: Mapping[str, Any] | None = None,
    ) -> BuiltModel:
        import torch

        if STANDALONE in name:
            return self._build_standalone(name, seed, dict(overrides or {}))
        kwargs, height, width = self._setting(name, full_size)
        construction = {**(overrides or {}), **({FEATURES: True} if entry == FEATURES else {})}
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = self._create(name, {**kwargs, **construction})
        generator = torch.Generator().manual_seed(seed)
        inputs = (torch.randn(BATCH, 3, height, width, generator=generator),)
        settings = {**kwargs, **construction, "input_size": [3, height, width]}
        if entry not in ("forward", FEATURES):
            model, settings = entry_point(model, entry), {**settings, "entry": entry}
        return BuiltModel(model, inputs, settings)

    def build_unrun(self, name: str, *, seed: int = 0) -> Any:
        if STANDALONE in name:  # a layer class on its own is a part already
            raise ValueError(f"{name} is a layer built on its own, no model holding parts")
        return self.build(name, seed=seed).model  # timm's build makes inputs without running

    def part_inputs(self, part: Any, seed: int) -> Iterator[tuple[str, Any]]:
        return iter(())  # timm's layers take feature maps or tokens: their layers say which

    def _build_standalone(self, name: str, seed: int, overrides: dict[str, Any]) -> BuiltModel:
        import importlib

        from .interface import BuildSettings
        from .parts import standalone_part  # imports torch: worker side only

        module_name, _, cls = name.partition(STANDALONE)
        layer = getattr(importlib.import_module(module_name), cls)
        model, (shape, inputs) = standalone_part(layer, BuildSettings(seed, "float32"), overrides)
        return BuiltModel(model, inputs, {**overrides, "input": shape})

    def entries(self, name: str) -> list[str]:
        """The model's other entry points that run layers, besides ``forward``:
        ``forward_intermediates`` (feature extraction), and the model built with
        ``features_only=True``, which builds timm's feature-extraction classes
        (``EfficientNetFeatures``, ``HighResolutionNetFeatures``) instead of the classifier."""
        return [] if STANDALONE in name else ["forward_intermediates", FEATURES]

    def entry_classes(self, name: str, entry: str, module_name: str) -> frozenset[str] | None:
        """What the ``features_only`` build holds of ``module_name`` (a meta-device build, kept
        in the survey store as ``name[features_only]``); ``None`` for the methods."""
        if entry != FEATURES:
            return None
        look = stored_look(
            self._store(), f"{name}[{FEATURES}]", lambda _: self._meta_build(name, {FEATURES: True})
        )
        return frozenset() if look is None else frozenset(look[0].get(module_name, ()))

    @contextmanager
    def keeping_registries(self) -> Iterator[None]:
        """timm's ``@register_model`` points the registry at whatever module registers a name
        last; a patched copy of a model module registers its own functions, which would make
        ``create_model`` build the patched classes for the original too. Put it all back."""
        registry = _registry()
        saved = {
            name: _copy(value)
            for name, value in vars(registry).items()
            if name.startswith("_") and isinstance(value, (dict, set))
        }
        try:
            yield
        finally:
            for name, value in saved.items():
                current = getattr(registry, name)
                current.clear()
                current.update(value)


def _copy(container: dict[Any, Any] | set[Any]) -> dict[Any, Any] | set[Any]:
    """A copy one level deep: the registry's dicts hold sets and lists it mutates in place."""
    if isinstance(container, set):
        return set(container)
    return {
        key: type(value)(value) if isinstance(value, (set, list, dict)) else value
        for key, value in container.items()
    }
