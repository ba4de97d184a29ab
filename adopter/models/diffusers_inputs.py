"""Inputs for a small diffusers model, from its ``forward`` signature and its configuration.

Each argument is made by what its name says it holds (words of the name, never a model's
name): the noisy sample (``sample``, ``hidden_states``, ``x``, ``latents``), a timestep per
sample, text conditioning of the conditioning width the configuration gives, masks over it,
a pooled projection, position ids for the rotary axes, micro-conditioning vectors. The
sample takes one of a few :data:`LAYOUTS` (a latent image, a short video, a token sequence,
a 1-D signal), tried in turn by the adapter.

Widths the configuration does not name the same way in every model (which of
``caption_channels``, ``text_dim``, ``context_in_dim`` is the text width?) are then fitted
to the model itself: :func:`fit_inputs` runs it once with hooks that see which layer first
takes each input tensor (a ``Linear``, a convolution, a norm, an embedding), and remakes the
input with the width that layer expects (its ``in_features``, ``in_channels``...), or in the
layout it expects (a ``Conv3d`` takes a video). What still does not run is raised with the
model's own error.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "BATCH",
    "LAYOUTS",
    "TOKENS",
    "Layout",
    "fit_inputs",
    "make_inputs",
    "missing_inputs",
]

BATCH = 2
TOKENS = 8
"""Length of a text conditioning sequence."""
GRID = 4
"""Edge of the latent grid a token-sequence sample stands for (16 tokens)."""
SIGNAL = 64
"""Length of a 1-D sample (audio latents)."""
MAX_FITS = 6
"""Runs :func:`fit_inputs` may remake inputs after."""


@dataclass(frozen=True)
class Layout:
    """The shape of the sample: ``image`` ``(B, C, H, W)``, ``video`` ``(B, C, F, H, W)``,
    ``tokens`` ``(B, N, C)`` (a latent grid flattened), ``signal`` ``(B, C, L)``; and the
    widths fitted so far (input name -> width, for the dimension that layer reads)."""

    kind: str
    frames: int = 0
    widths: dict[str, int] = field(default_factory=dict)
    frames_first: bool = False
    """A video as ``(B, F, C, H, W)``, the frames before the channels."""
    per_frame: bool = False
    """The conditioning repeated per frame (batch ``B x F``): video UNets built from image
    blocks take the text of each frame as its own sample."""
    optional: bool = False
    """Give the optional arguments of a known role too (a model that needs one it defaults
    to ``None``: ``'NoneType' object has no attribute 'to'``, "`mask` is required")."""

    @property
    def label(self) -> str:
        if self.kind != "video":
            return self.kind
        order = ", frames first" if self.frames_first else ""
        return f"video of {self.frames} frames{order}" + (
            ", text per frame" if self.per_frame else ""
        )

    @property
    def conditioning_batch(self) -> int:
        return BATCH * self.frames if self.per_frame else BATCH


LAYOUTS = (
    Layout("image"),
    Layout("video", 2),
    Layout("video", 5),
    Layout("video", 9),
    Layout("tokens"),
    Layout("signal"),
    Layout("video", 2, per_frame=True),
    Layout("video", 2, frames_first=True),
)
"""The sample layouts tried in turn. Video encoders take frames in groups after the first
(1 + 4k, 1 + 8k), so five and nine frames follow two."""

_SAMPLE = ("sample", "hidden_states", "x", "latents", "z", "z_latent", "input", "xs")
_TIME_WORDS = frozenset({"timestep", "timesteps", "t", "time", "sigma", "ts", "r"})
_TEXT_WORDS = frozenset(
    {"encoder", "text", "txt", "cap", "caption", "prompt", "context", "lyric", "clip", "t5"}
)
_TEXT_WIDTHS = (
    "cross_attention_dim", "joint_attention_dim", "caption_channels", "text_dim",
    "text_embed_dim", "cap_feat_dim", "context_in_dim", "encoder_hidden_size",
    "text_hidden_dim", "in_text_dim", "text_in_dim", "encoder_hid_dim", "c_cond",
    "text_encoder_dim", "condition_dim",
)  # fmt: skip
"""Configuration entries that give the width of the text conditioning, the likelier first
(a model's own first layer corrects a wrong guess, see :func:`fit_inputs`)."""
_POOLED_WIDTHS = (
    "pooled_projection_dim", "text_embed_dim", "projection_dim", "cond_embed_dim",
    "clip_text_pooled_in_channels",
)  # fmt: skip
_CHANNELS = ("in_channels", "c_in", "in_dim", "input_channels", "latent_channels", "z_dim")
_RETURN_FLAGS = {"return_dict": False}


def _words(name: str) -> set[str]:
    return set(name.lower().split("_"))


class _Config:
    """``get(key)`` of a model's configuration (``None`` for what it lacks); ``config`` the
    mapping itself."""

    def __init__(self, model: Any) -> None:
        config = getattr(model, "config", None)
        self.config = config if config is not None and hasattr(config, "get") else {}

    def __call__(self, key: str) -> Any:
        return self.config.get(key)


def _config_get(model: Any) -> _Config:
    return _Config(model)


def _first_int(get: Callable[[str], Any], keys: tuple[str, ...], default: int) -> int:
    for key in keys:
        value = get(key)
        if isinstance(value, (tuple, list)) and value and isinstance(value[0], int):
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def forward_parameters(model: Any) -> tuple[list[str], set[str]]:
    """The names ``model.forward`` takes (in order) and those it requires."""
    parameters = inspect.signature(model.forward).parameters
    names = [n for n, p in parameters.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    required = {n for n in names if parameters[n].default is inspect.Parameter.empty}
    return names, required


def _sample_name(names: list[str]) -> str | None:
    """The argument that takes the noisy sample, by the names diffusers gives it."""
    for name in _SAMPLE:
        if name in names:
            return name
    return None


def _downsampling(get: Callable[[str], Any]) -> int:
    """How much the model shrinks the sample's edge, as its configuration tells: halved
    between blocks of a per-block width list (``block_out_channels`` of four: 8x), or the
    compression ratio it names."""
    config = getattr(get, "config", {})
    lists = [
        value
        for key, value in config.items()
        if isinstance(key, str)
        and key.endswith("channels")
        and isinstance(value, (tuple, list))
        and len(value) > 1
    ]
    factor = 2 ** (max(len(value) for value in lists) - 1) if lists else 1
    for key in ("spatial_compression_ratio", "downscale_factor", "scale_factor_spatial"):
        value = config.get(key)
        if isinstance(value, int) and value > factor:
            factor = value
    return factor


def _edge(get: Callable[[str], Any]) -> int:
    """The sample's edge: the configuration's ``sample_size`` (the shrunk one), at least two
    pixels of the most downsampled feature map and two patches across, a multiple of the
    patch."""
    size = get("sample_size")
    size = size[0] if isinstance(size, (tuple, list)) and size else size
    size = size if isinstance(size, int) and size > 0 else 16
    size = max(size, 2 * _downsampling(get))
    patch = get("patch_size")
    patch = patch[-1] if isinstance(patch, (tuple, list)) and patch else patch
    patch = patch if isinstance(patch, int) and patch > 0 else 1
    size = max(size, 2 * patch)
    return -(-size // patch) * patch


def _sample(get: Callable[[str], Any], layout: Layout, name: str, randn: Callable) -> Any:
    channels = layout.widths.get(name) or _first_int(get, _CHANNELS, 4)
    edge = _edge(get)
    if layout.kind == "video" and layout.frames_first:
        return randn(BATCH, layout.frames, channels, edge, edge)
    if layout.kind == "video":
        return randn(BATCH, channels, layout.frames, edge, edge)
    if layout.kind == "tokens":
        return randn(BATCH, GRID * GRID, channels)
    if layout.kind == "signal":
        return randn(BATCH, channels, SIGNAL)
    return randn(BATCH, channels, edge, edge)


_ROLES_BY_NAME = {
    "added_time_ids": "vector",
    "micro_conds": "vector",
    "original_size": "vector",
    "target_size": "vector",
    "crop_coords": "vector",
    "img_shapes": "shapes",
    "guidance": "time",
    "num_frames": "grid",
    "height": "grid",
    "width": "grid",
    "fps": "fps",
    "c": "text",
    "effnet": "like_sample",
}
"""Arguments whose name alone says what they hold (``c``: Wuerstchen's text conditioning)."""
_VECTOR_WIDTHS = {"original_size": 2, "target_size": 2, "crop_coords": 2, "micro_conds": 5}
"""Micro-conditioning vectors' lengths: sizes and crops are (height, width) pairs; SDXL-style
micro-conditions (original size, crop, aesthetic score) five numbers."""
_ALWAYS = frozenset({"timestep", "encoder_hidden_states", "pooled_projections"})
"""Optional arguments given whenever the forward takes them: the conditioning a diffusion
model is run with (its default ``None`` skips the layers that take it)."""


_WORD_ROLES: tuple[tuple[Callable[[set[str], str], bool], str], ...] = (
    (lambda w, n: "mask" in w or n.endswith("mask"), "mask"),
    (lambda w, n: bool(w & {"ids", "id"} and w & {"img", "txt", "text", "image"}), "ids"),
    (lambda w, n: "ids" in w or {"input", "tokens"} <= w, "token_ids"),
    (lambda w, n: "pooled" in w, "pooled"),
    (lambda w, n: bool(w & {"mel", "spec"}), "signal"),
    (lambda w, n: bool(w & _TIME_WORDS and not w & {"embeds", "states", "cond", "emb"}), "time"),
    (lambda w, n: bool(w & {"latents", "cond"}) or n.startswith("control"), "like_sample"),
    (lambda w, n: bool(w & _TEXT_WORDS or w & {"embeds", "states", "feats", "global"}), "text"),
)
"""Roles by the words of a name, the first that applies: a mask, rotary position ids,
token ids, a pooled projection, a spectrogram, a timestep, a sample-shaped input (control
latents), a sequence of conditioning states."""


def _role(name: str) -> str | None:
    """What an argument named ``name`` holds: by the name itself, then by its words."""
    if name in _ROLES_BY_NAME:
        return _ROLES_BY_NAME[name]
    words = _words(name)
    return next((role for test, role in _WORD_ROLES if test(words, name)), None)


def make_inputs(model: Any, seed: int, layout: Layout = LAYOUTS[0]) -> dict[str, Any]:
    """Inputs for ``model.forward`` in ``layout``: every required argument whose name says
    what it holds, and the optional ones that models need though their default is ``None``
    (Flux's position ids, a conditioning mask). ``ValueError`` names the arguments that
    cannot be made."""
    import torch

    get = _config_get(model)
    names, required = forward_parameters(model)
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, generator=generator)

    inputs: dict[str, Any] = {}
    sample = _sample_name(names)
    if sample is not None:
        inputs[sample] = _sample(get, layout, sample, randn)
    for name in names:
        if name in inputs:
            continue
        value = _argument(name, name in required, get, layout, randn)
        if value is not None:
            inputs[name] = value
    missing = missing_inputs(model, inputs)
    if missing:
        raise ValueError(f"no inputs known for {type(model).__name__}: {', '.join(missing)}")
    inputs.update({k: v for k, v in _RETURN_FLAGS.items() if k in names})
    return inputs


def missing_inputs(model: Any, inputs: dict[str, Any]) -> list[str]:
    """The required arguments of ``model.forward`` that ``inputs`` lacks."""
    _, required = forward_parameters(model)
    return sorted(required - set(inputs))


def _argument(
    name: str,
    needed: bool,
    get: Callable[[str], Any],
    layout: Layout,
    randn: Callable,
) -> Any:
    """One argument other than the sample, or ``None`` (left to its default): given where it
    is required, is one of :data:`_ALWAYS`, or the layout asks for the optional ones too."""
    role = _role(name)
    if role is None or not (needed or name in _ALWAYS or layout.optional or role == "ids"):
        return None
    return _MAKERS[role](_Request(name, get, layout, randn))


@dataclass(frozen=True)
class _Request:
    """What a maker of one argument needs: its name, the configuration, the layout (its
    fitted width for the argument, if any), the seeded ``randn``."""

    name: str
    get: Callable[[str], Any]
    layout: Layout
    randn: Callable

    @property
    def width(self) -> int | None:
        return self.layout.widths.get(self.name)

    @property
    def batch(self) -> int:
        return self.layout.conditioning_batch


def _text(r: _Request) -> Any:
    return r.randn(r.batch, TOKENS, r.width or _first_int(r.get, _TEXT_WIDTHS, 32))


def _pooled(r: _Request) -> Any:
    return r.randn(r.batch, r.width or _first_int(r.get, _POOLED_WIDTHS, 32))


def _mask(r: _Request) -> Any:
    import torch

    # boolean: attention takes it as is, and ``1 - mask`` works too
    return torch.ones(r.batch, TOKENS, dtype=torch.bool)


def _time(r: _Request) -> Any:
    import torch

    return torch.tensor([10.0, 500.0][:BATCH])


def _token_ids(r: _Request) -> Any:
    import torch

    return torch.arange(BATCH * TOKENS).reshape(BATCH, TOKENS) % 8


def _vector(r: _Request) -> Any:
    return r.randn(BATCH, r.width or _VECTOR_WIDTHS.get(r.name, 3)).abs() * 8


def _fps(r: _Request) -> Any:
    import torch

    return torch.tensor([8] * BATCH)


def _signal(r: _Request) -> Any:
    channels = r.width or _first_int(r.get, ("num_mels", "mel_bins", "in_channels"), 64)
    return r.randn(BATCH, channels, SIGNAL)


_MAKERS: dict[str, Callable[[_Request], Any]] = {
    "time": _time,
    "text": _text,
    "pooled": _pooled,
    "mask": _mask,
    "ids": lambda r: _position_ids(r.name, r.get, r.layout),
    "token_ids": _token_ids,
    "vector": _vector,
    "shapes": lambda r: [[(1, GRID, GRID)] for _ in range(BATCH)],
    "fps": _fps,
    "signal": _signal,
    "grid": lambda r: 1 if r.name == "num_frames" else GRID,  # the grid tokens stand for
    "like_sample": lambda r: _like_sample(r.name, r.get, r.layout, r.randn),
}
"""How each role's argument is made (see :func:`_role`)."""


def _like_sample(name: str, get: Callable[[str], Any], layout: Layout, randn: Callable) -> Any:
    """An input shaped as the sample (a control image or latents, image latents), with its
    own channels; an image a ControlNet embeds down to the sample's size is larger by the
    downsampling of its conditioning embedding."""
    channels = layout.widths.get(name) or _first_int(get, ("conditioning_channels",), 0)
    own = replace(layout, widths={**layout.widths, name: channels} if channels else layout.widths)
    value = _sample(get, own, name, randn)
    stages = get("conditioning_embedding_out_channels")
    if isinstance(stages, (tuple, list)) and len(stages) > 1 and value.ndim >= 4:
        import torch.nn.functional as F

        scale = 2 ** (len(stages) - 1)
        flat = value.flatten(0, value.ndim - 3) if value.ndim > 4 else value
        grown = F.interpolate(flat, scale_factor=scale)
        value = grown.reshape(*value.shape[:-2], *grown.shape[-2:])
    return value


def _position_ids(name: str, get: Callable[[str], Any], layout: Layout) -> Any:
    """Rotary position ids of a token-sequence sample (``img_ids``: row and column of each of
    the grid's tokens) or of the text (``txt_ids``: zeros), one column per rotary axis."""
    import torch

    axes = get("axes_dims_rope") or get("axes_dim") or get("rope_axes_dim") or (0, 0, 0)
    count = len(axes) if isinstance(axes, (tuple, list)) else 3
    if _words(name) & {"txt", "text"}:
        return torch.zeros(TOKENS, count)
    rows, cols = torch.meshgrid(torch.arange(GRID), torch.arange(GRID), indexing="ij")
    ids = torch.zeros(GRID * GRID, count)
    if count >= 2:
        ids[:, -2], ids[:, -1] = rows.flatten().float(), cols.flatten().float()
    return ids


# -- fitting to the model ----------------------------------------------------------------------


def _expects(module: Any, tensor: Any) -> tuple[str, int] | None:
    """What ``module`` (a torch layer) expects of an input ``tensor`` it was handed first:
    ``("last", width)``, ``("channels", width)``, ``("ndim", dims)``; ``None`` if it fits or
    the layer is not one whose expectation is known."""
    from torch import nn

    if isinstance(module, nn.Linear):
        if tensor.shape[-1] != module.in_features:
            return "last", module.in_features
    elif isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        dims = 3 if isinstance(module, nn.Conv1d) else 4 if isinstance(module, nn.Conv2d) else 5
        if tensor.ndim != dims:
            return "ndim", dims
        if tensor.shape[1] != module.in_channels:
            return "channels", module.in_channels
    elif isinstance(module, nn.LayerNorm) and module.normalized_shape:
        if tensor.shape[-1] != module.normalized_shape[-1]:
            return "last", module.normalized_shape[-1]
    elif isinstance(module, nn.GroupNorm) and tensor.ndim > 1:
        if tensor.shape[1] != module.num_channels:
            return "channels", module.num_channels
    return None


def _read_layers() -> tuple[type, ...]:  # noqa: N802 - a constant, imported late
    """The layers whose expectation of an input :func:`_expects` reads; the first of them an
    input reaches is the one asked (a dropout or an activation before it says nothing)."""
    from torch import nn

    return (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.LayerNorm, nn.GroupNorm)


class _FirstLayers:
    """Forward pre-hooks on every layer of a model that note the first readable layer
    (:func:`_read_layers`) each input tensor (or a view of it: same storage) reaches, and
    what that layer expects of it."""

    def __init__(self, model: Any, inputs: dict[str, Any]) -> None:
        import torch

        self.model = model
        self.storage = {
            value.untyped_storage().data_ptr(): name
            for name, value in inputs.items()
            if isinstance(value, torch.Tensor) and value.is_floating_point()
        }
        self.seen: dict[str, tuple[str, int] | None] = {}
        self.handles: list[Any] = []

    def __enter__(self) -> _FirstLayers:
        for module in self.model.modules():
            if next(module.children(), None) is None:  # a layer, not a container
                self.handles.append(module.register_forward_pre_hook(self._hook))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()

    def _hook(self, module: Any, args: tuple[Any, ...]) -> None:
        import torch

        if not args or not isinstance(args[0], torch.Tensor):
            return
        name = self.storage.get(args[0].untyped_storage().data_ptr())
        if name is not None and name not in self.seen and isinstance(module, _read_layers()):
            self.seen[name] = _expects(module, args[0])


def _refit(layout: Layout, sample: str | None, wrong: dict[str, tuple[str, int]]) -> Layout:
    """``layout`` with the widths (or, for the sample, the layout) the first layers asked."""
    widths = dict(layout.widths)
    kind, frames = layout.kind, layout.frames
    for name, (what, value) in wrong.items():
        if what == "ndim" and name == sample:
            kind = {3: "signal", 4: "image", 5: "video"}[value]
            frames = frames or 2
        elif what == "last" and name == sample and kind != "tokens":
            kind = "tokens"
            widths[name] = value
        else:
            widths[name] = value
    return replace(layout, kind=kind, frames=frames if kind == "video" else 0, widths=widths)


_CHANNELS_MESSAGE = re.compile(r"to have (\d+) channels, but got (\d+) channels instead")
_MATMUL_MESSAGE = re.compile(
    r"mat1 and mat2 shapes cannot be multiplied \(\d+x(\d+) and (\d+)x\d+\)"
)


def _from_message(
    message: str, inputs: dict[str, Any], sample: str | None
) -> dict[str, tuple[str, int]]:
    """What torch's own error says a layer expected, where the hooks saw no input reach it
    as is (the model padded or concatenated it first): a convolution's channels for the
    sample when it has the channels the error names, a ``Linear``'s input width for the one
    input whose last dimension is the one the error names."""
    import torch

    channels = _CHANNELS_MESSAGE.search(message)
    value = inputs.get(sample) if sample else None
    if channels and isinstance(value, torch.Tensor) and value.ndim > 2:
        expected, got = int(channels[1]), int(channels[2])
        if value.shape[1] == got:
            return {sample: ("channels", expected)}
    product = _MATMUL_MESSAGE.search(message)
    if product:
        got, expected = int(product[1]), int(product[2])
        matching = [
            name
            for name, value in inputs.items()
            if isinstance(value, torch.Tensor) and value.is_floating_point()
            and value.ndim >= 2 and value.shape[-1] == got and name != sample
        ]  # fmt: skip
        if len(matching) == 1:
            return {matching[0]: ("last", expected)}
    return {}


def fit_inputs(
    model: Any, seed: int, layout: Layout, call: Callable[[Any, dict[str, Any]], Any]
) -> tuple[dict[str, Any], Layout]:
    """Inputs in ``layout`` that ``call(model, inputs)`` runs on, remade (at most
    :data:`MAX_FITS` times) with what the first layer each input reaches expects of it;
    the inputs and the layout they ended in. Raises the model's error where they do not
    run."""
    sample = _sample_name(forward_parameters(model)[0])
    tried: set[str] = set()
    for _ in range(MAX_FITS):
        inputs = make_inputs(model, seed, layout)
        probe = _FirstLayers(model, inputs)
        try:
            with probe:
                call(model, inputs)
            return inputs, layout
        except Exception as exc:
            wrong = {n: e for n, e in probe.seen.items() if e is not None}
            wrong = wrong or _from_message(str(exc), inputs, sample)
            key = repr(layout)
            if key in tried:
                raise
            tried.add(key)
            if wrong:
                layout = _refit(layout, sample, wrong)
            elif not layout.optional:  # it may need an argument it defaults to None
                layout = replace(layout, optional=True)
            else:
                raise
    inputs = make_inputs(model, seed, layout)
    call(model, inputs)  # the last refit, run without looking further
    return inputs, layout
