"""Session-wide hooks of the test suite."""

from __future__ import annotations

import pytest

from tests.environments import MODERN_RUN, MODERN_TEST_ID


def pytest_collection_finish(session: pytest.Session) -> None:
    # The modern-environment run takes minutes of mostly waiting (a download, a subprocess):
    # begin it now, beside the main suite, rather than when its test's turn comes.
    if any(item.nodeid == MODERN_TEST_ID for item in session.items):
        MODERN_RUN.start()
