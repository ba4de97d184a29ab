"""Options of ``adopter bench`` that must fail before any measurement runs."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

import adopter.bench.command
from adopter.cli import app

runner = CliRunner()


def test_plot_without_matplotlib_fails_before_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object, **kwargs: object):
        return None if name == "matplotlib" else real_find_spec(name, *args, **kwargs)

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("bench ran although --plot cannot be honoured")

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(adopter.bench.command, "run_bench", must_not_run)
    result = runner.invoke(app, ["bench", "bert", "--plot", "out.png"])
    assert result.exit_code == 2
    assert "--plot needs matplotlib" in result.output
    assert "Traceback" not in result.output


def test_plot_with_matplotlib_reaches_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # The other side of the check: with matplotlib importable the command goes on to run.
    reached: list[object] = []

    def record(target: object, options: adopter.bench.command.BenchOptions, **_: object) -> None:
        reached.append(options.plot_path)
        raise adopter.bench.command.BenchTargetError("stopped here by the test")

    monkeypatch.setattr(adopter.bench.command, "run_bench", record)
    result = runner.invoke(app, ["bench", "bert", "--plot", "out.png"])
    assert result.exit_code == 2 and "stopped here by the test" in result.output
    assert [str(path) for path in reached] == ["out.png"]
