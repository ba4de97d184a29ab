"""Names of model-configuration entries that mean layers or dropout: one vocabulary for all.

The transformers adapter shrinks a configuration to a tiny model
(:mod:`adopter.models.transformers.shrink`) and sets its dropout to 0 for an exact comparison;
``bench`` cuts a configuration's depth while keeping its widths and sets the dropout a benchmark
asks for (:func:`adopter.bench.command.bench_config`); verify's train mode zeroes dropout-like
module attributes (:mod:`adopter.models.dropout`). All read entries by name, and the names live
here, so that a model family taught to one stage is known to the others.

Pure name matching: no torch, no model library.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "ATTENTION_DROPOUT_NAME",
    "DROPOUT_NAME",
    "LAYER_COUNT_NAME",
    "LAYER_LIST_NAME",
    "SHARED_DROPOUT_NAMES",
    "STACK_DEPTH_LIST_NAMES",
    "STACK_DEPTH_NAMES",
    "is_sub_config",
    "zero_dropout_dict",
]


def is_sub_config(key: Any, value: Any) -> bool:
    """Nested configurations (``text_config``) - not other dicts such as ``id2label``."""
    if not isinstance(value, dict) or not isinstance(key, str):
        return False
    return key.endswith("config") or "model_type" in value


# -- layers ------------------------------------------------------------------------------------

LAYER_COUNT_NAME = re.compile(
    r"^(n_layers?|num_layers|num_hidden_layers|num_.*_layers|.*_layers|num_blocks|depth|"
    r"encoder_layers|decoder_layers|n_blocks)$"
)
"""Every integer that counts layers of some kind. ``verify`` cuts them all (to a tiny model, with
the per-layer lists that must follow, see :mod:`adopter.models.transformers.shrink`)."""
LAYER_LIST_NAME = re.compile(r"^(depths|num_layers|layers|block_counts|.*_depths)$")
"""Per-stage layer counts (Swin's ``depths``)."""

STACK_DEPTH_NAMES = frozenset(
    {
        "num_hidden_layers",
        "num_layers",
        "num_decoder_layers",
        "n_layer",
        "n_layers",
        "encoder_layers",
        "decoder_layers",
        "depth",  # vision towers (Qwen2-VL's, GLM-4V's): the block count
    }
)
"""The depths of a model's main layer stacks: the part of :data:`LAYER_COUNT_NAME` that ``bench``
cuts. A benchmark keeps every other size real, and the broad pattern also matches counts that are
no stack depth (wav2vec2's ``num_feat_extract_layers``, derived from its ``conv_dim`` list; its
``num_adapter_layers``); stacks named otherwise (LXMERT's ``l_layers``, ViT-MAE's
``decoder_num_hidden_layers``) keep their default depth in a benchmark."""
STACK_DEPTH_LIST_NAMES = frozenset({"depths"})
"""Per-stage depths that ``bench`` cuts (ResNet's, Swin's, GroupViT's vision tower's)."""

# -- dropout -----------------------------------------------------------------------------------

DROPOUT_NAME = re.compile(
    r"(dropout|_pdrop$|drop_rate|drop_path|^layerdrop$|_layerdrop$|drop_prob)"
)
"""Names of dropout probabilities (config keys and module attributes alike): HF's
``hidden_dropout_prob`` / ``attention_dropout``, GPT-2's ``resid_pdrop``, LayerDrop, drop path."""
ATTENTION_DROPOUT_NAME = re.compile(
    r"^(attention_probs_dropout_prob|attn_pdrop|attention_dropout|attention_dropout_prob|"
    r"attn_dropout|attention_dropout_rate)$"
)
"""The dropout of the attention probabilities alone (what the fused attention kernels need at 0
to take their fast path in training)."""
SHARED_DROPOUT_NAMES = frozenset({"dropout_rate"})
"""One rate for attention and everything else (T5), where there is no attention-only rate."""


def zero_dropout_dict(config: dict[str, Any]) -> dict[str, Any]:
    """Overrides that set every dropout-like probability (and LayerDrop) in ``config`` to 0.

    Train mode with all dropout at 0 makes a training-time forward deterministic, so it can be
    compared exactly while still running every ``self.training`` branch of the model.
    """
    overrides: dict[str, Any] = {}
    for key, value in config.items():
        if is_sub_config(key, value):
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
