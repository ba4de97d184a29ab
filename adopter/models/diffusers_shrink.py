"""Small configurations of a diffusers model class, read from its ``__init__`` defaults.

A diffusers model is configured by the keyword arguments of its ``__init__``
(``register_to_config``), and each class names its sizes its own way (``block_out_channels``,
``hidden_size``, ``dim``, ``inner_dim``, ``c_hidden``...). Sizes are related: the attention
width is the heads times the head dimension, rotary axes add up to the head dimension, norm
groups divide the channels, a conditioning width is another block's input. Cutting each size
to a fixed small value breaks those relations; dividing every width by one factor keeps them
(``a == b``, ``a == 2 * b``, ``a % b == 0`` and ``a == b + c + d`` all survive a common
divisor), so that is what a setting does:

- widths (arguments whose name says dimension, channels, hidden or embedding size, and the
  norm groups that divide them) are divided by a power of two ``factor``: the largest (up to
  :data:`MAX_FACTOR`) that divides every width a model chose (the multiples of 8: 20 audio
  features or 257 conditioning inputs are data sizes and stay), keeps rotary axes even and
  heads dimensions at least :data:`MIN_HEAD_DIM`;
- head counts stay, so a width that is heads x head dimension stays one; or, in a second
  setting, drop to :data:`HEADS` with the widths equal to heads x head dimension following;
- depths (``num_layers``, ``layers_per_block``, ``depth``, per-stage lists) go to 1 (2 in a
  later setting), and lists of layer indices (``vace_layers``) keep those below the new depth;
- the sample edge (``sample_size``, ``sample_height``) goes to :data:`SAMPLE`.

The interface widths (``in_channels``, ``latent_channels``) shrink with the others: the
inputs are made from the small configuration. Nothing here is keyed on a model's name, and
nothing imports torch or diffusers.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "HEADS",
    "MAX_FACTOR",
    "MIN_HEAD_DIM",
    "SAMPLE",
    "Setting",
    "classify",
    "init_defaults",
    "settings_for",
    "shrunk_config",
    "width_factor",
]

SAMPLE = 16
"""The edge of the latent sample a small model is built for (and given)."""
MAX_FACTOR = 32
"""Widths are divided by at most this: 3072 becomes 96, 320 becomes 10."""
MIN_HEAD_DIM = 4
"""A head dimension below this leaves rotary embeddings no pair to rotate."""
HEADS = 2
"""The head count of the setting that cuts heads as well as widths."""
STAGE = 32
"""The width step of the setting that gives per-block widths 32, 64, 96..."""

_DEPTH_WORDS = frozenset({"layers", "layer", "nlayers", "blocks", "depth", "depths"})
_NOT_DEPTH_WORDS = frozenset({"dim", "dims", "channels", "channel", "size", "sizes", "kernel"})
_INDEX_WORDS = frozenset({"id", "ids", "index", "indices", "idx"})
_HEAD_WORDS = frozenset({"heads", "head", "nhead", "nheads"})
_WIDTH_WORDS = frozenset(
    {
        "dim", "dims", "channels", "channel", "hidden", "features", "embd", "inner", "ff",
        "ffn", "ch", "c", "cond", "r", "groups", "kv",
    }
)  # fmt: skip
"""Words of a width's name (``d_model``, ``c_hidden``, ``n_embd``, ``multiple_of``: the
FFN's rounding, which must shrink with the widths it rounds)."""
_NOT_WIDTH_WORDS = frozenset(
    {
        "kernel", "kernels", "rate", "rates", "ratio", "ratios", "factor", "factors", "len",
        "length", "lens", "max", "min", "fps", "theta", "offset", "stride", "strides", "vocab",
        "codebook", "mult", "mults", "multiplier", "multipliers", "multiples", "scale", "shift",
        "token", "tokens", "pos", "sampling", "hop", "fft", "mels", "mel", "bins",
        "resolution", "frames", "window", "steps", "timesteps", "every", "interval",
        "compression", "compress", "expansions", "size", "sizes", "padding", "levels",
        "queries", "querie", "experts", "classes", "types", "seq", "sequence",
        "batch", "num", "partition", "extra", "magnitude",
    }
)  # fmt: skip
"""Words that make a name something else than a model width: a rate, a length, a count, a
data size (``num_mel_channels``). Interface widths (``in_channels``, ``latent_channels``) are
widths: the inputs are made from the configuration, so they follow."""
_WIDTH_SIZE = frozenset({"hidden_size", "intermediate_size"})
"""The ``*_size`` names that are widths (the others are patch, sample, kernel sizes)."""
_ROPE_WORDS = frozenset({"rope", "axes", "mrope", "rotary"})


@dataclass(frozen=True)
class Setting:
    """One small configuration to try: its label (for reports) and the arguments it sets."""

    label: str
    config: dict[str, Any] = field(default_factory=dict)


def init_defaults(cls: type) -> dict[str, Any]:
    """``cls.__init__``'s keyword arguments with a default, and those defaults."""
    defaults: dict[str, Any] = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or parameter.default is inspect.Parameter.empty:
            continue
        if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
            continue
        defaults[name] = parameter.default
    return defaults


def _words(name: str) -> set[str]:
    return {word for word in name.lower().split("_") if word}


def _is_ints(value: Any) -> bool:
    """An integer or a non-empty list or tuple of integers (booleans are neither)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return (
        isinstance(value, (tuple, list))
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def classify(name: str, value: Any) -> str | None:
    """What an integer ``__init__`` argument sizes: ``"depth"``, ``"indices"`` (layer
    indices), ``"heads"``, ``"head_dim"``, ``"rope"`` (rotary axes), ``"width"``,
    ``"sample"``, or ``None`` (left alone)."""
    if not _is_ints(value):
        return None
    words = _words(name)
    if name.startswith("sample_") and words & {"size", "height", "width"}:
        return "sample"
    if words & _ROPE_WORDS and words & {"dim", "dims", "section"}:
        return "rope"
    if words & _DEPTH_WORDS and not words & _NOT_DEPTH_WORDS:
        return "indices" if words & _INDEX_WORDS or _ascending_indices(value) else "depth"
    if words & _HEAD_WORDS:
        return "head_dim" if words & {"dim", "dims"} else "heads"
    return "width" if _is_width(name, words) else None


_NAMED_WIDTHS = frozenset({"norm_num_groups", "groups", "d_model", "d_ff", "d_kv", "multiple_of"})
"""Widths by their whole name: norm groups (they divide the channels, so they shrink with
them), T5-style ``d_*`` and the FFN's rounding ``multiple_of``."""


def _is_width(name: str, words: set[str]) -> bool:
    if name in _WIDTH_SIZE or name.endswith(tuple(f"_{n}" for n in _WIDTH_SIZE)):
        return True
    if name in _NAMED_WIDTHS or name.endswith("norm_num_groups"):
        return True
    return bool(words & _WIDTH_WORDS and not words & _NOT_WIDTH_WORDS)


def _ascending_indices(value: Any) -> bool:
    """A list of layer indices (``(0, 5, 10)``): strictly ascending from 0, unlike per-stage
    depths such as ``(3, 3, 4, 6, 3)`` or ``(8, 24)``."""
    if not isinstance(value, (tuple, list)) or len(value) < 2 or value[0] != 0:
        return False
    return all(b > a for a, b in zip(value, value[1:], strict=False))


def _ints(value: Any) -> list[int]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _chosen(values: list[int]) -> list[int]:
    """The widths of ``values`` that the model chose (multiples of 8); a list is taken whole
    or not at all, so that its widths keep their ratios."""
    if len(values) > 1:
        return values if all(v % 8 == 0 and v > 0 for v in values) else []
    return [v for v in values if v % 8 == 0 and v > 0]


def _divides(factor: int, kind: str, values: list[int]) -> bool:
    """Whether ``factor`` divides ``values`` (of a width of kind ``kind``) as they must be.
    A head dimension of 16 or less is taken for a head count (UNets' ``attention_head_dim``
    of 8 is one) and stays; a larger one keeps at least :data:`MIN_HEAD_DIM`."""
    if kind == "rope":
        return all(v % (2 * factor) == 0 for v in values)
    chosen = _chosen(values)
    if kind == "head_dim":
        chosen = [v for v in chosen if v > 16]
        if any(v // factor < MIN_HEAD_DIM for v in chosen):
            return False
    return all(v % factor == 0 for v in chosen)


def _head_counts_of(defaults: dict[str, Any], kinds: dict[str, str | None]) -> set[int]:
    """Every head count among ``defaults``: the heads arguments, and the head "dimensions"
    of 16 or less (UNets' ``attention_head_dim`` of 8, which counts heads)."""
    counts = {v for n, v in defaults.items() if kinds[n] == "heads" for v in _ints(v) if v > 1}
    counts |= {
        v for n, v in defaults.items() if kinds[n] == "head_dim" for v in _ints(v) if 1 < v <= 16
    }
    return counts


def _keeps_heads(factor: int, widths: list[int], counts: set[int]) -> bool:
    """Whether each width a head count divides still divides by it once divided by
    ``factor`` (320 channels over 8 heads: a factor of 32 leaves 10, which 8 heads cannot
    split)."""
    return all(
        (w // factor) % h == 0 for w in widths if w % factor == 0 for h in counts if w % h == 0
    )


def width_factor(defaults: dict[str, Any], limit: int = MAX_FACTOR) -> int:
    """The largest power of two up to ``limit`` that divides every width of ``defaults``
    chosen by the model (the multiples of 8), keeps each rotary axis even, each head
    dimension at least :data:`MIN_HEAD_DIM`, and each width split into as many heads as
    before."""
    kinds = {name: classify(name, value) for name, value in defaults.items()}
    sized = [name for name, kind in kinds.items() if kind in ("width", "head_dim", "rope")]
    counts = _head_counts_of(defaults, kinds)
    widths = [  # norm groups divide channels; heads do not split them
        v
        for n in sized
        if kinds[n] == "width" and "groups" not in _words(n)
        for v in _chosen(_ints(defaults[n]))
    ]
    factor = limit
    while factor > 1:
        if all(_divides(factor, kinds[n], _ints(defaults[n])) for n in sized) and _keeps_heads(
            factor, widths, counts
        ):
            return factor
        factor //= 2
    return 1


def _scaled(value: Any, factor: int, kind: str = "width") -> Any:
    """``value`` (an int or a list of ints) with each width the model chose divided (rotary
    axes whenever :func:`width_factor` let them through: they need only stay even)."""
    if kind == "head_dim" and all(v <= 16 for v in _ints(value)):
        return value
    if isinstance(value, (tuple, list)):
        if any(v % factor for v in value) or (kind != "rope" and not _chosen(list(value))):
            return value
        return type(value)(v // factor for v in value)
    return value // factor if _chosen([value]) and value % factor == 0 else value


def _capped(value: Any, cap: int) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(min(v, cap) for v in value)
    return min(value, cap)


def _head_counts(defaults: dict[str, Any], kinds: dict[str, str | None]) -> list[int]:
    """The query head counts of ``defaults`` (integers; key/value counts left out)."""
    return [
        value
        for name, value in defaults.items()
        if kinds[name] == "heads"
        and isinstance(value, int)
        and not _words(name) & {"kv", "key", "value"}
    ]


def _fewer_heads(name: str, value: Any, queries: list[int], heads: int) -> Any:
    """A head count cut to ``heads``; a key/value head count to what still divides it (the
    same where it equalled a query head count, else 1)."""
    if isinstance(value, (tuple, list)):
        return type(value)(min(v, heads) if v > 0 else v for v in value)
    if _words(name) & {"kv", "key", "value"}:
        return min(value, heads) if value in queries else 1
    return min(value, heads)


def _inner_widths(
    defaults: dict[str, Any], kinds: dict[str, str | None], factor: int, heads: int
) -> dict[int, int]:
    """Default width -> small width for the widths that are heads x head dimension, once the
    heads are cut to ``heads``. With a head dimension among the arguments the product is
    known; without one, a width that is a multiple of the head count splits into heads of
    that many dimensions (``hidden_size`` 1792 over 28 heads: 64 each)."""
    counts = [count for count in _head_counts(defaults, kinds) if count > heads]
    dims = [v for n, v in defaults.items() if kinds[n] == "head_dim" and isinstance(v, int)]
    if dims:
        return {c * d: min(c, heads) * _scaled(d, factor, "head_dim") for c in counts for d in dims}
    widths = [v for n, v in defaults.items() if kinds[n] == "width" and isinstance(v, int)]
    return {
        width: heads * _scaled(width // count, factor, "head_dim")
        for count in counts
        for width in widths
        if width % count == 0 and (width // count) % 8 == 0
    }


@dataclass(frozen=True)
class _Plan:
    factor: int
    depth: int = 1
    heads: int | None = None
    keep_interface: bool = False
    """Leave the interface widths (``in_channels``, ``latent_channels``) as they are: a model
    may relate them by a constant (``in_channels == 2 * latent_channels + 4``), which no
    common divisor keeps."""
    stages: int | None = None
    """Per-block width lists as ``stages`` x (1, 2, 3...), the rest divided by the factor:
    blocks that fix their norm groups at 32 (skip blocks add two blocks' channels) need
    every block a multiple of 32, which no power of two leaves of 224, 448, 672, 896."""


def shrunk_config(defaults: dict[str, Any], plan: _Plan) -> dict[str, Any]:
    """The arguments that differ from ``defaults`` under ``plan``: widths divided by its
    factor, depths cut to its depth, head counts (where it says) cut with the widths that
    are heads x head dimension following them, layer indices below the new depth, the
    sample edge at :data:`SAMPLE`."""
    kinds = {name: classify(name, value) for name, value in defaults.items()}
    inner = _inner_widths(defaults, kinds, plan.factor, plan.heads) if plan.heads else {}
    queries = _head_counts(defaults, kinds)
    config: dict[str, Any] = {}
    for name, value in defaults.items():
        kind = None if plan.keep_interface and _is_interface(name) else kinds[name]
        new = _shrunk_value(name, value, kind, plan, inner, queries)
        if new != value:
            config[name] = new
    return config


def _shrunk_value(
    name: str, value: Any, kind: str | None, plan: _Plan, inner: dict[int, int], queries: list[int]
) -> Any:
    """One argument's value under ``plan`` (``value`` itself where nothing applies)."""
    if plan.stages and kind == "width" and _is_stage_list(value):
        return type(value)(plan.stages * (i + 1) for i in range(len(value)))
    if kind in ("width", "head_dim", "rope"):
        new = inner.get(value) if isinstance(value, int) else None
        return _scaled(value, plan.factor, kind) if new is None else new
    if kind == "depth":
        return _capped(value, plan.depth)
    if kind == "indices":
        kept = [v for v in _ints(value) if v < plan.depth] or [0]
        return type(value)(kept) if isinstance(value, (tuple, list)) else kept[0]
    if kind == "heads" and plan.heads:
        return _fewer_heads(name, value, queries, plan.heads)
    if kind == "sample":
        return _capped(value, SAMPLE)
    return value


def _plans(defaults: dict[str, Any]) -> list[tuple[str, _Plan]]:
    factor = width_factor(defaults)
    plans = [(f"widths/{factor}", _Plan(factor))]
    smaller = factor // 2
    while smaller >= 1:  # a width the code fixes (``GroupNorm(32, channels)``) needs more
        plans.append((f"widths/{smaller}", _Plan(smaller)))
        smaller //= 2
    if _head_counts(defaults, {n: classify(n, v) for n, v in defaults.items()}):
        plans.append((f"widths/{factor}, {HEADS} heads", _Plan(factor, heads=HEADS)))
        plans.append((f"{HEADS} heads of full width", _Plan(1, heads=HEADS)))
    plans.append((f"widths/{factor}, depth 2", _Plan(factor, depth=2)))
    if any(_is_interface(n) and classify(n, v) == "width" for n, v in defaults.items()):
        plans.append((f"widths/{factor} but the interface", _Plan(factor, keep_interface=True)))
    if any(_is_stage_list(v) for n, v in defaults.items() if classify(n, v) == "width"):
        plans.append((f"blocks {STAGE} x stage", _Plan(factor, stages=STAGE)))
        plans.append(
            (f"blocks {STAGE} x stage, {HEADS} heads", _Plan(factor, heads=HEADS, stages=STAGE))
        )
    return plans


_INTERFACE_WORDS = frozenset({"in", "out", "latent", "z", "input", "output"})


def _is_interface(name: str) -> bool:
    """A width of the inputs or outputs (``in_channels``, ``latent_channels``, ``z_dim``)."""
    words = _words(name)
    return bool(words & _INTERFACE_WORDS and words & {"channels", "channel", "dim"})


def _is_stage_list(value: Any) -> bool:
    """A per-block width list (``block_out_channels``) the model chose."""
    return isinstance(value, (tuple, list)) and len(value) > 1 and bool(_chosen(list(value)))


REQUIRED_VALUES: dict[str, Any] = {
    "width": 32,
    "head_dim": 8,
    "heads": 2,
    "depth": 1,
    "sample": SAMPLE,
}
"""What a required ``__init__`` argument without a default is given, by kind."""


def required_values(cls: type) -> dict[str, Any]:
    """Values for the arguments of ``cls.__init__`` that have no default, by name and
    annotation: interface channels 4 (an image or latent), per-block widths ``(32, 64)``, a
    ratio or factor 2, other sizes by their kind. Arguments it cannot size are left out (the
    build then says which)."""
    values: dict[str, Any] = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or parameter.default is not inspect.Parameter.empty:
            continue
        if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
            continue
        value = _required_value(name, str(parameter.annotation))
        if value is not None:
            values[name] = value
    return values


def _required_value(name: str, annotation: str) -> Any:
    words = _words(name)
    listed = "tuple" in annotation or "list" in annotation
    if "int" not in annotation:
        return None
    if words & {"ratio", "factor", "stride"}:
        return 2
    if words & {"channels", "channel", "dim"} and words & {"in", "out", "latent", "z"}:
        return (32, 64) if listed else 4
    kind = classify(name, (1, 2) if listed else 1) or ("sample" if "size" in words else None)
    if kind is None:
        return None
    if listed:
        return (32, 64) if kind == "width" else (REQUIRED_VALUES[kind],) * 2
    return REQUIRED_VALUES[kind]


NONE_FILLS: dict[str, Any] = {
    "in_channels": 4,
    "out_channels": 4,
    "patch_size": 2,
    "sample_size": SAMPLE,
}
"""Arguments whose default ``None`` some models cannot build with (an image transformer
without ``in_channels``): given these in the settings tried after the others."""


def settings_for(cls: type) -> list[Setting]:
    """The small configurations of ``cls`` to try, most promising first: widths divided by
    the largest factor that keeps them related (then smaller factors), at depth 1; heads cut
    too; two heads of the full head width; depth 2 (some models need two layers). Required
    arguments get :func:`required_values`; the same settings follow with the ``None``
    defaults of :data:`NONE_FILLS` given."""
    defaults = init_defaults(cls)
    required = required_values(cls)  # small already: not divided again
    nones = {n: v for n, v in NONE_FILLS.items() if n in defaults and defaults[n] is None}
    settings: list[Setting] = []
    for fills in ({}, nones) if nones else ({},):
        for label, plan in _plans({**defaults, **fills}):
            config = {**fills, **shrunk_config({**defaults, **fills}, plan), **required}
            if fills:
                label += ", " + ", ".join(f"{k}={v}" for k, v in fills.items())
            if all(config != s.config for s in settings):
                settings.append(Setting(label, config))
    return settings
