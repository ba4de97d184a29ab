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

import math
import re
from dataclasses import dataclass
from typing import Any

from ..config_names import DROPOUT_NAME, zero_dropout_dict
from ..config_names import LAYER_COUNT_NAME as _LAYER_COUNT
from ..config_names import LAYER_LIST_NAME as _LAYER_LISTS
from ..config_names import is_sub_config as _is_sub_config

__all__ = [
    "DROPOUT_NAME",
    "SHRINK_SETTINGS",
    "ShrinkSetting",
    "fill_expert_counts",
    "keep_layer_structures",
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
    # Widths in multiples of 32, the group count GroupNorm layers usually have, and stage
    # widths in multiples of 128, so that a quarter of one (a bottleneck) still is one.
    ShrinkSetting(
        "grouped",
        layers=1,
        heads=2,
        head_dim=32,
        intermediate=64,
        vocab=128,
        positions=128,
        image_size=64,
        patch_size=16,
        channels=128,
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
# (Layer counts and dropout names are shared with ``bench``: :mod:`adopter.models.config_names`.)
_HEAD_COUNT = re.compile(
    r"^(n_heads?|num_heads|num_attention_heads|num_.*_heads|.*_attention_heads|.*_n_heads|"
    r"n_.*_heads)$"
)
_HEAD_LISTS = re.compile(r"^(num_heads|num_attention_heads|heads)$")
_HEAD_DIM = re.compile(
    r"^(head_dim|d_kv|attention_head_size|kv_channels|d_head|head_size|.*_d_head|.*_headdim)$"
)
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
# The channel count of a convolutional stack's first stage, which later stages multiply
# (VibeVoice's tokenizer doubles ``num_filters`` over seven stages).
_BASE_CHANNELS = re.compile(r"^(num_filters|n_filters|base_channels|base_filters)$")
_WINDOW = re.compile(r"^(window_size|attention_window)$")
# Counts kept small alike: video frames, and a detector's object queries (RT-DETR and its
# descendants pick their top ``num_queries`` anchors of the encoder's feature maps, of which a
# small image has few: 21 at 32 pixels).
_FRAMES = re.compile(r"^(num_frames|num_queries)$")
# Compound-scaling factors (EfficientNet's width/depth coefficients, MobileNet's multipliers)
# that blow every stage up: 1.0 keeps the base architecture.
_SCALE_FACTOR = re.compile(r"^(width|depth)_(coefficient|multiplier)$")
_INTERMEDIATE = re.compile(
    r"^(intermediate_size|d_ff|n_inner|ffn_dim|mlp_dim|.*_ffn_dim|.*intermediate_size|d_inner)$"
)
_EXPERT_WIDTH = re.compile(r"(moe|expert)")
_VOCAB = re.compile(r"^(vocab_size|.*_vocab_size|n_vocab|n_words)$")
_POSITIONS = re.compile(
    r"^(max_position_embeddings|n_positions|n_ctx|max_.*_positions|max_seq_len|"
    r"max_sequence_length|.*_max_position_embeddings)$"
)
_IMAGE_SIZE = re.compile(r"^(image_size|img_size|input_size)$")
_PATCH_SIZE = re.compile(r"^(patch_size|patch_sizes)$")
_TOKEN_ID = re.compile(r"^.*_token_id$")
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
    _shape_experts(defaults, overrides)
    _shape_attention_heads(defaults, overrides)
    _follow_sub_config_widths(defaults, overrides)
    keep_layer_structures(defaults, overrides)
    _shrink_stage_names(defaults, overrides)
    _couple_equal_sizes(defaults, overrides)
    _switch_defaults(defaults, overrides)
    if vocab is not None:
        _shrink_cutoffs(defaults, overrides, vocab)
        tokenizer_ids = any(
            isinstance(k, str) and _VOCAB.match(k) and v is None for k, v in defaults.items()
        )
        spare = 1
        for key, value in defaults.items():
            if tokenizer_ids and key in ("pad_token_id", "mask_token_id") and value is None:
                # The vocabulary is the tokenizer's (ESM), so are its special ids: pick some.
                overrides[key] = spare
                spare += 1
                continue
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
        if isinstance(value, (list, tuple)):  # one per layer: see _keep_layer_kinds
            return _shrink_list(value, lambda i, v: min(v, setting.intermediate))
        if _EXPERT_WIDTH.search(key) and _is_int(value):
            # Expert weights run through grouped matrix multiplies (``torch._grouped_mm``),
            # which need rows aligned to 16 bytes: a multiple of 8 elements.
            return min(value, -(-setting.intermediate // 8) * 8)
        return _shrink_int(value, setting.intermediate)
    if _CONV_WIDTH_LISTS.match(key):
        return _shrink_list(value, lambda i, v: min(v, setting.width))
    if _BASE_CHANNELS.match(key):
        return _shrink_int(value, setting.channels)
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


def _derive_head_dim(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """A ``head_dim`` the defaults leave ``None`` gets the width per head, the value it stands
    for: some attention code reads it without deriving it (Ministral's ``head_dim ** -0.5``)."""
    if "head_dim" not in defaults or defaults["head_dim"] is not None:
        return
    width = next((k for k in ("hidden_size", "d_model") if _is_int(defaults.get(k))), None)
    heads = next(
        (k for k in ("num_attention_heads", "num_heads") if _is_int(defaults.get(k))), None
    )
    if width is None or heads is None:
        return
    new_width, new_heads = (
        overrides.get(width, defaults[width]),
        overrides.get(heads, defaults[heads]),
    )
    if new_heads and new_width % new_heads == 0:
        overrides["head_dim"] = new_width // new_heads


# How many experts a token is routed to, and the experts every token goes through.
_EXPERTS_PER_TOKEN = re.compile(r"^(num_experts_per_tok|num_experts_per_token|moe_topk)$")
_SHARED_EXPERTS = re.compile(r"^(num|n)_shared_experts$")
_FILLED_EXPERTS = 4
"""Routed experts given to a configuration whose defaults leave the count unset."""


def fill_expert_counts(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Expert counts the defaults leave ``None`` (and ``overrides`` does not set) get small
    ones. Some mixture-of-experts configurations (transformers 5.24's Dots1, DeepSeek-V2) ship
    no counts in the class, only in each checkpoint's configuration, and their modules read
    them as ints (``torch.empty(None, ...)``, ``topk(k=None)``): 4 routed experts, 2 per token
    (at most as many as there are), 1 shared."""
    routed = next(
        (
            v
            for k, v in defaults.items()
            if isinstance(k, str) and _EXPERT_COUNT.match(k) and _is_int(v)
        ),
        _FILLED_EXPERTS,
    )
    for key, value in defaults.items():
        if value is not None or not isinstance(key, str) or key in overrides:
            continue
        if _EXPERT_COUNT.match(key):
            overrides[key] = _FILLED_EXPERTS
        elif _EXPERTS_PER_TOKEN.match(key):
            overrides[key] = min(2, routed)
        elif _SHARED_EXPERTS.match(key):
            overrides[key] = 1


_EXPAND = re.compile(r"^(.*_)?expand$")
_GROUPS = re.compile(r"^(.*_)?n_?groups$")


def _keep_expanded_heads(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Keep ``heads x head size == expand x width`` where the defaults have it.

    State-space mixers (Mamba-2) split the expanded width ``expand x hidden_size`` into heads
    of ``head_dim``, and their configurations check the product. The name rules shrink heads,
    head size and width independently, so the head count is recomputed from the other three;
    head groups (``n_groups``) that divided the heads are cut to keep dividing them.
    """
    width = next((k for k in ("hidden_size", "d_model") if _is_int(defaults.get(k))), None)
    if width is None:
        return
    new_width = overrides.get(width, defaults[width])

    def ints(pattern: re.Pattern[str]) -> list[str]:
        return [
            k for k, v in defaults.items() if isinstance(k, str) and pattern.match(k) and _is_int(v)
        ]

    for expand in ints(_EXPAND):
        product = defaults[expand] * defaults[width]
        for heads in ints(_HEAD_COUNT):
            for dim in ints(_HEAD_DIM):
                if defaults[heads] * defaults[dim] != product:
                    continue
                new_dim = overrides.get(dim, defaults[dim])
                wanted = overrides.get(expand, defaults[expand]) * new_width
                if not new_dim or wanted % new_dim:
                    continue
                overrides[heads] = wanted // new_dim
                for groups in ints(_GROUPS):
                    if defaults[heads] % defaults[groups] == 0:
                        new_groups = math.gcd(defaults[groups], overrides[heads])
                        if new_groups != defaults[groups]:
                            overrides[groups] = new_groups
                return


_EXPERT_COUNT = re.compile(r"^(num|n)_(local_|routed_)?experts$")


def _shape_experts(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """A mixture of experts: widths aligned for grouped multiplies, counts that are unset set."""
    _align_expert_widths(defaults, overrides)
    fill_expert_counts(defaults, overrides)


def _align_expert_widths(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """In a mixture-of-experts configuration the plain ``intermediate_size`` can be the
    experts' width too (Jamba): align every shrunk one to 8 elements, as above."""
    if not any(
        isinstance(k, str) and _EXPERT_COUNT.match(k) and _is_int(v) and v > 1
        for k, v in defaults.items()
    ):
        return
    for key, new in list(overrides.items()):
        if isinstance(key, str) and _INTERMEDIATE.match(key) and _is_int(new) and new % 8:
            overrides[key] = min(defaults[key], -(-new // 8) * 8)


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
        and (_WIDTH_LISTS.match(key) or _WIDTH.match(key))  # Florence's per-stage embed_dim
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


_CUTOFFS = re.compile(r"^(.*_)?cutoffs?$")


def _shrink_cutoffs(defaults: dict[str, Any], overrides: dict[str, Any], vocab: int) -> None:
    """Scale adaptive-softmax cluster boundaries (``cutoffs``) into the shrunk vocabulary,
    keeping them strictly increasing and below it."""
    old_vocab = max(
        (v for k, v in defaults.items() if isinstance(k, str) and _VOCAB.match(k) and _is_int(v)),
        default=None,
    )
    if not old_vocab or old_vocab <= vocab:
        return
    for key, value in defaults.items():
        if not (isinstance(key, str) and _CUTOFFS.match(key) and isinstance(value, (list, tuple))):
            continue
        if not value or not all(_is_int(v) for v in value):
            continue
        scaled: list[int] = []
        for v in value:
            new = max(v * vocab // old_vocab, scaled[-1] + 1 if scaled else 1)
            scaled.append(new)
        if scaled[-1] < vocab:
            overrides[key] = scaled


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _pattern_length(value: Any) -> int | None:
    """Expanded length of ``[[pattern, count], ...]`` (GPT-Neo's ``attention_types``), else None.

    Each entry is a list/tuple pattern (one element per layer) and an integer repeat count.
    """
    if not isinstance(value, (list, tuple)) or not value:
        return None
    total = 0
    for entry in value:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
            return None
        pattern, count = entry
        if not (isinstance(pattern, (list, tuple)) and pattern and _is_int(count) and count > 0):
            return None
        total += len(pattern) * count
    return total


_PER_LAYER = re.compile(r"(layers|types|_type)$")  # Zamba2: layers_block_type
# Lists of layer indices (``mlp_only_layers``, ``attn_layer_indices``): a kind of layer each.
_LAYER_INDICES = re.compile(r"(_layers|_indices|_layer_ids)$")
# Periodic layer kinds: layer ``i`` is special where ``i % period == offset`` (Jamba's
# ``attn_layer_period``/``attn_layer_offset``) or every ``interval``-th layer is
# (``full_attention_interval``).
_LAYER_PERIOD = re.compile(r"^(.*_)?(period|interval)$")


def keep_layer_structures(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Keep per-layer structures consistent with a shrunk layer count.

    A repeat pattern ``[[pattern, count], ...]`` whose expansion has as many entries as a layer
    count had gets its counts scaled down (at least one repeat each); the layer count then
    becomes the new expanded length, which may exceed the target when a pattern is longer.
    Flat lists with one entry per original layer (``layer_types``, ``mlp_layer_types``) keep
    the same selection of layers, see :func:`_keep_layer_kinds`.
    """
    reduced = {
        key: (defaults[key], new)
        for key, new in overrides.items()
        if isinstance(key, str)
        and _LAYER_COUNT.match(key)
        and _is_int(defaults.get(key))
        and _is_int(new)
        and new < defaults[key]
    }
    if not reduced:
        return
    for key, value in defaults.items():
        if key in overrides or not isinstance(key, str) or _is_sub_config(key, value):
            continue
        expanded = _pattern_length(value)
        if expanded is None:
            continue
        for old, new in reduced.values():
            if expanded != old:
                continue
            scaled = [[list(pattern), max(1, (count * new) // old)] for pattern, count in value]
            length = _pattern_length(scaled)
            overrides[key] = scaled
            for other, (other_old, _) in reduced.items():
                if other_old == old:
                    overrides[other] = length
            break
    for layer_key, (old, _) in reduced.items():
        if old > 1:
            _keep_layer_kinds(defaults, overrides, layer_key, old, reduced)
    _shrink_layer_periods(defaults, overrides, reduced)
    _cover_cyclic_kinds(defaults, overrides, reduced)
    _add_attention_layer(defaults, overrides, reduced)


_ATTENTION_INDICES = re.compile(r"^(attn|attention)_layer_(indices|ids)$")


def _add_attention_layer(
    defaults: dict[str, Any], overrides: dict[str, Any], reduced: dict[str, tuple[int, int]]
) -> None:
    """A hybrid whose attention layers are an index list left empty (Bamba's
    ``attn_layer_indices: None``) is all state-space layers by default, which a generation
    cache cannot measure; the shrunk model puts attention on its last layer, so both kinds of
    layer run."""
    depth = max((overrides[key] for key in reduced if _is_int(overrides.get(key))), default=0)
    if depth < 2:
        return
    for key, value in defaults.items():
        if isinstance(key, str) and _ATTENTION_INDICES.match(key) and value in (None, []):
            if key not in overrides:
                overrides[key] = [depth - 1]
        # The same in transformers' layer-kind vocabulary (GraniteMoeHybrid's default
        # ``layer_types`` is all "linear_attention").
        kinds = overrides.get(key, value)
        if (
            isinstance(key, str)
            and _PER_LAYER.search(key)
            and isinstance(kinds, (list, tuple))
            and len(kinds) == depth
            and set(kinds) == {"linear_attention"}
        ):
            overrides[key] = [*kinds[:-1], "full_attention"]


def _cover_cyclic_kinds(
    defaults: dict[str, Any], overrides: dict[str, Any], reduced: dict[str, tuple[int, int]]
) -> None:
    """A per-layer name list shorter than the layers repeats over them (RecurrentGemma's
    ``block_types``: two recurrent blocks, then attention): the depth grows to reach the
    first layer of every kind it names."""
    for key, value in defaults.items():
        if key in overrides or not isinstance(key, str) or not _PER_LAYER.search(key):
            continue
        if not isinstance(value, (list, tuple)) or not value or _pattern_length(value):
            continue
        if not all(isinstance(v, str) for v in value):
            continue
        reach = max(value.index(kind) for kind in set(value)) + 1
        for layer_key, (old, _) in reduced.items():
            new = overrides.get(layer_key)
            if len(value) < old and _is_int(new) and new < reach <= old:
                overrides[layer_key] = reach


_PER_LAYER_VALUES = re.compile(r"(_pattern|intermediate_size)$")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _keep_layer_kinds(
    defaults: dict[str, Any],
    overrides: dict[str, Any],
    layer_key: str,
    old: int,
    reduced: dict[str, tuple[int, int]],
) -> None:
    """Cut the per-layer lists of ``old`` layers to a selection that keeps every layer kind.

    A hybrid model (linear and full attention, Mamba and attention, dense and sparse MLPs)
    runs code for each kind of layer it has, and some only work with every kind present (a
    cache that needs one attention layer). So the selection is the first layer of each kind
    of every per-layer name list (``layer_types``) and of each layer-index list
    (``mlp_only_layers``: one listed layer, one not listed), topped up with the first other
    layers to the shrunk count; all such lists keep the same layers, index lists are renumbered
    and the layer count becomes the selection's size.
    """
    target = overrides[layer_key]
    if not _is_int(target):
        return
    names = {
        key: list(overrides.get(key, value))
        for key, value in defaults.items()
        if isinstance(key, str)
        and not _is_sub_config(key, value)
        and isinstance(value, (list, tuple))
        and _pattern_length(value) is None
        and len(value) == old
        and len(overrides.get(key, value)) == old
        and (
            (_PER_LAYER.search(key) and all(isinstance(v, str) for v in value))
            # Per-layer values (Gemma3n's ``intermediate_size`` and
            # ``activation_sparsity_pattern`` lists): distinct values are kinds too.
            or (_PER_LAYER_VALUES.search(key) and all(_is_number(v) for v in value))
            # A flag per layer under an index-list name (SmolLM3's and Llama 4's
            # ``no_rope_layers``: 1 or 0 for each of the layers) repeats its values.
            or (_per_layer_flags(key, value))
        )
    }
    indices = {
        key: set(value)
        for key, value in defaults.items()
        if key not in overrides
        and isinstance(key, str)
        and _LAYER_INDICES.search(key)
        and isinstance(value, (list, tuple))
        and value
        and all(_is_int(v) and 0 <= v < old for v in value)
        and not _per_layer_flags(key, value)
    }
    # Per-layer settings keyed by layer index (``per_layer_config: {"05": {...}}``).
    keyed = {
        key: value
        for key, value in defaults.items()
        if key not in overrides
        and isinstance(key, str)
        and "layer" in key  # not ``id2label``, which is keyed by small ints too
        and isinstance(value, dict)
        and value
        and all(_layer_index(k, old) is not None for k in value)
    }
    for key, value in keyed.items():
        indices[key] = {_layer_index(k, old) for k in value}  # type: ignore[misc]
    if not names and not indices:
        return
    keep: set[int] = set()
    for value in names.values():
        for kind in dict.fromkeys(value):
            keep.add(value.index(kind))
    for members in indices.values():
        keep.add(min(members))
        outside = [i for i in range(old) if i not in members]
        if outside:
            keep.add(outside[0])
    for i in range(old):
        if len(keep) >= target:
            break
        keep.add(i)
    chosen = sorted(keep)
    for key, value in names.items():
        overrides[key] = [value[i] for i in chosen]
    for key, members in indices.items():
        if key in keyed:
            by_index = {_layer_index(k, old): (k, v) for k, v in keyed[key].items()}
            overrides[key] = {
                _renumbered(by_index[i][0], position): by_index[i][1]
                for position, i in enumerate(chosen)
                if i in members
            }
            continue
        overrides[key] = [position for position, i in enumerate(chosen) if i in members]
    for other, (other_old, _) in reduced.items():
        if other_old == old:
            overrides[other] = len(chosen)


def _shape_attention_heads(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """The head counts and sizes, in this order: expanded heads, query groups, unset key/value
    head counts, then the head size derived from the shrunk width and counts."""
    _keep_expanded_heads(defaults, overrides)
    _keep_query_groups(defaults, overrides)
    _give_unset_key_value_heads(defaults, overrides)
    _derive_head_dim(defaults, overrides)


_KV_HEADS = re.compile(r"^(num_key_value_heads|n_kv_heads|num_kv_heads|n_head_kv)$")


def _keep_query_groups(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Grouped-query attention stays grouped: where the default configuration has at least
    twice as many query heads as key/value heads, the shrunk one has half as many key/value
    heads as query heads (shrinking both to the same count made every such model multi-head,
    so the code that repeats key/value heads never ran, and layers that double their key/value
    heads, MiMo-V2's sliding-window ones, ended up with more of them than query heads)."""
    heads = overrides.get("num_attention_heads")
    default_heads = defaults.get("num_attention_heads")
    if not (_is_int(heads) and _is_int(default_heads) and heads >= 2):
        return
    for key, value in defaults.items():
        if not (isinstance(key, str) and _KV_HEADS.match(key) and _is_int(value) and value > 0):
            continue
        if default_heads >= 2 * value and default_heads % value == 0:
            overrides[key] = heads // 2


def _give_unset_key_value_heads(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """A key/value head count the default configuration leaves ``None`` is set to the query head
    count: multi-head attention, what ``None`` means in the configurations that fill it in
    themselves. Nemotron's leaves it unset, and its attention divides by it, so no configuration
    built from the defaults ran."""
    heads = overrides.get("num_attention_heads", defaults.get("num_attention_heads"))
    if not _is_int(heads):
        return
    for key, value in defaults.items():
        if isinstance(key, str) and _KV_HEADS.match(key) and value is None:
            overrides.setdefault(key, heads)


def _per_layer_flags(key: str, value: Any) -> bool:
    """A list under an index-list name that holds one repeated small int per layer rather than
    distinct layer indices: a repeat cannot be an index list."""
    return (
        bool(_LAYER_INDICES.search(key))
        and isinstance(value, (list, tuple))
        and len(value) > 1
        and all(_is_int(v) for v in value)
        and len(set(value)) < len(value)
    )


def _layer_index(key: Any, layers: int) -> int | None:
    """``key`` as a layer index below ``layers`` (an int or a string of digits), else None."""
    if _is_int(key):
        index = key
    elif isinstance(key, str) and key.isdigit():
        index = int(key)
    else:
        return None
    return index if 0 <= index < layers else None


def _renumbered(key: Any, position: int) -> Any:
    """``position`` spelt like the layer key it replaces (``"05"``: zero-padded digits)."""
    return key.__class__(position) if _is_int(key) else str(position).zfill(len(key))


def _shrink_layer_periods(
    defaults: dict[str, Any], overrides: dict[str, Any], reduced: dict[str, tuple[int, int]]
) -> None:
    """Layer periods longer than the shrunk depth would leave out their special layers: the
    period becomes the depth (an offset stays inside it), so each kind keeps one layer."""
    depth = max((overrides[key] for key in reduced if _is_int(overrides.get(key))), default=None)
    if depth is None or depth < 2:
        return
    for key, value in defaults.items():
        match = _LAYER_PERIOD.match(key) if isinstance(key, str) else None
        if match is None or key in overrides or not _is_int(value) or value <= depth:
            continue
        overrides[key] = depth
        offset = f"{match.group(1) or ''}offset"
        if _is_int(defaults.get(offset)) and offset not in overrides:
            overrides[offset] = min(defaults[offset], depth - 1)


def _shrink_stage_names(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Backbone outputs (``out_features``/``out_indices``) of stages that a shrunk layer count
    removed move to the last remaining stage; ``stage_names`` is cut to match."""
    names = defaults.get("stage_names")
    if not (isinstance(names, (list, tuple)) and names) or "stage_names" in overrides:
        return
    depth = next(
        (
            new
            for key, new in overrides.items()
            if isinstance(key, str)
            and _LAYER_COUNT.match(key)
            and _is_int(new)
            and defaults.get(key) == len(names) - 1
        ),
        None,
    )
    if depth is None or depth >= len(names) - 1:
        return
    if any(
        isinstance(k, str)
        and _LAYER_LISTS.match(k)
        and isinstance(v, (list, tuple))
        and len(v) == len(names) - 1
        for k, v in defaults.items()
    ):
        return  # stages come from a per-stage list (Swin's ``depths``), which keeps its length
    kept = list(names[: depth + 1])
    overrides["stage_names"] = kept
    features = defaults.get("out_features")
    if isinstance(features, (list, tuple)):
        moved = [kept[min(names.index(f), depth)] for f in features if f in names]
        overrides["out_features"] = list(dict.fromkeys(moved))
    indices = defaults.get("out_indices")
    if isinstance(indices, (list, tuple)) and all(_is_int(i) for i in indices):
        overrides["out_indices"] = list(dict.fromkeys(min(i, depth) for i in indices))


# ``default_language: None`` beside ``languages: [...]``: the model needs one picked.
_DEFAULT_CHOICE = re.compile(r"^default_(\w+)$")
# Backbones from optional libraries (``use_timm_backbone``): use the transformers one instead.
_OPTIONAL_BACKBONE = re.compile(r"^use_\w+_backbone$")


# Horizons a forecasting model must be given (``prediction_length``: no default).
_REQUIRED_LENGTH = re.compile(r"^prediction_length$")


def _switch_defaults(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Settings a model cannot run without, picked from the configuration itself."""
    for key, value in defaults.items():
        if not isinstance(key, str):
            continue
        choice = _DEFAULT_CHOICE.match(key)
        if choice and value is None:
            for plural in (choice.group(1) + "s", choice.group(1) + "es"):
                options = defaults.get(plural)
                if isinstance(options, (list, tuple)) and options:
                    overrides[key] = options[0]
                    break
        if _OPTIONAL_BACKBONE.match(key) and value is True:
            overrides[key] = False
        if _REQUIRED_LENGTH.match(key) and value is None:
            overrides[key] = 4


_COUPLED = re.compile(r"(stride|size|dim)")
# Sizes a parent configuration repeats from a backbone's stage widths (UperNet's
# ``auxiliary_in_channels``, ViT-hybrid's ``backbone_featmap_shape``).
_CHANNEL_REFS = re.compile(r"(channels|featmap_shape)$")


def _follow_sub_config_widths(defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Map channel sizes of this configuration the way a sub-config's width lists were mapped."""
    mapping: dict[int, int] = {}
    for key, new in overrides.items():
        old = defaults.get(key)
        if not (_is_sub_config(key, old) and isinstance(new, dict)):
            continue
        for name, values in old.items():
            shrunk = new.get(name)
            if not (isinstance(name, str) and _WIDTH_LISTS.match(name)):
                continue
            if isinstance(values, (list, tuple)) and isinstance(shrunk, list):
                if len(values) == len(shrunk):
                    mapping.update((a, b) for a, b in zip(values, shrunk) if _is_int(a) and a != b)
    if not mapping:
        return
    for key, value in defaults.items():
        if key in overrides or not isinstance(key, str) or not _CHANNEL_REFS.search(key):
            continue
        if _is_int(value) and value in mapping:
            overrides[key] = mapping[value]
        elif isinstance(value, (list, tuple)) and any(_is_int(v) and v in mapping for v in value):
            overrides[key] = [mapping.get(v, v) if _is_int(v) else v for v in value]


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
