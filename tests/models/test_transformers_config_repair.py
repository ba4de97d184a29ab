"""Repairing shrunk configurations that the configuration's own validation rejects."""

from __future__ import annotations

from typing import Any

import pytest

from adopter.models.transformers.config_repair import construct_repaired, error_text, shrunk_paths

DEFAULTS: dict[str, Any] = {
    "hidden_size": 512,
    "num_layers": 7,
    "conv_dim": [512] * 7,
    "codebook_size": 2048,
    "vocab_size": 2048,
    "sub_config": {"model_type": "x", "width": 64, "groups": 32},
}


class Rejected(ValueError):
    pass


def _validating(rules: list[Any]) -> Any:
    """A stand-in configuration class whose validators raise like transformers 5's do."""

    def construct(kwargs: dict[str, Any]) -> dict[str, Any]:
        config = {**DEFAULTS, **kwargs}
        for rule in rules:
            problem = rule(config)
            if problem:
                try:
                    raise ValueError(problem)
                except ValueError as cause:
                    raise Rejected("Class validation error for validator 'check':") from cause
        return config

    return construct


def test_shrunk_paths_go_into_sub_configurations() -> None:
    overrides = {"hidden_size": 16, "sub_config": {"model_type": "x", "width": 8, "groups": 32}}
    assert shrunk_paths(DEFAULTS, overrides) == [("hidden_size",), ("sub_config", "width")]


def test_error_text_reads_the_cause() -> None:
    try:
        _validating([lambda c: "`codebook_size` must be a power of 2"])({})
    except Rejected as exc:
        assert "power of 2" in error_text(exc)


def test_a_named_entry_is_reverted_and_the_rest_stays_shrunk() -> None:
    construct = _validating(
        [lambda c: "" if c["codebook_size"] & (c["codebook_size"] - 1) == 0 else "codebook_size"]
    )
    overrides = {"hidden_size": 16, "codebook_size": 37, "vocab_size": 99}
    config = construct_repaired(construct, DEFAULTS, overrides, shrunk_paths(DEFAULTS, overrides))
    assert config["codebook_size"] == 2048
    assert config["hidden_size"] == 16 and config["vocab_size"] == 99


def test_an_unnamed_count_is_found_by_single_reverts() -> None:
    # "len(conv_dim) must equal the layer count" names the list, not the count.
    construct = _validating([lambda c: "" if len(c["conv_dim"]) == c["num_layers"] else "conv_dim"])
    overrides = {"hidden_size": 16, "num_layers": 2, "conv_dim": [16] * 7}
    config = construct_repaired(construct, DEFAULTS, overrides, shrunk_paths(DEFAULTS, overrides))
    assert config["num_layers"] == 7 and config["conv_dim"] == [16] * 7
    assert config["hidden_size"] == 16


def test_nested_entries_and_fixed_entries() -> None:
    construct = _validating(
        [lambda c: "" if c["sub_config"]["width"] % c["sub_config"]["groups"] == 0 else "width"]
    )
    overrides = {"sub_config": {"model_type": "x", "width": 8, "groups": 32}, "hidden_size": 16}
    config = construct_repaired(construct, DEFAULTS, overrides, shrunk_paths(DEFAULTS, overrides))
    assert config["sub_config"]["width"] == 64 and config["hidden_size"] == 16
    with pytest.raises(Rejected):  # nothing revertible: the original error
        construct_repaired(construct, DEFAULTS, overrides, [])


def test_gives_up_within_the_bound() -> None:
    calls = []

    def never(kwargs: dict[str, Any]) -> None:
        calls.append(kwargs)
        raise ValueError("no")

    overrides = {f"k{i}": i for i in range(100)}
    with pytest.raises(ValueError):
        construct_repaired(never, {}, overrides, [(k,) for k in overrides], max_tries=10)
    assert len(calls) == 11


def test_reasons_carry_the_validators_complaint() -> None:
    from adopter.models.common import error_line

    try:
        _validating([lambda c: "`codebook_size` must be a power of 2"])({})
    except Rejected as exc:
        assert error_line(exc) == (
            "Rejected: Class validation error for validator 'check': "
            "ValueError: `codebook_size` must be a power of 2"
        )
    assert error_line(ValueError("first\nsecond")) == "ValueError: first"


def test_sub_configurations_are_repaired_each_on_its_own() -> None:
    # Two sub-configurations break one rule with the same message: reverting either alone
    # leaves the message unchanged, so each is repaired by its own constructor first.
    inner_defaults = {"model_type": "x", "hidden_size": 128, "head_dim": 32}

    def inner(kwargs: dict[str, Any]) -> dict[str, Any]:
        config = {**inner_defaults, **kwargs}
        if config["head_dim"] < 16:
            raise ValueError("the rotary embedding needs 8 pairs")
        return config

    def outer(kwargs: dict[str, Any]) -> dict[str, Any]:
        return {key: inner(kwargs[key]) for key in ("a", "b")}

    defaults = {"a": dict(inner_defaults), "b": dict(inner_defaults)}
    shrunk = {"model_type": "x", "hidden_size": 16, "head_dim": 8}
    overrides = {"a": dict(shrunk), "b": dict(shrunk)}
    config = construct_repaired(
        outer,
        defaults,
        overrides,
        shrunk_paths(defaults, overrides),
        subs=lambda key: (inner, None),
    )
    assert config["a"]["head_dim"] == config["b"]["head_dim"] == 32
    assert config["a"]["hidden_size"] == config["b"]["hidden_size"] == 16
