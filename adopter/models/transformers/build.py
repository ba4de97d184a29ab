"""A small transformers model of one class, with inputs that run: the recipe loop.

Recipes are tried smallest first (:func:`.config.recipes`); a recipe whose model cannot be
built or run is repaired where the error says how (sizes that disagree, an input laid out the
other way, an optional input the model needs, see :mod:`.repairs`) and otherwise the next
recipe is tried. Worker side only: imports torch and transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from ..common import cast_inputs, error_line, module_sources, module_text, torch_dtype
from ..interface import (
    BUILD_FAILED,
    CACHED_STEP,
    BuildSettings,
    Subject,
    Unbuildable,
    prebuilt_first,
)
from .config import ModelRecipe, build_config, recipes
from .inputs import continued_inputs, make_inputs
from .reach import resolve_deferred
from .repairs import layout_fix, named_parameters, none_fixes, size_fixes, split_fixes
from .tokens import token_id_fixes

__all__ = ["MAX_PARAMETERS", "subject", "unrun_subject"]

# Beyond this size (reached by the unshrunk default configuration, the last resort, or by a
# configuration the name rules could not shrink) a CPU run of three modes - nine forward and
# backward passes per class - takes minutes, so give up instead.
MAX_PARAMETERS = 30_000_000
# Retries of one recipe: optional inputs an error names, input layouts, size repairs.
_MAX_REQUIRED = 8
_MAX_LAYOUTS = 4
_MAX_SIZE_FIXES = 4


def subject(
    name: str,
    original_module: ModuleType,
    patched_module: ModuleType,
    overrides: dict[str, Any],
    settings: BuildSettings,
) -> Subject | Unbuildable:
    """Class ``name`` of both modules, built from the first recipe whose original model runs,
    with ``overrides`` on top of its configuration, and the inputs it ran with."""
    original_cls = getattr(original_module, name, None)
    if not isinstance(original_cls, type):
        return Unbuildable("no such class in the original")
    patched_cls = getattr(patched_module, name, None)
    if not isinstance(patched_cls, type):
        return Unbuildable("the patched source does not define it", refuted=True)
    overrides = dict(overrides)
    cached_step = bool(overrides.pop(CACHED_STEP, False))
    found = _first_runnable(original_cls, name, module_text(original_module), overrides, settings)
    if isinstance(found, Unbuildable):
        return found
    recipe, fixes, config, inputs = found

    def build(cls: type, chosen: Any) -> Any:
        torch.manual_seed(settings.seed)
        return cls(chosen).to(torch_dtype(settings.dtype))

    first = build(original_cls, config)
    labelled = with_labels(original_cls, inputs, _logits_width(first))
    if labelled is None:
        labelled = with_segment_labels(original_cls, inputs, first.config, settings.seed)
    if cached_step:
        inputs, labelled = continued_inputs(original_cls, inputs), None
        if inputs is None:
            return Unbuildable("its forward takes no past_key_values to continue from")

    def quiet() -> tuple[Any, Any]:
        silent = build_config(
            original_cls.config_class, recipe.setting, cls_name=name, zero_dropout=True, fixes=fixes
        )
        return (lambda: build(original_cls, silent)), (lambda: build(patched_cls, silent))

    return Subject(
        name,
        recipe.label,
        prebuilt_first(first, lambda: build(original_cls, config)),
        lambda: build(patched_cls, config),
        inputs,
        quiet=quiet,
        labelled_inputs=labelled,
        dropout_texts=[module_text(patched_module)],
    )


def unrun_subject(
    name: str, original_module: ModuleType, patched_module: ModuleType, settings: BuildSettings
) -> Subject | Unbuildable:
    """Class ``name`` of both modules built from the first recipe whose model builds small,
    without inputs (none need run it whole): the host of part checks where no recipe's model
    runs (a vision tower's image size, an input a repair cannot make); or why none builds."""
    original_cls = getattr(original_module, name, None)
    patched_cls = getattr(patched_module, name, None)
    if not (isinstance(original_cls, type) and isinstance(patched_cls, type)):
        return Unbuildable("no such class on both sides")
    failures: list[str] = []
    for recipe in recipes():
        trial = _Trial(recipe, {})
        try:
            _build_recipe(original_cls, name, trial, settings)
        except Exception as exc:
            failures.append(f"{recipe.label}: {error_line(exc)}")
            continue
        config, probe = trial.config, trial.probe

        def build(cls: type, chosen: Any = config) -> Any:
            torch.manual_seed(settings.seed)
            return cls(chosen).to(torch_dtype(settings.dtype))

        return Subject(
            name,
            f"{recipe.label}, built without running it whole",
            prebuilt_first(probe, lambda: build(original_cls)),
            lambda: build(patched_cls),
            None,
            dropout_texts=[module_text(patched_module)],
        )
    return Unbuildable(f"no recipe builds it ({'; '.join(failures[:2])})")


@dataclass
class _Trial:
    """How far one recipe got: its fixes so far, the configuration and the probe model."""

    recipe: ModelRecipe
    fixes: dict[str, Any]
    config: Any = None
    probe: Any = None
    token_keys: set[str] = field(default_factory=set)


def _first_runnable(
    cls: type, name: str, source: str, overrides: dict[str, Any], settings: BuildSettings
) -> tuple[ModelRecipe, dict[str, Any], Any, dict[str, Any]] | Unbuildable:
    """(recipe, fixes, configuration, inputs) of the first recipe whose model runs."""
    failures: dict[str, list[str]] = {}  # error -> the recipes that hit it
    token_keys: set[str] = set()  # placeholder-id fixes: they do not count as size retries
    attempts = [(recipe, dict(overrides)) for recipe in recipes()]
    while attempts:
        recipe, fixes = attempts.pop(0)
        trial = _Trial(recipe, fixes, token_keys=token_keys)
        try:
            inputs = _run_recipe(cls, name, trial, settings)
        except Exception as exc:
            failures.setdefault(error_line(exc), []).append(recipe.label)
            more = _size_repairs(trial, source, exc)
            if (
                more
                and len(set(trial.fixes) - token_keys) < _MAX_SIZE_FIXES
                and not set(more) <= set(trial.fixes)
            ):
                attempts.insert(0, (recipe, {**trial.fixes, **more}))  # same recipe, sizes agreed
            continue
        return recipe, trial.fixes, trial.config, inputs
    tried = "; ".join(f"{' | '.join(labels)}: {error}" for error, labels in failures.items())
    return Unbuildable(f"{BUILD_FAILED} ({tried})")


def _run_recipe(cls: type, name: str, trial: _Trial, settings: BuildSettings) -> dict[str, Any]:
    """Build ``trial``'s configuration and probe model and find inputs it runs on (the probe
    only tries the recipe: it is dropped afterwards)."""
    _build_recipe(cls, name, trial, settings)
    return _runnable_inputs(trial.probe, trial.config, trial.recipe, settings)


def _build_recipe(cls: type, name: str, trial: _Trial, settings: BuildSettings) -> None:
    """``trial``'s configuration (deferred sizes resolved, placeholder token ids fixed) and
    its probe model in eval mode; raises what stops either, or a model too large to check."""
    setting = trial.recipe.setting

    def config_with(fixes: dict[str, Any]) -> Any:
        return build_config(cls.config_class, setting, cls_name=name, fixes=fixes)

    trial.fixes = resolve_deferred(trial.fixes, config_with)
    trial.config = config_with(trial.fixes)
    placeholders = token_id_fixes(trial.config)
    if placeholders:  # image tokens inside the text vocabulary, kept for "train" too
        trial.fixes = {**trial.fixes, **placeholders}
        trial.token_keys.update(placeholders)
        trial.config = config_with(trial.fixes)
    refuse_if_too_large(cls, trial.config, must_size=setting is None)
    torch.manual_seed(settings.seed)
    trial.probe = cls(trial.config).to(torch_dtype(settings.dtype))
    trial.probe.eval()


def _runnable_inputs(
    probe: Any, config: Any, recipe: ModelRecipe, settings: BuildSettings
) -> dict[str, Any]:
    """Inputs that ``probe`` runs on: the generated ones, plus the optional inputs an error
    names ("You have to specify bbox") and the other layout a first-layer shape error asks
    for, each once."""
    require: tuple[str, ...] = ()
    layouts: tuple[tuple[str, str], ...] = ()
    dtype = torch_dtype(settings.dtype)
    while True:
        inputs = make_inputs(probe, config, settings.seed, recipe.every_modality, require, layouts)
        inputs = cast_inputs(inputs, dtype)
        try:
            with torch.no_grad():
                probe(**inputs)
        except Exception as exc:
            named = named_parameters(exc, probe, inputs)
            if named and len(require) <= _MAX_REQUIRED:
                require = (*require, *named)
                continue
            layout = layout_fix(str(exc), inputs)
            if layout is not None and layout not in layouts and len(layouts) < _MAX_LAYOUTS:
                layouts = (*layouts, layout)
                continue
            raise
        return inputs


def _size_repairs(trial: _Trial, source: str, exc: Exception) -> dict[str, Any]:
    """Configuration changes after a failed recipe that make its sizes agree, if any."""
    if trial.config is None:
        return {}
    # The sections' default may sit in another family's file the model uses.
    texts = [source] if trial.probe is None else module_sources(trial.probe, [source])
    return (
        size_fixes(trial.config, str(exc))
        or split_fixes(trial.config, str(exc), "\n".join(texts))
        or none_fixes(trial.config, exc)
    )


def refuse_if_too_large(cls: type, config: Any, *, must_size: bool) -> None:
    """Raise unless ``cls(config)`` is small enough to check.

    Sized on the meta device, so a 7-billion-parameter default configuration (or one the name
    rules failed to shrink) is never materialised. Some models cannot be built on the meta
    device; that is only fatal where ``must_size`` (the unshrunk default configuration).
    """
    try:
        with torch.device("meta"):
            size = sum(p.numel() for p in cls(config).parameters())
    except Exception as exc:
        if must_size:
            raise ValueError(f"cannot size the model on the meta device ({exc})") from exc
        return
    if size > MAX_PARAMETERS:
        raise ValueError(f"{size:,} parameters, too many to check within the timeout")


def with_segment_labels(
    cls: type, inputs: Any, config: Any, seed: int, segments: int = 2
) -> dict[str, Any] | None:
    """The inputs of a training step of a universal-segmentation model (MaskFormer, Mask2Former,
    OneFormer, EoMT...), whose ``forward`` takes ``mask_labels`` and ``class_labels``: per
    image, ``segments`` random binary masks of the image's size and a class of
    ``config.num_labels`` for each. Only with them does the loss run, and with it the
    Hungarian matcher that pairs predicted and labelled segments (its softmax of the class
    scores is a site of its own)."""
    pixels = inputs.get("pixel_values") if isinstance(inputs, dict) else None
    classes = getattr(config, "num_labels", None)
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 4 or not isinstance(classes, int):
        return None
    if not _forward_takes(cls, "mask_labels", "class_labels"):
        return None
    generator = torch.Generator().manual_seed(seed)
    batch, _, height, width = pixels.shape
    masks = [
        (torch.rand(segments, height, width, generator=generator) > 0.5).to(pixels.dtype)
        for _ in range(batch)
    ]
    labels = [
        torch.randint(0, max(classes, 1), (segments,), generator=generator) for _ in range(batch)
    ]
    return {**inputs, "mask_labels": masks, "class_labels": labels}


def _forward_takes(cls: type, *names: str) -> bool:
    """Whether ``cls.forward`` has a parameter of each of ``names`` (no readable signature:
    no)."""
    import inspect

    try:
        parameters = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False
    return all(name in parameters for name in names)


def _logits_width(model: Any) -> int | None:
    """How many classes the model's output head scores (its output embeddings' rows), if it
    says."""
    get = getattr(model, "get_output_embeddings", None)
    try:
        head = get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        return None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if getattr(weight, "ndim", 0) == 2 else None


def with_labels(cls: type, inputs: Any, width: int | None = None) -> dict[str, Any] | None:
    """The inputs of a training step with labels (a language model's own token ids: the
    decoder's for an encoder-decoder, whose loss is over the decoder's vocabulary and length),
    for a model whose ``forward`` takes ``labels``: the loss a training loop reads is compared
    there, with every gradient (kernels that take over the loss run only when labels are
    given). Where the output head scores fewer classes (``width``) than the ids reach (a
    multimodal model's image token ids beyond its shrunk text head), the labels are the ids
    modulo that width: a label must name a class the logits have."""
    if not isinstance(inputs, dict) or "labels" in inputs:
        return None
    targets = inputs.get("decoder_input_ids", inputs.get("input_ids"))
    if not hasattr(targets, "clone") or not _forward_takes(cls, "labels"):
        return None
    labels = targets.clone()
    if width is not None and labels.numel() and int(labels.max()) >= width:
        labels = labels % width
    return {**inputs, "labels": labels}
