"""Seeded inputs for a shrunk transformers model, from its ``forward`` signature and config.

Worker side only: imports torch.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from ..common import Continued
from .config import sub_attr as _sub_attr
from .patch_grid import grid_parameter, patch_grid
from .tokens import placeholder_layout, placeholder_token_ids, special_token_ids

__all__ = ["MODALITIES", "continued_inputs", "make_inputs"]


BATCH = 2
SEQ_LEN = 7
NUM_CHOICES = 2
AUDIO_SAMPLES = 8000


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


def _image_hw(config: Any) -> tuple[int, int]:
    size = _sub_attr(config, "image_size", 32)
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    if isinstance(size, dict):
        size = size.get("height", 32)
    return int(size), int(size)


MODALITIES = ("input_ids", "pixel_values", "input_features", "input_values")


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
    draw = _Draw.of(model, config, seed, every_modality)
    inputs: dict[str, Any] = {}
    _add_text(draw, inputs)
    _add_images(draw, inputs)
    _add_audio(draw, inputs)
    _add_decoder_and_switches(draw, inputs)
    required = [
        name
        for name, p in draw.params.items()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and name not in inputs
    ]
    # Inputs the model cannot run without although the signature makes them optional: the
    # ones it raises about when absent (``You have to specify bbox``) are named by the caller.
    series = [n for n in draw.params if _SERIES.match(n) and draw.main.startswith("past_")]
    asked = [n for n in require if n in draw.params]
    for name in dict.fromkeys([*required, *series, *asked]):
        if name not in inputs:
            value = _named_input(name, config, draw.lead, draw.seq, draw.gen)
            if value is not None:
                inputs[name] = value
    for name, layout in layouts:  # the other layout an error asked for (see layout_fix)
        if isinstance(inputs.get(name), torch.Tensor):
            inputs[name] = _relayout(inputs[name], layout)
    missing = [name for name in required if name not in inputs]
    if missing:
        raise ValueError(f"cannot generate the required input(s) {', '.join(missing)}")
    return inputs


@dataclass
class _Draw:
    """What every input of one model is drawn with: the generator (one stream, drawn from in a
    fixed order), the ``forward`` parameters, the inputs wanted, the leading dimensions (batch,
    choices; token streams per codebook for ids), the sequence length and vocabulary, and the
    patch grid and image placeholders of a model that takes flattened patches."""

    config: Any
    gen: torch.Generator
    params: Any
    main: str
    wanted: set[str]
    lead: tuple[int, ...]
    id_lead: tuple[int, ...]
    vocab: int
    seq: int
    grid: Any = None
    grid_name: str | None = None
    tower: bool = False
    placeholders: tuple[list[int], list[int]] | None = None
    special: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, model: torch.nn.Module, config: Any, seed: int, every_modality: bool) -> _Draw:
        params = inspect.signature(model.forward).parameters
        main = getattr(model, "main_input_name", "input_ids")
        if main not in params:
            main = next((name for name in MODALITIES if name in params), main)
        wanted = {main} | ({m for m in MODALITIES if m in params} if every_modality else set())
        lead: tuple[int, ...] = (BATCH,)
        if "MultipleChoice" in type(model).__name__:
            lead = (BATCH, NUM_CHOICES)
        codebooks = _sub_attr(config, "num_codebooks", None)
        id_lead = lead
        if isinstance(codebooks, int) and codebooks > 1:  # one token stream per codebook
            id_lead = (lead[0] * codebooks, *lead[1:])
        positions = _sub_attr(config, "max_position_embeddings", None) or _sub_attr(
            config, "n_positions", None
        )
        seq = SEQ_LEN if positions is None else max(2, min(SEQ_LEN, int(positions)))
        vocab = int(_sub_attr(config, "vocab_size", 99))
        gen = torch.Generator().manual_seed(seed)
        draw = cls(config, gen, params, main, wanted, lead, id_lead, vocab, seq)
        draw.special = special_token_ids(config) | placeholder_token_ids(config)
        draw.add_grid()
        return draw

    def add_grid(self) -> None:
        """Flattened patches and their grid (see patch_grid): a tower takes them as its
        ``hidden_states``; a model as ``pixel_values``, with one placeholder per merged token."""
        self.grid_name = grid_parameter(self.params)
        self.tower = (
            self.grid_name is not None
            and "hidden_states" in self.params
            and "pixel_values" not in self.params
        )
        if self.grid_name is not None and (self.tower or "pixel_values" in self.wanted):
            config = self.config
            self.grid = patch_grid(lambda name: _sub_attr(config, name), self.lead[0], self.gen)
        if self.tower:
            self.wanted.discard("pixel_values")
        if self.grid is not None and not self.tower:
            self.placeholders = placeholder_layout(self.config, self.vocab, self.grid)
        if self.placeholders is not None:  # room for them, text on both sides, masked padding
            self.seq = max(self.seq, len(self.placeholders[0]) + 4)

    def ids(self, length: int, high: int | None = None, text: bool = True) -> torch.Tensor:
        """Random token ids. For text: no special tokens inside, and ``eos`` last where the
        model has one (sequence-classification heads of seq2seq models pool at the eos)."""
        high = self.vocab if high is None else high
        drawn = torch.randint(0, max(1, high), (*self.id_lead, length), generator=self.gen)
        if not text:
            return drawn
        ordinary = [i for i in range(high) if i not in self.special]
        if ordinary and self.special:
            replacement = torch.tensor(ordinary)[drawn % len(ordinary)]
            drawn = torch.where(
                torch.isin(drawn, torch.tensor(sorted(self.special))), replacement, drawn
            )
        eos = getattr(self.config, "eos_token_id", None)
        if isinstance(eos, int) and 0 <= eos < high:
            drawn[..., -1] = eos
        return drawn

    def mask(self, length: int) -> torch.Tensor:
        m = torch.ones((*self.lead, length), dtype=torch.long)
        if length > 3:
            m[1, ..., -2:] = 0
        return m

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn((*self.lead, *shape), generator=self.gen)


def _add_text(draw: _Draw, inputs: dict[str, Any]) -> None:
    """Token ids (with image placeholders where the model takes patches), their mask and
    token types."""
    if "input_ids" not in draw.wanted:
        return
    params, seq = draw.params, draw.seq
    inputs["input_ids"] = draw.ids(seq)
    if draw.placeholders is not None:
        layout, kinds = draw.placeholders
        span = slice(1, 1 + len(layout))
        inputs["input_ids"][..., span] = torch.tensor(layout)
        if "mm_token_type_ids" in params:  # 0 text, 1 image, as processors mark them
            types = torch.zeros_like(inputs["input_ids"])
            types[..., span] = torch.tensor(kinds)
            inputs["mm_token_type_ids"] = types
    if "attention_mask" in params:
        inputs["attention_mask"] = draw.mask(seq)
    type_vocab = _sub_attr(draw.config, "type_vocab_size", None)
    if "token_type_ids" in params and isinstance(type_vocab, int) and type_vocab > 0:
        inputs["token_type_ids"] = draw.ids(seq, type_vocab, text=False)


def _add_images(draw: _Draw, inputs: dict[str, Any]) -> None:
    """Patches and their grid, or images sized from the configuration (video: frames too)."""
    config = draw.config
    if draw.grid is not None:
        inputs["hidden_states" if draw.tower else "pixel_values"] = draw.grid.patches
        inputs[draw.grid_name or ""] = draw.grid.grid
    elif "pixel_values" in draw.wanted:
        channels = int(_sub_attr(config, "num_channels", 3))
        height, width = _image_hw(config)
        frames = _sub_attr(config, "num_frames", None)  # video models: (batch, frames, c, h, w)
        shape = (
            (channels, height, width)
            if not isinstance(frames, int)
            else (frames, channels, height, width)
        )
        inputs["pixel_values"] = draw.randn(*shape)


def _add_audio(draw: _Draw, inputs: dict[str, Any]) -> None:
    """Spectrogram features (mel bins first or frames first) and waveforms."""
    config = draw.config
    bins = _sub_attr(config, "num_mel_bins", None)
    if "input_features" in draw.wanted:
        if bins is not None:  # Whisper-style: (batch, mel bins, 2 x encoder positions)
            frames = 2 * int(_sub_attr(config, "max_source_positions", 10))
            inputs["input_features"] = draw.randn(int(bins), frames)
        else:  # Speech2Text-style: (batch, frames, features per frame)
            features = int(_sub_attr(config, "input_feat_per_channel", 16)) * int(
                _sub_attr(config, "input_channels", 1)
            )
            inputs["input_features"] = draw.randn(20, features)
    if "input_values" not in draw.wanted:
        return
    frames_total = getattr(config, "max_length", None)
    if isinstance(bins, int) and _sub_attr(config, "conv_dim") is None:
        # A spectrogram transformer: (batch, frames, mel bins), as many frames as it embeds.
        length = frames_total if isinstance(frames_total, int) and frames_total > 20 else 128
        inputs["input_values"] = draw.randn(length, bins)
    else:
        # Half a second at 16 kHz: long enough after the conv feature extractor's striding
        # for the time-masking spans models apply in training.
        inputs["input_values"] = draw.randn(AUDIO_SAMPLES)


def _add_decoder_and_switches(draw: _Draw, inputs: dict[str, Any]) -> None:
    """Decoder ids of an encoder-decoder, encoder states of a decoder with cross-attention,
    and the switches that return every layer's states in a dict."""
    config, params = draw.config, draw.params
    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    if encoder_decoder and "decoder_input_ids" in params:
        decoder_vocab = int(getattr(config, "decoder_vocab_size", None) or draw.vocab)
        # As long as the encoder input: some heads index decoder states with an encoder mask.
        inputs["decoder_input_ids"] = draw.ids(draw.seq, decoder_vocab)
    hidden = _sub_attr(config, "hidden_size", None)
    if (
        getattr(config, "add_cross_attention", False)
        and not encoder_decoder
        and "encoder_hidden_states" in params
        and isinstance(hidden, int)
    ):
        # A decoder configured with cross-attention (reached by flipping add_cross_attention):
        # without encoder states its cross-attention layers never run.
        inputs["encoder_hidden_states"] = draw.randn(draw.seq + 1, hidden)
    if "output_hidden_states" in params:
        inputs["output_hidden_states"] = True
    if "return_dict" in params:
        inputs["return_dict"] = True


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


# Per-token inputs of a decoder's step, besides its ids, that a cached step takes for the new
# token only (the encoder's inputs of an encoder-decoder stay whole: cross-attention reads them).
_STEP_KEYS = {
    "input_ids": ("input_ids", "token_type_ids", "position_ids"),
    "decoder_input_ids": ("decoder_input_ids", "decoder_position_ids"),
}
_STEP_MASK = {"input_ids": "attention_mask", "decoder_input_ids": "decoder_attention_mask"}


def _carried_cache(output: Any) -> dict[str, Any] | None:
    cache = getattr(output, "past_key_values", None)
    return None if cache is None else {"past_key_values": cache}


def continued_inputs(cls: type, inputs: dict[str, Any]) -> Continued | None:
    """``inputs`` of model class ``cls`` as a first call that returns the cache of keys and
    values, then a second call of one more token with that cache: the cached step of
    generation, where code under ``if past_key_values is not None:`` runs. The new token's ids
    are the last ones again; its attention mask gains one attended position. ``None`` where
    the model takes no cache or the inputs have no token ids to step."""
    params = inspect.signature(cls.forward).parameters
    ids_key = "decoder_input_ids" if "decoder_input_ids" in inputs else "input_ids"
    ids = inputs.get(ids_key)
    if "past_key_values" not in params or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return None
    first = dict(inputs)
    if "use_cache" in params:
        first["use_cache"] = True
    second = dict(first)
    length = ids.shape[1]
    for key in _STEP_KEYS[ids_key]:
        value = second.get(key)
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == length:
            second[key] = value[:, -1:]
    mask = second.get(_STEP_MASK[ids_key])
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] == length:
        second[_STEP_MASK[ids_key]] = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return Continued(first, second, _carried_cache)
