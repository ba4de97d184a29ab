"""``bench`` over several models: one job each, in order, an error per model that fails, and a
JSON file keyed by model; the same work function whatever the executor."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from adopter.bench.many import BenchJob, bench_many
from adopter.bench.options import BenchOptions
from adopter.cli import app

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

PLAIN_MODEL = Path(__file__).with_name("plain_model.py").read_text()
QUICK = {"modes": ("inference",), "repeats": 2, "warmup": 0, "memory": None, "threads": 1}


def test_each_model_gets_its_result_or_its_error_in_order(tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text(PLAIN_MODEL)
    jobs = [
        BenchJob(None, BenchOptions(**QUICK, factory=f"{tmp_path / 'net.py'}:build")),
        BenchJob("no_such_model_xyz", BenchOptions(**QUICK)),
    ]
    heard: list[int] = []
    outcomes = bench_many(jobs, on_result=lambda index, _: heard.append(index))
    assert heard == [0, 1]
    good, bad = outcomes
    assert good.error is None and good.label.endswith("net.py:build")
    assert good.bench_result().names == ["original", "patched"]
    assert good.where == "local worker 0"
    assert bad.result is None and "no_such_model_xyz" in bad.error


def test_the_cli_benchmarks_several_models_and_writes_one_json(tmp_path: Path) -> None:
    out = tmp_path / "zoo.json"
    result = runner.invoke(
        app,
        ["bench", "bert", "no_such_model_xyz", "--modes", "inference", "--repeats", "2"]
        + ["--warmup", "0", "--memory", "none", "--threads", "1", "--layers", "1"]
        + ["--seq-len", "8", "--json", str(out)],
    )
    assert result.exit_code == 2  # one model could not be benchmarked
    data = json.loads(out.read_text())
    assert list(data) == ["bert", "no_such_model_xyz"]
    assert data["bert"]["schema"].startswith("adopter.bench")
    assert "no_such_model_xyz" in data["no_such_model_xyz"]["error"]
    assert "patched" in result.stdout
