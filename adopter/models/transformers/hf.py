"""Build transformers models and their inputs without per-model code (worker side only).

A modeling file names everything needed: its ``PreTrainedModel`` subclasses carry
``config_class`` (build a configuration, shrink it by attribute names, see
:mod:`adopter.models.transformers.shrink`) and ``main_input_name``; their ``forward``
signatures say which inputs exist. This module turns that into models and seeded inputs. It
imports torch and is only ever imported inside the worker subprocess.
"""

from __future__ import annotations

import inspect
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from .config_repair import construct_repaired, shrunk_paths
from .patch_grid import grid_parameter, patch_grid
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
NUM_CHOICES = 2
AUDIO_SAMPLES = 8000


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

    Left out: family base classes (``BertPreTrainedModel``, any capitalisation, or any class
    without a ``forward`` of its own), which only carry shared settings; classes without a
    ``config_class``, which there is no configuration to build from; and internal blocks -
    classes the package does not export or, where it does not say, whose names do not read like
    a model (``...Model``, ``...For...``, ``...Backbone``).
    """
    base = _pretrained_base()
    exported = _exported_names(module)
    found = []
    for name, obj in vars(module).items():
        if not (isinstance(obj, type) and issubclass(obj, base) and obj is not base):
            continue
        if obj.__module__ != module.__name__ or name.lower().endswith("pretrainedmodel"):
            continue
        if obj.forward is torch.nn.Module.forward:  # no forward of its own: a base class
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


_SIZE_PAIRS = (
    re.compile(r"should contain (\d+) elements not (\d+)"),
    re.compile(r"to have (\d+) channels, but got (\d+) channels"),
)


# Hard-coded group counts (``nn.GroupNorm(32, d_model)``) that a shrunk width does not divide.
_GROUPS_DIVIDE = re.compile(r"num_channels \((\d+)\) must be divisible by num_groups \((\d+)\)")
_SIZE_NAME = re.compile(r"(size|dim|channels|d_model)$")


def size_fixes(config: Any, error: str) -> dict[str, Any]:
    """Top-level sizes to change after a size-mismatch error, so that the sizes agree.

    A layer built from one configuration size meets a tensor built from another; when the
    error names both numbers (``running_mean should contain 1280 elements not 16``), the
    configuration attributes holding either get the other's value. Only sizes, and only
    where a single attribute holds the number (several: it is not clear which one).
    """
    groups = _GROUPS_DIVIDE.search(error)
    if groups is not None:
        # Every width holding the rejected size grows to a multiple of the group count (all of
        # them: equal widths usually have to stay equal). Heads, powers of two, still divide.
        channels, count = int(groups.group(1)), int(groups.group(2))
        wider = math.lcm(channels, count)
        return {
            key: wider
            for key, value in config.to_dict().items()
            if _is_size(value) and value == channels and _SIZE_NAME.search(key)
        }
    for pattern in _SIZE_PAIRS:
        match = pattern.search(error)
        if match is None:
            continue
        a, b = int(match.group(1)), int(match.group(2))
        sizes = {
            key: value
            for key, value in config.to_dict().items()
            if isinstance(value, int)
            and not isinstance(value, bool)
            and value in (a, b)
            and re.search(r"(size|dim|channels)$", key)
        }
        if len(sizes) == 1:
            key, value = next(iter(sizes.items()))
            return {key: b if value == a else a}
    return {}


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def token_id_fixes(config: Any) -> dict[str, Any]:
    """Distinct in-vocabulary ids for a multimodal configuration's placeholder tokens.

    A configuration that embeds text through a sub-configuration (``text_config``) has no
    vocabulary of its own, so shrinking leaves its ``image_token_id`` (151655) far outside
    the shrunk text vocabulary: the text embedding then cannot look the placeholder up. Each
    such id gets its own id at the top of that vocabulary, below the ids already in use.
    """
    if getattr(config, "vocab_size", None) is not None:
        return {}
    vocab = _sub_attr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 8:
        return {}
    used = {v for v in _placeholder_token_ids(config) if v < vocab}
    fixes: dict[str, Any] = {}
    spare = vocab - 1
    for key, value in config.to_dict().items():
        if not (isinstance(key, str) and _PLACEHOLDER.match(key)):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < vocab:
            continue
        while spare in used:
            spare -= 1
        if spare < vocab // 2:  # too few spare ids: leave the rest alone
            break
        fixes[key] = spare
        used.add(spare)
    return fixes


# Shape errors a wrongly laid out input raises in the model's first layer.
_SHAPE_ERROR = re.compile(r"mat1 and mat2 shapes cannot be multiplied|to have \d+ channels")
# "Input must be a 5D tensor of shape (batch_size, 2, num_channels, height, width)"
_SPELLED_SHAPE = re.compile(r"(\d)D tensor of shape \(([\w, ]+)\)")
# A downsampling stack that runs out of pixels before its last pooling or convolution.
_TOO_SMALL = re.compile(r"Output size is too small|Kernel size can't be greater than actual input")
_CONV_CHANNELS = re.compile(r"expected input\[1, (\d+), (\d+)\] to have (\d+) channels")


def layout_fix(error: str, inputs: dict[str, Any]) -> tuple[str, str] | None:
    """The other layout to try for an input after a shape error, as (input name, layout).

    Two ambiguities that only running the model settles: spectrograms come mel-bins-first
    (Whisper: ``(batch, bins, frames)``) or frames-first (conformer encoders: ``(batch,
    frames, bins)``), so a 3-D feature input is transposed (``"swap"``); and a 1-D conv front
    end that wants ``(batch, 1, samples)`` reads a ``(batch, samples)`` waveform as one
    unbatched ``batch``-channel signal (``expected input[1, 2, 8000] to have 1 channels``),
    so the waveform gets its channel dimension (``"channel"``).
    """
    spelled = _SPELLED_SHAPE.search(error)
    if spelled is not None:
        # A shape the error spells out: the literal sizes in it (image *pairs*) are the
        # dimensions a generated input of one rank less lacks.
        dims = [d.strip() for d in spelled.group(2).split(",")]
        literal = [(i, int(d)) for i, d in enumerate(dims) if d.isdigit()]
        if len(literal) == 1 and len(dims) == int(spelled.group(1)):
            for name in _MODALITIES:
                value = inputs.get(name)
                if isinstance(value, torch.Tensor) and value.dim() == len(dims) - 1:
                    return name, f"stack:{literal[0][0]}:{literal[0][1]}"
    if _TOO_SMALL.search(error):  # images twice as large (up to 512 pixels a side)
        value = inputs.get("pixel_values")
        if isinstance(value, torch.Tensor) and value.dim() == 4 and max(value.shape[-2:]) < 512:
            height, width = value.shape[-2:]
            return "pixel_values", f"size:{2 * height}x{2 * width}"
    conv = _CONV_CHANNELS.search(error)
    if conv is not None and conv.group(3) == "1":
        shape = [int(conv.group(1)), int(conv.group(2))]
        for name, value in inputs.items():
            if isinstance(value, torch.Tensor) and list(value.shape) == shape:
                return name, "channel"
    if _SHAPE_ERROR.search(error):
        for name in ("input_features", "input_values"):
            value = inputs.get(name)
            if isinstance(value, torch.Tensor) and value.dim() == 3 and value.is_floating_point():
                return name, "swap"
    return None


def _relayout(value: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "swap":
        return value.transpose(-1, -2).contiguous()
    if layout == "channel":
        return value.unsqueeze(1)
    if layout.startswith("size:"):  # resampled, so the content stays the same image
        height, width = (int(v) for v in layout[len("size:") :].split("x"))
        return torch.nn.functional.interpolate(value, size=(height, width), mode="bilinear")
    if layout.startswith("stack:"):  # k copies, each shifted by one more pixel/step
        _, position, count = layout.split(":")
        copies = [value.roll(shift, dims=-1) for shift in range(int(count))]
        return torch.stack(copies, dim=int(position))
    return value


_SPLIT = re.compile(r"split_sizes to sum exactly to (\d+) .*?split_sizes=\[([\d, ]+)\]")


def _rescale(sizes: list[int], total: int) -> list[int] | None:
    """``sizes`` scaled to sum to ``total``, each at least 1, in the same proportions as far as
    whole numbers allow (largest remainders first); ``None`` where ``total`` is too small."""
    if total < len(sizes) or sum(sizes) <= 0:
        return None
    exact = [s * total / sum(sizes) for s in sizes]
    scaled = [max(1, int(e)) for e in exact]
    order = sorted(range(len(sizes)), key=lambda i: scaled[i] - exact[i])
    i = 0
    while sum(scaled) != total:
        j = order[i % len(order)]
        step = 1 if sum(scaled) < total else -1
        if scaled[j] + step >= 1:
            scaled[j] += step
        i += 1
    return scaled


def split_fixes(config: Any, error: str, source: str) -> dict[str, Any]:
    """Configuration entries to rescale after ``split_with_sizes`` rejected their sizes.

    A model splits a shrunk dimension (half a rotary head) into sections whose sizes the
    configuration fixes for the full model (multimodal RoPE's temporal/height/width sections);
    the error names both the sizes and the total they must reach. The entry holding them is a
    list equal to those sizes in the configuration or in a dict attribute of it; where the
    configuration leaves it out, the model's source names it as the default it falls back to
    (``config.<dict>.get("<key>", [16, 24, 24])``). Either way the sizes are scaled in
    proportion to the total, in every (sub-)configuration that has that entry or dict.
    """
    match = _SPLIT.search(error)
    if match is None:
        return {}
    sizes = [int(v) for v in match.group(2).split(",")]
    scaled = _rescale(sizes, int(match.group(1)))
    if scaled is None:
        return {}
    defaulted = {
        (found.group(1), found.group(2))
        for found in re.finditer(
            r"config\.(\w+)\.get\(\s*[\"'](\w+)[\"']\s*,\s*\[([\d,\s]+)\]\s*\)", source
        )
        if [int(v) for v in found.group(3).split(",") if v.strip()] == sizes
    }

    def fixed(entries: dict[str, Any]) -> dict[str, Any]:
        changes: dict[str, Any] = {}
        for key, value in entries.items():
            if isinstance(value, list) and value == sizes:
                changes[key] = scaled
            elif isinstance(value, dict) and not _is_config_dict(value):
                inner = {k: scaled for k, v in value.items() if isinstance(v, list) and v == sizes}
                inner.update({k: scaled for attr, k in defaulted if attr == key and k not in value})
                if inner:
                    changes[key] = {**value, **inner}
        return changes

    entries = config.to_dict()
    fixes = fixed(entries)
    for key, value in entries.items():
        if _is_config_dict(value):
            nested = fixed(value)
            if nested:
                fixes[key] = {**value, **nested}
    return fixes


def _is_config_dict(value: Any) -> bool:
    """A sub-configuration's dict (it names its ``model_type``), not a plain dict attribute."""
    return isinstance(value, dict) and "model_type" in value


def _sub_attr(config: Any, name: str, default: Any = None) -> Any:
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


def _special_token_ids(config: Any) -> set[int]:
    """The configuration's special token ids (``pad``, ``bos``, ``eos``, ...), as ints."""
    found: set[int] = set()
    for key in (
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "cls_token_id",
        "mask_token_id",
        "unk_token_id",
    ):
        value = getattr(config, key, None)
        values = value if isinstance(value, (list, tuple)) else [value]
        found.update(v for v in values if isinstance(v, int) and not isinstance(v, bool))
    return found


_PLACEHOLDER = re.compile(r"^\w+_token_(id|index)$")


def _placeholder_token_ids(config: Any) -> set[int]:
    """Every ``..._token_id`` / ``..._token_index`` int of the configuration and of its text
    sub-configuration (image, video, audio placeholders...): random text must avoid them, or
    it claims to hold an image that the inputs do not have."""
    found: set[int] = set()
    for holder in (config, getattr(config, "text_config", None)):
        to_dict = getattr(holder, "to_dict", None)
        if not callable(to_dict):
            continue
        for key, value in to_dict().items():
            if isinstance(key, str) and _PLACEHOLDER.match(key):
                if isinstance(value, int) and not isinstance(value, bool):
                    found.add(value)
    return found


def _first_token(config: Any, names: tuple[str, ...], vocab: int) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab:
            return value
    return None


def _placeholder_layout(config: Any, vocab: int, grid: Any) -> tuple[list[int], list[int]] | None:
    """The tokens standing for one image in the text (its placeholders, between the vision
    start and end markers where the configuration has them) and their modality types (1 for
    the placeholders); ``None`` without an image token inside the vocabulary."""
    image = _first_token(config, ("image_token_id", "image_token_index"), vocab)
    if image is None:
        return None
    start = _first_token(config, ("vision_start_token_id", "image_start_token_id"), vocab)
    end = _first_token(config, ("vision_end_token_id", "image_end_token_id"), vocab)
    layout = [image] * grid.tokens_per_image
    kinds = [1] * grid.tokens_per_image
    if start is not None:
        layout, kinds = [start, *layout], [0, *kinds]
    if end is not None:
        layout, kinds = [*layout, end], [*kinds, 0]
    return layout, kinds


def _image_hw(config: Any) -> tuple[int, int]:
    size = _sub_attr(config, "image_size", 32)
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    if isinstance(size, dict):
        size = size.get("height", 32)
    return int(size), int(size)


_MODALITIES = ("input_ids", "pixel_values", "input_features", "input_values")


def make_inputs(
    model: torch.nn.Module,
    config: Any,
    seed: int,
    every_modality: bool = True,
    require: tuple[str, ...] = (),
    layouts: tuple[tuple[str, str], ...] = (),
) -> dict[str, Any]:
    """Seeded inputs for ``model.forward``: every required parameter plus the usual masks.

    The main input (``main_input_name``) always; with ``every_modality`` also the other known
    primary inputs the signature accepts (a CLIP-style model needs ``input_ids`` *and*
    ``pixel_values``; where two are alternatives, the caller retries without). Token ids are
    drawn from the configuration's vocabulary, images sized from ``image_size`` (32 pixels when
    the configuration has none), encoder-decoders get ``decoder_input_ids``,
    ``...ForMultipleChoice`` models a choices dimension. Token ids avoid the special tokens
    and end with ``eos`` where there is one. The second sequence's last two tokens are masked
    out so that attention-mask handling is exercised. ``output_hidden_states`` is
    switched on where supported: every layer's output then shows up in the comparison, which
    tells which layer a difference starts in. (``bench`` builds realistic workload inputs of
    its own instead; ``adopter.bench.command.make_bench_inputs`` says how they differ.)
    """
    gen = torch.Generator().manual_seed(seed)
    params = inspect.signature(model.forward).parameters
    main = getattr(model, "main_input_name", "input_ids")
    if main not in params:
        main = next((name for name in _MODALITIES if name in params), main)
    wanted = {main} | ({m for m in _MODALITIES if m in params} if every_modality else set())
    lead: tuple[int, ...] = (BATCH,)
    if "MultipleChoice" in type(model).__name__:
        lead = (BATCH, NUM_CHOICES)
    codebooks = _sub_attr(config, "num_codebooks", None)
    id_lead = lead
    if isinstance(codebooks, int) and codebooks > 1:  # one token stream per codebook
        id_lead = (lead[0] * codebooks, *lead[1:])
    vocab = int(_sub_attr(config, "vocab_size", 99))
    positions = _sub_attr(config, "max_position_embeddings", None) or _sub_attr(
        config, "n_positions", None
    )
    seq = SEQ_LEN if positions is None else max(2, min(SEQ_LEN, int(positions)))
    inputs: dict[str, Any] = {}

    # Flattened patches and their grid (see patch_grid): a tower takes them as its
    # ``hidden_states``; a model as ``pixel_values``, with one placeholder per merged token.
    grid_name = grid_parameter(params)
    tower = grid_name is not None and "hidden_states" in params and "pixel_values" not in params
    grid = None
    if grid_name is not None and (tower or "pixel_values" in wanted):
        grid = patch_grid(lambda name: _sub_attr(config, name), lead[0], gen)
    if tower:
        wanted.discard("pixel_values")
    placeholders = _placeholder_layout(config, vocab, grid) if grid and not tower else None
    if placeholders is not None:  # room for them, plus text on both sides and masked padding
        seq = max(seq, len(placeholders[0]) + 4)

    special = _special_token_ids(config) | _placeholder_token_ids(config)
    eos = getattr(config, "eos_token_id", None)

    def ids(length: int, high: int = vocab, text: bool = True) -> torch.Tensor:
        """Random token ids. For text: no special tokens inside, and ``eos`` last where the
        model has one (sequence-classification heads of seq2seq models pool at the eos)."""
        drawn = torch.randint(0, max(1, high), (*id_lead, length), generator=gen)
        if not text:
            return drawn
        ordinary = [i for i in range(high) if i not in special]
        if ordinary and special:
            replacement = torch.tensor(ordinary)[drawn % len(ordinary)]
            drawn = torch.where(
                torch.isin(drawn, torch.tensor(sorted(special))), replacement, drawn
            )
        if isinstance(eos, int) and 0 <= eos < high:
            drawn[..., -1] = eos
        return drawn

    def mask(length: int) -> torch.Tensor:
        m = torch.ones((*lead, length), dtype=torch.long)
        if length > 3:
            m[1, ..., -2:] = 0
        return m

    if "input_ids" in wanted:
        inputs["input_ids"] = ids(seq)
        if placeholders is not None:
            layout, kinds = placeholders
            span = slice(1, 1 + len(layout))
            inputs["input_ids"][..., span] = torch.tensor(layout)
            if "mm_token_type_ids" in params:  # 0 text, 1 image, as processors mark them
                types = torch.zeros_like(inputs["input_ids"])
                types[..., span] = torch.tensor(kinds)
                inputs["mm_token_type_ids"] = types
        if "attention_mask" in params:
            inputs["attention_mask"] = mask(seq)
        type_vocab = _sub_attr(config, "type_vocab_size", None)
        if "token_type_ids" in params and isinstance(type_vocab, int) and type_vocab > 0:
            inputs["token_type_ids"] = ids(seq, type_vocab, text=False)
    if grid is not None:
        inputs["hidden_states" if tower else "pixel_values"] = grid.patches
        inputs[grid_name] = grid.grid
    elif "pixel_values" in wanted:
        channels = int(_sub_attr(config, "num_channels", 3))
        height, width = _image_hw(config)
        frames = _sub_attr(config, "num_frames", None)  # video models: (batch, frames, c, h, w)
        shape = (
            (channels, height, width)
            if not isinstance(frames, int)
            else (frames, channels, height, width)
        )
        inputs["pixel_values"] = torch.randn((*lead, *shape), generator=gen)
    if "input_features" in wanted:
        bins = _sub_attr(config, "num_mel_bins", None)
        if bins is not None:  # Whisper-style: (batch, mel bins, 2 x encoder positions)
            frames = 2 * int(_sub_attr(config, "max_source_positions", 10))
            inputs["input_features"] = torch.randn((*lead, int(bins), frames), generator=gen)
        else:  # Speech2Text-style: (batch, frames, features per frame)
            features = int(_sub_attr(config, "input_feat_per_channel", 16)) * int(
                _sub_attr(config, "input_channels", 1)
            )
            inputs["input_features"] = torch.randn((*lead, 20, features), generator=gen)
    bins = _sub_attr(config, "num_mel_bins", None)
    frames_total = getattr(config, "max_length", None)
    if "input_values" in wanted and isinstance(bins, int) and _sub_attr(config, "conv_dim") is None:
        # A spectrogram transformer: (batch, frames, mel bins), as many frames as it embeds.
        length = frames_total if isinstance(frames_total, int) and frames_total > 20 else 128
        inputs["input_values"] = torch.randn((*lead, length, bins), generator=gen)
    elif "input_values" in wanted:
        # Half a second at 16 kHz: long enough after the conv feature extractor's striding
        # for the time-masking spans models apply in training.
        inputs["input_values"] = torch.randn((*lead, AUDIO_SAMPLES), generator=gen)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        decoder_vocab = int(getattr(config, "decoder_vocab_size", None) or vocab)
        # As long as the encoder input: some heads index decoder states with an encoder mask.
        inputs["decoder_input_ids"] = ids(seq, decoder_vocab)
    hidden = _sub_attr(config, "hidden_size", None)
    if (
        getattr(config, "add_cross_attention", False)
        and not getattr(config, "is_encoder_decoder", False)
        and "encoder_hidden_states" in params
        and isinstance(hidden, int)
    ):
        # A decoder configured with cross-attention (reached by flipping add_cross_attention):
        # without encoder states its cross-attention layers never run.
        inputs["encoder_hidden_states"] = torch.randn((*lead, seq + 1, hidden), generator=gen)
    if "output_hidden_states" in params:
        inputs["output_hidden_states"] = True
    if "return_dict" in params:
        inputs["return_dict"] = True

    required = [
        name
        for name, p in params.items()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and name not in inputs
    ]
    # Inputs the model cannot run without although the signature makes them optional: the
    # ones it raises about when absent (``You have to specify bbox``) are named by the caller.
    series = [n for n in params if _SERIES.match(n) and main.startswith("past_")]
    for name in dict.fromkeys([*required, *series, *[n for n in require if n in params]]):
        if name in inputs:
            continue
        value = _named_input(name, config, lead, seq, gen)
        if value is not None:
            inputs[name] = value
    for name, layout in layouts:  # the other layout an error asked for (see layout_fix)
        if isinstance(inputs.get(name), torch.Tensor):
            inputs[name] = _relayout(inputs[name], layout)
    missing = [name for name in required if name not in inputs]
    if missing:
        raise ValueError(f"cannot generate the required input(s) {', '.join(missing)}")
    return inputs


_BOX = re.compile(r"(^|_)(bbox|boxes)$")
_SERIES = re.compile(r"^(past|future)_(values|time_features|observed_mask|values_padding)$")


def _series_input(
    name: str, config: Any, lead: tuple[int, ...], gen: torch.Generator
) -> torch.Tensor | None:
    """Time-series inputs: ``past_*`` spans the context plus the largest lag, ``future_*`` the
    prediction length (or ``horizon_length``); values are ``input_size`` wide (a channels
    dimension where the configuration counts ``num_input_channels``, even of one), time
    features ``num_time_features``; observed masks are all ones, paddings all zeros."""
    match = _SERIES.match(name)
    prediction = getattr(config, "prediction_length", None)
    if not isinstance(prediction, int):
        prediction = getattr(config, "horizon_length", None)
    if match is None or not isinstance(prediction, int):
        return None
    context = getattr(config, "context_length", None) or prediction
    lags = getattr(config, "lags_sequence", None) or [0]
    length = context + max(lags) if match.group(1) == "past" else prediction
    size = getattr(config, "input_size", 1)
    width: tuple[int, ...] = () if size == 1 else (size,)
    channels = getattr(config, "num_input_channels", None)
    if isinstance(channels, int) and not isinstance(channels, bool) and channels > 0:
        width = (channels,)
    if match.group(2) == "time_features":
        width = (int(getattr(config, "num_time_features", 0) or 0),)
    if match.group(2) == "observed_mask":
        return torch.ones((*lead, length, *width))
    if match.group(2) == "values_padding":  # nothing padded
        return torch.zeros((*lead, length, *width), dtype=torch.long)
    return torch.randn((*lead, length, *width), generator=gen)


def _named_input(
    name: str, config: Any, lead: tuple[int, ...], seq: int, gen: torch.Generator
) -> torch.Tensor | None:
    """A tensor for an input only its name and the configuration describe, else ``None``.

    Boxes (``bbox``): sorted corner coordinates per token, as many as ``dim_bbox`` says (4
    otherwise), integers below ``max_2d_position_embeddings`` where the model embeds them, else
    fractions. Feature inputs (``visual_feats``, ``visual_pos``): one vector per position, as
    wide as the configuration's ``<name>_dim`` (singular or plural).
    """
    series = _series_input(name, config, lead, gen)
    if series is not None:
        return series
    stems = {name, name.rstrip("s")}
    dims = [f"{stem}_dim" for stem in stems] + [f"dim_{stem}" for stem in stems]
    dim = next(
        (v for v in (_sub_attr(config, d) for d in dims) if isinstance(v, int) and v > 0), None
    )
    if _BOX.search(name):
        corners = dim if dim is not None and dim % 2 == 0 else 4
        high = _sub_attr(config, "max_2d_position_embeddings", None)
        points = torch.rand((*lead, seq, corners // 2, 2), generator=gen)
        points = points.sort(dim=-2).values  # x0 <= x1, y0 <= y1
        box = points.reshape(*lead, seq, corners)
        if isinstance(high, int) and high > 1:
            return (box * (high - 1)).long()
        return box
    if dim is not None:
        return torch.randn((*lead, seq, dim), generator=gen)
    # A categorical input the configuration sizes as ``<name>_size`` (``freq`` and
    # ``freq_size``: which frequency each series is sampled at): one id per sequence.
    categories = getattr(config, f"{name}_size", None)
    if isinstance(categories, int) and not isinstance(categories, bool) and categories > 0:
        return torch.randint(0, categories, (*lead, 1), generator=gen)
    return None


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
