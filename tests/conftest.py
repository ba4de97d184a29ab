"""Session-wide hooks of the test suite."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# The kernels read this machine's measured backend table (written by `adopter bench
# --backends`) and the ADOPTER_BACKENDS preferences when they are imported: the suite must not
# depend on what a developer measured or set, so it runs every kernel on its safe defaults
# (tests that need a table write their own). Set before anything imports adopter.kernels; the
# verify workers the tests start inherit it.
os.environ["ADOPTER_BACKENDS_TABLE"] = str(Path(tempfile.gettempdir()) / "adopter-no-table.json")
os.environ.pop("ADOPTER_BACKENDS", None)

# One thread per torch process. The suite runs two test workers, the modern environment's
# run and their subprocesses at once on a machine of a few cores, on models of a few thousand
# parameters: a second OpenMP thread per process finds no work worth splitting and spins while
# it waits, which on two cores cost a fifth of the suite's CPU time. Set before anything imports
# torch; the subprocesses the tests start (the modern run, verify workers) inherit it. No test
# asserts a thread count or a timing.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Byte-code written, whatever the shell says. The README's install passes --no-compile, so a
# fresh environment holds no .pyc files, and a machine whose environment sets
# PYTHONDONTWRITEBYTECODE=1 (this workplace's do) then compiled torch and transformers from
# source in every process that imported them: 9.7 s instead of 3.3 s for `import torch,
# transformers.modeling_utils` here, in each of the suite's hundreds of verify workers, example
# runs and CLI subprocesses. Writing it lets the first process that imports a module compile it
# once for all the others (the subprocesses inherit the environment).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from tests.environments import MODERN_RUN, MODERN_TEST_ID

sys.dont_write_bytecode = False  # this process too (Python read the variable at its start)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist's --dist loadfile hands files out by their number of tests, most first: the
    # Ray cluster's file (7 tests, minutes) and the example runs (1 test each) came last, and
    # one worker ran them while the other had nothing left. Hand them out in the order below.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Files holding a test marked slow first (in pytest-randomly's shuffled order, done before
    # this hook), the quick ones after: the longest work starts first and the short files fill
    # the end, so the two workers finish together.
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the shuffle stays
    # The modern test only waits for the background run (below). Wherever the order puts it,
    # the main suite would stop there until the modern run ends, leaving a core idle: run it
    # last, when the main suite's work is done.
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
        # The modern run is one process, the suite's longest chain: with three busy processes
        # on two cores it got two thirds of a core and ended last, one core idle for its final
        # 50-100 s. Lower this thread's priority (Linux keeps a nice value per thread; the
        # modern run's thread, started above, and the process it starts keep theirs) so that it
        # runs on a core of its own and the two workers share what is left: the same work
        # ends sooner. The tests and everything they start inherit the lower priority.
        os.nice(5)
