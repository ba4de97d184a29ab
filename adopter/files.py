"""Reading the files a user names (sources and rule files): regular files only, up to a size limit.

A FIFO, a terminal or a device such as ``/dev/zero`` would block a read forever or never end, and
a source file of tens of megabytes costs minutes and gigabytes of analysis for no model code
anyone writes by hand. Both are refused with a message that says why and how to lift the limit.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from pathlib import Path

MAX_FILE_ENV = "ADOPTER_MAX_FILE_MB"
DEFAULT_MAX_FILE_MB = 4
"""About three times the largest ``.py`` file we found in a model zoo's dependency tree (torch's
``common_methods_invocations.py``, 1.4 MB); real modeling files stay under 0.5 MB. A 4 MB model
file costs a scan about 10 s of CPU and 0.6 GB (8 MB: 19 s, 1.1 GB; 50 MB: minutes, 6.5 GB)."""
_MB = 1024 * 1024


class FileRefused(Exception):
    """A path that names something other than a readable regular file of acceptable size."""


def max_file_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The size limit in bytes: ``$ADOPTER_MAX_FILE_MB`` megabytes, else the default."""
    raw = (os.environ if environ is None else environ).get(MAX_FILE_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_FILE_MB * _MB
    try:
        megabytes = float(raw)
    except ValueError:
        megabytes = -1.0
    if not megabytes > 0 or megabytes == float("inf"):
        raise FileRefused(f"{MAX_FILE_ENV}={raw!r} is not a positive number of megabytes")
    return int(megabytes * _MB)


def _describe_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a special file"


def _megabytes(size: int) -> str:
    return f"{size / _MB:.1f} MB"


def _limit_text(limit: int) -> str:
    value = limit / _MB
    return f"{value:g} MB"


def read_regular_file(path: str | Path, limit: int | None = None) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (default :func:`max_file_bytes`).

    Raises :class:`FileRefused` for anything else (FIFO, device, socket, too large), and
    ``OSError`` (``FileNotFoundError``, ``IsADirectoryError``, ...) when the file cannot be opened.
    The kind and size are checked on the opened descriptor, so a path swapped between the
    check and the read changes nothing; ``O_NONBLOCK`` keeps the open of a FIFO from waiting
    for a writer.
    """
    if limit is None:
        limit = max_file_bytes()
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    descriptor = os.open(path, flags)
    try:
        info = os.fstat(descriptor)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(f"not a regular file ({_describe_kind(info.st_mode)}); not read")
        if info.st_size > limit:
            raise _too_large(info.st_size, limit)
        chunks = []
        remaining = limit + 1  # the file may have grown since fstat
        while remaining > 0:
            chunk = os.read(descriptor, min(remaining, _MB))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise _too_large(len(data), limit)
        return data
    finally:
        os.close(descriptor)


def _too_large(size: int, limit: int) -> FileRefused:
    return FileRefused(
        f"file is {_megabytes(size)}, over the {_limit_text(limit)} limit for one file "
        f"(set {MAX_FILE_ENV} to raise it)"
    )


def read_text_file(path: str | Path, limit: int | None = None) -> str:
    """:func:`read_regular_file` decoded as UTF-8 (``UnicodeDecodeError`` passes through)."""
    return read_regular_file(path, limit).decode("utf-8")
