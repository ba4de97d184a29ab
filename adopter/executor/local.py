"""The default executor: a pool of workers on this machine.

Tasks are dealt round-robin into one group per worker, and each group goes to the work function
in one call: for verify that is one worker process per group, so torch and the model library are
imported once per worker rather than once per file (what ``adopter verify`` always did with one
worker). Each group is driven by a thread of this process; the heavy lifting happens in the
processes the work function starts.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from .base import Executor, Task, TaskResult, WorkFunction, round_robin

__all__ = ["LocalExecutor"]

_DONE = object()
_POLL_SECONDS = 0.1
_JOIN_SECONDS = 10.0


class LocalExecutor(Executor):
    """``workers`` groups of tasks at once on this machine (default 1: one after the other)."""

    name = "local"

    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._workers = workers

    @property
    def workers(self) -> int:
        return self._workers

    def describe(self) -> str:
        return f"local pool of {self._workers} worker(s)"

    def run(self, function: WorkFunction, tasks: Sequence[Task[Any]]) -> Iterator[TaskResult]:
        results: queue.Queue[Any] = queue.Queue()
        stop = threading.Event()
        groups = round_robin(len(tasks), self._workers)
        threads = [
            threading.Thread(
                target=_drive,
                args=(function, tasks, group, stop, results, f"local worker {number}"),
                name=f"adopter-local-{number}",
                daemon=True,
            )
            for number, group in enumerate(groups)
        ]
        for thread in threads:
            thread.start()
        running = len(threads)
        finished = False
        try:
            while running:
                try:
                    item = results.get(timeout=_POLL_SECONDS)
                except queue.Empty:
                    continue
                if item is _DONE:
                    running -= 1
                else:
                    yield item
            finished = True
        finally:
            if not finished:  # Ctrl-C, or the caller stopped reading: end every worker
                stop.set()
                # A work function ends what it started within moments of ``stop``; one that
                # cannot (a benchmark mid-run) is left to end with this process (daemon).
                deadline = time.monotonic() + _JOIN_SECONDS
                for thread in threads:
                    thread.join(max(0.0, deadline - time.monotonic()))


def _drive(
    function: WorkFunction,
    tasks: Sequence[Task[Any]],
    group: list[int],
    stop: threading.Event,
    results: queue.Queue[Any],
    where: str,
) -> None:
    """Run one group through ``function`` and put each task's result on ``results``."""
    produced = 0
    clock = time.monotonic()
    failure = "the work function returned fewer results than tasks"
    try:
        for value in function([tasks[index].payload for index in group], stop):
            if produced == len(group):
                break
            now = time.monotonic()
            index = group[produced]
            results.put(TaskResult(index, tasks[index].label, value, None, 1, now - clock, where))
            produced, clock = produced + 1, now
    except BaseException as exc:  # a bug in the work function: its tasks fail, others go on
        failure = f"{type(exc).__name__}: {exc}"
    finally:
        if stop.is_set():
            failure = "cancelled"
        for index in group[produced:]:
            results.put(TaskResult(index, tasks[index].label, None, failure, 1, 0.0, where))
        results.put(_DONE)
