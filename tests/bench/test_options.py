"""``BenchOptions``: checked once, when made, with a message that names the bad value."""

from __future__ import annotations

import pickle

import pytest
from typer.testing import CliRunner

import adopter.bench.command
from adopter.bench.command import FASTER_OPTIONS, only_faster_rules
from adopter.bench.options import BenchOptions
from adopter.cli import app


def test_defaults_are_the_documented_run() -> None:
    options = BenchOptions()
    assert (options.batch_size, options.seq_len, options.layers) == (2, 128, 2)
    assert options.modes == ("inference", "train") and options.memory is None
    assert (FASTER_OPTIONS.warmup, FASTER_OPTIONS.repeats) == (1, 5)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"dropout": "some"}, "unknown dropout mode 'some'"),
        ({"modes": ("inference", "training")}, "unknown mode 'training'"),
        ({"memory_modes": ("eval",)}, "unknown mode 'eval'"),
        ({"repeats": 0}, "repeats >= 1"),
        ({"warmup": -1}, "warmup >= 0"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"seq_len": 0}, "seq_len must be at least 1"),
        ({"layers": 0}, "layers must be at least 1"),
        ({"threads": 0}, "threads must be at least 1"),
        ({"decoder_seq_len": -4}, "decoder_seq_len must be at least 1"),
        ({"dtype": "float33"}, "unknown dtype 'float33'"),
        ({"memory": "heap"}, "unknown memory method 'heap'"),
        ({"memory": "cuda"}, "needs a CUDA device"),
        ({"optimizer": "lion"}, "unknown optimizer 'lion'"),
        ({"device": "gpu0"}, "unknown device 'gpu0'"),
    ],
)
def test_a_bad_value_is_refused_when_the_options_are_made(settings, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BenchOptions(**settings)


def test_values_are_normalised_and_copied() -> None:
    overrides = {"hidden_size": 32}
    options = BenchOptions(
        modes=["train"], memory_modes=["train"], memory_variants=["patched"],
        config_overrides=overrides, optimizer="adamw_fused", memory="rss",
    )  # fmt: skip
    overrides["hidden_size"] = 64  # the caller's dict changed later: the run is not
    assert options.config_overrides == {"hidden_size": 32}
    assert (options.modes, options.memory_modes, options.memory_variants) == (
        ("train",),
        ("train",),
        ("patched",),
    )
    # jobs travel to other machines pickled
    assert pickle.loads(pickle.dumps(options)) == options


def test_only_faster_refuses_options_it_would_ignore() -> None:
    for settings in ({"compile": True}, {"memory": "auto"}, {"patched_factory": "a:b"}):
        with pytest.raises(ValueError, match="does not use"):
            only_faster_rules("bert", [], BenchOptions(**settings))


def test_the_cli_fails_on_a_bad_option_before_any_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("bench ran with an unusable option")

    monkeypatch.setattr(adopter.bench.command, "run_bench", must_not_run)
    result = CliRunner().invoke(app, ["bench", "bert", "--dropout", "some"])
    assert result.exit_code == 2
    assert "unknown dropout mode 'some'" in result.output
    assert "Traceback" not in result.output
