"""Where verify and bench jobs run: a pool of workers here (default) or a Ray cluster.

``verify``, ``bench`` over many models and the zoo benchmarks hand their jobs to an
:class:`Executor` as :class:`Task` objects together with a *work function* that holds the whole
job logic (see :mod:`adopter.executor.base`); the executor only decides where and how many run
at once, and streams :class:`TaskResult` objects back as tasks finish. :class:`LocalExecutor` is
the default and needs nothing; :class:`RayExecutor` needs ``pip install 'adopter[ray]'`` and is
imported only when asked for. A work function whose jobs must not run in this process (verify's
run model code) hands them to :func:`run_contained`: worker processes with a timeout per job and
a memory limit, whose every process is killed when they end (:mod:`adopter.executor.contained`).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from .base import Executor, ExecutorUnavailable, Task, TaskResult, WorkFunction, round_robin
from .contained import BatchJob, ContainedWorker, JobOutcome, run_contained
from .local import LocalExecutor

__all__ = [
    "EXECUTOR_HELP",
    "BatchJob",
    "ContainedWorker",
    "Executor",
    "ExecutorUnavailable",
    "JobOutcome",
    "LocalExecutor",
    "Task",
    "TaskResult",
    "WorkFunction",
    "make_executor",
    "round_robin",
    "run_contained",
    "run_in_order",
    "terminate_as_interrupt",
]

V = TypeVar("V")

EXECUTOR_HELP = (
    "local (worker processes on this machine, the default) or ray[:ADDRESS] (a Ray cluster; "
    "without an address ray.init() starts or finds one on this machine; needs "
    "pip install 'adopter[ray]')."
)


def make_executor(
    spec: str | None,
    *,
    workers: int | None = None,
    placement: str = "task",
    runtime_env: dict[str, Any] | None = None,
) -> Executor:
    """The executor named by ``spec``: ``local``, ``ray`` or ``ray:ADDRESS``.

    ``workers``: the local pool's size (default 1), or the CPUs of a Ray instance started on
    this machine (default: all). ``placement``: ``task`` or ``node`` (one task per node, for
    benchmarks; the local pool then runs one task at a time). Raises ``ValueError`` for an
    unknown spec and :class:`ExecutorUnavailable` for ``ray`` when Ray is not installed.
    """
    name, _, address = (spec or "local").strip().partition(":")
    if name == "local" and not address:
        if runtime_env:
            raise ValueError("a runtime environment is for --executor ray")
        return LocalExecutor(1 if placement == "node" else (workers or 1))
    if name == "ray":
        from .ray_cluster import RayExecutor, import_ray

        import_ray()  # the clear "not installed" error now, before any work
        return RayExecutor(
            address or None,
            cpus=None if address else workers,
            placement=placement,
            runtime_env=runtime_env,
        )
    raise ValueError(f"unknown executor {spec!r}: use local, ray or ray:ADDRESS")


def run_in_order(
    function: WorkFunction,
    tasks: Sequence[Task[Any]],
    settle: Callable[[TaskResult, Any], V],
    executor: Executor | None = None,
    on_result: Callable[[int, V], None] | None = None,
) -> list[V]:
    """Run ``tasks`` through ``function`` on ``executor`` (default: one local worker) and return
    what ``settle(result, payload)`` makes of each task's result (its value, or the failure that
    left none), in the tasks' order; ``on_result(index, settled)`` hears of each as it
    finishes."""
    settled: list[V | None] = [None] * len(tasks)
    for result in (executor or LocalExecutor()).run(function, tasks):
        settled[result.index] = value = settle(result, tasks[result.index].payload)
        if on_result is not None:
            on_result(result.index, value)
    return [value for value in settled if value is not None]


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within this block ``SIGTERM`` (``kill``, a job scheduler stopping us) acts as Ctrl-C:
    it raises ``KeyboardInterrupt``, so executors cancel their tasks and end what they started
    instead of leaving workers behind. Only in the main thread (elsewhere it does nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
