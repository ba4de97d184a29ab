"""Runs ``tests/modern/`` in the modern environment (see tests/environments.py)."""

from __future__ import annotations

import pytest

from tests.environments import MODERN_RUN

pytestmark = pytest.mark.slow  # see pyproject.toml's markers


def test_modern_suite_passes_in_its_own_environment():
    # Started in the background at collection (tests/conftest.py); this waits for its outcome.
    done = MODERN_RUN.outcome()
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
