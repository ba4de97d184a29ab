"""Model zoos to scan, fetched as wheels from PyPI at run time and cached in a git-ignored
folder (never vendored): ``fetch_wheel("transformers==4.34.0")`` returns the unpacked tree."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

DEFAULT_CACHE = Path(".cache") / "corpus"


class FetchError(RuntimeError):
    """pip could not download the requested distribution."""


def cache_dir(explicit: Path | None = None) -> Path:
    if explicit is not None:
        return explicit
    return Path(os.environ.get("ADOPTER_CACHE_DIR", DEFAULT_CACHE))


def fetch_wheel(spec: str, cache: Path | None = None, quiet: bool = True) -> Path:
    """Download the wheel for a pinned requirement (``name==version``) with pip, unpack it once,
    and return the folder holding its packages. Nothing is imported or installed."""
    name, separator, version = spec.partition("==")
    if not separator or not name or not version:
        raise FetchError(f"{spec!r}: give an exact version, e.g. transformers==4.34.0")
    root = cache_dir(cache)
    target = root / f"{name}-{version}"
    marker = target / ".complete"
    if marker.exists():
        return target
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(wheels),
        spec,
    ]
    if quiet:
        command.append("--quiet")
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        detail = (completed.stderr or completed.stdout).strip().splitlines()
        raise FetchError(f"pip download {spec} failed: {detail[-1] if detail else 'no output'}")
    normalized = name.replace("-", "_").lower()
    candidates = [
        path
        for path in wheels.glob("*.whl")
        if path.name.lower().startswith(f"{normalized}-{version}-")
    ]
    if not candidates:
        raise FetchError(f"pip download {spec} produced no wheel in {wheels}")
    partial = target.with_name(target.name + ".partial")
    with zipfile.ZipFile(candidates[0]) as archive:
        archive.extractall(partial)
    if target.exists():
        import shutil

        shutil.rmtree(target)
    partial.rename(target)
    marker.write_text(candidates[0].name)
    return target
