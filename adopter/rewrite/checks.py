"""Safety checks of the rewrite, each a named function that raises :class:`Refusal` with the
reason a site is skipped. For now it holds the post-condition every edit passes before it is
written; the planner's checks (``rewrite/plan.py``) are to move here one by one (issue 21,
item 9)."""

from __future__ import annotations

import ast

from .plan import Plan, Refusal
from .source import SourceText

WRAPPER = "if True:"  # as apply._edit_span parses an indented span


def _fragment(text: str, indented: bool) -> ast.Module:
    """Whole statements of one block, parsed alone (under ``if True:`` when indented)."""
    return ast.parse((WRAPPER + "\n" if indented else "") + text)


def check_edit(
    source: SourceText, start: int, end: int, new_lines: list[str], plans: list[Plan]
) -> None:
    """The post-condition of every edit: the new lines call each planned kernel once more than
    the old ones did, and hold none of the statements and expressions the plans replaced (a
    statement moved into the arms of an ``if`` at most as often as before). Otherwise the
    edit is refused, never written."""
    try:
        indented = bool(source.indentation(start))  # as _edit_span parsed them
        old = _fragment("".join(source.lines[start - 1 : end]), indented)
        new = _fragment("".join(new_lines), indented)
    except SyntaxError as error:
        raise Refusal(f"lines {start}-{end}: the edit does not parse ({error.msg})") from None
    done = [part for plan in plans for part in (plan, *plan.also_patched)]
    calls: dict[str, int] = {}
    for plan in done:
        for name in plan.kernel_calls:
            calls[name] = calls.get(name, 0) + 1

    def called(tree: ast.AST, name: str) -> int:
        return sum(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
            for n in ast.walk(tree)
        )

    for name, count in calls.items():
        if called(new, name) != called(old, name) + count:
            raise Refusal(f"lines {start}-{end}: the edit does not call {name} as planned")
    removed: dict[str, int] = {}
    kept: dict[str, int] = {}  # moved or copied into other arms: no more often than before
    for plan in done:
        gone: list[ast.AST] = [*plan.delete_statements, *(s for s, _ in plan.replace_statements)]
        gone += [node for node, _ in plan.replace_expressions]
        if plan.wrap is not None and plan.wrap[1] is None:
            gone += plan.wrap[0]
        moved = [*plan.hoist[0]] if plan.hoist is not None else []
        if plan.sunk:
            moved += [s for s in plan.delete_statements]
            gone = [g for g in gone if not any(g is m for m in moved)]
        for node in gone:
            removed[ast.dump(node)] = removed.get(ast.dump(node), 0) + 1
        for node in moved:
            kept.setdefault(ast.dump(node), 0)
    before = _dump_counts(old, set(removed) | set(kept))
    after = _dump_counts(new, set(removed) | set(kept))
    for dumped, count in removed.items():
        if after[dumped] > before[dumped] - count:
            raise Refusal(f"lines {start}-{end}: the edit keeps a computation the kernel replaces")
    for dumped in kept:
        if after[dumped] > before[dumped]:
            raise Refusal(f"lines {start}-{end}: the edit runs a moved statement twice")


def _dump_counts(tree: ast.AST, wanted: set[str]) -> dict[str, int]:
    counts = dict.fromkeys(wanted, 0)
    for node in ast.walk(tree):
        if isinstance(node, (ast.stmt, ast.expr)):
            dumped = ast.dump(node)
            if dumped in counts:
                counts[dumped] += 1
    return counts
