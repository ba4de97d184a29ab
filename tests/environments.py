"""The second test environment: code our users run in 2026 (transformers 5.x, timm, diffusers).

transformers 4.34 (the paper benchmark, in the main test environment) and 5.x cannot share one
environment, so the tests under ``tests/modern/`` run in a virtual environment of their own
(built by ``tests/modern_env.py``, which says how and why). The main suite runs them there in a
subprocess (``tests/test_modern_environment.py``), so the README's single test command covers
both environments.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from tests.modern_env import MODERN_REQUIREMENTS, ROOT, SKIP_VARIABLE, BuildFailed, ensure

__all__ = ["MODERN_REQUIREMENTS", "MODERN_RUN", "MODERN_TEST_ID", "ROOT", "ModernRun"]


def modern_python() -> Path:
    """The interpreter of the modern environment, once built (or rebuilt) when needed; a build
    the README's command started in the background is waited for."""
    if os.environ.get(SKIP_VARIABLE) == "1":
        pytest.skip(f"{SKIP_VARIABLE}=1: modern-environment tests not run")
    try:
        return ensure()
    except BuildFailed as failed:
        pytest.fail(str(failed))


MODERN_TEST_ID = "tests/test_modern_environment.py::test_modern_suite_passes_in_its_own_environment"


class ModernRun:
    """``tests/modern`` run in the modern environment, in a background thread.

    Building the environment is mostly download and unpacking, and the modern tests run in a
    process of their own: neither needs the main suite to wait. ``tests/conftest.py`` starts
    the run as soon as collection shows the modern test will run, so the two overlap;
    the test itself only waits for the outcome. A skip or failure while building is kept and
    raised in the test, where pytest reports it.

    Under pytest-xdist every worker collects, and so starts, the run (:meth:`share`): the one
    that takes the lock in the shared folder runs it and writes the outcome there; the test,
    on whichever worker it lands, waits for that file.
    """

    OUTCOME = "outcome.json"

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._done: subprocess.CompletedProcess[str] | None = None
        self._raised: BaseException | None = None
        self._shared: Path | None = None
        self._lock: IO[str] | None = None
        self._runs_here = True

    def share(self, folder: Path) -> None:
        """Coordinate with the other test workers through ``folder`` (one per test run)."""
        self._shared = folder

    def start(self) -> None:
        if self._thread is not None or not self._runs_here:
            return
        if self._shared is not None:
            self._shared.mkdir(parents=True, exist_ok=True)
            lock = open(self._shared / "lock", "w")  # held while this worker lives
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                self._runs_here = False  # another worker runs it
                return
            self._lock = lock
        self._thread = threading.Thread(target=self._run, name="modern-suite", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            python = modern_python()
            environment = {**os.environ, "PYTHONPATH": str(ROOT)}
            command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/modern"]
            self._done = subprocess.run(
                command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=900
            )
        except BaseException as raised:  # pytest's skip and fail outcomes are BaseExceptions
            self._raised = raised
        finally:
            if self._shared is not None:
                self._write_outcome(self._shared)

    def _write_outcome(self, folder: Path) -> None:
        raised, done = self._raised, self._done
        if isinstance(raised, pytest.skip.Exception):
            data: dict[str, object] = {"skip": str(raised.msg)}
        elif raised is not None or done is None:
            data = {"fail": f"the modern run raised {raised!r}"}
        else:
            data = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
        partial = folder / (self.OUTCOME + ".partial")
        partial.write_text(json.dumps(data))
        partial.replace(folder / self.OUTCOME)

    def _outcome_of_another_worker(self, folder: Path) -> subprocess.CompletedProcess[str]:
        path = folder / self.OUTCOME
        deadline = time.monotonic() + 1800  # building the environment, then the 900 s run
        while not path.exists():
            if time.monotonic() > deadline:
                pytest.fail(f"no outcome of the modern run in {path} after 30 minutes")
            time.sleep(1)
        data = json.loads(path.read_text())
        if "skip" in data:
            pytest.skip(data["skip"])
        if "fail" in data:
            pytest.fail(data["fail"])
        return subprocess.CompletedProcess([], data["returncode"], data["stdout"], data["stderr"])

    def outcome(self) -> subprocess.CompletedProcess[str]:
        """The finished run (started now if nobody started it); re-raises what the build raised."""
        self.start()
        if not self._runs_here:
            assert self._shared is not None
            return self._outcome_of_another_worker(self._shared)
        assert self._thread is not None
        self._thread.join()
        if self._raised is not None:
            raise self._raised
        assert self._done is not None
        return self._done


MODERN_RUN = ModernRun()
