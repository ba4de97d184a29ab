"""Table, JSON and PNG output of a benchmark."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from adopter.bench import from_json, plot, render_table, to_json
from adopter.bench.report import format_bytes, format_seconds, speedup_verdict
from tests.bench.synthetic import make_result


def _text(table) -> str:
    console = Console(record=True, width=220, color_system=None)
    console.print(table)
    return console.export_text()


def test_json_round_trips_a_real_run(toy_result):
    data = to_json(toy_result)
    text = json.dumps(data, allow_nan=False)  # strict JSON: no NaN or Infinity
    loaded = from_json(json.loads(text))
    assert loaded == toy_result
    assert data["schema"] == "adopter.bench/1"
    train = data["variants"]["patched"]["train"]
    assert len(train["timing"]["times_s"]) == 3
    assert train["timing"]["iqr_s"] == pytest.approx(
        train["timing"]["q3_s"] - train["timing"]["q1_s"]
    )
    assert set(train["speedup"]) == {"ratio", "ci_low", "ci_high", "confidence", "method"}
    assert train["memory"]["method"] == "profiler"


def test_json_round_trips_errors_and_missing_values():
    result = make_result({"broken": {"inference": "step failed: x"}})
    assert from_json(json.loads(json.dumps(to_json(result)))) == result


def test_unknown_schema_is_rejected(toy_result):
    data = to_json(toy_result)
    data["schema"] = "something/else"
    with pytest.raises(ValueError, match="schema"):
        from_json(data)


def test_table_renders_a_real_run(toy_result):
    text = _text(render_table(toy_result))
    for needle in ("original", "patched", "inference", "train", "Speedup", "95% CI", "1.00x"):
        assert needle in text
    assert "torch " in text and "1 threads" in text and "memory: profiler" in text
    assert "Note" not in text  # no errors, no note column


def test_table_shows_failures_and_colours_verdicts():
    result = make_result(
        {
            "fast": {"inference": (1.5, 1.2, 1.8), "train": (1.5, 1.2, 1.8)},
            "broken": {"inference": "torch.compile failed: nope"},
        },
        memory={"fast": {"inference": 0.5, "train": 0.75}},
    )
    text = _text(render_table(result))
    assert "failed" in text and "torch.compile failed: nope" in text
    assert "1.50x" in text and "[1.20, 1.80]" in text
    assert "-50.0%" in text and "-25.0%" in text
    assert speedup_verdict(result.get("fast", "train")) == "faster"
    assert speedup_verdict(result.get("broken", "train")) == "n/a"


def test_names_are_not_read_as_markup():
    result = make_result({"rule[bold]": {"inference": (1.1, 1.0, 1.2), "train": (1.1, 1.0, 1.2)}})
    result.settings.update(compile=True, compile_backend="inductor")
    text = _text(render_table(result))
    assert "rule[bold]" in text and "torch.compile[inductor]" in text


def test_plot_writes_a_png(toy_result, tmp_path):
    out = plot({"toy-mlp": toy_result}, tmp_path / "charts" / "bench.png")
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000


def test_plot_handles_ablation_errors_and_no_memory(tmp_path):
    ablation = make_result(
        {
            "rule-a": {"inference": (1.2, 1.1, 1.3), "train": (1.1, 1.0, 1.2)},
            "rule-b": {"inference": "step failed: boom", "train": (0.9, 0.8, 1.0)},
        }
    )
    other = make_result({"patched": {"inference": (1.05, 0.9, 1.2)}}, modes=("inference",))
    out = plot({"bert": ablation, "gpt2": other}, tmp_path / "ablation.png", title="ablation")
    assert out.stat().st_size > 5000


def test_plot_needs_a_variant(tmp_path):
    with pytest.raises(ValueError, match="nothing to plot"):
        plot({"alone": make_result({})}, tmp_path / "x.png")


def test_formatting_helpers():
    assert format_seconds(812.4e-6) == "812.4 µs"
    assert format_seconds(3.2109e-3) == "3.21 ms"
    assert format_seconds(1.2044) == "1.204 s"
    assert format_bytes(512) == "512 B"
    assert format_bytes(3.5 * 2**20) == "3.5 MiB"
    assert format_bytes(5 * 2**40) == "5120.0 GiB"
