"""The unified diff ``apply`` prints: ``git apply`` / ``patch -p1`` read it."""

from __future__ import annotations

import difflib

from ..extract.source import split_lines
from .apply import FileRewrite

NO_NEWLINE = "\\ No newline at end of file\n"


def diff_label(prefix: str, path: str) -> str:
    """``a/models/bert.py``; an absolute path loses its leading slash as in ``git diff``
    (``a/tmp/x.py``, not ``a//tmp/x.py``)."""
    return prefix + path.lstrip("/")


def unified_diff(rewrite: FileRewrite) -> str:
    """The rewrite as a unified diff. Lines are the file's own (Python's line breaks only, each
    with its ending); a last line without one is marked as ``diff`` marks it."""
    lines = difflib.unified_diff(
        split_lines(rewrite.original),
        split_lines(rewrite.patched),
        diff_label("a/", rewrite.path),
        diff_label("b/", rewrite.path),
    )
    out: list[str] = []
    for line in lines:
        out.append(line)
        if not line.endswith(("\n", "\r")):
            out.append("\n" + NO_NEWLINE)
    return "".join(out)
