"""``adopter bench --backends``: every installed backend timed per op and shape, the winners
recorded in the table the kernels read, shown as a table and a plot (tiny shapes here; the
figures are docs/kernels.md's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adopter.bench.backends import (
    BackendRow,
    Shape,
    default_shapes,
    measure_backends,
    model_shapes,
    plot_backends,
    record,
    render_backends,
    winners,
)
from adopter.cli import app
from adopter.kernels import backends

TINY = [
    Shape("linear_cross_entropy", "8x4 -> 11", {"tokens": 8, "hidden": 4, "vocab": 11}),
    Shape("rms_norm", "2x3x8", {"batch": 2, "seq": 3, "hidden": 8}),
    Shape("add_rms_norm", "2x3x8", {"batch": 2, "seq": 3, "hidden": 8}),
    Shape(
        "attention",
        "1x2x4x8",
        {"batch": 1, "heads": 2, "kv_heads": 1, "seq": 4, "head_dim": 8},
    ),
]


@pytest.fixture(autouse=True)
def own_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(backends.TABLE_ENV, str(tmp_path / "table.json"))
    backends.reload_table()
    yield
    monkeypatch.undo()
    backends.reload_table()


def test_every_installed_backend_is_measured_and_the_winners_recorded(tmp_path: Path) -> None:
    rows = measure_backends(TINY, repeats=2, warmup=0, modes=("train",))
    measured = {(r.op, r.backend) for r in rows}
    for shape in TINY:
        assert (shape.op, "original") in measured
        for name in backends.available(shape.op, "cpu"):
            assert (shape.op, name) in measured, name
    assert all(r.median_s > 0 and r.peak_bytes is not None for r in rows)
    reference = {r.op: r.reference for r in rows}
    assert reference == {
        "linear_cross_entropy": "adopter",
        "rms_norm": "adopter",
        "add_rms_norm": "adopter",
        "attention": "original",
    }
    path = record(rows)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["machine"] == backends.machine_description()
    assert set(data["winners"]) == {s.op for s in TINY}
    assert backends.current_table() == data["winners"]  # the kernels read it at once
    console_table = render_backends(rows, winners(rows))
    assert console_table.row_count == len(rows)
    pytest.importorskip("matplotlib")
    assert plot_backends(rows, tmp_path / "b.png").stat().st_size > 0


def _row(backend: str, median_s: float, ci: tuple[float, float], mode: str = "train") -> BackendRow:
    return BackendRow(
        "rms_norm",
        "s",
        f"cpu/float32/{mode}/h8",
        mode,
        backend,
        median_s,
        0.1 / median_s,
        ci,
        None,
        "adopter",
    )


def test_a_winner_must_be_clearly_faster_than_the_reference() -> None:
    rows = [_row("adopter", 0.1, (1, 1)), _row("torch", 0.09, (0.95, 1.2))]
    assert winners(rows) == {"rms_norm": {"cpu/float32/train/h8": "adopter"}}  # within noise
    rows = [
        _row("adopter", 0.1, (1, 1)),
        _row("torch", 0.05, (1.6, 2.2)),
        _row("original", 0.07, (1.2, 1.6)),
    ]
    assert winners(rows) == {"rms_norm": {"cpu/float32/train/h8": "torch"}}


def test_each_mode_has_its_own_winner() -> None:
    # a backend that wins the forward alone need not win the step with its backward
    rows = [
        _row("adopter", 0.1, (1, 1)),
        _row("torch", 0.2, (0.4, 0.6)),
        _row("adopter", 0.1, (1, 1), "inference"),
        _row("torch", 0.05, (1.6, 2.2), "inference"),
    ]
    assert winners(rows) == {
        "rms_norm": {"cpu/float32/train/h8": "adopter", "cpu/float32/inference/h8": "torch"}
    }


def test_shapes_of_a_configuration_and_the_defaults() -> None:
    class Config:
        hidden_size, vocab_size, num_attention_heads, num_key_value_heads = 64, 100, 4, 2

    found = {s.op: s.sizes for s in model_shapes(Config(), 2, 16)}
    assert found["linear_cross_entropy"] == {"tokens": 32, "hidden": 64, "vocab": 100}
    assert found["attention"]["head_dim"] == 16 and found["attention"]["kv_heads"] == 2
    assert {s.op for s in default_shapes()} == {o.name for o in backends.OPS}


def test_plot_without_matplotlib_fails_before_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    result = CliRunner().invoke(app, ["bench", "--backends", "--plot", "x.png"])
    assert result.exit_code != 0 and "matplotlib" in result.output
