"""Line numbers of patched code in terms of the original file.

The patched functions are compiled under the original file's name, so tracebacks, debuggers
and ``inspect`` read the lines from that file. The rewrite keeps every line outside the edited
statements as it was but may move it (one kernel import added at the top, two statements fused
into one). :class:`LineMap` maps each patched line to the original line it came from - exactly
for unchanged lines, and to the first line of the replaced statements for edited ones - and
:func:`remap` moves an AST onto the original lines before it is compiled.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Sequence


class LineMap:
    """Patched line number -> original line number (both 1-based), never decreasing.

    ``old`` and ``new`` are lines of the two versions, possibly excerpts (one function of
    each) starting at lines ``original_first`` and ``patched_first`` of their files: diffing
    one changed function at a time costs a fraction of diffing whole files, and the rewrite
    keeps every function's place in the outline, so the excerpts correspond."""

    def __init__(
        self,
        old: Sequence[str],
        new: Sequence[str],
        original_first: int = 1,
        patched_first: int = 1,
    ) -> None:
        self._first = patched_first
        self._map = [0] * (len(new) + 1)
        self._exact = [False] * (len(new) + 1)
        base = original_first - 1
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            for offset, j in enumerate(range(j1, j2)):
                if tag == "equal":
                    self._map[j + 1], self._exact[j + 1] = base + i1 + offset + 1, True
                elif i2 > i1:  # replaced lines: the k-th new line on the k-th old one
                    self._map[j + 1] = base + i1 + min(offset, i2 - i1 - 1) + 1
                else:  # inserted lines: on the original line before them
                    self._map[j + 1] = base + max(i1, 1)

    def line(self, patched_line: int) -> int:
        index = patched_line - self._first + 1
        if 0 < index < len(self._map):
            return self._map[index]
        return patched_line

    def exact(self, patched_line: int) -> bool:
        index = patched_line - self._first + 1
        return 0 < index < len(self._exact) and self._exact[index]


def remap(tree: ast.AST, lines: LineMap) -> None:
    """Move every node of ``tree`` onto original lines. Columns stay where the line is
    unchanged; on edited lines they would point into different text, so they become 0."""
    for node in ast.walk(tree):
        start = getattr(node, "lineno", None)
        if start is None:
            continue
        end = getattr(node, "end_lineno", None) or start
        exact = lines.exact(start) and lines.exact(end)
        node.lineno = lines.line(start)  # type: ignore[attr-defined]
        node.end_lineno = lines.line(end)  # type: ignore[attr-defined]
        if not exact:
            node.col_offset = 0  # type: ignore[attr-defined]
            node.end_col_offset = 0  # type: ignore[attr-defined]
