"""Synthesis across the arms of a branch (paper Fig. 4) for a kernel with several results.

``q = self.q_proj(h) * s`` before an ``if``/``elif``/``else`` chain whose arms compute
``k = self.k_proj(h)`` and ``v = self.v_proj(h)`` (or take them from a cache): no single place
holds the three projections. The statements before the chain that the match shares are copied
to the start of every arm (an ``else:`` is added when there is none), so each path still runs
them exactly once, where it did, just after the conditions; in each arm that holds the rest of
a match, the copy becomes the fused call and the arm's projections read its results. Arms that
do not reach the match keep the plain copy.

The mirror image, the keys and values projected in the arms and the query after the chain
(BLIP-2's and UMT5's attention), copies the shared statements to the *end* of every arm that
falls through (an arm that returns or raises never ran them); a fused arm opens with the fused
call and ends with the copies, reading its results.

Copying is allowed only when it cannot change what runs: the conditions call nothing and read
nothing the copied statement sets (before the chain only: after it, the copies still run after
the conditions), nothing between the statement and the chain depends on it, and in a fused arm
nothing before the last projection changes an input or uses a result (with the shared
statements after the chain: nothing in the whole arm changes an input, as they ran after it).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..match.matcher import Site
from .checks import (
    check_arm_chain,
    check_arm_keeps_inputs,
    check_between,
    check_between_untouched,
    check_carried,
    check_chain_conditions,
    check_dropped_arguments,
    check_fresh_name,
    check_inputs_kept,
    check_one_result_each,
    check_one_spelling,
    check_simple_statement,
    check_sinkable_past,
    check_some_arm_fuses,
    input_names,
    require,
    spelling_names,
    spellings_made_one,
    step_expression,
)
from .render import tuple_assignment
from .source import (
    assigned_names,
    chain_arms,
    encloses,
    is_plain_assignment,
    names_in,
    outer_block,
    read_names,
)

if TYPE_CHECKING:
    from .plan import Plan, Planner


@dataclass
class ArmStart:
    """A statement that starts a fused arm: ``text`` alone (a new statement), or a copy of
    ``copy_of`` with its body replaced by ``text`` (``node`` is ``None``) or with ``node``
    replaced by the name ``text``."""

    text: str
    copy_of: ast.stmt | None = None
    node: ast.expr | None = None
    at_end: bool = False  # a copy of a statement after the chain closes the arm instead
    plain: bool = False  # an unchanged copy of ``copy_of``


@dataclass
class Spread:
    """Statements moved from before ``branch`` to the start of each arm of its ``if``/``elif``
    chain (arm 0 is the ``if`` body, the last arm the ``else``, added when missing), or with
    ``after`` from after it to the end of each arm that falls through; the arms in ``fused``
    have their statements instead of the copies."""

    moved: list[ast.stmt]
    branch: ast.If
    arms: int
    has_else: bool
    fused: dict[int, list[ArmStart]] = field(default_factory=dict)
    after: bool = False
    # arms that end in a return, raise or loop jump: a statement after the chain never ran there
    closed: set[int] = field(default_factory=set)
    # the statements of ``moved`` that use what the shared ones set: copied into every arm
    carried: list[ast.stmt] = field(default_factory=list)
    # the statements of ``moved`` that followed the chain: their copies close the arms
    late: list[ast.stmt] = field(default_factory=list)


def plan_tuple_across_arms(
    planner: Planner,
    site: Site,
    plan: Plan,
    targets: list[str],
    producer_of: dict[str, int],
) -> Plan:
    """The Fig. 4 plan of a several-results site whose statements sit in different blocks."""
    blocks = planner.blocks(plan.function)
    matches = [site, *site.alternatives]
    statements_of = [
        [match.steps[producer_of[target]].statement for target in targets] for match in matches
    ]
    require(check_arm_chain(planner.source, blocks, statements_of))
    block = outer_block(blocks, statements_of[0])  # type: ignore[arg-type]
    assert block is not None
    shared = [s for s in statements_of[0] if blocks.block_of(s)[0] is block]  # type: ignore[arg-type]
    rest = [s for s in statements_of[0] if not any(s is m for m in shared)]
    branch = next(s for s in block if encloses(s, rest[0]))  # type: ignore[arg-type]
    assert isinstance(branch, ast.If)
    after = blocks.block_of(shared[0])[1] > block.index(branch)  # type: ignore[arg-type]
    tests, bodies = chain_arms(planner.source.lines, branch)
    inputs = input_names(site)
    if after:
        shared.sort(key=lambda s: blocks.block_of(s)[1])  # type: ignore[arg-type]
        for statement in shared:
            between = list(blocks.between(branch, statement))
            require(check_sinkable_past(statement, between, shared))  # type: ignore[arg-type]
    carried: list[ast.stmt] = []
    if not after:
        # statements between the shared ones and the chain that use what they set (the
        # query's norm, rotary, transpose) move with them, in order
        carried = _carried(blocks, shared, branch)  # type: ignore[arg-type]
        moved = sorted([*shared, *carried], key=lambda s: blocks.block_of(s)[1])  # type: ignore[arg-type]
        for statement in carried:
            require(check_carried(statement, inputs))
        for statement in moved:
            require(check_between(statement, branch, moved, inputs, blocks))  # type: ignore[arg-type]
        require(check_chain_conditions(tests, moved))  # type: ignore[arg-type]
    spread = Spread(
        moved=sorted([*shared, *carried], key=lambda s: blocks.block_of(s)[1]),  # type: ignore[arg-type]
        carried=carried,
        branch=branch,
        arms=len(bodies),
        has_else=bool(bodies[-1]),
        after=after,
        closed=closed_arms(bodies),
        late=list(shared) if after else [],  # type: ignore[arg-type]
    )
    pattern = site.rule.forward.steps  # type: ignore[union-attr]
    (new_step,) = site.rule.forward.replacement  # type: ignore[union-attr,misc]
    final_index = max(producer_of[t] for t in targets)
    taken = names_in(plan.function)
    plan.kernel_calls.clear()  # rendered again below, once for each fused arm
    plan.fallback.clear()  # and so are the original arms of their guards
    for match, statements in zip(matches, statements_of, strict=True):
        if match is not site:
            require(check_one_spelling(match))
            require(check_dropped_arguments(planner.source, match, pattern, new_step, final_index))
        call_text = planner.render.call(
            new_step, match, plan, pattern[final_index], match.steps[final_index]
        )
        call_text = planner.identity_guarded(match, plan, call_text, targets, producer_of)
        call_text = planner.condition_guarded(match, plan, call_text, targets, producer_of)
        in_arm = [s for s in statements if not any(s is m for m in shared)]
        arm = next(i for i, body in enumerate(bodies) if any(in_arm[0] is s for s in body))
        body = bodies[arm]
        ordered = sorted(in_arm, key=lambda s: blocks.block_of(s)[1])  # type: ignore[arg-type]
        span = [body[0], *(s for s in ordered if s is not body[0])]
        # every spelling of an input (read by the identity test at the arm's start) stays too
        kept = inputs | spelling_names(site)
        require(check_inputs_kept(blocks, span, kept))  # type: ignore[arg-type]
        if after:  # the shared projections ran after the whole arm, now at its start
            require(check_arm_keeps_inputs(body, kept))
        steps = [match.steps[producer_of[target]] for target in targets]
        # after the chain, the copies keep their place at the arm's end, reading new names
        plain = not after and all(
            is_plain_assignment(step.statement, step_expression(step))  # type: ignore[arg-type]
            for step in steps
        )
        if plain:
            names = [planner.source.segment(s.targets[0]) for s in statements]  # type: ignore[union-attr]
            # a statement among the projections that uses their names (``k = k.view(...)``
            # between ``k = ...`` and ``v = ...``) keeps them: the results get names of their
            # own, which only the input check above needs
            plain = check_between_untouched(blocks, span, set(names) | kept) is None  # type: ignore[arg-type]
        if plain:
            # one statement binds all results: the first copy's line, with its comment
            spread.fused[arm] = [
                ArmStart(tuple_assignment(names, call_text), copy_of=shared[0]),
                *(ArmStart("", copy_of=c, plain=True) for c in carried),
            ]
            plan.delete_statements.extend(ordered)  # type: ignore[arg-type]
        else:
            for step in steps:
                require(check_simple_statement(step))
            names = []
            for target, step in zip(targets, steps, strict=True):
                # after the chain, the query is the match's last step and so bound to the
                # pattern's last name: the projection's own name says what each result is
                base = _module_name(step) if after else None
                base = base if base and base not in names else target
                name = base if base not in taken else f"fused_{base}"
                require(check_fresh_name(name, taken | set(names), "function"))
                names.append(name)
            starts = [ArmStart(tuple_assignment(names, call_text))]
            for step, name in zip(steps, names, strict=True):
                node = step_expression(step)
                if any(step.statement is s for s in shared):
                    starts.append(ArmStart(name, copy_of=step.statement, node=node, at_end=after))
                else:
                    plan.replace_expressions.append((node, name))
            starts += [ArmStart("", copy_of=c, plain=True) for c in carried]
            spread.fused[arm] = _in_source_order(starts, spread.moved)
        plan.touched.extend(in_arm)  # type: ignore[arg-type]
        plan.statements.extend(in_arm)  # type: ignore[arg-type]
    plan.spread = spread
    plan.touched.extend([*spread.moved, branch])
    plan.statements.extend([*spread.moved, branch])
    fused = ", ".join(str(tests[a].lineno) if a < len(tests) else "else" for a in spread.fused)
    place = "the end of" if after else ""
    plan.summary = (
        f"lines {', '.join(str(s.lineno) for s in spread.moved)} copied into {place}"
        f"{' ' if place else ''}{spread.arms} arms of the branch at line {branch.lineno}; "
        f"fused in the arms at {fused}"
    )
    return plan


def plan_tuple_around_branch(
    planner: Planner,
    site: Site,
    plan: Plan,
    targets: list[str],
    producer_of: dict[str, int],
    call_text: str,
) -> Plan | None:
    """The query projected before an ``if`` that may rebind the input (SegFormer's and PVT's
    sequence reduction), the keys and values after it: every arm gets the query at its start
    and the keys and values at its end (an ``else:`` is added when there is none), and each
    arm that keeps the input fuses the three at its start. ``None`` when the statements are not
    laid out so (one ``if`` among them, statements on both sides of it)."""
    blocks = planner.blocks(plan.function)
    steps = [site.steps[producer_of[target]] for target in targets]
    block = blocks.block_of(steps[0].statement)[0]  # type: ignore[arg-type]
    ordered: list[ast.stmt] = []
    for step in steps:
        if not any(step.statement is s for s in ordered):
            ordered.append(step.statement)  # type: ignore[arg-type]
    ordered.sort(key=lambda s: blocks.block_of(s)[1])
    first, last = blocks.block_of(ordered[0])[1], blocks.block_of(ordered[-1])[1]
    others = [s for s in block[first + 1 : last] if not any(s is m for m in ordered)]
    branches = [s for s in others if isinstance(s, ast.If)]
    if len(branches) != 1:
        return None
    branch = branches[0]
    where = block.index(branch)
    early = [s for s in ordered if blocks.block_of(s)[1] < where]
    late = [s for s in ordered if blocks.block_of(s)[1] > where]
    if not early or not late:
        return None
    require(check_one_result_each(ordered, steps))
    tests, bodies = chain_arms(planner.source.lines, branch)
    require(check_chain_conditions(tests, early))
    inputs = input_names(site) | spelling_names(site)
    # the query moves past what stays before the branch; what follows it (the keys' shape)
    # moves into the arms' ends with the keys and values, ahead of them
    for statement in early:
        staying = [s for s in others if blocks.block_of(s)[1] < where]
        require(check_sinkable_past(statement, staying, early))
    post = [s for s in others if blocks.block_of(s)[1] > where]
    for statement in post:
        require(check_carried(statement, inputs))
    closed = closed_arms(bodies)
    fused_arms = [
        i
        for i, body in enumerate(bodies)
        if i not in closed and check_arm_keeps_inputs(body, inputs) is None
    ]
    # an arm that makes the spellings one tensor (diffusers' ``encoder_hidden_states =
    # hidden_states`` when no encoder states are given) fuses at its end, with no identity
    # test: the query moves past the arm's statements, which neither call anything nor touch
    # what it reads or sets
    late_fused = [
        i
        for i, body in enumerate(bodies)
        if i not in closed
        and i not in fused_arms
        and spellings_made_one(body, site)
        and check_arm_keeps_inputs(body, inputs - spelling_names(site)) is None
        and all(check_sinkable_past(s, body, early) is None for s in early)
    ]
    require(check_some_arm_fuses(branch, fused_arms + late_fused))
    taken = names_in(plan.function)
    names: list[str] = []
    for target in targets:
        name = target if target not in taken else f"fused_{target}"
        require(check_fresh_name(name, taken | set(names), "function"))
        names.append(name)
    moved = sorted([*ordered, *post], key=lambda s: blocks.block_of(s)[1])
    spread = Spread(
        moved=moved,
        branch=branch,
        arms=len(bodies),
        has_else=bool(bodies[-1]),
        closed=closed,
        carried=post,
        late=[s for s in moved if blocks.block_of(s)[1] > where],
    )
    for arm in fused_arms + late_fused:
        # an arm fused at its start keeps the identity test; one fused at its end needs none,
        # and every statement it fuses ran before its end
        at_arm_end = arm in late_fused
        text = plan.unguarded_call if at_arm_end else call_text
        starts = [ArmStart(tuple_assignment(names, text), at_end=at_arm_end)]
        for step, name in zip(steps, names, strict=True):
            at_end = at_arm_end or any(step.statement is s for s in late)
            starts.append(
                ArmStart(name, copy_of=step.statement, node=step_expression(step), at_end=at_end)
            )
        starts += [ArmStart("", copy_of=s, plain=True, at_end=True) for s in post]
        spread.fused[arm] = _in_source_order(starts, moved)
    fused_arms = sorted(fused_arms + late_fused)
    plan.kernel_calls[:] = plan.kernel_calls * len(fused_arms)  # the call in each fused arm
    plan.spread = spread
    plan.touched.extend([*moved, branch])
    plan.statements.extend([*moved, branch])
    arms = ", ".join(str(tests[a].lineno) if a < len(tests) else "else" for a in fused_arms)
    plan.summary = (
        f"lines {', '.join(str(s.lineno) for s in early)} copied to the start and "
        f"{', '.join(str(s.lineno) for s in late)} to the end of the {len(bodies)} arms of "
        f"the branch at line {branch.lineno}; fused in the arms at {arms}"
    )
    return plan


def _carried(blocks, shared: list[ast.stmt], branch: ast.If) -> list[ast.stmt]:
    """The statements between the shared ones and the chain that read or rebind what those
    (or one carried before) set: they move into the arms with them."""
    first = min(blocks.block_of(s)[1] for s in shared)
    block = blocks.block_of(shared[0])[0]
    written: set[str] = set()
    carried: list[ast.stmt] = []
    for statement in block[first : block.index(branch)]:
        if any(statement is s for s in shared):
            written |= assigned_names(statement)
            continue
        if (read_names(statement) | assigned_names(statement)) & written:
            carried.append(statement)
            written |= assigned_names(statement)
    return carried


def _module_name(step) -> str | None:
    """``key`` for a step that calls ``self.key(...)``; ``None`` for any other callee."""
    node = step_expression(step)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        owner = node.func.value
        if isinstance(owner, ast.Name) and owner.id == "self":
            return node.func.attr
    return None


def _ends_flow(statement: ast.stmt) -> bool:
    """The arm's last statement leaves it: what follows the chain never runs after it."""
    return isinstance(statement, (ast.Return, ast.Raise, ast.Continue, ast.Break))


def closed_arms(bodies: list[list[ast.stmt]]) -> set[int]:
    """The arms of a chain (``chain_arms``' bodies) that never fall through to what follows."""
    return {i for i, body in enumerate(bodies) if body and _ends_flow(body[-1])}


def _in_source_order(starts: list[ArmStart], shared: list[ast.stmt]) -> list[ArmStart]:
    """The new tuple assignment first, then the copies in the order they had."""
    order = {id(s): i for i, s in enumerate(shared)}
    head = [s for s in starts if s.copy_of is None]
    copies = sorted(
        (s for s in starts if s.copy_of is not None), key=lambda s: order[id(s.copy_of)]
    )
    return head + copies
