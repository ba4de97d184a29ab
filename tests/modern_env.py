"""Builds the modern test environment (transformers 5.x, timm, diffusers); standard library only.

transformers 4.34 (the paper benchmark, in the main test environment) and 5.x cannot share one
environment, so the tests under ``tests/modern/`` run in a virtual environment of their own,
built in the git-ignored ``.cache/venv-modern`` and rebuilt when its requirements change
(``tests/environments.py`` runs them there).

Building it is mostly downloading and unpacking on one core, and so is installing the main
environment. The README's test command therefore starts this build first, in the background::

    python3 tests/modern_env.py --background && python3 -m venv .venv && ...

so the two installs share the machine's cores; the test run then waits for the build, or builds
the environment itself when nobody started one. A lock file beside the environment keeps two
builds from running at once: whoever holds it builds, everyone else waits for it.

timm imports torchvision, and PyPI's torchvision wheels need the CUDA build of torch: the CPU
build of torch 2.13.0 on this machine's disk cannot load their operators. The environment
therefore takes PyPI's torch 2.13.0 (same release, CUDA build, runs on the CPU here); the
``!=2.13.0+cpu`` keeps pip from picking the local CPU file for it.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODERN_ENV = Path(os.environ.get("ADOPTER_MODERN_ENV", ROOT / ".cache" / "venv-modern"))
# The package's `libraries` extra (what the README tells users to install) and the test tools.
MODERN_REQUIREMENTS = (
    *tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "libraries"
    ],
    "pytest>=8",
    "hypothesis>=6.100",
)
# Set to 1 to skip (not pass) the modern-environment tests, e.g. on a machine without PyPI.
SKIP_VARIABLE = "ADOPTER_SKIP_MODERN_ENV"


class BuildFailed(Exception):
    """pip could not install the environment; the message holds the end of its output."""


def _stamp() -> str:
    text = json.dumps([sys.version, list(MODERN_REQUIREMENTS)])
    return hashlib.sha256(text.encode()).hexdigest()


def _python(environment: Path) -> Path:
    return environment / "bin" / "python"


def _stamp_path(environment: Path) -> Path:
    return environment / ".adopter-requirements"


def _lock_path(environment: Path) -> Path:
    return environment.with_name(environment.name + ".lock")


def is_current(environment: Path = MODERN_ENV) -> bool:
    """Built, and for these requirements and this Python."""
    stamp = _stamp_path(environment)
    return _python(environment).exists() and stamp.exists() and stamp.read_text() == _stamp()


def _build(environment: Path) -> None:
    venv.EnvBuilder(with_pip=True, clear=True).create(environment)
    # --no-compile: byte-compiling every file of torch, transformers and diffusers at install
    # costs about 30 s of CPU; Python compiles the modules the tests import on first use.
    command = [str(_python(environment)), "-m", "pip", "install", "-q", "--no-compile"]
    command += ["-e", str(ROOT), *MODERN_REQUIREMENTS]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildFailed(
            f"could not build {environment}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    _stamp_path(environment).write_text(_stamp())


def _open_lock(environment: Path) -> int:
    environment.parent.mkdir(parents=True, exist_ok=True)
    return os.open(_lock_path(environment), os.O_RDWR | os.O_CREAT, 0o644)


def ensure(environment: Path = MODERN_ENV) -> Path:
    """The environment's interpreter: waits for a build under way (``--background``), or
    builds (or rebuilds) the environment here when it is missing or stale."""
    lock = _open_lock(environment)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits while another process builds
        if not is_current(environment):
            _build(environment)
    finally:
        os.close(lock)  # releases the lock
    return _python(environment)


def start_in_background(environment: Path = MODERN_ENV) -> str:
    """Start a build in a detached process and return at once (a sentence saying what
    happened). The lock is taken here, before returning, and handed to the builder, so a test
    run started right after waits for this build instead of starting its own."""
    if os.environ.get(SKIP_VARIABLE) == "1":
        return f"{SKIP_VARIABLE}=1: the modern environment is not built"
    if is_current(environment):
        return f"{environment} is up to date"
    lock = _open_lock(environment)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return f"{environment} is being built by another process"
        log = _lock_path(environment).with_suffix(".log")
        with log.open("wb") as output:
            subprocess.Popen(
                [sys.executable, __file__, "--holding-lock", str(lock), str(environment)],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                pass_fds=(lock,),
                start_new_session=True,  # not ended with the shell that started it
            )
    finally:
        os.close(lock)  # the builder holds its own copy of the locked file, and so the lock
    return f"building {environment} in the background (its output: {log})"


def _build_holding(lock: int, environment: Path) -> int:
    """The background builder: the lock is already held (inherited as ``lock``)."""
    try:
        if not is_current(environment):
            _build(environment)
    except BuildFailed as failed:
        # The test run finds the environment stale, builds it again and reports this error.
        print(failed, file=sys.stderr)
        return 1
    finally:
        os.close(lock)
    return 0


def main(arguments: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--background", action="store_true", help="build in a detached process")
    parser.add_argument("--holding-lock", nargs=2, metavar=("FD", "ENV"), help=argparse.SUPPRESS)
    options = parser.parse_args(arguments)
    if options.holding_lock:
        descriptor, environment = options.holding_lock
        return _build_holding(int(descriptor), Path(environment))
    if options.background:
        print(f"modern test environment: {start_in_background()}")
        return 0
    try:
        print(ensure())
    except BuildFailed as failed:
        print(failed, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
