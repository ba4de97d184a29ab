"""The contained batch runner on its own: one worker for a batch, a fresh one after a crash, a
timeout or the memory limit, each job's outcome in order, and nothing the worker started left
running. The worker here is a few lines of Python that follow the batch protocol."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from adopter.executor import BatchJob, ContainedWorker, run_contained
from tests.helpers import process_alive

# Each job says what to do: finish with its value, crash, hang, hold memory, or start a process
# that leaves the worker's session and then hang.
WORKER = """
import os, subprocess, sys, time
from pathlib import Path
from adopter.executor.contained import ResultFile, read_batch

for job in read_batch(sys.argv[1]):
    result = ResultFile(Path(job["result"]), {"pid": os.getpid(), "env": os.environ.get("PROBE")})
    if job["do"] == "crash":
        print("boom", flush=True)
        sys.exit(3)
    if job["do"] == "hold":
        held = bytearray(256 * 1024**2)
        held[:: 4096] = b"x" * len(held[:: 4096])
    if job["do"] == "escape":
        child = "import os, time; os.setsid(); time.sleep(120)"
        result.data["child"] = subprocess.Popen([sys.executable, "-c", child]).pid
        result.flush()
    if job["do"] != "finish":
        time.sleep(120)
    result.finish()
"""


def _jobs(tmp_path: Path, *steps: str) -> list[BatchJob]:
    paths = [tmp_path / f"result-{n}.json" for n in range(len(steps))]
    return [BatchJob({"do": s, "result": str(p)}, p) for s, p in zip(steps, paths)]


def _worker(timeout: float = 30.0, memory_limit: int | None = None) -> ContainedWorker:
    return ContainedWorker((sys.executable, "-c", WORKER), timeout, memory_limit, {"PROBE": "on"})


def test_one_worker_runs_the_whole_batch_in_order(tmp_path: Path) -> None:
    outcomes = list(run_contained(_jobs(tmp_path, "finish", "finish"), _worker(), tmp_path))
    assert [o.failure for o in outcomes] == [None, None]
    assert all(o.result and o.result["done"] and o.result["env"] == "on" for o in outcomes)
    assert outcomes[0].result["pid"] == outcomes[1].result["pid"]  # type: ignore[index]


def test_a_crash_takes_only_its_job_and_a_fresh_worker_goes_on(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path, "finish", "crash", "finish")
    first, crashed, last = run_contained(jobs, _worker(), tmp_path)
    assert crashed.failure == "the worker exited with code 3: boom"
    assert crashed.result is not None and not crashed.result["done"]  # what it wrote is kept
    assert last.failure is None and last.result is not None
    assert first.result is not None and last.result["pid"] != first.result["pid"]


def test_a_job_past_its_timeout_is_ended_and_the_next_runs(tmp_path: Path) -> None:
    hung, after = run_contained(_jobs(tmp_path, "hang", "finish"), _worker(timeout=1), tmp_path)
    assert hung.failure == "timed out after 1 s" and hung.seconds >= 1
    assert after.failure is None


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_worker_over_its_memory_limit_is_ended(tmp_path: Path) -> None:
    (held,) = run_contained(_jobs(tmp_path, "hold"), _worker(memory_limit=64 * 1024**2), tmp_path)
    assert held.failure is not None
    assert held.failure.startswith("exceeded the memory limit of 0.06 GiB")


@pytest.mark.slow  # waits out a 3 s timeout
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_process_that_left_the_session_ends_with_its_worker(tmp_path: Path) -> None:
    (escaped,) = run_contained(_jobs(tmp_path, "escape"), _worker(timeout=3), tmp_path)
    assert escaped.failure == "timed out after 3 s"
    assert escaped.result is not None
    child = escaped.result["child"]
    deadline = time.monotonic() + 5
    while process_alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_alive(child)


def test_stop_ends_the_worker_and_the_batch(tmp_path: Path) -> None:
    stop = threading.Event()
    outcomes = run_contained(_jobs(tmp_path, "finish", "hang", "finish"), _worker(), tmp_path, stop)
    first = next(outcomes)
    assert first.failure is None and first.result is not None
    stop.set()
    started = time.monotonic()
    assert list(outcomes) == []
    assert time.monotonic() - started < 5
    assert not process_alive(first.result["pid"])
