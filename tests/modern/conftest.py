"""Tests of code our users run today; they need transformers 5.x, timm and diffusers and run
only in the modern environment (tests/environments.py), never beside transformers 4.34."""

from __future__ import annotations

import os
from importlib import metadata

# One torch thread per process, as in the main suite (tests/conftest.py says why); set here too
# for a run of tests/modern on its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _modern() -> bool:
    try:
        return metadata.version("transformers").startswith("5.")
    except metadata.PackageNotFoundError:
        return False


# In the main environment these files are not even imported; tests/test_modern_environment.py
# runs them in their own environment.
collect_ignore_glob = [] if _modern() else ["test_*.py"]


if _modern():
    import pytest

    @pytest.fixture(scope="session")
    def runtime_cache(tmp_path_factory: pytest.TempPathFactory):
        """One runtime cache for every test here that patches installed packages (the examples
        under ``adopter run``, ``adopter.patch`` of built models), as one user's machine has,
        never the user's own: the first test to patch a module rewrites it (seconds for a
        large one), the others read it."""
        return tmp_path_factory.mktemp("runtime-cache")
