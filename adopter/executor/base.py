"""What every executor shares: the task, its result, and the contract of the work function.

A *work function* is a module-level function ``function(payloads, stop)`` that yields one
result per payload, in order, and returns early (ending whatever it started) once ``stop`` is
set. It holds the whole logic of a job - verify's contained worker, a benchmark - so that an
executor only decides where and how many payloads run together: the logic is never written twice.
Payloads and results must pickle (Ray sends them between machines).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = [
    "Executor",
    "ExecutorUnavailable",
    "Task",
    "TaskResult",
    "WorkFunction",
    "round_robin",
]

P = TypeVar("P")
R = TypeVar("R")

WorkFunction = Callable[[Sequence[Any], threading.Event], Iterator[Any]]


class ExecutorUnavailable(RuntimeError):
    """The executor asked for cannot run here (Ray not installed, cluster unreachable)."""


@dataclass(frozen=True)
class Task(Generic[P]):
    """One unit of work: ``payload`` for the work function, with its limits.

    ``timeout`` (seconds) is enforced by the work function itself (verify kills its worker
    process tree at it); an executor that runs tasks far away adds a backstop. ``memory``
    (bytes) is what the task may use: a Ray task reserves it when it is scheduled. ``None``:
    no limit.
    """

    payload: P
    label: str
    timeout: float | None = None
    memory: int | None = None


@dataclass
class TaskResult(Generic[R]):
    """What became of one task: its ``value``, or the ``failure`` that left none.

    ``index`` is the task's position in the submitted sequence; ``attempts`` counts how often it
    was started (a task whose worker died is started once more); ``where`` names the worker or
    node it ran on last.
    """

    index: int
    label: str
    value: R | None
    failure: str | None = None
    attempts: int = 1
    seconds: float = 0.0
    where: str = ""

    @property
    def ok(self) -> bool:
        return self.failure is None


def round_robin(count: int, groups: int) -> list[list[int]]:
    """Task indices ``0..count-1`` dealt into at most ``groups`` non-empty groups (cards-style,
    so neighbouring tasks - often of similar cost - go to different groups)."""
    groups = max(1, min(groups, count))
    return [list(range(start, count, groups)) for start in range(groups)] if count else []


class Executor(ABC):
    """Runs tasks through a work function and yields their results as they finish.

    Use as a context manager: entering starts what the executor needs (a Ray connection),
    leaving releases it. ``run`` may be called several times in between.
    """

    name: str = "executor"

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:  # noqa: B027 - most executors hold nothing to release
        """Release what ``__enter__`` started."""

    @abstractmethod
    def describe(self) -> str:
        """One line for reports: what ran the tasks (workers, nodes)."""

    @property
    @abstractmethod
    def workers(self) -> int:
        """How many tasks can run at once."""

    @abstractmethod
    def run(self, function: WorkFunction, tasks: Sequence[Task[Any]]) -> Iterator[TaskResult]:
        """Yield one :class:`TaskResult` per task, in the order they finish.

        On ``KeyboardInterrupt`` (Ctrl-C) every running task is stopped and every queued one
        dropped before the interrupt propagates: nothing started here outlives it.
        """
