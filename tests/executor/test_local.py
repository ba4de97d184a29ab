"""The local pool: results per task as they finish, failures per group, clean stops, and the
spec parser that picks an executor."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from adopter.executor import (
    ExecutorUnavailable,
    LocalExecutor,
    Task,
    make_executor,
    round_robin,
    run_in_order,
)


def square_slowly(payloads: Sequence[float], stop: threading.Event) -> Iterator[float]:
    for seconds in payloads:
        if stop.wait(seconds):
            return
        yield seconds * seconds


def fail_on_negative(payloads: Sequence[int], stop: threading.Event) -> Iterator[int]:
    for value in payloads:
        if value < 0:
            raise RuntimeError(f"negative: {value}")
        yield value


def test_round_robin_deals_every_index_once() -> None:
    assert round_robin(5, 2) == [[0, 2, 4], [1, 3]]
    assert round_robin(2, 4) == [[0], [1]]
    assert round_robin(0, 3) == []


def test_results_stream_as_tasks_finish_and_name_their_task() -> None:
    tasks = [Task(seconds, f"t{n}") for n, seconds in enumerate([0.6, 0.0, 0.0, 0.0])]
    order = [r.index for r in LocalExecutor(2).run(square_slowly, tasks)]
    # group 0 = tasks 0, 2 (slow first); group 1 = tasks 1, 3: 1 and 3 come before 0
    assert sorted(order) == [0, 1, 2, 3]
    assert order.index(1) < order.index(0) and order.index(3) < order.index(0)


def test_values_labels_and_times_are_kept() -> None:
    tasks = [Task(0.0, "a"), Task(0.2, "b")]
    results = sorted(LocalExecutor(1).run(square_slowly, tasks), key=lambda r: r.index)
    assert [(r.label, r.value, r.failure, r.attempts) for r in results] == [
        ("a", 0.0, None, 1),
        ("b", 0.2 * 0.2, None, 1),
    ]
    assert results[1].seconds >= 0.2
    assert results[0].where == "local worker 0"


def test_an_exception_fails_the_rest_of_its_group_only() -> None:
    tasks = [Task(v, str(v)) for v in (1, 2, -1, 3)]  # groups: [1, -1], [2, 3]
    results = {r.label: r for r in LocalExecutor(2).run(fail_on_negative, tasks)}
    assert results["1"].value == 1 and results["2"].value == 2 and results["3"].value == 3
    assert results["-1"].value is None
    assert results["-1"].failure == "RuntimeError: negative: -1"


def test_closing_the_stream_stops_every_worker_at_once() -> None:
    tasks = [Task(30.0, "slow"), Task(0.0, "quick")]
    started = time.monotonic()
    stream = LocalExecutor(2).run(square_slowly, tasks)
    first = next(stream)
    assert first.label == "quick"
    stream.close()  # what Ctrl-C does to the loop reading it
    assert time.monotonic() - started < 5
    assert not [t for t in threading.enumerate() if t.name.startswith("adopter-local-")]


def test_run_in_order_settles_every_task_in_submission_order() -> None:
    tasks = [Task(v, str(v)) for v in (3, -1, 5)]  # one worker: -1 fails itself and 5
    heard = []
    settled = run_in_order(
        fail_on_negative,
        tasks,
        lambda result, payload: (payload, result.value, result.failure),
        on_result=lambda index, value: heard.append(index),
    )
    assert settled == [
        (3, 3, None),
        (-1, None, "RuntimeError: negative: -1"),
        (5, None, "RuntimeError: negative: -1"),
    ]
    assert sorted(heard) == [0, 1, 2]


def test_make_executor_parses_specs() -> None:
    assert isinstance(make_executor(None), LocalExecutor)
    assert make_executor("local", workers=3).workers == 3
    assert make_executor("local", workers=3, placement="node").workers == 1
    with pytest.raises(ValueError, match="unknown executor"):
        make_executor("dask")
    with pytest.raises(ValueError, match="runtime environment"):
        make_executor("local", runtime_env={"pip": ["x"]})


def test_ray_without_ray_installed_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ExecutorUnavailable, match=r"pip install 'adopter\[ray\]'"):
        make_executor("ray")


def test_cli_names_the_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from adopter.cli import app

    monkeypatch.setitem(sys.modules, "ray", None)
    factory = "tests/verify/factories.py:make_original"
    result = CliRunner().invoke(
        app, ["verify", "--factory", factory, "--patched-factory", factory, "--executor", "ray"]
    )
    assert result.exit_code == 2
    assert "pip install 'adopter[ray]'" in result.output


def test_without_ray_the_local_pool_verifies_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from adopter.cli import app

    monkeypatch.setitem(sys.modules, "ray", None)  # as on a machine without the extra
    result = CliRunner().invoke(
        app,
        [
            "verify",
            "--factory",
            "tests/verify/factories.py:make_original",
            "--patched-factory",
            "tests/verify/factories.py:make_patched",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert '"verified"' in result.output


def test_nothing_imports_ray_unless_asked() -> None:
    import subprocess

    modules = "adopter.cli, adopter.executor, adopter.verify.runner, adopter.bench.many"
    probe = (
        f"import sys, {modules}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"
