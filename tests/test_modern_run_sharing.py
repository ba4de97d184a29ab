"""Under pytest-xdist every worker starts the modern run; one runs it, the others read its
outcome (tests/environments.py)."""

from __future__ import annotations

import subprocess

import pytest

from tests.environments import ModernRun


def _fake_run(outcome):
    def run(self: ModernRun) -> None:
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            self._done = outcome
        except BaseException as raised:
            self._raised = raised
        finally:
            if self._shared is not None:
                self._write_outcome(self._shared)

    return run


def test_one_worker_runs_it_and_another_reads_the_outcome(tmp_path, monkeypatch):
    done = subprocess.CompletedProcess([], 1, "2 failed", "")
    monkeypatch.setattr(ModernRun, "_run", _fake_run(done))
    first, second = ModernRun(), ModernRun()
    first.share(tmp_path)
    second.share(tmp_path)
    first.start()
    second.start()  # the lock is taken: this worker only waits
    assert first._runs_here and not second._runs_here
    assert first.outcome() is done
    read = second.outcome()
    assert (read.returncode, read.stdout) == (1, "2 failed")


def test_a_skip_while_building_reaches_the_other_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(ModernRun, "_run", _fake_run(pytest.skip.Exception("no PyPI")))
    first, second = ModernRun(), ModernRun()
    first.share(tmp_path)
    second.share(tmp_path)
    first.start()
    second.start()
    with pytest.raises(pytest.skip.Exception, match="no PyPI"):
        second.outcome()
