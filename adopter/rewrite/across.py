"""Synthesis of a match that starts at the end of a helper and ends in its caller: two edits,
the helper's and the caller's, that only make sense together (see :func:`plan_across_call`)."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from ..dsl.syntax import Step as PatternStep
from ..dsl.syntax import Var
from ..extract.model import Step as FlowStep
from ..match.matcher import BoundModule, Site
from .checks import (
    check_across_call,
    check_dropped_arguments,
    check_final_outputs,
    check_fresh_name,
    check_hands_over,
    check_helper_returns,
    check_helper_tail,
    check_inputs_stay,
    check_no_extra_arguments,
    check_read_before_changed,
    check_result_followed,
    require,
)
from .render import call_with_keywords, guarded_return
from .source import assigned_names, is_plain_assignment, names_in

if TYPE_CHECKING:
    from .plan import Plan, Planner


def plan_across_call(planner: Planner, site: Site, replacement: tuple[PatternStep, ...]) -> Plan:
    """Fuse a match whose first computation ends a helper (``MLP.forward`` returns
    ``self.dropout(h)``) and whose rest runs in the caller (``ln_2(n + self.mlp(n))``).

    The helper gains keyword-only parameters, ``None`` by default, for the caller's values
    and returns the kernel's result when they are given; every other caller still runs the
    original code. When several callers match, each passes its own values to the one
    edited helper. The caller passes them and drops the computations the kernel took over::

        def forward(self, x, *, residual=None, norm=None):
            h2 = self.c_proj(self.act(self.c_fc(x)))
            if norm is not None:
                return dropout_add_layer_norm(h2, residual, self.dropout, norm)
            return self.dropout(h2)

        h = self.mlp(n, residual=n, norm=self.ln_2)
    """
    from .plan import Plan

    steps = site.steps
    pattern = site.rule.forward.steps  # type: ignore[union-attr]
    held = _held_by_helper(steps)
    require(check_across_call(steps, held, replacement))
    inner, outer = steps[:held], steps[held:]
    helper, caller = inner[0].function, outer[0].function
    assert helper is not None and caller is not None
    (new_step,) = replacement
    require(check_final_outputs(site, new_step))
    require(check_no_extra_arguments(site, planner.render.forward_rest(pattern[-1], steps[-1])))
    require(check_dropped_arguments(planner.source, site, pattern, new_step, len(pattern) - 1))
    insert_at = _helper_tail(helper, inner)
    require(check_read_before_changed(site, inner))
    found = _helper_call(planner, caller, inner[-1], outer[0])
    require(check_result_followed(found))
    call, call_statement = found  # type: ignore[misc]
    handed = _handed_over(site, new_step, helper, inner)
    require(check_hands_over(handed))
    helper_plan, kernel_call = _helper_plan(planner, site, new_step, helper, insert_at, handed)

    caller_plan = Plan(site=site, function=caller)
    values = {
        name: planner.render.value(Var(variable), site, caller_plan, None)
        for variable, name in handed.items()
    }
    call_text = call_with_keywords(planner.source, call, values)
    planner.fuse_through_call(caller_plan, site, inner[-1], call, call_statement, outer, call_text)
    caller_plan.companions.append(helper_plan)
    caller_plan.summary = (
        f"{caller_plan.summary}; {helper.name}() returns {kernel_call} when given "
        + ", ".join(handed.values())
    )
    return caller_plan


def _helper_plan(
    planner: Planner,
    site: Site,
    new_step: PatternStep,
    helper: ast.FunctionDef,
    insert_at: ast.stmt,
    handed: dict[str, str],
) -> tuple[Plan, str]:
    """The helper's edit: it returns the kernel's result, before ``insert_at``, when the
    caller hands over its values (``handed``: variable -> parameter); and the kernel call."""
    from .plan import Plan

    pattern = site.rule.forward.steps  # type: ignore[union-attr]
    helper_plan = Plan(site=site, function=helper)
    planner.render.var_text = dict(handed)
    try:
        kernel_call = planner.render.call(new_step, site, helper_plan, pattern[-1], site.steps[-1])
    finally:
        planner.render.var_text = {}
    require(check_inputs_stay(helper, planner.render.moved_calls, insert_at))
    planner.render.moved_calls = []
    guard = next(
        (handed[n] for n in handed if isinstance(site.bindings.get(n), BoundModule)),
        next(iter(handed.values())),
    )
    helper_plan.insert_before.append((insert_at, guarded_return(guard, kernel_call)))
    helper_plan.keyword_parameters = list(handed.values())
    helper_plan.touched.append(insert_at)
    helper_plan.statements.extend([helper, insert_at])  # type: ignore[list-item]
    helper_plan.instance_of = site
    return helper_plan, kernel_call


def _helper_call(
    planner: Planner, caller: ast.FunctionDef, inner: FlowStep, consumer: FlowStep
) -> tuple[ast.Call, ast.stmt] | None:
    """The call of the helper in the caller, and the statement that holds it (``None``: the
    helper's result reaches ``consumer`` in a way not followed)."""
    operand = next(
        (o for o in consumer.operands() if any(flow.value == inner.output for flow in o.flows)),
        None,
    )
    if operand is None or operand.node is None:
        return None
    node = operand.node
    if isinstance(node, ast.Call):
        return node, planner.statement_containing(caller, node)
    if not isinstance(node, ast.Name) or consumer.statement is None:
        return None
    blocks = planner.blocks(caller)
    holder: ast.stmt | None = consumer.statement
    while holder is not None:  # the nearest assignment before it, in its block or around
        body, index, parent, _ = blocks.block_of(holder)
        for statement in reversed(body[:index]):
            if node.id not in assigned_names(statement):
                continue
            if (
                isinstance(statement, ast.Assign)
                and isinstance(statement.value, ast.Call)
                and is_plain_assignment(statement, statement.value)
                and statement.targets[0].id == node.id  # type: ignore[attr-defined]
            ):
                return statement.value, statement
            return None
        holder = parent if isinstance(parent, ast.If) else None
    return None


def _held_by_helper(steps: list[FlowStep]) -> int:
    """How many of the first matched steps run in the function of the first, inlined alike."""
    helper, chain = steps[0].function, steps[0].inline_chain
    held = 0
    while held < len(steps) and steps[held].function is helper:
        if steps[held].inline_chain != chain:
            break
        held += 1
    return held


def _helper_tail(helper: ast.FunctionDef, steps: list[FlowStep]) -> ast.stmt:
    """The statement before which the helper can return the kernel's result: the first of
    the matched statements, when they end the helper and it returns the last one's value."""
    require(check_helper_returns(helper, steps[-1].node))
    statements = [step.statement for step in steps]
    first = next((i for i, s in enumerate(helper.body) if s is statements[0]), None)
    require(check_helper_tail(helper, statements, first))
    return helper.body[first]  # type: ignore[index]


def _handed_over(
    site: Site, new_step: PatternStep, helper: ast.FunctionDef, inner: list[FlowStep]
) -> dict[str, str]:
    """The replacement's inputs the caller must hand to the helper, and under which names."""
    taken = names_in(helper)
    handed: dict[str, str] = {}
    for arg in new_step.args:
        value = getattr(arg, "value", None)
        if not isinstance(value, Var) or _bound_in(site, value.name, inner):
            continue
        name = value.name if value.name not in taken else f"fused_{value.name}"
        require(check_fresh_name(name, taken, "helper"))
        handed[value.name] = name
    return handed


def _bound_in(site: Site, variable: str, steps: list[FlowStep]) -> bool:
    """Whether a matched value or module belongs to one of ``steps``."""
    bound = site.bindings.get(variable)
    if isinstance(bound, BoundModule):
        return any(step.module == bound.path for step in steps)
    return any(operand is bound for step in steps for operand in step.operands())
