"""Token ids of a transformers configuration: special ids, placeholders, the image layout.

Random text must avoid special and placeholder ids, multimodal inputs hold placeholders where
the model expects an image, and a shrunk text vocabulary needs the placeholders inside it.
"""

from __future__ import annotations

import re
from typing import Any

from .config import sub_attr as _sub_attr

__all__ = [
    "image_token",
    "placeholder_layout",
    "placeholder_token_ids",
    "special_token_ids",
    "token_id_fixes",
]


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
    used = {v for v in placeholder_token_ids(config) if v < vocab}
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


def special_token_ids(config: Any) -> set[int]:
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


def placeholder_token_ids(config: Any) -> set[int]:
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


def image_token(config: Any, vocab: int) -> int | None:
    """The token standing for an image feature in the text, where the configuration names one
    inside the vocabulary."""
    return _first_token(config, ("image_token_id", "image_token_index"), vocab)


def placeholder_layout(config: Any, vocab: int, grid: Any) -> tuple[list[int], list[int]] | None:
    """The tokens standing for one image in the text (its placeholders, between the vision
    start and end markers where the configuration has them) and their modality types (1 for
    the placeholders); ``None`` without an image token inside the vocabulary."""
    image = image_token(config, vocab)
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
