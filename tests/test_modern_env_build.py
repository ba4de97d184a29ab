"""The modern environment's build (tests/modern_env.py): one build at a time, and a test run
waits for the one the README's command started in the background instead of starting its own.
These tests use a stand-in environment folder; nothing is installed."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests import modern_env


def _hold_lock_then_finish(environment, seconds: float) -> subprocess.Popen[bytes]:
    """A process standing in for a background build: takes the lock, waits, then leaves the
    environment current (its interpreter and stamp in place) and ends."""
    script = textwrap.dedent(
        f"""
        import fcntl, os, sys, time
        from pathlib import Path
        sys.path.insert(0, {str(modern_env.ROOT)!r})
        from tests import modern_env
        environment = Path({str(environment)!r})
        lock = modern_env._open_lock(environment)
        fcntl.flock(lock, fcntl.LOCK_EX)
        print("locked", flush=True)
        time.sleep({seconds})
        (environment / "bin").mkdir(parents=True)
        (environment / "bin" / "python").write_text("")
        modern_env._stamp_path(environment).write_text(modern_env._stamp())
        """
    )
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
    return holder


def test_a_test_run_waits_for_the_build_under_way_and_does_not_build_again(tmp_path, monkeypatch):
    environment = tmp_path / "venv-modern"
    monkeypatch.setattr(modern_env, "_build", lambda _: pytest.fail("built a second time"))
    holder = _hold_lock_then_finish(environment, 1.0)
    started = time.monotonic()
    python = modern_env.ensure(environment)
    assert time.monotonic() - started >= 0.5  # it waited for the holder
    assert python == environment / "bin" / "python"
    assert holder.wait(timeout=30) == 0


def test_a_stale_environment_is_built_by_whoever_takes_the_lock(tmp_path, monkeypatch):
    environment = tmp_path / "venv-modern"
    built = []
    monkeypatch.setattr(modern_env, "_build", built.append)
    modern_env.ensure(environment)
    assert built == [environment]


def test_starting_a_background_build_says_when_there_is_nothing_to_start(tmp_path, monkeypatch):
    environment = tmp_path / "venv-modern"
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("started a build"))
    monkeypatch.setenv(modern_env.SKIP_VARIABLE, "1")
    assert "not built" in modern_env.start_in_background(environment)
    monkeypatch.delenv(modern_env.SKIP_VARIABLE)
    (environment / "bin").mkdir(parents=True)
    (environment / "bin" / "python").write_text("")
    modern_env._stamp_path(environment).write_text(modern_env._stamp())
    assert "up to date" in modern_env.start_in_background(environment)
    modern_env._stamp_path(environment).write_text("requirements of an older commit")
    lock = modern_env._open_lock(environment)
    fcntl.flock(lock, fcntl.LOCK_EX)  # another build under way
    try:
        assert "being built by another process" in modern_env.start_in_background(environment)
    finally:
        os.close(lock)
