"""What the runtime says, through the ``adopter`` logger, once per process per message.

A module is patched once, but an import hook sees hundreds of modules and a training script
may call ``patch`` again: each module's outcome (patched with which sites, left alone and why)
is logged the first time only. Modules with nothing to patch are logged at DEBUG.
"""

from __future__ import annotations

import logging
import sys
import threading

LOGGER = logging.getLogger("adopter")
_SEEN: set[tuple[str, str]] = set()
_LOCK = threading.Lock()


def once(level: int, key: str, message: str) -> None:
    with _LOCK:
        if (key, message) in _SEEN:
            return
        _SEEN.add((key, message))
    LOGGER.log(level, message)


def once_per_key(level: int, key: str, message: str) -> None:
    """Log ``message`` only the first time ``key`` is seen in this process."""
    with _LOCK:
        if (key, "") in _SEEN:
            return
        _SEEN.add((key, ""))
    LOGGER.log(level, message)


def show_on_stderr(level: int | str = logging.INFO) -> None:
    """Print the ``adopter`` logger's messages on stderr (``adopter run``, ``ADOPTER_LOG``)."""
    if any(getattr(h, "_adopter_runtime", False) for h in LOGGER.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("adopter: %(message)s"))
    handler._adopter_runtime = True  # type: ignore[attr-defined]
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level)
    LOGGER.propagate = False  # printed here once, not again by the program's root handlers
