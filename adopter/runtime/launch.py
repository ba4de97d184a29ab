"""``adopter run -- COMMAND``: run a command with every Python in it patched on import.

The command gets an environment in which Python imports
``adopter/runtime/bootstrap/sitecustomize.py`` at start-up (its folder first on
``PYTHONPATH``), which installs the import hook with the settings passed as ``ADOPTER_*``
variables. That reaches the processes the command starts too (``torchrun`` workers, data
loader workers that re-import), keeps ``sys.argv`` exactly as the script expects it, and, since
the command replaces this process, its exit code and signals are the command's own.

The interpreter running Adopter has its ``bin`` folder put first on ``PATH``, as activating its
virtual environment would, so ``adopter run -- python train.py`` runs the Python that has
Adopter (and the model libraries) installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

BOOTSTRAP = Path(__file__).with_name("bootstrap")


def run_environment(
    base: Mapping[str, str],
    *,
    rules: Sequence[str],
    select: str | None,
    packages: Sequence[str],
    exclude: str | None = None,
    verify: bool,
    log_level: str | None,
) -> dict[str, str]:
    """The environment of the command: ``base`` plus the bootstrap and the settings."""
    env = dict(base)
    paths = [str(BOOTSTRAP)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    bin_dir = str(Path(sys.executable).parent)
    search = [p for p in env.get("PATH", "").split(os.pathsep) if p]
    env["PATH"] = os.pathsep.join([bin_dir, *search])
    env["ADOPTER_RULES"] = ",".join(rules)
    env["ADOPTER_PACKAGES"] = ",".join(packages)
    env["ADOPTER_VERIFY"] = "1" if verify else "0"
    if select:
        env["ADOPTER_SELECT"] = select
    else:
        env.pop("ADOPTER_SELECT", None)
    if exclude:
        env["ADOPTER_EXCLUDE"] = exclude
    else:
        env.pop("ADOPTER_EXCLUDE", None)
    if log_level:
        env["ADOPTER_LOG"] = log_level
    else:
        env.pop("ADOPTER_LOG", None)
    env.pop("ADOPTER_RUNTIME_DISABLED", None)
    return env


def run_command(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Replace this process by ``command`` (POSIX); elsewhere run it and return its exit code.
    Returns 127 when the command does not exist."""
    executable = shutil.which(command[0], path=env.get("PATH"))
    if executable is None:
        print(f"adopter run: command not found: {command[0]}", file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "posix":
        os.execve(executable, list(command), dict(env))
    return subprocess.call([executable, *command[1:]], env=dict(env))
