"""Matching call-site rules (:class:`~adopter.dsl.syntax.CallPattern`): a call of a named
callee anywhere in a file - module level, any function, any method - resolved through the
file's imports, never by executing anything.

A name is resolved only when every import in the file binds it to the same dotted path and
nothing else in the file binds it (an assignment, a ``def``, a parameter, a loop target...): a
class of the user's own that happens to be called ``AdamW`` is not ``torch.optim.AdamW``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from ..dsl.syntax import CallPattern, Rule
from ..extract.names import ImportTable


@dataclass(frozen=True)
class CallMatch:
    """A call a call-site rule names, and whether (and why not) it can be rewritten."""

    rule: Rule
    node: ast.Call
    cls: str | None
    function: str
    applicable: bool
    reason: str = ""


class FileNames:
    """What the dotted names of one file mean: imports anywhere in it, minus names it also
    binds otherwise."""

    def __init__(self, tree: ast.Module) -> None:
        self.imported: dict[str, set[str]] = {}
        self.bound_otherwise: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                table = ImportTable()
                table.add(node)
                for local, full in table.aliases.items():
                    self.imported.setdefault(local, set()).add(full)
            else:
                self.bound_otherwise.update(_bound_names(node))

    def resolve(self, node: ast.expr) -> str | None:
        """``torch.optim.AdamW`` for ``optim.AdamW`` after ``from torch import optim``; ``None``
        when the head is not an import of this file, or not only one."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id in self.bound_otherwise:
            return None
        origins = self.imported.get(node.id, set())
        if len(origins) != 1:
            return None
        return ".".join([next(iter(origins)), *reversed(parts)])


def _bound_names(node: ast.AST) -> Iterator[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name
    elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        yield node.id
    elif isinstance(node, ast.arg):
        yield node.arg
    elif isinstance(node, ast.ExceptHandler) and node.name:
        yield node.name
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        yield from node.names
    elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
        yield node.name


def _places(tree: ast.Module) -> Iterator[tuple[ast.Call, str | None, str]]:
    """Every call with the class and function it is in (``<module>`` at module level)."""

    def visit(node: ast.AST, cls: str | None, function: str) -> Iterator[tuple]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from visit(child, child.name, function)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(child, cls, child.name)
            else:
                if isinstance(child, ast.Call):
                    yield child, cls, function
                yield from visit(child, cls, function)

    yield from visit(tree, None, "<module>")


def match_calls(rules: list[Rule], tree: ast.Module) -> list[CallMatch]:
    """The calls of ``tree`` that the call-site ``rules`` name, in file order."""
    patterns = [(rule, rule.call) for rule in rules if rule.call is not None]
    if not patterns:
        return []
    names = FileNames(tree)
    found: list[CallMatch] = []
    for node, cls, function in _places(tree):
        callee = names.resolve(node.func)
        if callee is None:
            continue
        for rule, pattern in patterns:
            if callee in pattern.callees:
                applicable, reason = _judge(pattern, node)
                if applicable is not None:
                    found.append(CallMatch(rule, node, cls, function, applicable, reason))
    return found


def _judge(pattern: CallPattern, node: ast.Call) -> tuple[bool | None, str]:
    """``(True, "")`` for a site, ``(False, why)`` for a match left alone, ``(None, "")`` for a
    call the rule does not report at all (a keyword rule whose keyword holds another value)."""
    given = {keyword.arg: keyword.value for keyword in node.keywords if keyword.arg is not None}
    for keyword, why in pattern.refused:
        if keyword in given:
            return False, f"{keyword}= is given: {why}"
    unpacked = any(keyword.arg is None for keyword in node.keywords)
    if pattern.wrap_keyword is None:
        if unpacked:
            return False, "the call passes **kwargs, which may hold fused= or foreach="
        return True, ""
    value = given.get(pattern.wrap_keyword)
    if value is None:
        return None, ""  # left to the library's default (see the rule's documentation)
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return (True, "") if value.value in pattern.values else (None, "")
    return False, f"{pattern.wrap_keyword}= is computed at run time, not a literal"
