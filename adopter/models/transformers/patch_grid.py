"""Inputs of vision models that take images as flattened patches plus a patch grid.

Such a vision tower (Qwen2-VL's and its many descendants') does not take ``(batch, channels,
height, width)`` images: its processor cuts every image into ``patch x patch`` squares (and
``temporal_patch_size`` frames), flattens each into one row, stacks all images' rows into a
``(patches, channels * temporal * patch * patch)`` matrix and says in a ``(images, 3)`` grid
how many ``(frames, rows, columns)`` of patches each image has. The tower merges
``spatial_merge_size``-square blocks of patches into one token, and the language model expects
that many image placeholder tokens in its ``input_ids``. All sizes come from the
configuration's own names; only torch is needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["PatchGrid", "grid_parameter", "patch_grid"]

# A forward parameter holding the grid: ``grid_thw`` in a tower, ``image_grid_thw`` in a model.
_GRID = re.compile(r"^(image_)?grid_thw$")
# Merged-token blocks per side of each generated image: two, so that rows and columns differ
# from one another in position (one block would hide a transposed layout).
_BLOCKS = 2


def grid_parameter(params: Any) -> str | None:
    """The forward parameter that takes a patch grid, if the signature has one."""
    return next((name for name in params if _GRID.match(name)), None)


@dataclass(frozen=True)
class PatchGrid:
    """One image per batch row, as flattened patches and their grid."""

    patches: torch.Tensor  # (images * patches per image, patch features)
    grid: torch.Tensor  # (images, 3): frames, rows, columns of patches
    tokens_per_image: int  # placeholders each image fills after merging


def _int(value: Any, default: int) -> int:
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default
    )


def patch_grid(
    get: Any, images: int, gen: torch.Generator, image_size: int | None = None
) -> PatchGrid | None:
    """Seeded patches and grid for ``images`` images, each of :data:`_BLOCKS` x
    :data:`_BLOCKS` merged tokens, or as many as an ``image_size``-pixel square holds (at
    least one); ``get(name)`` reads the configuration (a vision sub-configuration's values
    included). ``None`` without a ``patch_size``."""
    patch = get("patch_size")
    if isinstance(patch, (list, tuple)) and patch:
        patch = patch[0]
    if not isinstance(patch, int) or patch <= 0:
        return None
    temporal = _int(get("temporal_patch_size"), 1)
    channels = _int(get("in_channels"), _int(get("num_channels"), 3))
    merge = _int(get("spatial_merge_size"), _int(get("merge_size"), 1))
    blocks = _BLOCKS if image_size is None else max(1, image_size // (patch * merge))
    side = blocks * merge
    grid = torch.tensor([[1, side, side]] * images, dtype=torch.long)
    features = channels * temporal * patch * patch
    patches = torch.randn((images * side * side, features), generator=gen)
    return PatchGrid(patches, grid, tokens_per_image=blocks * blocks)
