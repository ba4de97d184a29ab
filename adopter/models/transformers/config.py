"""Shrunk transformers configurations: the recipes to try and the configuration each builds.

Overrides go through the configuration's constructor (see :mod:`.config_repair` for what its
validation rejects and :mod:`.shrink` for the name rules). No torch needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..config_names import zero_dropout_dict
from .config_repair import construct_repaired, shrunk_paths
from .shrink import SHRINK_SETTINGS, ShrinkSetting, shrink_config_dict

__all__ = ["ModelRecipe", "build_config", "recipes", "sub_attr"]


def build_config(
    config_class: type,
    setting: ShrinkSetting | None,
    *,
    cls_name: str = "",
    zero_dropout: bool = False,
    fixes: dict[str, Any] | None = None,
) -> Any:
    """A configuration shrunk to ``setting`` (``None``: defaults), optionally without dropout.

    Overrides go through the configuration's constructor, so attributes it derives from others
    (T5's ``num_decoder_layers``, head sizes) are recomputed from the shrunk values. Sequence-
    classification heads of models without a padding token get token 0 as one: they look for
    it to find where each sequence ends (only there: other models reject an unexpected one).
    """
    defaults = config_class().to_dict()
    overrides = shrink_config_dict(defaults, setting) if setting is not None else {}
    flipped = any(
        isinstance(value, bool) and defaults.get(key) is not value
        for key, value in overrides.items()
    )
    if setting is not None and flipped:
        # A flipped switch (a transformers backbone instead of a timm one) can bring in
        # sub-configs that the defaults did not have: shrink those too.
        try:  # (construct_repaired passes copies: constructors pop keys from nested dicts)
            construct, subs = _constructors(config_class)
            revertible = shrunk_paths(defaults, overrides)
            switched = construct_repaired(construct, defaults, overrides, revertible, subs)
            switched = switched.to_dict()
        except Exception:
            switched = {}
        for key, value in switched.items():
            if isinstance(value, dict) and not isinstance(defaults.get(key), dict):
                nested = shrink_config_dict({key: value}, setting).get(key)
                if isinstance(nested, dict):
                    overrides[key] = nested
    # Only what the name rules shrank may be given back where the configuration's own
    # validation rejects it; what follows (flipped options, size fixes, no dropout) stays.
    revertible = shrunk_paths(defaults, overrides)
    if (
        "SequenceClassification" in cls_name
        and "pad_token_id" in defaults
        and defaults["pad_token_id"] is None
    ):
        overrides["pad_token_id"] = 0
    overrides.update(fixes or {})
    if zero_dropout:
        overrides.update(zero_dropout_dict({**defaults, **overrides}))
    fixed = set(fixes or {}) | ({"pad_token_id"} if "pad_token_id" in overrides else set())
    revertible = [path for path in revertible if path[0] not in fixed]
    construct, subs = _constructors(config_class)
    return construct_repaired(construct, defaults, overrides, revertible, subs)


def _constructors(config_class: type) -> tuple[Any, Any]:
    """A configuration class's constructor from keyword arguments, and a look-up of the same
    for its sub-configurations (``sub_configs``: key -> class, transformers 5), so that each
    can be repaired on its own. ``AutoConfig`` entries have no constructor of that kind."""

    def construct(kwargs: dict[str, Any]) -> Any:
        return config_class(**kwargs)

    def subs(key: str) -> tuple[Any, Any] | None:
        sub = (getattr(config_class, "sub_configs", None) or {}).get(key)
        if not isinstance(sub, type) or not hasattr(sub, "to_dict"):
            return None
        return _constructors(sub)

    return construct, subs


def sub_attr(config: Any, name: str, default: Any = None) -> Any:
    """``config.name``, else the same attribute of a text/vision/encoder sub-configuration."""
    value = getattr(config, name, None)
    if value is not None:
        return value
    for sub in ("text_config", "vision_config", "encoder", "audio_config"):
        inner = getattr(config, sub, None)
        if inner is not None and getattr(inner, name, None) is not None:
            return getattr(inner, name)
    # Then any other sub-configuration (``encoder_config``, ``speech_config``...), in order.
    for sub, inner in vars(config).items():
        if sub.endswith("_config") and callable(getattr(inner, "to_dict", None)):
            if getattr(inner, name, None) is not None:
                return getattr(inner, name)
    return default


@dataclass(frozen=True)
class ModelRecipe:
    """One way to build a model class and its inputs; the first that runs is used."""

    setting: ShrinkSetting | None
    every_modality: bool

    @property
    def label(self) -> str:
        size = "default configuration" if self.setting is None else f"{self.setting.name} config"
        return size if self.every_modality else f"{size}, main input only"


def recipes() -> Iterator[ModelRecipe]:
    """Shrink settings to try, smallest first, the unshrunk default configuration last; each
    with every input modality the model accepts first, then with its main input alone."""
    for setting in SHRINK_SETTINGS:
        yield ModelRecipe(setting, every_modality=True)
        yield ModelRecipe(setting, every_modality=False)
