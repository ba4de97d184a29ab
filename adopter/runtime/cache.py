"""The per-user cache of rewrites: patched source text and a JSON record, never pickles.

An entry is one JSON file named by a digest of everything the rewrite depends on: the module's
source bytes, the rules (their files' bytes), Adopter's own code, the torch version and the
Python version. A second start therefore reads a file instead of analysing the module, and any
change to one of those inputs simply misses. The other files of the package the analysis read
(helpers, base classes) are listed in the record with their digests and checked on use
(:mod:`.prepare`); the record's shape is checked too (:mod:`.records`).

What is read back is compiled and executed in the user's process, so the cache is only used
where no one else can write: the folder must be owned by this user and not writable by group
or others (it is created ``0700``), and each entry must be a regular file owned by this user.
A folder that fails these checks is refused (the runtime then works without a cache and says
so once). Location: ``$ADOPTER_CACHE_DIR``, else ``$XDG_CACHE_HOME/adopter/runtime``, else
``~/.cache/adopter/runtime``.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from .. import __version__

FORMAT = 2
_PACKAGE_ROOT = Path(__file__).resolve().parents[1]


class CacheRefused(Exception):
    """The cache folder is not safe to execute code from."""


def cache_dir() -> Path:
    """Where the runtime cache lives for this user (not created here)."""
    override = os.environ.get("ADOPTER_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "adopter" / "runtime"


def check_private(path: Path) -> None:
    """Raise :class:`CacheRefused` unless ``path`` is a real folder that only we can write."""
    try:
        info = os.lstat(path)
    except OSError as error:
        raise CacheRefused(f"{path}: {error.strerror}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise CacheRefused(f"{path}: not a folder (a link or a file)")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise CacheRefused(f"{path}: owned by another user (uid {info.st_uid})")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheRefused(f"{path}: writable by others (mode {stat.S_IMODE(info.st_mode):o})")


def _make_private(path: Path) -> None:
    """Create ``path`` (and missing parents) ``0700``, then check it."""
    missing = []
    current = path
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass
    check_private(path)


# The stages a rewrite, its verdict and the patching depend on (not the CLI or bench).
_STAGES = ("dsl", "extract", "match", "rewrite", "verify", "kernels", "rules", "runtime")


@cache
def code_fingerprint() -> str:
    """Adopter's version and a digest of the source of the stages rewrites depend on."""
    digest = hashlib.sha256(__version__.encode())
    files = [file for stage in _STAGES for file in (_PACKAGE_ROOT / stage).rglob("*.py")]
    for file in sorted(files):
        digest.update(str(file.relative_to(_PACKAGE_ROOT)).encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


@cache
def torch_version() -> str:
    """The installed torch version, without importing torch when it is not imported yet."""
    module = sys.modules.get("torch")
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("torch")
    except PackageNotFoundError:
        return "none"


def entry_key(source: bytes, rules_fingerprint: str, kind: str = "rewrite") -> str:
    """The name of the entry for this source under these rules, here."""
    parts = [
        str(FORMAT),
        kind,
        hashlib.sha256(source).hexdigest(),
        rules_fingerprint,
        code_fingerprint(),
        torch_version(),
        sys.implementation.name,
        sys.version,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


class RuntimeCache:
    """Entries under one checked folder. ``get``/``put`` never raise for I/O trouble."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder if folder is not None else cache_dir()
        _make_private(self.folder)

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The record stored under ``key``; ``None`` when absent, unreadable or not ours."""
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
        try:
            handle = os.open(self._path(key), flags)
        except OSError:
            return None
        with os.fdopen(handle, "rb") as stream:
            info = os.fstat(stream.fileno())
            if not stat.S_ISREG(info.st_mode):
                return None
            if hasattr(os, "getuid") and info.st_uid != os.getuid():
                return None
            if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return None
            try:
                record = json.loads(stream.read().decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                return None
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            return None
        return record

    def put(self, key: str, record: dict[str, Any]) -> None:
        """Store ``record`` atomically (temporary file + rename); failures are ignored."""
        data = json.dumps({"format": FORMAT, **record}).encode("utf-8")
        try:
            handle, temporary = tempfile.mkstemp(prefix=".entry-", dir=self.folder)
        except OSError:
            return
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(data)
            os.replace(temporary, self._path(key))
        except OSError:
            try:
                os.unlink(temporary)
            except OSError:
                pass


def clear_cache(folder: Path | None = None) -> int:
    """Delete the runtime cache's entries; returns how many. The folder itself stays."""
    folder = folder if folder is not None else cache_dir()
    if not folder.exists():
        return 0
    check_private(folder)
    removed = 0
    for entry in folder.iterdir():
        if entry.suffix == ".json" or entry.name.startswith(".entry-"):
            try:
                entry.unlink()
                removed += 1
            except OSError:
                pass
    return removed
