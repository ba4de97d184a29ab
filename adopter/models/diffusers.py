"""diffusers: the model classes (``ModelMixin`` subclasses) that may use a file, each built
from its ``__init__`` defaults shrunk by name, with inputs from its ``forward`` signature.

Which classes: those the file defines, then those of every ``diffusers.models`` module whose
text names one of the file's patched classes or functions, then (one step further) of those
naming a helper module's functions that name them (``get_down_block`` builds
``CrossAttnDownBlock2D``, which builds ``ResnetBlock2D``).

Small: depths to 1 (``layers_per_block``, ``num_layers``...), channels per block to 32, 64, ...
(GroupNorm's 32 groups still divide them), heads to 2 of 8 or 16 dimensions, conditioning
widths (``cross_attention_dim``...) to 32, the sample to 16 x 16. Inputs: ``sample`` or
``hidden_states`` as a latent image (or, where the model takes a sequence, tokens of
``in_channels`` features), ``timestep``, and ``encoder_hidden_states`` of the conditioning
width. A build is tried once at that size, without gradients; what does not run is reported
with the error, not guessed further.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import warnings
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
from .common import call_model
from .surveys import SurveyStore, module_survey, stored_look, surveyed_candidates

__all__ = ["DiffusersAdapter", "small_config"]

BATCH = 2
SAMPLE = 16
TOKENS = 8
FRAMES = 2
WIDTH = 32
MAX_CANDIDATES = 30
SURVEY_BUDGET = 45.0
"""Seconds of fresh meta-device builds one file's candidate search may spend."""
CHOICES_PER_CLASS = 3
"""Surveyed classes that build a patched class before the search for it stops."""

_DEPTH = re.compile(r"^(num_(\w+_)?layers|layers_per_block|num_(\w+_)?blocks|depth)$")
_HEADS = re.compile(r"^(num_(\w+_)?attention_heads|num_heads|heads)$")
_HEAD_DIM = re.compile(r"^(attention_head_dim|head_dim|dim_head)$")
_CONDITION = re.compile(
    r"^(cross_attention_dim|joint_attention_dim|encoder_hid_dim|pooled_projection_dim|"
    r"caption_channels|text_embed_dim|caption_projection_dim|projection_class_embeddings_input_dim)$"
)


def _int_cap(name: str) -> int | None:
    """The largest small value of an integer ``__init__`` argument called ``name``."""
    for pattern, cap in ((_DEPTH, 1), (_HEADS, 2), (_HEAD_DIM, 8), (_CONDITION, WIDTH)):
        if pattern.match(name):
            return cap
    return SAMPLE if name == "sample_size" else None


def _list_cap(name: str) -> int | None:
    """The largest small element of an integer-list ``__init__`` argument called ``name``."""
    if _HEAD_DIM.match(name):
        return 8
    if name == "transformer_layers_per_block" or _HEADS.match(name):
        return 1
    return SAMPLE if name == "sample_size" else None


def _shrunk(name: str, value: Any) -> Any:
    """The small value of one ``__init__`` argument (``value`` where no rule applies)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        cap = _int_cap(name)
        return value if cap is None else min(value, cap)
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, int) for v in value):
        if name == "block_out_channels":
            return type(value)(WIDTH * (index + 1) for index in range(len(value)))
        cap = _list_cap(name)
        return value if cap is None else type(value)(min(v, cap) for v in value)
    return value


def small_config(cls: type) -> dict[str, Any]:
    """The keyword arguments that build ``cls`` small: its ``__init__`` defaults, shrunk."""
    parameters = inspect.signature(cls.__init__).parameters
    config = {}
    for name, parameter in parameters.items():
        if name == "self" or parameter.default is inspect.Parameter.empty:
            continue
        if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
            continue
        small = _shrunk(name, parameter.default)
        if small != parameter.default:
            config[name] = small
    return config


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
        """A model class by its name (``UNet2DConditionModel``) or ``module:Class``."""
        module_name, _, class_name = name.rpartition(":")
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
        import diffusers

        root = Path(diffusers.__file__).parent
        return {
            ".".join(("diffusers", *path.relative_to(root).with_suffix("").parts)): path.read_text(
                encoding="utf-8"
            )
            for path in sorted((root / "models").rglob("*.py"))
        }

    def _model_classes(self, module_name: str, text: str) -> list[str]:
        """``module:Class`` of the model classes a module's text defines (read statically:
        a class whose bases name ``ModelMixin``)."""
        found = re.findall(r"^class\s+(\w+)\(([^)]*ModelMixin[^)]*)\)", text, re.MULTILINE)
        return [f"{module_name}:{name}" for name, _ in found]

    def candidates(self, module_name: str, names: set[str]) -> list[ModelCandidate]:
        """The model classes to check ``module_name``'s ``names`` through: a small covering set
        of those that a meta-device build at the small configuration shows building the file's
        patched classes (attention processors included), then the others that build them,
        smallest first; classes that could not be surveyed after those. The text of
        ``diffusers.models`` says which classes may (:meth:`_ranked`)."""
        order, _ = surveyed_candidates(
            self._ranked(module_name, names),
            _module_text(module_name),
            names,
            self._meta_look,
            self._store(),
            module_name,
            budget=SURVEY_BUDGET,
            choices=CHOICES_PER_CLASS,
            max_parameters=MAX_SMALL_PARAMETERS,
        )
        return [ModelCandidate(model, why) for model, why in order[:MAX_CANDIDATES]]

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
        for modules, why in ((direct, "names"), (reached, "builds through a helper that names")):
            for module in sorted(modules):
                for model in self._model_classes(module, texts[module]):
                    chosen.setdefault(model, f"its module {why} {', '.join(sorted(names))[:80]}")
        return list(chosen.items())

    @functools.cache  # noqa: B019 - one adapter per process
    def _store(self) -> SurveyStore:
        import diffusers

        return SurveyStore("diffusers", diffusers.__version__)

    def survey(self, name: str, module_name: str) -> ModelSurvey | None:
        return module_survey(self._meta_look, name, module_name)

    def _meta_look(self, name: str) -> tuple[dict[str, list[str]], int] | None:
        """Model class ``name`` built at its small configuration on the meta device (no
        weights allocated): the diffusers classes it builds per module (its attention
        processors included) and its parameter count; ``None`` where it cannot be built so.
        Kept in the survey store, so each class is built once per diffusers version."""
        return stored_look(self._store(), name, self._meta_build)

    def _meta_build(self, name: str) -> dict[str, Any] | None:
        import torch

        cls = self._class(name)
        if cls is None:
            return None
        try:
            with warnings.catch_warnings(), torch.device("meta"):
                warnings.simplefilter("ignore")
                model = cls(**small_config(cls))
        except Exception:
            return None
        by_module: dict[str, set[str]] = {}
        for obj in library_objects(model, ("diffusers",)):
            by_module.setdefault(type(obj).__module__, set()).add(type(obj).__name__)
        return {
            "modules": {module: sorted(classes) for module, classes in by_module.items()},
            "parameters": sum(p.numel() for p in model.parameters()),
        }

    # -- building ----------------------------------------------------------------------------
    @functools.cache  # noqa: B019 - one adapter per process
    def _small(self, name: str) -> tuple[BuiltModel, int | None]:
        """The small model with inputs that ran once, and the frames its sample needed:
        ``None`` for a latent image; where that does not run, a video of :data:`FRAMES`
        frames (``B, C, F, H, W``) is tried, and the image's error raised if that fails too.
        Built once per process; :meth:`build` builds fresh ones the same way."""
        import torch

        failure: Exception | None = None
        for frames in (None, FRAMES):
            built = self._make(name, seed=0, full_size=False, frames=frames)
            try:
                with torch.no_grad():
                    call_model(built.model.eval(), built.inputs)
                return built, frames
            except Exception as exc:  # the model's own error, reported if no shape runs
                failure = failure or exc
        assert failure is not None
        raise failure

    def _make(self, name: str, *, seed: int, full_size: bool, frames: int | None) -> BuiltModel:
        import torch

        cls = self._class(name)
        if cls is None:
            raise ValueError(f"no diffusers model class {name!r}")
        config = {} if full_size else small_config(cls)
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = cls(**config)
        size = sum(p.numel() for p in model.parameters())
        if not full_size and size > MAX_SMALL_PARAMETERS:
            raise NotSmallError(f"{name} has {size:,} parameters at the smallest config tried")
        inputs = make_inputs(model, seed, frames)
        settings = {**config, **({"frames": frames} if frames else {})}
        return BuiltModel(model, inputs, settings)

    def build(
        self, name: str, *, seed: int = 0, full_size: bool = False, entry: str = "forward"
    ) -> BuiltModel:
        # raises what keeps it from running small, once
        frames = None if full_size else self._small(name)[1]
        built = self._make(name, seed=seed, full_size=full_size, frames=frames)
        if entry != "forward":
            built.model = entry_point(built.model, entry)
        return built

    def entries(self, name: str) -> list[str]:
        return []

    def keeping_registries(self) -> Any:
        """diffusers registers nothing when a module is loaded."""
        import contextlib

        return contextlib.nullcontext()


def make_inputs(model: Any, seed: int, frames: int | None = None) -> dict[str, Any]:
    """Inputs for ``model.forward`` from its signature and configuration: a latent image (a
    video of ``frames`` frames where given) of ``in_channels``, a timestep per sample,
    conditioning states, and the conditioning mask and pooled projection where required."""
    import torch

    config = getattr(model, "config", {})
    get = config.get if hasattr(config, "get") else lambda key, default=None: default
    parameters = inspect.signature(model.forward).parameters
    required = {
        name
        for name, p in parameters.items()
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }
    generator = torch.Generator().manual_seed(seed)
    channels = int(get("in_channels", None) or 4)
    size = get("sample_size", None) or SAMPLE
    size = int(size[0] if isinstance(size, (tuple, list)) else size)
    shape = (BATCH, channels, *((frames,) if frames else ()), size, size)
    inputs: dict[str, Any] = {}
    image = torch.randn(*shape, generator=generator)
    for name in ("sample", "hidden_states", "x"):
        if name in parameters:
            inputs[name] = image
            break
    if "timestep" in parameters:
        inputs["timestep"] = torch.tensor([10, 500][:BATCH])
    inputs.update(_conditioning(get, set(parameters), required, generator))
    missing = sorted(required - set(inputs))
    if missing or not inputs:
        raise ValueError(f"no inputs known for {type(model).__name__}: {', '.join(missing)}")
    if "return_dict" in parameters:
        inputs["return_dict"] = False
    return inputs


def _conditioning(
    get: Any, parameters: set[str], required: set[str], generator: Any
) -> dict[str, Any]:
    """The text conditioning a model takes: states of its conditioning width, and where
    required a mask over them and a pooled projection."""
    import torch

    inputs: dict[str, Any] = {}
    if "encoder_hidden_states" in parameters:
        width = get("cross_attention_dim", None) or get("joint_attention_dim", None) or WIDTH
        width = int(width[0] if isinstance(width, (tuple, list)) else width)
        inputs["encoder_hidden_states"] = torch.randn(BATCH, TOKENS, width, generator=generator)
    if "encoder_attention_mask" in required:
        inputs["encoder_attention_mask"] = torch.ones(BATCH, TOKENS, dtype=torch.long)
    if "pooled_projections" in required:
        width = int(get("pooled_projection_dim", None) or get("text_embed_dim", None) or WIDTH)
        inputs["pooled_projections"] = torch.randn(BATCH, width, generator=generator)
    return inputs
