"""Model zoos to scan, fetched as wheels from PyPI at run time and cached in a git-ignored
folder (never vendored): ``fetch_wheel("transformers==4.34.0")`` returns the unpacked tree."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_CACHE = Path(".cache") / "corpus"


class FetchError(RuntimeError):
    """pip could not download the requested distribution."""


def cache_dir(explicit: Path | None = None) -> Path:
    if explicit is not None:
        return explicit
    return Path(os.environ.get("ADOPTER_CACHE_DIR", DEFAULT_CACHE))


def pinned_requirement(spec: str) -> tuple[str, str]:
    """``(canonical name, normalised version)`` of an exact pin such as ``transformers==4.34.0``.

    The spec is parsed as a PEP 508 requirement (never as a pip option or a path): an option
    (``-d/tmp/x``), a path (``../fake==1``), a URL, extras, markers or any operator other than
    one exact ``==`` raise :class:`FetchError`. The cache folder and pip's argument are rebuilt
    from the canonical parts, so nothing the user typed reaches either verbatim.
    """
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    example = "give an exact version, e.g. transformers==4.34.0"
    if spec.lstrip().startswith("-"):
        raise FetchError(f"{spec!r} is an option, not a requirement; {example}")
    try:
        requirement = Requirement(spec)
    except InvalidRequirement as error:
        raise FetchError(f"{spec!r} is not a requirement ({error}); {example}") from None
    if requirement.url or requirement.marker or requirement.extras:
        raise FetchError(f"{spec!r}: no URL, marker or extras; {example}")
    specifiers = list(requirement.specifier)
    if len(specifiers) != 1 or specifiers[0].operator != "==" or "*" in specifiers[0].version:
        raise FetchError(f"{spec!r}: {example}")
    try:
        version = Version(specifiers[0].version)
    except InvalidVersion:
        raise FetchError(f"{spec!r}: {specifiers[0].version!r} is not a version") from None
    return canonicalize_name(requirement.name), str(version)


def fetch_wheel(spec: str, cache: Path | None = None, quiet: bool = True) -> Path:
    """Download the wheel for a pinned requirement (``name==version``) with pip, unpack it once,
    and return the folder holding its packages. Nothing is imported or installed.

    pip runs isolated (``python -I``: neither the current folder nor ``PYTHON*`` variables
    reach its import path, so a ``pip.py`` in the working folder is never executed)."""
    name, version = pinned_requirement(spec)
    root = cache_dir(cache)
    target = root / f"{name}-{version}"
    if (target / ".complete").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    # Two processes fetching the same release (parallel test workers, two shells) would
    # unpack into one ".partial" folder: one fetches, the other waits and finds it done.
    with _exclusive(root / f".{name}-{version}.lock"):
        if (target / ".complete").exists():
            return target
        return _download_and_unpack(name, version, root, target, quiet)


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


def _download_and_unpack(name: str, version: str, root: Path, target: Path, quiet: bool) -> Path:
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    marker = target / ".complete"
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pinned = f"{name}=={version}"
    command = [
        sys.executable,
        "-I",
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(wheels),
    ]
    if quiet:
        command.append("--quiet")
    command += ["--", pinned]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        detail = (completed.stderr or completed.stdout).strip().splitlines()
        raise FetchError(f"pip download {pinned} failed: {detail[-1] if detail else 'no output'}")
    candidates = []
    for path in sorted(wheels.glob("*.whl")):
        try:
            wheel_name, wheel_version, _, _ = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if wheel_name == name and str(wheel_version) == version:
            candidates.append(path)
    if not candidates:
        raise FetchError(f"pip download {pinned} produced no wheel in {wheels}")
    partial = target.with_name(target.name + ".partial")
    with zipfile.ZipFile(candidates[0]) as archive:
        archive.extractall(partial)
    if target.exists():
        import shutil

        shutil.rmtree(target)
    partial.rename(target)
    marker.write_text(candidates[0].name)
    return target
