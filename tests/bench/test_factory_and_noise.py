"""``bench`` and ``verify`` share one factory syntax; bench measures memory by default and says
when its own intervals are too wide to decide."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adopter.bench.command import BenchOptions, plan_variants
from adopter.bench.measure import MemoryStats, _summarise
from adopter.bench.report import noise_warnings, render_table
from adopter.bench.results import BenchResult, ModeResult, Speedup, TimingStats
from adopter.cli import app
from adopter.models.factories import FACTORY_HELP, FactoryRef, parse_factory, resolve_factory

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

PLAIN_MODEL = Path(__file__).with_name("plain_model.py").read_text()


# -- item 18: one factory syntax ----------------------------------------------------------------


def test_parse_factory_forms(tmp_path):
    model = tmp_path / "m.py"
    model.write_text("def build():\n    return None\n")
    assert parse_factory("pkg.mod:build") == FactoryRef("build", module="pkg.mod")
    assert parse_factory("pkg.mod:Zoo.build") == FactoryRef("Zoo.build", module="pkg.mod")
    assert parse_factory(f"{model}:build") == FactoryRef("build", path=str(model.resolve()))
    for bad in ("nocolon", "mod:", ":fn", "mod:1fn", "a b:fn", "missing.py:fn", "x/y:fn"):
        with pytest.raises(ValueError):
            parse_factory(bad)


def test_a_file_factory_named_like_a_standard_module_builds_its_own_model(tmp_path):
    """``code.py:build`` used to import the standard library's ``code`` module instead."""
    (tmp_path / "code.py").write_text(PLAIN_MODEL)
    plan = plan_variants(options=BenchOptions(factory=f"{tmp_path / 'code.py'}:build"))
    assert [variant.name for variant in plan.variants] == ["original", "patched"]
    model, inputs = plan.variants[0].build()
    assert type(model).__name__ == "TinyNet"
    patched, _ = plan.variants[1].build()
    assert type(patched).__name__ == "TinyNet"
    assert type(patched).__module__ != type(model).__module__  # the patched copy


def test_a_module_factory_is_found_in_the_working_folder(tmp_path, monkeypatch):
    """As verify's workers do: the current folder is on the import path for module names
    (the console script's ``sys.path`` starts with its own folder, not the working one)."""
    (tmp_path / "my_bench_factory_7f3.py").write_text(PLAIN_MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    plan = plan_variants(options=BenchOptions(factory="my_bench_factory_7f3:build"))
    model, _ = plan.variants[0].build()
    assert type(model).__name__ == "TinyNet"
    sys.modules.pop("my_bench_factory_7f3", None)


def test_a_factory_pair_accepts_files_too(tmp_path):
    (tmp_path / "original.py").write_text(PLAIN_MODEL)
    (tmp_path / "patched.py").write_text(PLAIN_MODEL)
    options = BenchOptions(
        factory=f"{tmp_path / 'original.py'}:build",
        patched_factory=f"{tmp_path / 'patched.py'}:build",
    )
    plan = plan_variants(options=options)
    for variant in plan.variants:
        model, _ = variant.build()
        assert type(model).__name__ == "TinyNet"


def test_verify_and_bench_resolve_the_same_spec(tmp_path):
    (tmp_path / "code.py").write_text(PLAIN_MODEL)
    spec = f"{tmp_path / 'code.py'}:build"
    function, module = resolve_factory(spec, "_adopter_test_code")
    assert module.__file__ == str(tmp_path / "code.py")
    model, _ = function()
    assert type(model).__name__ == "TinyNet"
    sys.modules.pop("_adopter_test_code", None)


@pytest.mark.parametrize("command", ["bench", "verify"])
def test_factory_help_says_what_a_factory_returns(command):
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "400"})
    text = " ".join(result.stdout.split())
    assert "path/to/file.py:function" in text and "returns (model, inputs)" in text
    assert " ".join(FACTORY_HELP.split()[:8]) in text


def test_bench_cli_with_a_file_factory(tmp_path, monkeypatch):
    (tmp_path / "code.py").write_text(PLAIN_MODEL)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(
        app,
        [
            "bench",
            "--factory",
            "code.py:build",
            "--modes",
            "inference",
            "--repeats",
            "2",
            "--warmup",
            "0",
            "--memory",
            "none",
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "patched" in result.stdout


# -- item 19: memory by default, the right note, and noise ---------------------------------------


def test_bench_measures_memory_by_default(monkeypatch):
    seen = {}

    def fake_run_bench(target, options, **_kwargs):
        seen.update(vars(options))
        raise ValueError("stop")

    monkeypatch.setattr("adopter.bench.command.run_bench", fake_run_bench)
    result = runner.invoke(app, ["bench", "bert"])
    assert result.exit_code == 2 and "stop" in result.stderr
    assert seen["memory"] == "auto"
    help_text = " ".join(runner.invoke(app, ["bench", "--help"]).stdout.split())
    assert "auto (RSS" in help_text


def test_rss_resolution_note_names_the_command_line_option():
    times = {"original": {"train": [1.0, 1.1]}, "patched": {"train": [1.0, 1.1]}}
    memories = {
        "original": {"train": MemoryStats("rss_subprocess", 4096)},
        "patched": {"train": MemoryStats("rss_subprocess", 4096)},
    }
    out = _summarise(
        ["original", "patched"],
        ("train",),
        "original",
        times,
        {"original": {}, "patched": {}},
        memories,
        1,
        confidence=0.95,
        resamples=100,
        seed=0,
    )
    note = out["patched"]["train"].memory_error
    assert "--memory profiler" in note and "memory='profiler'" not in note


def _speedup(ratio, low, high):
    return Speedup(ratio, low, high, 0.95, "paired")


@pytest.mark.parametrize(
    ("speedup", "expected"),
    [
        (_speedup(1.00, 0.80, 1.30), "too noisy to decide"),
        (_speedup(1.02, 0.94, 1.06), "too noisy to decide"),
        (_speedup(2.00, 1.60, 2.50), "the size of the effect is uncertain"),
        (_speedup(0.50, 0.40, 0.52), "the size of the effect is uncertain"),
        (_speedup(1.30, 1.25, 1.36), None),
        (_speedup(1.00, 0.97, 1.04), None),
        (_speedup(0.80, 0.78, 0.83), None),
    ],
)
def test_noise_threshold(speedup, expected):
    noise = speedup.noise()
    assert (noise is None) if expected is None else (expected in noise)


def _result(speedup: Speedup) -> BenchResult:
    timing = TimingStats.from_times([0.01, 0.02, 0.5], 2)
    return BenchResult(
        baseline="original",
        modes=("inference",),
        variants={
            "original": {"inference": ModeResult(timing=timing, speedup=_speedup(1, 1, 1))},
            "patched": {"inference": ModeResult(timing=timing, speedup=speedup)},
        },
        settings={"confidence": 0.95},
    )


def test_noisy_ratios_are_flagged_in_the_table_the_warnings_and_the_json():
    from rich.console import Console

    noisy = _result(_speedup(1.0, 0.6, 1.7))
    (warning,) = noise_warnings(noisy)
    assert warning.startswith("patched, inference: 95% interval [0.60, 1.70]")
    assert "--repeats" in warning
    data = noisy.to_dict()
    assert "too noisy" in data["variants"]["patched"]["inference"]["noise"]
    assert data["variants"]["original"]["inference"]["noise"] is None
    assert BenchResult.from_dict(data).get("patched", "inference").speedup == _speedup(
        1.0, 0.6, 1.7
    )
    console = Console(width=200, record=True)
    console.print(render_table(noisy))
    assert "[0.60, 1.70] noisy" in console.export_text()
    calm = _result(_speedup(1.3, 1.25, 1.36))
    assert noise_warnings(calm) == []
    assert calm.to_dict()["variants"]["patched"]["inference"]["noise"] is None


def test_the_cli_prints_noise_warnings(monkeypatch):
    monkeypatch.setattr(
        "adopter.bench.command.run_bench",
        lambda target, options, **kw: _result(_speedup(1.0, 0.6, 1.7)),
    )
    result = runner.invoke(app, ["bench", "bert"])
    assert result.exit_code == 0, result.stderr
    assert "warning: patched, inference: 95% interval [0.60, 1.70]" in " ".join(
        result.stdout.split()
    )


# -- the patched copies bench imports live where only this process can write --------------------


def test_patched_copies_are_never_taken_from_a_shared_folder(tmp_path):
    """bench imports (executes) the patched copy it writes: a file planted under the name it
    once used in the shared temporary folder (``$TMPDIR/adopter-bench/<sha1>/<name>``) must
    never be what runs."""
    import hashlib
    import tempfile
    import uuid

    from adopter.bench.command import patched_source_file

    text = f"MARK = {uuid.uuid4().hex!r}\n"
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]
    planted = Path(tempfile.gettempdir()) / "adopter-bench" / digest / "modeling_x.py"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text("raise SystemExit('planted code ran')\n")
    try:
        path = patched_source_file(text, "modeling_x.py")
        assert path.read_text() == text
        assert path.parent.stat().st_mode & 0o077 == 0
        assert path.parent.parent.stat().st_mode & 0o077 == 0
        assert patched_source_file(text, "modeling_x.py") == path  # reused in this process
    finally:
        planted.unlink()
        planted.parent.rmdir()
