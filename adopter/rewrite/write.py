"""Writing patched files without ever losing an edit or changing what a file is.

A file is written only when its content is still exactly the text that was analysed: it is read
again under an advisory lock (``flock`` on the file itself, which every ``adopter apply`` takes,
so two runs on one tree take turns) and once more just before the rename, which leaves an
editor that saves at that moment a window of microseconds instead of the whole run. Otherwise
it is skipped with the reason, and a rerun completes it.

The write is atomic (a temporary file in the same folder, flushed, then renamed over the file),
in the file's own encoding, BOM and line endings (:mod:`adopter.rewrite.encoding`), and keeps
what the file is: a symlink stays a link and its target is patched; owner, group and mode are
copied; a read-only file is refused unless ``force_read_only``; a file with several hard links
is refused, since a rename would give this name a new file and leave the other names unpatched,
unless ``in_place_hard_links``, which rewrites the shared file where it is (every name sees the
patch, but the write is no longer atomic).

Temporary files are locked while written; one left by a killed run (ours by name, owned by this
user, unlocked, older than :data:`STALE_AFTER_SECONDS`) is removed by the next run.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from ..extract.source import SourceError, decode_source_file
from .apply import FileRewrite
from .driver import ApplyResult
from .encoding import EncodingRefusal, encode_patched

TEMPORARY_SUFFIX = ".adopter"
# ``tempfile.mkstemp(prefix=".NAME.", suffix=".adopter")``: eight characters from [a-z0-9_].
_TEMPORARY_NAME = re.compile(r"\A\..+\.[a-z0-9_]{8}\.adopter\Z", re.S)
STALE_AFTER_SECONDS = 10.0  # a live write renames its temporary file within milliseconds
LOCK_TIMEOUT_SECONDS = 60.0


class WriteStatus(StrEnum):
    WRITTEN = "written"
    UNCHANGED = "unchanged"  # nothing to write
    SKIPPED = "skipped"  # not written on purpose; the reason says why and what to do
    FAILED = "failed"  # the system refused (disk full, permissions); the file is as it was


@dataclass(frozen=True)
class WriteResult:
    path: str
    status: WriteStatus
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.reason else f"{self.path}: {self.status}"


@dataclass(frozen=True)
class WriteOptions:
    force_read_only: bool = False
    in_place_hard_links: bool = False


def write_changed(
    result: ApplyResult, options: WriteOptions, say: Callable[[str], None]
) -> tuple[list[FileRewrite], int]:
    """``apply --write``: remove temporary files an interrupted run left next to the files, write
    every changed file, and ``say`` what was removed, not written or written with a remark.
    Returns the files written and how many were not."""
    for removed in remove_stale_temporaries(r.path for r in result.files):
        say(f"removed {removed}: a temporary file left by an interrupted apply")
    changed = result.changed
    outcomes = write_rewrites(changed, options)
    not_written = 0
    for outcome in outcomes:
        failed = outcome.status in (WriteStatus.SKIPPED, WriteStatus.FAILED)
        not_written += failed
        if failed or outcome.reason:
            prefix = "error: " if outcome.status is WriteStatus.FAILED else ""
            say(f"{prefix}{outcome}")
    written = {o.path for o in outcomes if o.status is WriteStatus.WRITTEN}
    return [r for r in changed if r.path in written], not_written


class _Changed(Exception):
    """The file on disk is no longer the text that was analysed."""


class _CannotKeep(Exception):
    """Something the file is (its owner) that this write could not keep."""


CHANGED = "not written: changed since it was read (run apply again)"


def write_rewrites(
    rewrites: Iterable[FileRewrite], options: WriteOptions = WriteOptions()
) -> list[WriteResult]:
    """Write each changed rewrite; a file reached under two names (a symlink and its target,
    two hard links written in place) is written once."""
    results: list[WriteResult] = []
    written: dict[object, str] = {}
    for rewrite in rewrites:
        keys: list[object] = [os.path.realpath(rewrite.path)]
        try:
            info = os.stat(rewrite.path)
            if info.st_nlink > 1:  # written in place, so the inode stays the file's identity
                keys.append((info.st_dev, info.st_ino))
        except OSError:
            pass
        first = next((written[key] for key in keys if key in written), None)
        if first is not None:
            results.append(
                WriteResult(
                    rewrite.path, WriteStatus.UNCHANGED, f"the same file as {first}, written once"
                )
            )
            continue
        result = write_rewrite(rewrite, options)
        if result.status is WriteStatus.WRITTEN:
            written.update(dict.fromkeys(keys, rewrite.path))
        results.append(result)
    return results


def write_rewrite(rewrite: FileRewrite, options: WriteOptions = WriteOptions()) -> WriteResult:
    """Write one patched file if, and only if, it is still the text that was analysed."""
    path = rewrite.path
    if not rewrite.changed or rewrite.error is not None:
        return WriteResult(path, WriteStatus.UNCHANGED)
    target = os.path.realpath(path)  # a symlink's target is patched, the link kept

    def skipped(reason: str) -> WriteResult:
        return WriteResult(path, WriteStatus.SKIPPED, reason)

    try:
        with _locked(target) as (handle, info):
            if not stat.S_ISREG(info.st_mode):
                return skipped("not written: not a regular file")
            data = _read_all(handle)
            try:
                source = decode_source_file(data, path)
            except SourceError as error:
                return skipped(f"not written: cannot read it back ({error.message})")
            if source.text != rewrite.original:
                return skipped(CHANGED)
            try:
                new = encode_patched(path, data, source, rewrite.patched)
            except EncodingRefusal as refusal:
                return skipped(f"not written: {refusal}")
            if _read_only(target, info) and not options.force_read_only:
                return skipped("not written: the file is read-only (--force-read-only writes it)")
            if info.st_nlink > 1:
                if not options.in_place_hard_links:
                    return skipped(
                        f"not written: the file has {info.st_nlink} hard links, and an atomic "
                        "write would leave the other names unpatched (--in-place-hard-links "
                        "writes through all of them, not atomically)"
                    )
                _write_in_place(target, new, data)
            else:
                _replace_atomically(target, new, info, expected=data)
    except _Changed:
        return skipped(CHANGED)
    except _CannotKeep as reason:
        return skipped(str(reason))
    except TimeoutError:
        return skipped(
            f"not written: another process held its lock for {LOCK_TIMEOUT_SECONDS:.0f} s"
        )
    except OSError as error:
        return WriteResult(
            path, WriteStatus.FAILED, f"cannot write: {error.strerror or error}; left as it was"
        )
    return WriteResult(path, WriteStatus.WRITTEN)


@contextmanager
def _locked(target: str) -> Iterator[tuple[int, os.stat_result]]:
    """The file open and ``flock``-ed, as it is now on disk: when another run replaced it while
    this one waited for the lock, the lock is taken again on the new file."""
    deadline = time.monotonic() + LOCK_TIMEOUT_SECONDS
    while True:
        handle = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError from None
                    time.sleep(0.01)
            info = os.fstat(handle)
            now = os.stat(target, follow_symlinks=False)
            if (info.st_dev, info.st_ino) == (now.st_dev, now.st_ino):
                yield handle, info
                return
        finally:
            os.close(handle)  # releases the lock


def _read_all(handle: int) -> bytes:
    chunks = []
    offset = 0
    while chunk := os.pread(handle, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _read_only(target: str, info: os.stat_result) -> bool:
    """No write permission for anyone, or none for this user (root ignores permission bits,
    so the bits are looked at too)."""
    return not info.st_mode & 0o222 or not os.access(target, os.W_OK)


def _replace_atomically(target: str, new: bytes, info: os.stat_result, expected: bytes) -> None:
    """Write ``new`` to a locked temporary file beside ``target``, give it ``info``'s owner,
    group and mode, and rename it over ``target`` if that still holds ``expected``."""
    folder, name = os.path.split(target)
    handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=TEMPORARY_SUFFIX, dir=folder)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)  # in use: a cleaning run leaves it alone
        view = memoryview(new)
        while view:
            view = view[os.write(handle, view) :]
        os.fsync(handle)
        created = os.fstat(handle)
        if (created.st_uid, created.st_gid) != (info.st_uid, info.st_gid):
            try:
                os.fchown(handle, info.st_uid, info.st_gid)
            except PermissionError:
                raise _CannotKeep(
                    f"not written: its owner and group ({info.st_uid}:{info.st_gid}) could not "
                    "be kept (run as its owner)"
                ) from None
        os.fchmod(handle, stat.S_IMODE(info.st_mode))  # after chown, which clears set-id bits
        # The lock keeps other adopter runs out, not an editor: look once more, just before.
        if Path(target).read_bytes() != expected:
            raise _Changed
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    finally:
        os.close(handle)
    _sync_folder(folder)


def _write_in_place(target: str, new: bytes, expected: bytes) -> None:
    """Rewrite a hard-linked file's shared content where it is (not atomic)."""
    with open(target, "r+b") as stream:
        if stream.read() != expected:
            raise _Changed
        stream.seek(0)
        stream.write(new)
        stream.truncate()
        stream.flush()
        os.fsync(stream.fileno())


def _sync_folder(folder: str) -> None:
    """Make the rename durable (a crash right after it keeps the new file)."""
    try:
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def remove_stale_temporaries(paths: Iterable[str | Path]) -> list[str]:
    """Remove, in the folders of ``paths`` (and of their symlinks' targets), the temporary
    files a killed ``apply`` left: named as ours, owned by this user, older than
    :data:`STALE_AFTER_SECONDS` and not locked by a live run. Returns the removed paths."""
    folders: dict[str, None] = {}
    for path in paths:
        folders.setdefault(os.path.dirname(os.path.abspath(path)), None)
        folders.setdefault(os.path.dirname(os.path.realpath(path)), None)
    removed: list[str] = []
    now = time.time()
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if not _TEMPORARY_NAME.match(entry.name):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (
                not stat.S_ISREG(info.st_mode)
                or info.st_uid != os.geteuid()
                or now - info.st_mtime < STALE_AFTER_SECONDS
            ):
                continue
            if _remove_unless_locked(entry.path, info):
                removed.append(entry.path)
    return removed


def _remove_unless_locked(path: str, info: os.stat_result) -> bool:
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False  # a live run is writing it
            raise
        current = os.fstat(handle)
        if (current.st_dev, current.st_ino) != (info.st_dev, info.st_ino):
            return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(handle)
