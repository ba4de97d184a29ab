"""Runs ``tests/modern/`` in the modern environment (see tests/environments.py)."""

from __future__ import annotations

import os
import subprocess

from tests.environments import ROOT, modern_python


def test_modern_suite_passes_in_its_own_environment():
    python = modern_python()
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/modern"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
