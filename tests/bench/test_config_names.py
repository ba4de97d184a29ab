"""The configuration vocabulary ``bench`` shares with ``verify``: its narrower sets stay inside the
broad patterns, so a name ``bench`` treats as a layer count or a dropout ``verify`` does too."""

from __future__ import annotations

import pytest

from adopter.models.config_names import (
    ATTENTION_DROPOUT_NAME,
    DROPOUT_NAME,
    LAYER_COUNT_NAME,
    LAYER_LIST_NAME,
    SHARED_DROPOUT_NAMES,
    STACK_DEPTH_LIST_NAMES,
    STACK_DEPTH_NAMES,
    is_sub_config,
)


@pytest.mark.parametrize("name", sorted(STACK_DEPTH_NAMES))
def test_stack_depths_are_layer_counts(name: str) -> None:
    assert LAYER_COUNT_NAME.match(name)


@pytest.mark.parametrize("name", sorted(STACK_DEPTH_LIST_NAMES))
def test_stage_depths_are_layer_lists(name: str) -> None:
    assert LAYER_LIST_NAME.match(name)


@pytest.mark.parametrize(
    "name",
    [
        *SHARED_DROPOUT_NAMES,
        "attention_probs_dropout_prob",
        "attn_pdrop",
        "attention_dropout",
        "attention_dropout_prob",
        "attn_dropout",
        "attention_dropout_rate",
    ],
)
def test_attention_and_shared_dropouts_are_dropouts(name: str) -> None:
    assert DROPOUT_NAME.search(name)
    assert bool(ATTENTION_DROPOUT_NAME.match(name)) is (name not in SHARED_DROPOUT_NAMES)


@pytest.mark.parametrize(
    ("key", "value", "nested"),
    [
        ("text_config", {"hidden_size": 8}, True),
        ("backbone", {"model_type": "resnet"}, True),
        ("id2label", {"0": "a"}, False),
        ("text_config", None, False),
    ],
)
def test_sub_configurations(key: str, value: object, nested: bool) -> None:
    assert is_sub_config(key, value) is nested


def test_no_dropout_benchmarks_also_switch_off_layerdrop() -> None:
    """``--dropout none``: LayerDrop skips random layers, so variants would do unequal work."""
    from adopter.bench.command import _dropout_overrides

    config = {
        "hidden_dropout": 0.1,
        "attention_dropout": 0.1,
        "encoder_layerdrop": 0.05,
        "layerdrop": 0.1,
        "drop_path_rate": 0.1,
        "layer_norm_eps": 1e-5,
    }
    assert _dropout_overrides(config, "none") == {
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "layerdrop": 0.0,
        "drop_path_rate": 0.0,
    }
    assert _dropout_overrides(config, "no-attention") == {"attention_dropout": 0.0}
