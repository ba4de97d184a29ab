"""What verify's harness asks of a model adapter, and the answers an adapter gives.

An adapter is a module (``adopter.models.<library>``) with these functions, called inside
verify's worker after the original module and the patched sibling module are imported:

``model_classes(module) -> list[str]``
    the model classes of the file a check can start from, in file order;
``planned(module, classes, max_heads) -> list[str]``
    the ones to check first (a base model and up to ``max_heads`` heads);
``subject(name, original, patched, overrides, settings) -> Subject | Unbuildable``
    a small model of class ``name`` from both modules (with ``overrides`` on its default
    configuration) and inputs that run on the original, or why there is none;
``unrun_subject(name, original, patched, settings) -> Subject | Unbuildable``
    both sides of class ``name`` built small without inputs (never run whole): the models
    whose parts are checked on their own where no inputs run the whole;
``reach_context(module, classes) -> object``
    whatever ``reach_attempts`` needs to know of the classes' configurations;
``reach_attempts(site, checked, classes, fixed, context, broken) -> list[(name, overrides)]``
    further checks that may run a patched site the planned checks did not run;

and ``NO_MODELS``, the message for a file without model classes. The harness does the rest:
loading state, running both sides in each mode, comparing, recording which sites ran.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BUILD_FAILED",
    "CACHED_STEP",
    "DEFAULT_ADAPTER",
    "PART_SUFFIX",
    "PER_ELEMENT",
    "WORKER_ENVIRONMENT",
    "BuildSettings",
    "Subject",
    "Unbuildable",
    "adapter_for",
    "prebuilt_first",
    "setting_label",
]

PER_ELEMENT = "[]"
"""How a site's guard fields (``PatchedSite.config_fields``) name a comparison with an element
of a per-layer list (``config.layer_types[i] == "sparse"``): the field name with this suffix."""

PART_SUFFIX = " (part)"
"""How a part check's verdict names the module class it checked on its own
(:mod:`adopter.models.parts`: ``LlavaMultiModalProjector (part)``)."""

CACHED_STEP = "cached_step"
"""The override key of a check that calls a language model twice, the second time with the
cache of keys and values the first returned (code under ``if past_key_values is not None:``
runs only then); an adapter pops it before building the configuration."""

BUILD_FAILED = "could not build and run the original model"
"""How an :class:`Unbuildable` reason starts when no recipe gave a model that runs."""

WORKER_ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
"""Environment defaults of verify's worker for the adapters' libraries: no downloads (a check
builds models from configurations, never from a hub), no tokenizer threads."""

# The library whose conventions a modeling file outside any known package is read by.
DEFAULT_ADAPTER = "adopter.models.transformers"


def adapter_for(module_name: str) -> str:
    """The adapter module for the file ``module_name`` (dotted): the one named after its top
    package where there is one (``adopter.models.<top>``), else :data:`DEFAULT_ADAPTER`."""
    top = module_name.partition(".")[0]
    candidate = f"{__package__}.{top}"
    if top and top.isidentifier() and importlib.util.find_spec(candidate) is not None:
        adapter = importlib.import_module(candidate)
        if callable(getattr(adapter, "model_classes", None)):
            return candidate
    return DEFAULT_ADAPTER


def setting_label(overrides: dict[str, Any]) -> str:
    """How a check's configuration overrides are named in its verdict (``use_cache=False``)."""
    return ", ".join(f"{key}={value!r}" for key, value in overrides.items())


@dataclass(frozen=True)
class BuildSettings:
    """How models are built for a check: weights seeded with ``seed``, in ``dtype``."""

    seed: int
    dtype: str


@dataclass
class Subject:
    """One model to check: builders of fresh seeded models of both sides and their inputs.

    ``label`` says how it was built (a recipe, the settings that made it small; ``""``: as
    its factory builds it). ``quiet`` builds both sides without any dropout (for train mode;
    ``None``: the same builders, with dropout modules switched off by the harness).
    ``labelled_inputs`` are the inputs of a training step with labels, where the model takes
    them. ``dropout_texts`` are the sources whose kernels decide whether train mode with dropout
    can be compared; ``dropout_mode`` whether that comparison is made at all (``False``: train
    mode is compared with dropout off only).
    """

    name: str
    label: str
    build_original: Callable[[], Any]
    build_patched: Callable[[], Any]
    inputs: Any
    quiet: Callable[[], tuple[Callable[[], Any], Callable[[], Any]]] | None = None
    labelled_inputs: Any = None
    dropout_texts: list[str] = field(default_factory=list)
    dropout_mode: bool = True


def prebuilt_first(model: Any, rebuild: Callable[[], Any]) -> Callable[[], Any]:
    """A builder for a :class:`Subject` that hands out ``model`` (built and never run) first,
    then fresh ones from ``rebuild``: the build that showed a model can be made is not wasted."""
    waiting = [model]

    def build() -> Any:
        return waiting.pop() if waiting else rebuild()

    return build


@dataclass(frozen=True)
class Unbuildable:
    """Why no check of a class can run: not checkable, or refuted where the patched source is
    at fault (it no longer defines the class)."""

    reason: str
    refuted: bool = False
