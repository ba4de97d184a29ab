"""Synthesis of a replacement that takes over whole statements: a guarded replacement (the
kernel where a run-time test allows it, the original statements everywhere else) and a rule of
``scope: "block"`` (the kernel in place of the statements, on every path through them).

A rule whose kernel is only right in some situations decided at run time (``=> if
kernel.applies(...) { ... }``) is rewritten by wrapping the matched statements, unchanged, in
the ``else`` arm of an ``if`` whose test is the guard call and whose body runs the kernel::

    if fused_loss_applies(self, labels, self.loss_function, **kwargs):
        logits = None
        loss = causal_lm_loss(hidden_states, self.lm_head, labels, self.config.vocab_size, **kwargs)
    else:
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, ...)

The wrapped range is every statement of one block from the one holding the first matched call
to the one holding the last. The kernel arm replaces that range only when it is safe to skip
it: the range does nothing but the matched calls (no other call, no ``return``, ``raise``,
``yield``, loop jump or global), every name the range binds that is read anywhere else in the
function is bound by the kernel arm, and the kernel arm reads nothing the range assigns. With
``scope: "block"`` and no guard the kernel arm simply replaces the range. A range already
inside the ``else`` arm of its own guard is a site that was patched before: refused, so a
second ``apply`` changes nothing.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from ..dsl.syntax import Literal, Name
from ..dsl.syntax import Step as PatternStep
from ..match.matcher import Site
from .source import Blocks, assigned_names, contains, read_names

if TYPE_CHECKING:
    from .plan import Plan, Planner

# Statements after which the kernel arm could not stand in for the range.
_CONTROL = (
    ast.Return,
    ast.Raise,
    ast.Break,
    ast.Continue,
    ast.Global,
    ast.Nonlocal,
    ast.Yield,
    ast.YieldFrom,
    ast.Await,
    ast.Delete,
)


def plan_guarded(planner: Planner, site: Site, guard: PatternStep | None, body: tuple) -> Plan:
    from .plan import Plan, Refusal, _is_plain_assignment, _step_expression

    steps = site.steps
    pattern = site.rule.forward.steps  # type: ignore[union-attr]
    function = steps[0].function
    if function is None or any(
        s.function is not function or s.inline_chain != steps[0].inline_chain for s in steps
    ):
        raise Refusal("a guarded replacement must lie in one function; not rewritten")
    if any(s.synthetic or s.statement is None for s in steps):
        raise Refusal("a guarded replacement needs each matched call in a statement")
    plan = Plan(site=site, function=function)
    blocks = planner.blocks(function)
    block, first_index, parent, field = blocks.block_of(steps[0].statement)  # type: ignore[arg-type]
    last_index = first_index
    for step in steps:
        holder = next(
            (i for i, s in enumerate(block) if contains(s, step.statement)),  # type: ignore[arg-type]
            None,
        )
        if holder is None or holder < first_index:
            raise Refusal(f"line {step.line}: the matched calls are not in one block")
        last_index = max(last_index, holder)
    wrapped = block[first_index : last_index + 1]
    if guard is not None and _inside_own_guard(planner, parent, field, guard):
        raise Refusal("already guarded by its kernel (patched before)")

    # The range must do nothing but the matched work.
    matched_nodes = [_step_expression(s) for s in steps]
    for statement in wrapped:
        for node in ast.walk(statement):
            if isinstance(node, _CONTROL) or isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                raise Refusal(
                    f"line {node.lineno}: the matched statements also hold "  # type: ignore[attr-defined]
                    f"`{type(node).__name__.lower()}`; not rewritten"
                )
            if isinstance(node, ast.Call) and not any(contains(m, node) for m in matched_nodes):
                raise Refusal(
                    f"line {node.lineno}: `{planner.source.segment(node)}` runs among the "
                    "matched statements; not rewritten"
                )

    # The kernel arm: each target bound to the name its producer's statement assigns.
    producer = {t.name: (p, s) for p, s in zip(pattern, steps, strict=True) for t in p.targets}
    lines: list[str] = []
    bound: set[str] = set()
    last_pattern, last_step = pattern[-1], steps[-1]
    for new_step in body:
        if not new_step.targets or any(t.name not in producer for t in new_step.targets):
            raise Refusal("a replacement step must name values of the pattern")
        names = []
        for target in new_step.targets:
            pattern_step, step = producer[target.name]
            node = _step_expression(step)
            statement = step.statement
            assert statement is not None
            if not _is_plain_assignment(statement, node):
                raise Refusal(f"line {step.line}: the value is not assigned to a plain name")
            names.append(
                statement.targets[0].id  # type: ignore[union-attr]
                if isinstance(statement, ast.Assign)
                else statement.target.id  # type: ignore[union-attr]
            )
        name = ", ".join(names)
        if isinstance(new_step.callee, Literal):
            value = repr(new_step.callee.value)
        elif isinstance(new_step.callee, Name):
            value = planner.render_call(new_step, site, plan, pattern_step, step)
        else:
            raise Refusal(f"cannot render replacement step {new_step}")
        lines.append(f"{name} = {value}")
        bound.update(names)
    guard_text = (
        planner.render_call(guard, site, plan, last_pattern, last_step) if guard else "True"
    )
    planner._moved_calls = []  # arguments are evaluated where the range began: the same point

    assigned = set().union(*(assigned_names(s) for s in wrapped))
    elsewhere = read_names(function) - set().union(*(read_names(s) for s in wrapped))
    unset = (assigned - bound) & (elsewhere | _read_in_range_loops(blocks, wrapped))
    if unset:
        raise Refusal(
            "the matched statements also set "
            + ", ".join(f"`{n}`" for n in sorted(unset))
            + ", which the kernel arm would leave unset"
        )
    # The kernel arm runs where the range starts: what it reads must not change inside it.
    changed = _read_before_bound(lines, guard_text) & assigned
    if changed:
        raise Refusal(
            "the kernel arm reads "
            + ", ".join(f"`{n}`" for n in sorted(changed))
            + ", which the matched statements assign"
        )

    outer = planner.source.indentation(function.lineno)
    inner = planner.source.indentation(function.body[0].lineno)
    plan.wrap = (wrapped, guard_text if guard else None, lines, inner[len(outer) :] or "    ")
    plan.statements.extend(wrapped)
    plan.touched.extend(matched_nodes)
    plan.summary = f"{planner.source.segment(matched_nodes[-1])} -> " + (
        f"if {guard_text}: ..." if guard else "; ".join(lines)
    )
    return plan


def _read_in_range_loops(blocks: Blocks, wrapped: list[ast.stmt]) -> set[str]:
    """Names read by a loop around the range (a later iteration reads them again)."""
    found: set[str] = set()
    parent = blocks.block_of(wrapped[0])[2]
    while parent is not None:
        if isinstance(parent, (ast.For, ast.AsyncFor, ast.While)):
            found |= read_names(parent)
        parent = blocks.block_of(parent)[2] if id(parent) in blocks.where else None
    return found


def _read_before_bound(lines: list[str], guard_text: str) -> set[str]:
    """Names the kernel arm reads before (or where) it binds them itself."""
    seen: set[str] = set()
    early: set[str] = set(read_names(ast.parse(guard_text)))
    for line in lines:
        statement = ast.parse(line).body[0]
        early |= read_names(statement) - seen
        seen |= assigned_names(statement)
    return early


def _inside_own_guard(planner: Planner, parent: ast.stmt | None, field: str, guard) -> bool:
    """The range is the ``else`` arm of ``if <the guard kernel>(...)``: patched before."""
    if not isinstance(parent, ast.If) or field != "orelse" or not isinstance(guard.callee, Name):
        return False
    test = parent.test
    if not isinstance(test, ast.Call):
        return False
    called = planner.source.segment(test.func).rsplit(".", 1)[-1]
    kernel = guard.callee.dotted.rsplit(".", 1)[-1]
    return called in (kernel, planner.aliases.get(kernel), f"adopter_{kernel}")
