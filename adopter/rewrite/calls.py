"""Rewriting the sites of call-site rules (``Rule.call``, the ``train`` set): the matched call
is routed through the rule's kernel in place, with every other byte of the file as written.

Two shapes (see :class:`~adopter.dsl.syntax.CallPattern`):

* wrap the call, ``torch.optim.AdamW(model.parameters(), lr=1e-3)`` becomes
  ``fused_optimizer(torch.optim.AdamW, model.parameters(), lr=1e-3)``: the callee's text moves
  inside the parentheses as the first argument, and the arguments, comments and line breaks
  stay where they were;
* wrap one keyword's value, ``optim="adamw_torch"`` becomes
  ``optim=fused_training_optimizer("adamw_torch")``.

An edit is a list of replacements inside single lines, at ``ast`` positions (UTF-8 byte
columns), so several sites on one line compose.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ..match.matcher import Site
from .checks import Refusal
from .source import SourceText


@dataclass(frozen=True)
class LineReplacement:
    """Bytes ``start:end`` of line ``line`` (1-based) become ``text``."""

    line: int
    start: int
    end: int
    text: str


def call_edit(site: Site, source: SourceText, kernel: str) -> list[LineReplacement]:
    """The replacements that route ``site``'s call through ``kernel`` (its local name); raises
    :class:`Refusal` for a call whose text does not have the expected shape."""
    node, pattern = site.call, site.rule.call
    assert node is not None and pattern is not None
    if pattern.wrap_keyword is None:
        return _wrap_call(node, source, kernel)
    for keyword in node.keywords:
        if keyword.arg == pattern.wrap_keyword:
            value = keyword.value
            if value.lineno != value.end_lineno:
                raise Refusal(f"{keyword.arg}= spans several lines")
            text = source.segment(value)
            return [
                LineReplacement(
                    value.lineno, value.col_offset, value.end_col_offset, f"{kernel}({text})"
                )
            ]
    raise Refusal(f"the call has no {pattern.wrap_keyword}=")


def _wrap_call(node: ast.Call, source: SourceText, kernel: str) -> list[LineReplacement]:
    callee = node.func
    if callee.lineno != callee.end_lineno:
        raise Refusal("the callee is written across lines")
    line = callee.lineno
    data = source.lines[line - 1].encode("utf-8")
    after = callee.end_col_offset
    paren = after + len(data[after:]) - len(data[after:].lstrip(b" \t"))
    if data[paren : paren + 1] != b"(":
        raise Refusal("no '(' after the callee on its line")
    callee_text = source.segment(callee)
    rest = data[paren + 1 :].decode("utf-8").strip()
    has_arguments = bool(node.args or node.keywords)
    if not has_arguments:
        inserted = callee_text
    elif not rest or rest.startswith("#"):  # the arguments start on the next line
        inserted = f"{callee_text},"
    else:
        inserted = f"{callee_text}, "
    return [
        LineReplacement(line, paren + 1, paren + 1, inserted),
        LineReplacement(line, callee.col_offset, callee.end_col_offset, kernel),
    ]


def apply_replacements(lines: list[str], replacements: list[LineReplacement]) -> None:
    """Make ``replacements`` in ``lines`` (the file's lines, line breaks kept), right to left
    on each line, so that earlier byte positions stay valid."""
    ordered = sorted(replacements, key=lambda r: (r.line, r.start, r.end), reverse=True)
    for replacement in ordered:
        data = lines[replacement.line - 1].encode("utf-8")
        data = (
            data[: replacement.start] + replacement.text.encode("utf-8") + data[replacement.end :]
        )
        lines[replacement.line - 1] = data.decode("utf-8")


def summary(site: Site, kernel: str) -> str:
    pattern = site.rule.call
    assert pattern is not None
    if pattern.wrap_keyword is None:
        return f"{kernel}(<optimizer class>, ...)"
    return f"{pattern.wrap_keyword}={kernel}(...)"
