"""Shrink a model configuration generically, by attribute-name patterns.

A differential test only needs a model that exercises every code path once, not a useful one, so
the configuration of each model family is cut down to a couple of layers, two or four heads and
tiny widths - small enough that building, running and back-propagating the original and the
patched model takes well under a second on a CPU.

No model family gets hand-written code: the rules below look at the attribute *names* of the
default configuration (``hidden_size``/``n_embd``/``d_model`` are widths, ``num_hidden_layers``/
``n_layer`` are depths, ...) and keep the constraints models rely on: every width is a multiple
of the head count (width = heads x head size), head sizes and rotary dimensions agree, the image
size is a multiple of the patch size, position tables stay longer than the test sequence and
special token ids stay inside the shrunk vocabulary. Nested sub-configurations (``text_config``,
``vision_config``) are shrunk recursively. Because a pattern can still pick a combination some
model rejects, :data:`SHRINK_SETTINGS` lists several settings to try in order.

Pure dict manipulation: this module neither imports torch nor the code under test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DROPOUT_NAME",
    "SHRINK_SETTINGS",
    "ShrinkSetting",
    "shrink_config_dict",
    "zero_dropout_dict",
]


@dataclass(frozen=True)
class ShrinkSetting:
    """One set of target sizes. ``None`` as a setting means "leave the configuration alone"."""

    name: str
    layers: int
    heads: int
    head_dim: int
    intermediate: int
    vocab: int
    positions: int
    image_size: int
    patch_size: int
    channels: int
    window: int
    frames: int = 4

    @property
    def width(self) -> int:
        """The model width: a multiple of the head count, as attention reshapes require."""
        return self.heads * self.head_dim


SHRINK_SETTINGS: tuple[ShrinkSetting | None, ...] = (
    ShrinkSetting(
        "tiny",
        layers=2,
        heads=2,
        head_dim=8,
        intermediate=37,
        vocab=99,
        positions=64,
        image_size=32,
        patch_size=8,
        channels=8,
        window=4,
    ),
    ShrinkSetting(
        "small",
        layers=1,
        heads=4,
        head_dim=8,
        intermediate=64,
        vocab=128,
        positions=128,
        image_size=64,
        patch_size=16,
        channels=16,
        window=4,
    ),
    ShrinkSetting(
        "medium",
        layers=2,
        heads=4,
        head_dim=16,
        intermediate=128,
        vocab=256,
        positions=512,
        image_size=224,
        patch_size=16,
        channels=32,
        window=7,
    ),
    None,  # last resort: the default configuration as shipped
)

# Exact names and suffixes; ``_shrink_value`` tries them in a fixed order, first match decides.
_LAYER_COUNT = re.compile(
    r"^(n_layers?|num_layers|num_hidden_layers|num_.*_layers|.*_layers|num_blocks|depth|"
    r"encoder_layers|decoder_layers|n_blocks)$"
)
_LAYER_LISTS = re.compile(r"^(depths|num_layers|layers|block_counts|.*_depths)$")
_HEAD_COUNT = re.compile(
    r"^(n_heads?|num_heads|num_attention_heads|num_.*_heads|.*_attention_heads)$"
)
_HEAD_LISTS = re.compile(r"^(num_heads|num_attention_heads|heads)$")
_HEAD_DIM = re.compile(r"^(head_dim|d_kv|attention_head_size|kv_channels|d_head|head_size)$")
_ROTARY_DIM = re.compile(r"^(rotary_dim|rotary_emb_dim)$")
_WIDTH = re.compile(
    r"^(hidden_size|n_embd|n_embed|d_model|embed_dim|dim|hidden_dim|model_dim|embedding_dim|"
    r"embedding_size|word_embed_proj_dim|projection_dim|emb_dim|d_latents|.*_hidden_size|"
    r".*_embed_dim|.*_d_model)$"
)
_WIDTH_LISTS = re.compile(
    r"^(hidden_sizes|embed_dims|embedding_dims|dims|widths|channels|in_channels|out_channels)$"
)
# Per-layer channel lists of a convolutional feature extractor (wav2vec2's conv_dim): any
# width works, so all layers get the same small one.
_CONV_WIDTH_LISTS = re.compile(r"^(conv_dim|conv_channels|.*_conv_dim)$")
_WINDOW = re.compile(r"^(window_size|attention_window)$")
_FRAMES = re.compile(r"^(num_frames)$")
# Compound-scaling factors (EfficientNet's width/depth coefficients, MobileNet's multipliers)
# that blow every stage up: 1.0 keeps the base architecture.
_SCALE_FACTOR = re.compile(r"^(width|depth)_(coefficient|multiplier)$")
_INTERMEDIATE = re.compile(
    r"^(intermediate_size|d_ff|n_inner|ffn_dim|mlp_dim|.*_ffn_dim|.*intermediate_size|d_inner)$"
)
_VOCAB = re.compile(r"^(vocab_size|.*_vocab_size|n_vocab|n_words)$")
_POSITIONS = re.compile(
    r"^(max_position_embeddings|n_positions|n_ctx|max_.*_positions|max_seq_len|"
    r"max_sequence_length|.*_max_position_embeddings)$"
)
_IMAGE_SIZE = re.compile(r"^(image_size|img_size|input_size)$")
_PATCH_SIZE = re.compile(r"^(patch_size|patch_sizes)$")
_TOKEN_ID = re.compile(r"^.*_token_id$")
# Names of dropout probabilities (config keys and module attributes alike): HF's
# ``hidden_dropout_prob``/``attention_dropout``, GPT-2's ``resid_pdrop``, LayerDrop, drop path.
DROPOUT_NAME = re.compile(
    r"(dropout|_pdrop$|drop_rate|drop_path|^layerdrop$|_layerdrop$|drop_prob)"
)
# Small integers that the patterns above would otherwise treat as sizes.
_KEEP = frozenset({"type_vocab_size", "num_labels", "num_channels", "num_choices"})


def _shrink_int(value: Any, target: int) -> Any:
    """``target`` when ``value`` is a larger int, else ``value`` unchanged (never grow)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    return min(value, target)


def _shrink_list(value: Any, make: Any) -> Any:
    """Rebuild a list of ints element by element (``make(index, element)``), same length."""
    if not isinstance(value, (list, tuple)) or not value:
        return value
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    return [make(i, v) for i, v in enumerate(value)]


def shrink_config_dict(defaults: dict[str, Any], setting: ShrinkSetting) -> dict[str, Any]:
    """The overrides (only the changed keys) that shrink ``defaults`` to ``setting``.

    ``defaults`` is a configuration's ``to_dict()``; the result is meant to be passed as keyword
    arguments to the configuration class, so that derived attributes are recomputed by its
    ``__init__`` from the shrunk values.
    """
    overrides: dict[str, Any] = {}
    vocab: int | None = None
    for key, value in defaults.items():
        new = _shrink_value(key, value, setting)
        if new is not value and new != value:
            overrides[key] = new
        if isinstance(key, str) and _VOCAB.match(key) and key not in _KEEP and isinstance(new, int):
            vocab = new if vocab is None else min(vocab, new)
    _shrink_width_lists(defaults, overrides, setting)
    _couple_equal_sizes(defaults, overrides)
    if vocab is not None:
        for key, value in defaults.items():
            if isinstance(key, str) and _TOKEN_ID.match(key):
                clamped = _clamp_token_id(value, vocab)
                if clamped != value:
                    overrides[key] = clamped
    image, patch = (
        overrides.get("image_size", defaults.get("image_size")),
        overrides.get("patch_size", defaults.get("patch_size")),
    )
    if isinstance(image, int) and isinstance(patch, int) and patch and image % patch:
        overrides["image_size"] = max(patch, image - image % patch)
    return overrides


def _is_sub_config(key: Any, value: Any) -> bool:
    """Nested configurations (``text_config``) - not other dicts such as ``id2label``."""
    if not isinstance(value, dict) or not isinstance(key, str):
        return False
    return key.endswith("config") or "model_type" in value


def _shrink_value(key: Any, value: Any, setting: ShrinkSetting) -> Any:
    if _is_sub_config(key, value):
        nested = shrink_config_dict(value, setting)
        return {**value, **nested} if nested else value
    if not isinstance(key, str) or key in _KEEP:
        return value
    if _HEAD_DIM.match(key):
        return _shrink_int(value, setting.head_dim)
    if _ROTARY_DIM.match(key):
        return _shrink_int(value, setting.head_dim // 2)
    if _HEAD_COUNT.match(key) or _HEAD_LISTS.match(key):
        if isinstance(value, (list, tuple)):
            # Per-stage head counts must divide per-stage widths we cannot pair up by name;
            # powers of two up to ``heads`` divide every width the stage rules produce.
            return _shrink_list(value, lambda i, v: _power_of_two_at_most(min(v, setting.heads)))
        return _shrink_int(value, setting.heads)
    if _LAYER_LISTS.match(key) and isinstance(value, (list, tuple)):
        return _shrink_list(value, lambda i, v: min(v, 1))
    if _LAYER_COUNT.match(key):
        return _shrink_int(value, setting.layers)
    if _INTERMEDIATE.match(key):
        return _shrink_int(value, setting.intermediate)
    if _CONV_WIDTH_LISTS.match(key):
        return _shrink_list(value, lambda i, v: min(v, setting.width))
    if _WINDOW.match(key):
        return _shrink_int(value, setting.window)
    if _SCALE_FACTOR.match(key) and isinstance(value, float):
        return min(value, 1.0)
    if _FRAMES.match(key):
        return _shrink_int(value, setting.frames)
    if _WIDTH_LISTS.match(key):
        return value  # see _shrink_width_lists: shrunk together, consistently
    if _WIDTH.match(key):
        return _shrink_int(value, setting.width)
    if _VOCAB.match(key):
        # Some configurations leave the vocabulary to the tokenizer (ESM: ``None``).
        return setting.vocab if value is None else _shrink_int(value, setting.vocab)
    if _POSITIONS.match(key):
        return _shrink_int(value, setting.positions)
    if _IMAGE_SIZE.match(key):
        if isinstance(value, (list, tuple)):
            return _shrink_list(value, lambda i, v: min(v, setting.image_size))
        return _shrink_int(value, setting.image_size)
    if _PATCH_SIZE.match(key):
        if isinstance(value, (list, tuple)):
            return _shrink_list(value, lambda i, v: min(v, setting.patch_size))
        return _shrink_int(value, setting.patch_size)
    return value


def _shrink_width_lists(
    defaults: dict[str, Any], overrides: dict[str, Any], setting: ShrinkSetting
) -> None:
    """Shrink all per-stage width lists with one value-to-value map.

    Stage lists constrain each other (EfficientNet's ``out_channels[i]`` feeds
    ``in_channels[i + 1]``), so equal widths must stay equal; the map keeps their order and
    makes each a multiple of ``setting.channels`` (so power-of-two head counts divide it).
    Widths up to four times that are kept: model code hard-codes small ones (EfficientNet's
    32-channel stem feeds ``in_channels[0]``).
    """
    lists = {
        key: value
        for key, value in defaults.items()
        if isinstance(key, str)
        and _WIDTH_LISTS.match(key)
        and isinstance(value, (list, tuple))
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    }
    keep = 4 * setting.channels  # small widths stay: code hard-codes stems like "32 channels"
    large = sorted({v for value in lists.values() for v in value if v > keep})
    small = {v: keep + setting.channels * (rank + 1) for rank, v in enumerate(large)}
    for key, value in lists.items():
        shrunk = [small.get(v, v) for v in value]
        if shrunk != list(value):
            overrides[key] = shrunk


_COUPLED = re.compile(r"(stride|size|dim)")


def _couple_equal_sizes(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Shrink a size the rules left alone when it equals a size they shrank.

    Such equalities are usually constraints (ViT's ``encoder_stride`` must equal
    ``patch_size`` for the masked-image decoder to rebuild the image), so they are kept.
    """
    shrunk = {
        defaults[key]: new
        for key, new in overrides.items()
        if isinstance(defaults.get(key), int) and isinstance(new, int)
    }
    for key, value in defaults.items():
        if key in overrides or not isinstance(key, str) or key in _KEEP:
            continue
        if not _COUPLED.search(key):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value in shrunk:
            overrides[key] = shrunk[value]


def _power_of_two_at_most(value: int) -> int:
    return 1 << (max(1, value).bit_length() - 1)


def _clamp_token_id(value: Any, vocab: int) -> Any:
    """Keep special token ids inside the shrunk vocabulary (embedding padding_idx must be)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if value < vocab else vocab - 1
    if isinstance(value, list):
        return [_clamp_token_id(v, vocab) for v in value]
    return value


def zero_dropout_dict(config: dict[str, Any]) -> dict[str, Any]:
    """Overrides that set every dropout-like probability (and LayerDrop) in ``config`` to 0.

    Train mode with all dropout at 0 makes a training-time forward deterministic, so it can be
    compared exactly while still running every ``self.training`` branch of the model.
    """
    overrides: dict[str, Any] = {}
    for key, value in config.items():
        if _is_sub_config(key, value):
            nested = zero_dropout_dict(value)
            if nested:
                overrides[key] = {**value, **nested}
        elif (
            isinstance(key, str)
            and DROPOUT_NAME.search(key)
            and isinstance(value, float)
            and value != 0.0
        ):
            overrides[key] = 0.0
    return overrides
