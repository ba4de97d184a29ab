"""Build transformers models and their inputs without per-model code (worker side only).

A modeling file names everything needed: its ``PreTrainedModel`` subclasses carry
``config_class`` (build a configuration, shrink it by attribute names, see
:mod:`adopter.verify.shrink`) and ``main_input_name``; their ``forward`` signatures say which
inputs exist. This module turns that into models and seeded inputs. It imports torch and is only
ever imported inside the worker subprocess.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from .shrink import SHRINK_SETTINGS, ShrinkSetting, shrink_config_dict, zero_dropout_dict

__all__ = [
    "ModelRecipe",
    "build_config",
    "find_model_classes",
    "make_inputs",
    "recipes",
    "select_classes",
]

BATCH = 2
SEQ_LEN = 7
DECODER_SEQ_LEN = 5
NUM_CHOICES = 2


def _pretrained_base() -> type:
    from transformers.modeling_utils import PreTrainedModel

    return PreTrainedModel


_MODEL_NAME = re.compile(r"(Model|For[A-Z]\w*|Backbone)$")


def _exported_names(module: ModuleType) -> set[str] | None:
    """The names the package exports from this file, where it says (lazy ``_import_structure``).

    transformers packages list their public model classes per file; internal building blocks
    that are also ``PreTrainedModel`` subclasses (``T5Stack``) are not listed there.
    """
    package = sys.modules.get(module.__name__.rpartition(".")[0])
    structure = getattr(package, "_import_structure", None)
    if not isinstance(structure, dict):
        return None
    stem = re.sub(r"^_adopter_(original|patched)_\d+_", "", module.__name__.rpartition(".")[2])
    names = structure.get(stem)
    return set(names) if isinstance(names, (list, tuple, set)) else None


def find_model_classes(module: ModuleType) -> list[type]:
    """Public, concrete ``PreTrainedModel`` subclasses defined in ``module``, in file order.

    The family base class (``BertPreTrainedModel``) only carries shared settings and cannot run a
    forward, so names ending in ``PreTrainedModel`` are left out, as are classes without a
    ``config_class`` (there is no configuration to build them from) and internal blocks: classes
    the package does not export, or - where it does not say - whose names do not read like a
    model (``...Model``, ``...For...``, ``...Backbone``).
    """
    base = _pretrained_base()
    exported = _exported_names(module)
    found = []
    for name, obj in vars(module).items():
        if not (isinstance(obj, type) and issubclass(obj, base) and obj is not base):
            continue
        if obj.__module__ != module.__name__ or name.endswith("PreTrainedModel"):
            continue
        if getattr(obj, "config_class", None) is None or inspect.isabstract(obj):
            continue
        if exported is not None and name not in exported:
            continue
        if exported is None and not _MODEL_NAME.search(name):
            continue
        found.append(obj)
    return found


def select_classes(classes: list[type], max_heads: int = 2) -> list[type]:
    """The base model (``XModel``) plus up to ``max_heads`` head classes, to bound the time.

    The base model is the one named after the configuration (``BertConfig`` -> ``BertModel``),
    else the first ``...Model`` class without ``For`` in its name. Heads follow in file order.
    """
    if not classes:
        return []
    base = None
    for cls in classes:
        config_name = getattr(cls.config_class, "__name__", "")
        if (
            config_name.endswith("Config")
            and cls.__name__ == config_name[: -len("Config")] + "Model"
        ):
            base = cls
            break
    if base is None:
        plain = [c for c in classes if c.__name__.endswith("Model") and "For" not in c.__name__]
        base = plain[0] if plain else classes[0]
    heads = [c for c in classes if c is not base][:max_heads]
    return [base, *heads]


def build_config(config_class: type, setting: ShrinkSetting | None, zero_dropout: bool) -> Any:
    """A configuration shrunk to ``setting`` (``None``: defaults), optionally without dropout.

    Overrides go through the configuration's constructor, so attributes it derives from others
    (T5's ``num_decoder_layers``, head sizes) are recomputed from the shrunk values.
    """
    defaults = config_class().to_dict()
    overrides = shrink_config_dict(defaults, setting) if setting is not None else {}
    if zero_dropout:
        overrides.update(zero_dropout_dict({**defaults, **overrides}))
    return config_class(**overrides)


def _sub_attr(config: Any, name: str, default: Any = None) -> Any:
    """``config.name``, else the same attribute of a text/vision/encoder sub-configuration."""
    value = getattr(config, name, None)
    if value is not None:
        return value
    for sub in ("text_config", "vision_config", "encoder", "audio_config"):
        inner = getattr(config, sub, None)
        if inner is not None and getattr(inner, name, None) is not None:
            return getattr(inner, name)
    return default


def _image_hw(config: Any) -> tuple[int, int]:
    size = _sub_attr(config, "image_size", 32)
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    if isinstance(size, dict):
        size = size.get("height", 32)
    return int(size), int(size)


def make_inputs(model: torch.nn.Module, config: Any, seed: int) -> dict[str, Any]:
    """Seeded inputs for ``model.forward``: every required parameter plus the usual masks.

    Token ids are drawn from the configuration's vocabulary, images sized from ``image_size``
    (32 pixels when the configuration has none), encoder-decoders get ``decoder_input_ids``,
    ``...ForMultipleChoice`` models a choices dimension. The second sequence's last two tokens
    are masked out so that attention-mask handling is exercised. ``output_hidden_states`` is
    switched on where supported: every layer's output then shows up in the comparison, which
    tells which layer a difference starts in.
    """
    gen = torch.Generator().manual_seed(seed)
    signature = inspect.signature(model.forward)
    params = signature.parameters
    main = getattr(model, "main_input_name", "input_ids")
    lead: tuple[int, ...] = (BATCH,)
    if "MultipleChoice" in type(model).__name__:
        lead = (BATCH, NUM_CHOICES)
    vocab = int(_sub_attr(config, "vocab_size", 99))
    positions = _sub_attr(config, "max_position_embeddings", None) or _sub_attr(
        config, "n_positions", None
    )
    seq = SEQ_LEN if positions is None else max(2, min(SEQ_LEN, int(positions)))
    inputs: dict[str, Any] = {}

    def ids(length: int, high: int = vocab) -> torch.Tensor:
        return torch.randint(0, max(1, high), (*lead, length), generator=gen)

    def mask(length: int) -> torch.Tensor:
        m = torch.ones((*lead, length), dtype=torch.long)
        if length > 3:
            m[1, ..., -2:] = 0
        return m

    if main == "input_ids" or ("input_ids" in params and main not in params):
        inputs["input_ids"] = ids(seq)
    if main == "pixel_values" or (main not in params and "pixel_values" in params):
        channels = int(_sub_attr(config, "num_channels", 3))
        height, width = _image_hw(config)
        inputs["pixel_values"] = torch.randn((*lead, channels, height, width), generator=gen)
    if main == "input_features":
        bins = _sub_attr(config, "num_mel_bins", None)
        if bins is not None:
            frames = 2 * int(_sub_attr(config, "max_source_positions", 10))
            inputs["input_features"] = torch.randn((*lead, int(bins), frames), generator=gen)
        else:
            features = int(_sub_attr(config, "input_feat_per_channel", 16)) * int(
                _sub_attr(config, "input_channels", 1)
            )
            inputs["input_features"] = torch.randn((*lead, 20, features), generator=gen)
    if main == "input_values":
        inputs["input_values"] = torch.randn((*lead, 1600), generator=gen)
    if "input_ids" in inputs:
        if "attention_mask" in params:
            inputs["attention_mask"] = mask(seq)
        type_vocab = _sub_attr(config, "type_vocab_size", None)
        if "token_type_ids" in params and isinstance(type_vocab, int) and type_vocab > 0:
            inputs["token_type_ids"] = ids(seq, type_vocab)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        decoder_vocab = int(getattr(config, "decoder_vocab_size", None) or vocab)
        inputs["decoder_input_ids"] = ids(DECODER_SEQ_LEN, decoder_vocab)
    if "output_hidden_states" in params:
        inputs["output_hidden_states"] = True
    if "return_dict" in params:
        inputs["return_dict"] = True

    missing = [
        name
        for name, p in params.items()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and name not in inputs
    ]
    if missing:
        raise ValueError(f"cannot generate the required input(s) {', '.join(missing)}")
    return inputs


@dataclass(frozen=True)
class ModelRecipe:
    """How to build one model class: the shrink setting that worked for it, by name."""

    setting: ShrinkSetting | None

    @property
    def label(self) -> str:
        return "default configuration" if self.setting is None else f"{self.setting.name} config"


def recipes() -> Iterator[ModelRecipe]:
    """Shrink settings to try, smallest first, the unshrunk default configuration last."""
    for setting in SHRINK_SETTINGS:
        yield ModelRecipe(setting)
