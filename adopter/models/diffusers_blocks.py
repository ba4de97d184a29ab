"""Non-default block types: building a model with the blocks a file defines but no default
configuration uses.

A UNet is configured by block type names (``down_block_types=("CrossAttnDownBlock2D",
...)``) that a factory of the blocks' module maps to classes; blocks no default names
(``SkipUpBlock2D``, ``AttnSkipUpBlock2D``) run only in a model built with them. A *variant*
is a model class with one such argument set to such a block throughout, written
``module:Class[up_block_types=SkipUpBlock2D]`` so that reports say how it was built. Which
argument takes which block is read from the names alone: the block's name is a choice of the
file (its text has the name as a string, as a factory compares it) and says the same
direction (up, down, mid) as the argument.

Pure text and signature reading: no torch, no diffusers.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["block_arguments", "split_variant", "variant_config", "variant_names"]

_VARIANT = re.compile(r"^(?P<base>[^\[]+)\[(?P<arg>\w+)=(?P<block>\w+)\]$")
_DIRECTIONS = ("up", "down", "mid")


def split_variant(name: str) -> tuple[str, dict[str, str]]:
    """``module:Class`` and the block argument a variant name sets (none for a plain name)."""
    match = _VARIANT.match(name)
    if match is None:
        return name, {}
    return match["base"], {match["arg"]: match["block"]}


def _direction(words: list[str]) -> str | None:
    found = [w for w in (w.lower() for w in words) if w in _DIRECTIONS]
    return found[0] if found else None


def _class_words(name: str) -> list[str]:
    """``AttnSkipUpBlock2D`` -> ``Attn``, ``Skip``, ``Up``, ``Block``, ``2D``."""
    return re.findall(r"[A-Z][a-z]*|\d+[A-Z]?", name) or [name]


def block_arguments(defaults: dict[str, Any]) -> dict[str, str | None]:
    """The block-type arguments of a model's ``__init__`` defaults (a string or a tuple of
    strings, named ``*_block_type(s)``) and the direction each builds."""
    found: dict[str, str | None] = {}
    for name, value in defaults.items():
        if not re.search(r"block_types?$", name):
            continue
        values = value if isinstance(value, (tuple, list)) else (value,)
        if values and all(isinstance(v, str) for v in values):
            found[name] = _direction(name.split("_"))
    return found


def variant_config(defaults: dict[str, Any], overrides: dict[str, str]) -> dict[str, Any]:
    """The block arguments a variant sets: a tuple argument to the block at every place (as
    long as its default), a single one to the block."""
    config: dict[str, Any] = {}
    for name, block in overrides.items():
        default = defaults.get(name)
        config[name] = (
            type(default)([block] * len(default)) if isinstance(default, (tuple, list)) else block
        )
    return config


def variant_names(
    model: str, defaults: dict[str, Any], blocks: set[str], own_text: str
) -> list[str]:
    """The variants of ``model`` (its ``__init__`` ``defaults``) that build each of
    ``blocks``: classes of the file (``own_text``) that its text names as a string (a block
    type its factory maps) and that say the direction of one of the model's block
    arguments, which the model's default does not already use."""
    arguments = block_arguments(defaults)
    variants = []
    for block in sorted(blocks):
        if f'"{block}"' not in own_text and f"'{block}'" not in own_text:
            continue
        direction = _direction(_class_words(block))
        for argument, builds in arguments.items():
            default = defaults[argument]
            used = default if isinstance(default, (tuple, list)) else (default,)
            if builds == direction and block not in used:
                variants.append(f"{model}[{argument}={block}]")
    return variants
