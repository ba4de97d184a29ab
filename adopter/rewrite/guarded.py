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

from ..dsl.syntax import Literal, Name, Var
from ..dsl.syntax import Step as PatternStep
from ..extract.model import Operand
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


class AlreadyPatched(Exception):
    """The site is the original code kept in the ``else`` arm of its own guard: nothing to do
    (not a skipped site)."""


def plan_guarded(planner: Planner, site: Site, guard: PatternStep | None, body: tuple) -> Plan:
    from .plan import Plan, Refusal, _is_plain_assignment, _step_expression

    steps = site.steps
    pattern = site.rule.forward.steps  # type: ignore[union-attr]
    if any(s.synthetic or s.statement is None or s.function is None for s in steps):
        raise Refusal("a replacement of statements needs each matched call in a statement")
    function, holders, helper_calls = _root_and_holders(planner, steps)
    plan = Plan(site=site, function=function)
    blocks = planner.blocks(function)
    block, first_index, parent, field = blocks.block_of(holders[0])
    last_index = first_index
    for step, statement in zip(steps, holders, strict=True):
        holder = next(
            (i for i, s in enumerate(block) if contains(s, statement)),
            None,
        )
        if holder is None or holder < first_index:
            raise Refusal(f"line {step.line}: the matched calls are not in one block")
        last_index = max(last_index, holder)
    wrapped = block[first_index : last_index + 1]
    _check_whole_lines(planner, block, first_index, last_index)
    if guard is not None and _inside_own_guard(planner, parent, field, guard):
        raise AlreadyPatched("already guarded by its kernel (patched before)")

    # The range must do nothing but the matched work (and the calls of helpers that do only
    # matched work); a ``return`` may end it when it returns the replacement's value.
    matched_nodes = [_step_expression(s) for s in steps] + helper_calls
    # ``loss_fct = CrossEntropyLoss()`` among them: a matched module built where it is used.
    allowed = matched_nodes + _modules_built_in(site, function)
    final_return = wrapped[-1] if isinstance(wrapped[-1], ast.Return) else None
    for statement in wrapped:
        for node in ast.walk(statement):
            if node is final_return:
                continue
            if isinstance(node, _CONTROL) or isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                raise Refusal(
                    f"line {node.lineno}: the matched statements also hold "  # type: ignore[attr-defined]
                    f"`{type(node).__name__.lower()}`; not rewritten"
                )
            if guard is not None and _unmatched_value(node, allowed):
                # ``if cond: logits = logits * scale`` between head and loss: the kernel arm
                # would skip the scale (a match reached the loss through the unscaled path).
                raise Refusal(
                    f"line {node.lineno}: `{planner.source.segment(node)}` computes among the "  # type: ignore[attr-defined]
                    "matched statements; not rewritten"
                )
            if isinstance(node, ast.Call) and not any(contains(m, node) for m in allowed):
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
            if statement is final_return and final_return.value is node:
                names.append("return")
                continue
            if not _is_plain_assignment(statement, node):
                raise Refusal(f"line {step.line}: the value is not assigned to a plain name")
            names.append(
                statement.targets[0].id  # type: ignore[union-attr]
                if isinstance(statement, ast.Assign)
                else statement.target.id  # type: ignore[union-attr]
            )
        if "return" in names and (len(names) > 1 or new_step is not body[-1]):
            raise Refusal("only the last replacement step may give the returned value")
        name = ", ".join(names)
        if isinstance(new_step.callee, Literal):
            value = repr(new_step.callee.value)
        elif isinstance(new_step.callee, Name):
            value = planner.render_call(new_step, site, plan, pattern_step, step)
        else:
            raise Refusal(f"cannot render replacement step {new_step}")
        lines.append(f"return {value}" if names == ["return"] else f"{name} = {value}")
        bound.update(names)
    if final_return is not None and not lines[-1].startswith("return "):
        raise Refusal(f"line {final_return.lineno}: the matched statements end in a `return`")
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
    # The kernel arm runs where the range starts: each value it reads must be the one the
    # matched call that read it saw (no statement of the range assigns it before that call).
    changed = _changed_before_read(site, steps, holders, wrapped, guard, body)
    if changed:
        raise Refusal(
            "the kernel arm reads "
            + ", ".join(f"`{n}`" for n in sorted(changed))
            + ", which the matched statements assign before it is read"
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


def _modules_built_in(site: Site, function: ast.FunctionDef) -> list[ast.expr]:
    """The constructor calls, in ``function``, of modules the match calls (built in forward)."""
    built = []
    for bound in site.bindings.values():
        construction = getattr(bound, "construction", None)
        node = getattr(construction, "node", None)
        if isinstance(node, ast.Call) and construction.function is function:  # type: ignore[union-attr]
            if construction.method != "__init__":  # type: ignore[union-attr]
                built.append(node)
    return built


def _unmatched_value(node: ast.AST, matched: list[ast.expr]) -> bool:
    """An assignment of a value that is neither a constant nor one of the matched calls."""
    if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or node.value is None:
        return False
    value = node.value
    if isinstance(value, ast.Constant) or isinstance(node, ast.AugAssign):
        return isinstance(node, ast.AugAssign)
    return not any(contains(m, value) for m in matched)


def _check_whole_lines(planner: Planner, block: list[ast.stmt], first: int, last: int) -> None:
    """The replaced statements must be whole lines: the kernel arm takes their place, so a
    statement sharing a line with them (``a; b``) or a one-line body (``if c: a; b``) would be
    wrapped or dropped with them."""
    from .plan import Refusal

    start, end = block[first], block[last]
    prefix = planner.source.lines[start.lineno - 1].encode("utf-8")[: start.col_offset]
    joined = (first > 0 and block[first - 1].end_lineno == start.lineno) or (
        last + 1 < len(block) and block[last + 1].lineno == end.end_lineno
    )
    if joined or prefix.strip():
        raise Refusal(
            f"line {start.lineno}: the matched statements share a line with other code "
            "(joined statements or a one-line body); not rewritten"
        )


def _root_and_holders(
    planner: Planner, steps: list
) -> tuple[ast.FunctionDef, list[ast.stmt], list[ast.expr]]:
    """The function the replacement edits, the statement of it that runs each matched step,
    and the calls of helpers whose matched steps it runs.

    All steps in one function: that function and their statements. Otherwise the function of
    the steps inlined least deep, and for a step in a helper it calls (``self._norm(x)``), the
    statement holding the one call of that helper; a helper must be called once there, lie one
    call deeper, and do nothing but matched work (so the replacement may skip its call)."""
    from .plan import Refusal, _step_expression

    why = "the matched calls span functions in a way not rewritten"
    shallow = min(len(s.inline_chain) for s in steps)
    roots = {id(s.function): s.function for s in steps if len(s.inline_chain) == shallow}
    if len(roots) != 1:
        raise Refusal(why)
    (function,) = roots.values()
    chain = next(s.inline_chain for s in steps if s.function is function)
    matched = [_step_expression(s) for s in steps]
    holders: list[ast.stmt] = []
    calls: dict[int, ast.expr] = {}
    for step in steps:
        if step.function is function:
            if step.inline_chain != chain:
                raise Refusal(why)
            holders.append(step.statement)
            continue
        helper = step.function
        if len(step.inline_chain) != shallow + 1 or step.inline_chain[:shallow] != chain:
            raise Refusal(why)
        call = calls.get(id(helper))
        if call is None:
            sites = [
                node
                for node in ast.walk(function)
                if isinstance(node, ast.Call)
                and (
                    (isinstance(node.func, ast.Name) and node.func.id == helper.name)
                    or (
                        isinstance(node.func, ast.Attribute)
                        and node.func.attr == helper.name
                        and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "self"
                    )
                )
            ]
            if len(sites) != 1 or not _only_matched_work(helper, matched):
                raise Refusal(f"{helper.name}(): called more than once or does other work")
            call = calls[id(helper)] = sites[0]
        holders.append(planner.statement_containing(function, call))
    return function, holders, list(calls.values())


def _only_matched_work(helper: ast.FunctionDef, matched: list[ast.expr]) -> bool:
    """A helper whose statements only compute matched values and return one."""
    body = list(helper.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if not body or not isinstance(body[-1], ast.Return):
        return False
    if any(not isinstance(statement, (ast.Assign, ast.Return)) for statement in body):
        return False
    return all(
        any(contains(m, node) for m in matched)
        for statement in body
        for node in ast.walk(statement)
        if isinstance(node, ast.Call)
    )


def _read_in_range_loops(blocks: Blocks, wrapped: list[ast.stmt]) -> set[str]:
    """Names read by a loop around the range (a later iteration reads them again)."""
    found: set[str] = set()
    parent = blocks.block_of(wrapped[0])[2]
    while parent is not None:
        if isinstance(parent, (ast.For, ast.AsyncFor, ast.While)):
            found |= read_names(parent)
        parent = blocks.block_of(parent)[2] if id(parent) in blocks.where else None
    return found


def _changed_before_read(
    site: Site,
    steps: list,
    holders: list[ast.stmt],
    wrapped: list[ast.stmt],
    guard: PatternStep | None,
    body: tuple,
) -> set[str]:
    """Names the kernel arm reads whose value the range changes before its matched call reads
    them (a name of the rule's text, ``self``, must not change anywhere in the range)."""
    used = {
        value.name
        for step in (*([guard] if guard else []), *body)
        for arg in step.args
        if isinstance(value := getattr(arg, "value", None), Var)
    }
    changed: set[str] = set()
    for name in used:
        bound = site.bindings.get(name)
        if not isinstance(bound, Operand) or bound.node is None:
            continue
        index = next(
            (i for i, s in enumerate(steps) if any(op is bound for op in s.operands())), None
        )
        if index is None:
            continue
        read_at = steps[index].statement
        holder = next(i for i, s in enumerate(wrapped) if contains(s, holders[index]))
        assigned: set[str] = set()
        for statement in wrapped[: holder + 1]:
            for node in ast.walk(statement):
                if (
                    isinstance(node, ast.Name)
                    and isinstance(node.ctx, ast.Store)
                    and (statement is not wrapped[holder] or node.lineno < read_at.lineno)
                ):
                    assigned.add(node.id)
        changed |= read_names(bound.node) & assigned
    literal_names = {
        value.dotted.split(".")[0]
        for step in (*([guard] if guard else []), *body)
        for value in [step.callee, *(getattr(arg, "value", None) for arg in step.args)]
        if isinstance(value, Name) and not value.dotted.startswith("adopter.")
    }
    return changed | (literal_names & set().union(*(assigned_names(s) for s in wrapped)))


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
