"""timm: every registered model (``timm.list_models()``) whose code may use a file, built with
``timm.create_model(name, pretrained=False)`` at a small image size and with a small head.

Which models use a file is read statically: a ``timm.models.<name>`` module's own registered
models, then the models of every model module whose text names one of the file's patched
classes or functions, then (one step further) of those naming a helper module's functions
that name them (``create_attn`` builds ``GlobalContext``). The smallest-sounding variants come
first (``resnet10t`` before ``resnet152``); :meth:`TimmAdapter.survey` builds a candidate on
the meta device (no weights allocated) to tell its size and which of the file's classes it
really builds.

Small: timm's smallest registered variants are small already (a few million parameters);
what makes a check slow is the image, so a model whose input size is free gets 64 x 64 pixels
and one whose size is fixed is rebuilt for 112 x 112 (``img_size``) where it accepts that;
otherwise its default size. Each choice is tried on the meta device first (shapes only).
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
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
    modules_naming,
)

__all__ = ["TimmAdapter", "smallness"]

BATCH = 2
SMALL_CLASSES = 10
FREE_SIZE = 64
FIXED_SIZE = 112
MAX_CANDIDATES = 40

# How large a name token sounds: lower is smaller (timm's size words and letters).
_SIZE_WORDS = {
    "test": -9, "atto": 0, "femto": 0, "pico": 0, "nano": 1, "tiny": 1, "micro": 1,
    "xxxs": 0, "xxs": 1,
    "xs": 2, "mini": 2, "t": 2, "s": 3, "small": 3, "m": 4, "medium": 4, "b": 5, "base": 5,
    "l": 8, "large": 8, "h": 9, "huge": 9, "g": 10, "giant": 10, "xl": 10, "xxl": 11,
}  # fmt: skip
_RESOLUTIONS = {240, 256, 260, 288, 300, 320, 336, 380, 384, 448, 456, 512, 518, 528, 600, 800}


def smallness(name: str) -> tuple[float, int, str]:
    """A sort key that puts the variants whose names sound smallest first."""
    score = 0.0
    for token in re.findall(r"[a-z]+|\d+", name.lower()):
        if token.isdigit():
            number = int(token)
            score += number / 112 if number in _RESOLUTIONS or number >= 224 else number / 60
        else:
            score += _SIZE_WORDS.get(token, 0)
    return score, len(name), name


def _registry() -> Any:
    from timm.models import _registry

    return _registry


def _models_dir() -> Path:
    import timm.models

    return Path(timm.models.__file__).parent


def _round_robin(groups: list[list[str]]) -> Iterator[str]:
    """The first of every group, then the second of every group, ...: each module's smallest
    model is tried before any module's second."""
    for index in range(max((len(g) for g in groups), default=0)):
        for group in groups:
            if index < len(group):
                yield group[index]


class TimmAdapter:
    """The :class:`~adopter.models.base.ModelAdapter` of timm."""

    library = "timm"

    def owns(self, module_name: str) -> bool:
        return module_name == "timm" or module_name.startswith("timm.")

    def knows(self, name: str) -> bool:
        import timm

        return bool(timm.is_model(name))

    # -- which models ------------------------------------------------------------------------
    def _module_models(self, short: str) -> list[str]:
        return sorted(_registry()._module_to_models.get(short, ()), key=smallness)

    @functools.cache  # noqa: B019 - one adapter per process (the registry's)
    def _texts(self) -> dict[str, str]:
        """Each module of ``timm.models`` and ``timm.layers``: ``short name -> text``."""
        found = {}
        for folder in (_models_dir(), _models_dir().parent / "layers"):
            for path in sorted(folder.glob("*.py")):
                found[f"{folder.name}.{path.stem}"] = path.read_text(encoding="utf-8")
        return found

    def candidates(self, module_name: str, names: set[str]) -> list[ModelCandidate]:
        short = module_name.rpartition(".")[2]
        chosen: dict[str, str] = {}
        if module_name.startswith("timm.models."):
            for model in self._module_models(short):
                chosen.setdefault(model, f"registered in {module_name}")
        direct, reached = self._modules_naming(module_name, names)
        for keys, why in ((direct, "names"), (reached, "builds through a helper that names")):
            groups = [self._module_models(key.split(".")[1]) for key in sorted(keys)]
            for model in _round_robin([g for g in groups if g]):
                chosen.setdefault(model, f"its module {why} {', '.join(sorted(names))[:80]}")
        return [ModelCandidate(m, why) for m, why in list(chosen.items())[:MAX_CANDIDATES]]

    def _modules_naming(self, module_name: str, names: set[str]) -> tuple[set[str], set[str]]:
        """The other modules whose text names one of ``names``, and those that name a helper
        defined in such a module that registers no model (one step through helpers)."""
        short = module_name.rpartition(".")[2]
        own = f"{module_name.split('.')[-2]}.{short}" if module_name.count(".") >= 2 else ""
        return modules_naming(
            self._texts(), own, names, lambda key: bool(self._module_models(key.split(".")[1]))
        )

    def survey(self, name: str, module_name: str) -> ModelSurvey | None:
        found = self._meta_look(name)
        if found is None:
            return None
        by_module, parameters = found
        return ModelSurvey(frozenset(by_module.get(module_name, ())), parameters)

    @functools.cache  # noqa: B019 - one adapter per process (the registry's)
    def _meta_look(self, name: str) -> tuple[dict[str, set[str]], int] | None:
        """Model ``name`` with a small head, built on the meta device: the timm classes it
        builds per module, and its parameter count; ``None`` where it cannot be built so."""
        import torch

        try:
            with warnings.catch_warnings(), torch.device("meta"):
                warnings.simplefilter("ignore")
                model = self._create(name, {"num_classes": SMALL_CLASSES})
        except Exception:
            return None
        by_module: dict[str, set[str]] = {}
        for obj in library_objects(model, ("timm",)):
            by_module.setdefault(type(obj).__module__, set()).add(type(obj).__name__)
        return by_module, sum(p.numel() for p in model.parameters())

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
        if not full_size and survey is not None and survey.parameters > MAX_SMALL_PARAMETERS:
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
        self, name: str, *, seed: int = 0, full_size: bool = False, entry: str = "forward"
    ) -> BuiltModel:
        import torch

        kwargs, height, width = self._setting(name, full_size)
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = self._create(name, kwargs)
        generator = torch.Generator().manual_seed(seed)
        inputs = (torch.randn(BATCH, 3, height, width, generator=generator),)
        settings = {**kwargs, "input_size": [3, height, width]}
        if entry != "forward":
            model, settings = entry_point(model, entry), {**settings, "entry": entry}
        return BuiltModel(model, inputs, settings)

    def entries(self, name: str) -> list[str]:
        """The model's other entry points that run layers: ``forward_intermediates`` (feature
        extraction), besides ``forward``."""
        return ["forward_intermediates"]

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
