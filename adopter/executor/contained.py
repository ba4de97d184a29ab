"""Run a batch of jobs in contained worker processes, each job under its own limits.

The mechanism behind a work function whose jobs must not run in the caller's process (verify's:
model code can hang, crash the interpreter or poison global state). A *worker* is a command
(``python -m some.module``) that is handed the path of a batch file, ``{"jobs": [JOB, ...]}``
(:func:`read_batch`), runs the jobs in order and keeps each job's result file up to date
(:class:`ResultFile`), a JSON object that says ``"done": true`` once the job is complete. What a
job is and what its result means is the caller's business; this module only starts workers,
watches the result files and ends workers.

Each worker starts in a session of its own with a mark in its environment
(:mod:`adopter.executor.contain`), so that when it ends - done, crashed, timed out, over its
memory limit or stopped - everything it started is killed with it, including processes that
left its session. One worker takes as many jobs as it can (a worker's start-up, importing torch
and a model library, costs seconds); each job still has its own timeout, and a worker that has
to be ended takes only its current job with it: a fresh one takes the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contain import MARK_VARIABLE, PARENT_VARIABLE, end_worker, new_mark, resident_bytes

__all__ = [
    "BatchJob",
    "ContainedWorker",
    "JobOutcome",
    "ResultFile",
    "read_batch",
    "run_contained",
]

_OUTPUT_TAIL = 2000
_POLL_SECONDS = 0.05
_MEMORY_POLL_SECONDS = 0.5
_GIB = 1024**3
_ADOPTER_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ContainedWorker:
    """How to start a worker and hold it to its limits.

    ``command`` is the worker's command line less the batch file's path, which is appended.
    ``environment`` is set in the worker's environment over this process's (this ``adopter``
    is importable there too). ``timeout`` (seconds) applies to each job; ``memory_limit``
    (bytes, ``None``: none) to what the worker and everything it started hold resident.
    """

    command: Sequence[str]
    timeout: float
    memory_limit: int | None = None
    environment: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchJob:
    """One job for a worker: its JSON, and the result file the job's JSON tells it to keep."""

    data: Mapping[str, Any]
    result_path: Path


@dataclass
class JobOutcome:
    """What became of one job: its last result JSON (``None``: none written), the ``failure``
    that ended its worker before the job was done, and its seconds (counted from the end of the
    job before it, or from the worker's start)."""

    result: dict[str, Any] | None
    failure: str | None
    seconds: float


class ResultFile:
    """Worker side: one job's result file, ``data`` and whether the job is done, rewritten
    atomically by every :meth:`flush` (the parent reads it at any moment, and a worker killed
    meanwhile leaves the previous whole text). ``started`` is when the job began."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {**data, "done": False, "seconds": None}
        self.started = time.perf_counter()
        self.flush()

    def flush(self) -> None:
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps(self.data, indent=1))
        os.replace(scratch, self.path)

    def finish(self) -> None:
        """Mark the job done, with its own seconds: the parent starts the next job's clock
        from here."""
        self.data["done"] = True
        self.data["seconds"] = round(time.perf_counter() - self.started, 3)
        self.flush()


def read_batch(path: Path | str) -> list[dict[str, Any]]:
    """Worker side: the jobs of the batch file at ``path``, in order."""
    return json.loads(Path(path).read_text(encoding="utf-8"))["jobs"]


def _read_result(result_path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(result_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):  # not written yet, or being replaced right now
        return None


def _is_done(result_path: Path) -> bool:
    return bool((_read_result(result_path) or {}).get("done"))


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _OUTPUT_TAIL else "..." + text[-_OUTPUT_TAIL:]


def run_contained(
    jobs: Sequence[BatchJob],
    worker: ContainedWorker,
    workdir: Path,
    stop: threading.Event | None = None,
) -> Iterator[JobOutcome]:
    """Run ``jobs`` in as few ``worker`` processes as possible and yield each job's outcome, in
    order, as soon as it is known. Batch files and worker logs go to ``workdir``.

    One worker runs the jobs in order. A job that is not done ``worker.timeout`` seconds after
    the previous one finished (or the worker started) is timed out - the worker is ended and a
    new one takes the remaining jobs; a worker that dies takes only its current job with it, and
    so does one whose process tree holds more than ``worker.memory_limit`` bytes resident.
    Whatever ends this generator early - ``stop`` set, ``KeyboardInterrupt`` (also the one
    ``ray.cancel`` raises), the caller closing it - ends the worker and all it started.
    """
    done = 0
    launch = 0
    while done < len(jobs):
        log_path = workdir / f"worker-{launch}.log"
        mark = new_mark()
        batch_path = workdir / f"batch-{launch}.json"
        process = _start(worker, jobs[done:], batch_path, log_path, mark)
        watch = _Watch(process, mark, worker.timeout, worker.memory_limit, stop)
        try:
            for outcome in watch.outcomes(jobs, done):
                done += 1
                yield outcome
        finally:
            _end(process, mark)  # what the job's code left running goes too
        if watch.stopped:
            return
        if done < len(jobs):
            failure = watch.failure
            if failure is None:
                output = log_path.read_text(encoding="utf-8", errors="replace")
                failure = f"the worker exited with code {process.returncode}: {_tail(output)}"
            result = _read_result(jobs[done].result_path)
            yield JobOutcome(result, failure, time.monotonic() - watch.clock)
            done += 1
        launch += 1


def _environment(worker: ContainedWorker, mark: str) -> dict[str, str]:
    """The worker's environment: this process's with ``worker.environment`` over it, this
    ``adopter`` importable, and the mark that finds every process the worker starts."""
    env = dict(os.environ)
    env.update(worker.environment)
    env[MARK_VARIABLE] = mark
    env[PARENT_VARIABLE] = str(os.getpid())
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(_ADOPTER_ROOT) + (os.pathsep + existing if existing else "")
    return env


def _start(
    worker: ContainedWorker,
    jobs: Sequence[BatchJob],
    batch_path: Path,
    log_path: Path,
    mark: str,
) -> subprocess.Popen[bytes]:
    """A worker for ``jobs``, in its own session, its output in ``log_path``."""
    batch = {"jobs": [dict(job.data) for job in jobs]}
    batch_path.write_text(json.dumps(batch, indent=1), encoding="utf-8")
    command = [*worker.command, str(batch_path)]
    with log_path.open("wb") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_environment(worker, mark),
            start_new_session=True,
        )


def _end(process: subprocess.Popen[bytes], mark: str) -> None:
    """Kill the worker (when still running) and every process it started."""
    end_worker(process.pid, mark)
    process.wait()


class _Watch:
    """Watches one worker: yields each job's outcome as its result file says it is done, and
    stops at the worker's end, a timeout, the memory limit or ``stop`` (``failure`` then says
    why, ``stopped`` whether ``stop`` ended it)."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        mark: str,
        timeout: float,
        memory_limit: int | None,
        stop: threading.Event | None,
    ) -> None:
        self.process, self.mark, self.timeout = process, mark, timeout
        self.memory_limit, self.stop = memory_limit, stop
        self.clock = self.weighed = time.monotonic()
        self.failure: str | None = None
        self.stopped = False

    def outcomes(self, jobs: Sequence[BatchJob], done: int) -> Iterator[JobOutcome]:
        while True:
            returncode = self.process.poll()
            while done < len(jobs) and _is_done(jobs[done].result_path):
                now = time.monotonic()
                result = _read_result(jobs[done].result_path)
                yield JobOutcome(result, None, now - self.clock)
                done, self.clock = done + 1, now
            if returncode is not None or done == len(jobs):
                return
            if self.stop is not None and self.stop.is_set():
                self.stopped = True
                return
            self.failure = self._failure(time.monotonic())
            if self.failure is not None:
                return
            time.sleep(_POLL_SECONDS)

    def _failure(self, now: float) -> str | None:
        """Why the worker must stop now: its job timed out or it holds too much memory."""
        if now - self.clock > self.timeout:
            return f"timed out after {self.timeout:g} s"
        if self.memory_limit and now - self.weighed > _MEMORY_POLL_SECONDS:
            self.weighed = now
            resident = resident_bytes(self.process.pid, self.mark)
            if resident > self.memory_limit:
                return (
                    f"exceeded the memory limit of {self.memory_limit / _GIB:.2f} GiB "
                    f"({resident / _GIB:.2f} GiB resident)"
                )
        return None
