"""``adopter bench`` over many models: each model one task, never two timed at once on a machine.

:func:`bench_many` hands one :class:`BenchJob` per model to an executor with the ``node``
placement - a Ray cluster runs one benchmark per node and nothing else there meanwhile; the
local pool runs them one after another - and streams each model's :class:`BenchOutcome` back as
it is done. The work function, :func:`run_bench_jobs`, is :func:`~adopter.bench.run_bench` itself,
so a model measured on a Ray node is measured exactly as ``adopter bench MODEL`` measures it here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..dsl.syntax import Rule
from ..executor import Executor, Task, TaskResult, run_in_order
from .options import BenchOptions
from .results import BenchResult

__all__ = ["BenchJob", "BenchOutcome", "bench_many", "run_bench_jobs"]


@dataclass(frozen=True)
class BenchJob:
    """One model to benchmark: ``target`` (or a factory in ``options``), its options (no
    output paths: the caller writes what comes back) and the rules (``None``: the default)."""

    target: str | None
    options: BenchOptions = field(default_factory=BenchOptions)
    rules: tuple[Rule, ...] | None = None

    @property
    def label(self) -> str:
        return self.target or str(self.options.factory or "model")


@dataclass
class BenchOutcome:
    """A model's benchmark (as :func:`~adopter.bench.report.to_json` data, which travels
    between machines) or the error that stopped it; ``where`` names the machine."""

    label: str
    result: dict[str, Any] | None
    error: str | None = None
    where: str = ""
    seconds: float = 0.0

    def bench_result(self) -> BenchResult | None:
        from .report import from_json

        return None if self.result is None else from_json(self.result)


def run_bench_jobs(
    jobs: Sequence[BenchJob], stop: threading.Event | None = None
) -> Iterator[BenchOutcome]:
    """The work function: benchmark each job in this process, one after the other.

    A model that cannot be benchmarked (unknown target, nothing patched, a build or run error)
    yields its error and the next one goes on. ``stop`` is looked at between models: a timed
    run is never cut short half-way (it holds no process of its own to end).
    """
    from .command import BenchTargetError, run_bench
    from .measure import VariantBuildError
    from .report import to_json

    for job in jobs:
        if stop is not None and stop.is_set():
            return
        try:
            result = run_bench(job.target, job.options, rules=job.rules)
        except (BenchTargetError, ValueError, VariantBuildError, RuntimeError) as error:
            yield BenchOutcome(job.label, None, f"{type(error).__name__}: {error}")
            continue
        yield BenchOutcome(job.label, to_json(result))


def bench_many(
    jobs: Sequence[BenchJob],
    executor: Executor | None = None,
    on_result: Callable[[int, BenchOutcome], None] | None = None,
) -> list[BenchOutcome]:
    """Benchmark every job, one per machine at a time; outcomes in ``jobs``' order.

    ``executor`` should use the ``node`` placement (:func:`~adopter.executor.make_executor`
    with ``placement="node"``); the default runs the jobs here, one after another.
    ``on_result(index, outcome)`` hears of each as it is done.
    """
    tasks = [Task(job, job.label) for job in jobs]

    def settle(done: TaskResult, job: BenchJob) -> BenchOutcome:
        if done.ok and isinstance(done.value, BenchOutcome):
            outcome = done.value
        else:
            outcome = BenchOutcome(job.label, None, done.failure or "no result")
        outcome.where, outcome.seconds = done.where, done.seconds
        return outcome

    return run_in_order(run_bench_jobs, tasks, settle, executor, on_result)
