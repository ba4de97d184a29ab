"""Where a file keeps its layers' attention probabilities whether or not they were asked for.

transformers gathers them into an output field named ``attentions`` (``all_self_attentions``,
``all_cross_attentions``...), appended to or extended layer by layer, normally under a test of
``output_attentions`` (or of the collection not being ``None``, which such a test set up). A
file that appends them unconditionally (BridgeTower's ``all_self_attentions.append(...)``)
returns them to every caller, so a kernel that returns them only when asked changes what the
model returns.
"""

from __future__ import annotations

import ast


def _asks_for_weights(test: ast.expr) -> bool:
    """Whether an ``if`` test decides whether attention probabilities are wanted: it reads an
    ``output_attentions`` option, or tests a collection of them against ``None``."""
    for node in ast.walk(test):
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if isinstance(name, str) and "attentions" in name:
            return True
    return False


def _collects(statement: ast.stmt) -> bool:
    """``all_..._attentions.append(...)`` / ``.extend(...)`` or ``all_..._attentions += ...`` of
    a layer's own probabilities: not of a model output's ``.attentions`` (an inner model
    returns those only when asked, so the outer one passes the answer on)."""
    added: list[ast.expr] = []
    if isinstance(statement, ast.AugAssign):
        target = statement.target
        if isinstance(target, ast.Name) and target.id.endswith("attentions"):
            added = [statement.value]
    elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        callee = statement.value.func
        if (
            isinstance(callee, ast.Attribute)
            and callee.attr in {"append", "extend"}
            and isinstance(callee.value, ast.Name)
            and callee.value.id.endswith("attentions")
        ):
            added = list(statement.value.args)
    passed_on = any(
        isinstance(node, ast.Attribute) and node.attr.endswith("attentions")
        for value in added
        for node in ast.walk(value)
    )
    return bool(added) and not passed_on


def unasked_collections(tree: ast.Module) -> list[int]:
    """The lines of ``tree`` that add attention probabilities to a collection outside any
    ``if`` that asks whether they are wanted (either arm of such an ``if`` depends on it)."""
    lines: list[int] = []

    def visit(body: list[ast.stmt]) -> None:
        for statement in body:
            if isinstance(statement, ast.If) and _asks_for_weights(statement.test):
                continue
            if _collects(statement):
                lines.append(statement.lineno)
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(statement, field, None) or [])
            for handler in getattr(statement, "handlers", None) or []:
                visit(handler.body)

    visit(tree.body)
    return lines
