"""What the runtime says, through the ``adopter`` logger, once per process per message.

A module is patched once, but an import hook sees hundreds of modules and a training script
may call ``patch`` again: each module's outcome (patched with which sites, left alone and why)
is logged the first time only. Modules with nothing to patch are logged at DEBUG.

On stderr at INFO (``adopter run``, ``ADOPTER_LOG=INFO``) the per-module lines are folded into
one summary line per package each time an import of it finishes (:func:`summarise`): a timm or
diffusers script imports dozens of modules it never uses, and a line for each buries what
matters. At DEBUG (``adopter run -v``) every line is printed as it happens.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from collections import Counter, defaultdict

LOGGER = logging.getLogger("adopter")
_SEEN: set[tuple[str, str]] = set()
_LOCK = threading.Lock()


# The ``extra`` field naming a per-module outcome line: "patched" (with ``adopter_sites``),
# "unpatched" (the module was left alone) or "partial" (some of its sites were not patched).
OUTCOME = "adopter_outcome"


def once(level: int, key: str, message: str, *, outcome: str = "", sites: int = 0) -> None:
    with _LOCK:
        if (key, message) in _SEEN:
            return
        _SEEN.add((key, message))
    extra = {OUTCOME: outcome, "adopter_module": key, "adopter_sites": sites} if outcome else None
    LOGGER.log(level, message, extra=extra)


class _Summary(logging.Filter):
    """Holds back per-module outcome lines on a handler above DEBUG and counts them per
    package, for :func:`summarise` to print as one line."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: defaultdict[str, Counter[str]] = defaultdict(Counter)

    def filter(self, record: logging.LogRecord) -> bool:
        outcome = getattr(record, OUTCOME, "")
        if not outcome:
            return True
        package = str(getattr(record, "adopter_module", "")).partition(".")[0]
        with _LOCK:
            self.counts[package][outcome] += 1
            self.counts[package]["sites"] += int(getattr(record, "adopter_sites", 0))
        # At DEBUG (``-v``) the line is printed too; counted either way, so that the summary
        # line after it does not say "patched 0 site(s)" of a package whose lines it followed.
        return LOGGER.getEffectiveLevel() <= logging.DEBUG

    def rewritten(self, module: str, milliseconds: int) -> None:
        """Count a module rewritten now (not read from the cache) and the time it took."""
        package = module.partition(".")[0]
        with _LOCK:
            self.counts[package]["rewritten"] += 1
            self.counts[package]["rewrite_ms"] += milliseconds

    def take(self, everything: bool = False) -> dict[str, Counter[str]]:
        """The counts of the packages with a module patched or left alone since the last
        call (of every package with ``everything``); a package that only had modules
        rewritten with nothing to patch keeps its counts for its next line."""
        with _LOCK:
            taken = {
                package: counts
                for package, counts in self.counts.items()
                if everything or counts["patched"] or counts["unpatched"] or counts["partial"]
            }
            for package in taken:
                del self.counts[package]
        return taken


_SUMMARY = _Summary()


def summary_line(package: str, counts: Counter[str]) -> str:
    parts = [f"{package}: patched {counts['sites']} site(s) in {counts['patched']} module(s)"]
    if counts["unpatched"]:
        parts.append(f"{counts['unpatched']} module(s) left unpatched")
    if counts["partial"]:
        parts.append(f"{counts['partial']} module(s) with sites not patched")
    if counts["rewritten"]:
        seconds = counts["rewrite_ms"] / 1000
        parts.append(
            f"rewrote {counts['rewritten']} module(s) in {seconds:.1f} s (cached for later runs)"
        )
    held_back = counts["unpatched"] or counts["partial"]
    # Under -v (DEBUG) the lines saying which and why were just printed.
    pointer = held_back and LOGGER.getEffectiveLevel() > logging.DEBUG
    return ", ".join(parts) + (" (adopter run -v says which and why)" if pointer else "")


def rewriting(module: str) -> None:
    """Say, once per package, that its modules are being rewritten now: a first run (or one
    after an upgrade or a rule change) spends seconds per module before the program goes on,
    and without a line it looks hung."""
    package = module.partition(".")[0]
    once_per_key(
        logging.INFO,
        f"rewriting:{package}",
        f"{package}: rewriting its imported modules (first run with these rules and this "
        "version; later runs read the cache) ...",
    )


PROGRESS_EVERY_S = 10.0
_PROGRESS: dict[str, tuple[float, int]] = {}  # package: (last line's time, modules rewritten)


def rewritten(module: str, seconds: float) -> None:
    """Count a module rewritten now for the package's summary line, and say how far the
    rewriting has gone every :data:`PROGRESS_EVERY_S` seconds while it lasts."""
    _SUMMARY.rewritten(module, round(seconds * 1000))
    package = module.partition(".")[0]
    now = time.monotonic()
    with _LOCK:
        last, count = _PROGRESS.get(package, (now, 0))
        count += 1
        due = now - last >= PROGRESS_EVERY_S
        _PROGRESS[package] = (now if due else last, count)
    if due:
        LOGGER.info(f"{package}: {count} module(s) rewritten so far ...")


def summarise(everything: bool = False) -> None:
    """Print the summary line of each package whose modules were patched or left alone since
    the last call (the import hook calls it when an outermost import finishes). Imports that
    only rewrote modules with nothing to patch print nothing then (a script's first imports of
    transformers would each print "patched 0 site(s)"); their counts go into the package's next
    line, or into the last one, at exit (``everything``)."""
    for package, counts in sorted(_SUMMARY.take(everything).items()):
        LOGGER.info(summary_line(package, counts))


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
    handler.addFilter(_SUMMARY)
    handler._adopter_runtime = True  # type: ignore[attr-defined]
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level)
    LOGGER.propagate = False  # printed here once, not again by the program's root handlers
    # What the last imports rewrote without patching anything is said once, at exit (this
    # runs before logging's own shutdown, which was registered first).
    atexit.register(summarise, everything=True)
