"""Configuration and input repairs read off the errors torch and transformers raise.

Each pattern here matches an exception text of the installed libraries (pinned by
``tests/models/test_transformers_error_texts.py``, which triggers each error): a layer built from
one size meeting a tensor of another, a group count a shrunk width does not divide, split sizes
fixed for the full model, an input laid out the other way. The fix is what makes the sizes or
layouts agree; nothing is keyed on a model's name.
"""

from __future__ import annotations

import inspect
import linecache
import math
import re
from collections.abc import Callable
from typing import Any

import torch

from .inputs import MODALITIES

__all__ = ["layout_fix", "named_parameters", "none_fixes", "size_fixes", "split_fixes"]


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
        channels, count = int(groups.group(1)), int(groups.group(2))
        return _through_sub_configurations(
            config.to_dict(), lambda entries: _group_fixes(entries, channels, count)
        )
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


def _group_fixes(entries: dict[str, Any], channels: int, count: int) -> dict[str, Any]:
    """Every width holding the rejected size grows to a multiple of the group count (all of
    them: equal widths usually have to stay equal; heads, powers of two, still divide)."""
    wider = math.lcm(channels, count)
    return {
        key: wider
        for key, value in entries.items()
        if _is_size(value) and value == channels and _SIZE_NAME.search(key)
    }


def _through_sub_configurations(
    entries: dict[str, Any], fixed: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """``fixed``'s changes to a configuration's ``entries`` and to those of each of its
    sub-configurations, at any depth (Emu3's VQ-VAE ``vq_config.base_channels``); a changed
    sub-configuration is given whole, as the fix of its entry."""
    fixes = fixed(entries)
    for key, value in entries.items():
        if _is_config_dict(value):
            nested = _through_sub_configurations(value, fixed)
            if nested:
                fixes[key] = {**value, **nested}
    return fixes


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
            for name in MODALITIES:
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

    return _through_sub_configurations(config.to_dict(), fixed)


def _is_config_dict(value: Any) -> bool:
    """A sub-configuration's dict (it names its ``model_type``), not a plain dict attribute."""
    return isinstance(value, dict) and "model_type" in value


def named_parameters(exc: BaseException, model: Any, inputs: dict[str, Any]) -> tuple[str, ...]:
    """Forward parameters the error message names that the inputs leave out."""
    params = inspect.signature(model.forward).parameters
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", f"{exc} {_none_on_failing_line(exc)}")
    return tuple(dict.fromkeys(w for w in words if w in params and w not in inputs))


def _none_on_failing_line(exc: BaseException) -> str:
    """The names on the line that raised a ``'NoneType' object ...`` error whose local values
    are ``None`` there: an optional input the model used without checking (``bbox[:, :, 0]``
    in a helper that the caller handed ``bbox=None``)."""
    if not isinstance(exc, (TypeError, AttributeError)) or "NoneType" not in str(exc):
        return ""
    frames = _frames_and_lines(exc)
    if not frames:
        return ""
    frame, line = frames[-1]
    names = dict.fromkeys(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", line))
    return " ".join(n for n in names if n in frame.f_locals and frame.f_locals[n] is None)


# A mapping the model reads (``vocab_map.get("<image>")``) that the configuration leaves None.
_NONE_MAPPING = re.compile(r"'NoneType' object has no attribute '(get|items|keys|values)'")


def none_fixes(config: Any, exc: BaseException) -> dict[str, Any]:
    """An empty mapping for each configuration entry that is ``None`` where a frame of the
    failing call read it (``config.vocabulary_map`` handed on, then ``.get`` on it): a class
    whose defaults leave a mapping to a checkpoint's JSON (Emu3's ``vocabulary_map``). Only
    entries read as ``<name>.<entry>`` from the configuration object itself."""
    if not isinstance(exc, AttributeError) or _NONE_MAPPING.search(str(exc)) is None:
        return {}
    fixes: dict[str, Any] = {}
    for frame, line in _frames_and_lines(exc):
        for base, entry in re.findall(r"\b([A-Za-z_]\w*)\.([A-Za-z_]\w*)\b", line):
            if frame.f_locals.get(base) is config and getattr(config, entry, 0) is None:
                fixes[entry] = {}
    return fixes


def _frames_and_lines(exc: BaseException) -> list[tuple[Any, str]]:
    """Each frame of ``exc``'s traceback, outermost first, with the source line it was at."""
    found = []
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        found.append((frame, linecache.getline(frame.f_code.co_filename, tb.tb_lineno)))
        tb = tb.tb_next
    return found
