"""The second test environment: code our users run in 2026 (transformers 5.x, timm, diffusers).

transformers 4.34 (the paper benchmark, in the main test environment) and 5.x cannot share one
environment, so the tests under ``tests/modern/`` run in a virtual environment of their own,
built on first use in the git-ignored ``.cache/venv-modern`` and rebuilt when its requirements
change. The main suite runs them there in a subprocess (``tests/test_modern_environment.py``),
so the README's single test command covers both environments.

timm imports torchvision, and PyPI's torchvision wheels need the CUDA build of torch: the CPU
build of torch 2.13.0 on this machine's disk cannot load their operators. The environment
therefore takes PyPI's torch 2.13.0 (same release, CUDA build, runs on the CPU here); the
``!=2.13.0+cpu`` keeps pip from picking the local CPU file for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODERN_ENV = Path(os.environ.get("ADOPTER_MODERN_ENV", ROOT / ".cache" / "venv-modern"))
MODERN_REQUIREMENTS = (
    "torch==2.13.0,!=2.13.0+cpu",
    "torchvision==0.28.0",
    "transformers==5.24.0",
    "timm==1.0.31",
    "diffusers==0.42.1",
    "pytest>=8",
    "hypothesis>=6.100",
)
# Set to 1 to skip (not pass) the modern-environment tests, e.g. on a machine without PyPI.
SKIP_VARIABLE = "ADOPTER_SKIP_MODERN_ENV"


def _stamp() -> str:
    text = json.dumps([sys.version, list(MODERN_REQUIREMENTS)])
    return hashlib.sha256(text.encode()).hexdigest()


def modern_python() -> Path:
    """The interpreter of the modern environment, built (or rebuilt) when needed."""
    if os.environ.get(SKIP_VARIABLE) == "1":
        pytest.skip(f"{SKIP_VARIABLE}=1: modern-environment tests not run")
    python = MODERN_ENV / "bin" / "python"
    stamp = MODERN_ENV / ".adopter-requirements"
    if python.exists() and stamp.exists() and stamp.read_text() == _stamp():
        return python
    venv.EnvBuilder(with_pip=True, clear=True).create(MODERN_ENV)
    command = [str(python), "-m", "pip", "install", "-q", "-e", str(ROOT), *MODERN_REQUIREMENTS]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"could not build {MODERN_ENV}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    stamp.write_text(_stamp())
    return python
