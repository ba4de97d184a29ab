"""Session-wide hooks of the test suite."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.environments import MODERN_RUN, MODERN_TEST_ID


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The modern test only waits for the background run (below). Wherever pytest-randomly's
    # shuffle (done before this hook) puts it, the main suite would stop there until the modern
    # run ends, leaving a core idle: run it last, when the main suite's work is done.
    waiting = [item for item in items if item.nodeid == MODERN_TEST_ID]
    items[:] = [item for item in items if item.nodeid != MODERN_TEST_ID] + waiting


def pytest_collection_finish(session: pytest.Session) -> None:
    # The modern-environment run takes minutes of mostly waiting (a download, a subprocess):
    # begin it now, beside the main suite, rather than when its test's turn comes.
    if any(item.nodeid == MODERN_TEST_ID for item in session.items):
        worker = getattr(session.config, "workerinput", None)  # set under pytest-xdist
        if worker is not None:
            run_id = worker["testrunuid"]
            MODERN_RUN.share(Path(tempfile.gettempdir()) / f"adopter-modern-run-{run_id}")
        MODERN_RUN.start()
