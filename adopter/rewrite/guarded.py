"""Synthesis of a replacement that takes over whole statements: a guarded replacement (the
kernel where a run-time test allows it, the original statements everywhere else) and a rule of
``scope: "block"`` (the kernel in place of the statements, on every path through them).

A rule whose kernel is only right in some situations decided at run time (``=> if
kernel.applies(...) { ... }``) is rewritten by wrapping the matched statements, unchanged, in
the ``else`` arm of an ``if`` whose test is the guard call and whose body runs the kernel::

    if fused_loss_applies(self, labels, self.loss_function, **kwargs):
        logits = None
        loss = causal_lm_loss(hidden_states, self.lm_head, labels, self.config.vocab_size, **kwargs,
                              loss_function=self.loss_function)
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
from ..extract.model import Operand
from ..extract.model import Step as FlowStep
from ..match.matcher import Site
from .checks import (
    CONTROL_STATEMENTS,
    check_arguments_unchanged,
    check_arm_reads_unchanged,
    check_arm_sets_what_is_read,
    check_assigned_plainly,
    check_constant_not_returned_over,
    check_helper_called_once,
    check_helper_result_named,
    check_in_block,
    check_inlined_alike,
    check_inlined_through_wrappers,
    check_matched_on_every_path,
    check_one_copied_helper,
    check_one_root,
    check_only_matched_work,
    check_renderable_step,
    check_return_kept,
    check_return_last,
    check_statements_matched,
    check_targets_named,
    check_whole_lines,
    require,
    step_expression,
)
from .inline import InlinedHelper, module_helper
from .source import (
    Blocks,
    assigned_names,
    contains,
    free_reads,
    has_call,
    mutated_names,
    read_names,
)

if TYPE_CHECKING:
    from .plan import Plan, Planner


class AlreadyPatched(Exception):
    """The site is the original code kept in the ``else`` arm of its own guard: nothing to do
    (not a skipped site)."""


def plan_guarded(planner: Planner, site: Site, guard: PatternStep | None, body: tuple) -> Plan:
    from .plan import Plan

    steps = site.steps
    pattern = site.rule.forward.steps  # type: ignore[union-attr]
    require(check_statements_matched(steps))
    function, holders, helper_calls, inlined = _root_and_holders(planner, site, steps)
    plan = Plan(site=site, function=function)
    blocks = planner.blocks(function)
    wrapped = _wrapped_range(planner, blocks, steps, holders, guard)
    matched_nodes = [step_expression(s) for s in steps] + helper_calls
    final_return = wrapped[-1] if isinstance(wrapped[-1], ast.Return) else None
    module_text = inlined.module_text if inlined is not None else None
    planner.render.var_text = dict(inlined.var_text) if inlined is not None else {}
    in_range = frozenset(assigned_names(ast.Module(body=wrapped, type_ignores=[])))
    decided: list[ast.expr] = []
    if guard is None:
        decided = [step_expression(s) for s in site.where_steps if s.node is not None]
        conditions, var_text, name_text = _optional_under_conditions(
            planner, site, wrapped, matched_nodes, in_range
        )
        decided += conditions
        planner.render.var_text.update(var_text)
        planner.render.name_text = name_text
    # ``x = (attn @ v).transpose(1, 2)``: the last statement is kept around the kernel call
    kept = (
        _kept_around(steps[-1], wrapped[-1], wrapped[:-1])
        if guard is None and inlined is None
        else None
    )
    try:
        lines, bound = _kernel_arm(planner, site, plan, body, final_return, inlined, function, kept)
        guard_text = (
            planner.render.call(
                guard, site, plan, pattern[-1], steps[-1], module_text, unbound=in_range
            )
            if guard
            else "True"
        )
    finally:
        planner.render.var_text = {}
        planner.render.name_text = {}
    # ``loss_fct = CrossEntropyLoss()`` among them: a matched module built where it is used;
    # and what the kernel arm reads that the range computes from outside the match (the cap
    # read from the configuration), which the kernel arm computes first too
    if guard is None:
        require(check_matched_on_every_path(wrapped, matched_nodes, decided + matched_nodes))
    setups = _setups(planner, wrapped, matched_nodes, lines, guard_text, blocks, holders)
    allowed = matched_nodes + _modules_built_in(site, function) + [n for _, _, n in setups]
    copies: list[int] = []
    if guard is not None:
        # the kernel arm runs where the guard holds, on each path it takes
        decided_here = matched_nodes + [n for _, _, n in setups]
        given = _given_inputs(site)
        require(check_matched_on_every_path(wrapped, matched_nodes, decided_here, given))
        arm_lines = [*(inlined.lines if inlined is not None else []), *lines]
        copies = _apart_from_match(
            function, wrapped, allowed, arm_lines, guard_text, setups, len(lines)
        )
    require(
        check_only_matched_work(
            planner.source,
            [s for i, s in enumerate(wrapped) if i not in copies],
            allowed,
            final_return,
            guarded=guard is not None,
            kept=kept,
        )
    )
    lines = [f"{name} = {planner.source.segment(value)}" for name, value, _ in setups] + lines
    bound |= {name for name, _, _ in setups}
    bound |= set().union(set(), *(assigned_names(wrapped[i]) for i in copies))
    plan.wrap_copies = (tuple(copies), len(setups) + len(inlined.lines if inlined else []))
    plan.reopens = bool(copies)  # the kernel arm's copies may hold other sites
    if inlined is not None:  # the copied statements read the call's arguments where it ran
        holder = planner.statement_containing(function, inlined.call)
        require(check_arguments_unchanged(wrapped, holder, inlined.call))
        lines = [*inlined.lines, *lines]
        bound |= inlined.bound
        plan.reopens |= bool(inlined.lines)  # the copied statements may hold other sites
    planner.render.moved_calls = []  # arguments are evaluated where the range began: the same
    require(check_arm_sets_what_is_read(function, wrapped, bound, blocks))
    computed = frozenset(name for name, _, _ in setups)
    require(check_arm_reads_unchanged(site, holders, wrapped, guard, body, computed))

    outer = planner.source.indentation(function.lineno)
    inner = planner.source.indentation(function.body[0].lineno)
    plan.wrap = (wrapped, guard_text if guard else None, lines, inner[len(outer) :] or "    ")
    plan.statements.extend(wrapped)
    plan.touched.extend(matched_nodes)
    plan.summary = f"{planner.source.segment(matched_nodes[-1])} -> " + (
        f"if {guard_text}: ..." if guard else "; ".join(lines)
    )
    return plan


def _optional_under_conditions(
    planner: Planner,
    site: Site,
    wrapped: list[ast.stmt],
    matched: list[ast.expr],
    bound: frozenset[str],
) -> tuple[list[ast.expr], dict[str, str], dict[str, str]]:
    """``if self.with_scale: out = out * self.weight.float()`` (Gemma 3n, Gemma 4): an ``if``
    of the range, without ``else``, whose arm holds only matched work reading an input the rule
    declares optional (the kernel reads ``None`` as absent) and nothing else of the match. The
    kernel is handed ``self.weight if self.with_scale else None``, so its test must be safe to
    evaluate there instead: no call, nothing the range binds (``bound``). Returns the tests so
    decided and the text of each optional variable and name."""
    optional = site.rule.optional
    if not optional:
        return [], {}, {}
    conditions: list[ast.expr] = []
    var_text: dict[str, str] = {}
    name_text: dict[str, str] = {}
    for branch in (s for s in wrapped if isinstance(s, ast.If) and not s.orelse):
        test = branch.test
        inside = [m for m in matched if any(contains(part, m) for part in branch.body)]
        if not inside or has_call(test) or read_names(test) & bound:
            continue
        if any(contains(test, m) for m in matched):
            continue
        texts: dict[str, str] = {}
        for entry in optional:
            node = _optional_node(site, entry, inside)
            if node is not None:
                texts[entry] = planner.source.segment(node)
        read_elsewhere = any(
            _optional_node(site, entry, [m for m in matched if m not in inside]) is not None
            for entry in texts
        )
        if not texts or read_elsewhere:
            continue
        condition = planner.source.segment(test)
        for entry, text in texts.items():
            chosen = f"{text} if {condition} else None"
            if entry.startswith("$"):
                var_text[entry[1:]] = chosen
            else:
                name_text[entry] = chosen
        conditions.append(test)
    return conditions, var_text, name_text


def _given_inputs(site: Site) -> frozenset[str]:
    """The dumps of the expressions bound to the rule's ``given:`` inputs (``labels``)."""
    nodes = (getattr(site.bindings.get(name), "node", None) for name in site.rule.given)
    return frozenset(ast.dump(node) for node in nodes if node is not None)


def _optional_node(site: Site, entry: str, matched: list[ast.expr]) -> ast.expr | None:
    """Where one of ``matched`` reads an optional input: its bound operand for ``$var``, the
    spelled-out name (``self.weight``) otherwise."""
    if entry.startswith("$"):
        value = site.bindings.get(entry[1:])
        node = getattr(value, "node", None)
        if isinstance(value, Operand) and node is not None:
            return node if any(contains(m, node) for m in matched) else None
        return None
    for m in matched:
        for node in ast.walk(m):
            if isinstance(node, (ast.Name, ast.Attribute)) and ast.unparse(node) == entry:
                return node  # type: ignore[return-value]
    return None


def _setups(
    planner: Planner,
    wrapped: list[ast.stmt],
    matched: list[ast.expr],
    lines: list[str],
    guard_text: str,
    blocks: Blocks,
    holders: list[ast.stmt],
) -> list[tuple[str, ast.expr, ast.AST]]:
    """The values the range binds, outside the match, that the kernel arm reads (T5Gemma's
    ``decoder_config = self.get_decoder().config``, Gemma 3n's ``(cap := ...) is not None``,
    Canary's ``shift_labels = kwargs.pop("shift_labels", labels)`` just before the loss):
    each a name bound once in the range, by an assignment of its own or a ``:=`` in a
    condition, from nothing the range assigns before it and nothing the match computes, so the
    kernel arm can compute it first. An assignment may sit in the range's top level or in the
    block of a matched statement, before it: it runs whenever that statement runs, and the
    kernel arm stands for a run of every matched statement. Each comes as (name, value, node
    the checks allow)."""
    read = set().union(set(), *(read_names(ast.parse(line)) for line in lines))
    guard_reads = read_names(ast.parse(guard_text, mode="eval"))
    stores = [
        n
        for s in wrapped
        for n in ast.walk(s)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    ]
    bound = [n.id for n in stores]
    statements = list(wrapped)
    for holder in holders:
        if not any(holder is s for s in wrapped) and any(contains(s, holder) for s in wrapped):
            body, index, _, _ = blocks.block_of(holder)
            statements += [s for s in body[:index] if not any(s is t for t in statements)]
    found: list[tuple[str, ast.expr, ast.AST]] = []
    for statement in statements:
        candidates: list[tuple[str, ast.expr, ast.AST]] = []
        if (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ):
            candidates.append((statement.targets[0].id, statement.value, statement.value))
        if any(statement is s for s in wrapped):  # a nested statement's are walked already
            for node in ast.walk(statement):
                if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
                    candidates.append((node.target.id, node.value, node))
        start = (statement.lineno, statement.col_offset)
        before = {n.id for n in stores if (n.lineno, n.col_offset) < start}
        for name, value, node in candidates:
            if (
                name in read
                and name not in guard_reads
                and bound.count(name) == 1
                and not read_names(value) & before
                and not any(contains(value, m) or contains(m, value) for m in matched)
            ):
                found.append((name, value, node))
    return sorted(found, key=lambda setup: (setup[2].lineno, setup[2].col_offset))  # type: ignore[attr-defined]


def _apart_from_match(
    function: ast.FunctionDef,
    wrapped: list[ast.stmt],
    matched: list[ast.expr],
    arm_lines: list[str],
    guard_text: str,
    setups: list[tuple[str, ast.expr, ast.AST]],
    kernel_lines: int,
) -> list[int]:
    """The statements of a guarded range that take no part in the match, which the kernel arm
    runs first, as written (GPT-2's and OpenAI GPT's double-heads models compute the
    multiple-choice head and its loss between the LM head and the LM loss): the positions in
    ``wrapped`` of top-level statements that hold no matched node, no ``return`` or other jump,
    read nothing an earlier statement of the range binds or changes, and bind or change
    nothing a later one reads before binding it, nor anything the guard, the setups or the
    kernel arm's lines read or bind. Moved ahead of the matched calls their values are the
    same (the matched calls are the head and the loss, which change nothing). A statement that
    computes nothing (``mc_loss = None``) is taken when it sets a name the kernel arm does not
    and a taken statement or the code after the range reads it; otherwise it stays out, as
    before (``loss = None`` is set again by the kernel arm)."""
    arm_reads = read_names(ast.parse(guard_text, mode="eval")) | {
        name for _, value, _ in setups for name in read_names(value)
    }
    # names bound before the copies (setups, a copied submodule's work) and after (the kernel)
    early_binds = {name for name, _, _ in setups}
    late_binds: set[str] = set()
    for position, line in enumerate(arm_lines):
        tree = ast.parse(line)
        arm_reads |= read_names(tree)
        (early_binds if position < len(arm_lines) - kernel_lines else late_binds).update(
            assigned_names(tree)
        )
    changed = [assigned_names(s) | mutated_names(s) for s in wrapped]
    chosen = {
        i
        for i, statement in enumerate(wrapped)
        if not any(contains(statement, node) for node in matched)
        and not any(isinstance(n, _JUMPS) for n in ast.walk(statement))
    }
    settled = False
    while not settled:  # dropping one may make another unsafe: until none is dropped
        settled = True
        for index in sorted(chosen):
            rest = [j for j in range(len(wrapped)) if j not in chosen]
            before = set().union(set(), *(changed[j] for j in rest if j < index))
            after = free_reads([wrapped[j] for j in rest if j > index])
            if free_reads([wrapped[index]]) & (before | early_binds) or changed[index] & (
                after | arm_reads | early_binds
            ):
                chosen.discard(index)
                settled = False
    computing = [i for i in sorted(chosen) if not _sets_constants_only(wrapped[i])]
    if not computing:
        return []
    outside = read_names(function) - set().union(*(read_names(s) for s in wrapped))
    read_by_copies = set().union(*(read_names(wrapped[i]) for i in computing))
    set_by_copies = set().union(*(changed[i] for i in computing))
    constants = [
        i
        for i in sorted(chosen)
        if i not in computing
        and (changed[i] & read_by_copies or (changed[i] - late_binds) & (outside | set_by_copies))
    ]
    return sorted(computing + constants)


# Statements a copy ahead of the matched calls could not keep in their place.
_JUMPS = (
    *CONTROL_STATEMENTS,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Lambda,
)


def _sets_constants_only(statement: ast.stmt) -> bool:
    """``mc_loss = None``, ``lm_loss, mc_loss = None, None``."""
    if not isinstance(statement, ast.Assign):
        return False
    value = statement.value
    parts = value.elts if isinstance(value, ast.Tuple) else [value]
    return all(isinstance(part, ast.Constant) for part in parts)


def _wrapped_range(
    planner: Planner,
    blocks: Blocks,
    steps: list[FlowStep],
    holders: list[ast.stmt],
    guard: PatternStep | None,
) -> list[ast.stmt]:
    """Every statement of one block from the one holding the first matched call to the one
    holding the last."""
    block, first_index, parent, field = blocks.block_of(holders[0])
    last_index = first_index
    for step, statement in zip(steps, holders, strict=True):
        holder = next((i for i, s in enumerate(block) if contains(s, statement)), None)
        require(check_in_block(step, holder, first_index))
        last_index = max(last_index, holder)  # type: ignore[type-var]
    require(check_whole_lines(planner.source, block, first_index, last_index))
    if guard is not None and _inside_own_guard(planner, parent, field, guard):
        raise AlreadyPatched("already guarded by its kernel (patched before)")
    return block[first_index : last_index + 1]


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


def _kernel_arm(
    planner: Planner,
    site: Site,
    plan: Plan,
    body: tuple[PatternStep, ...],
    final_return: ast.Return | None,
    inlined: InlinedHelper | None = None,
    function: ast.FunctionDef | None = None,
    kept: ast.stmt | None = None,
) -> tuple[list[str], set[str]]:
    """The kernel arm's lines, each target bound to the name its producer's statement
    assigns (a value a copied submodule returns: the name its call is assigned to), and the
    names they bind; the last step's call in place of its matched value in ``kept`` (see
    :func:`_kept_around`) when that statement holds it."""
    pattern = site.rule.forward.steps  # type: ignore[union-attr]
    producer = {t.name: (p, s) for p, s in zip(pattern, site.steps, strict=True) for t in p.targets}
    module_text = inlined.module_text if inlined is not None else None
    lines: list[str] = []
    bound: set[str] = set()
    for new_step in body:
        require(check_targets_named(new_step, producer))
        if kept is not None and new_step is body[-1] and len(new_step.targets) == 1:
            pattern_step, step = producer[new_step.targets[0].name]
            if step.statement is kept:
                value = planner.render.call(new_step, site, plan, pattern_step, step, module_text)
                lines.append(_with_call_in_place(planner, kept, step_expression(step), value))
                bound.update(assigned_names(kept))
                continue
        names = [
            _bound_name(producer[t.name][1], final_return, planner, inlined, function)
            for t in new_step.targets
        ]
        require(check_return_last(names, new_step, body))
        require(check_renderable_step(new_step))
        if isinstance(new_step.callee, Literal):
            value = repr(new_step.callee.value)
        else:
            pattern_step, step = producer[new_step.targets[-1].name]
            value = planner.render.call(new_step, site, plan, pattern_step, step, module_text)
        name = ", ".join(names)
        lines.append(f"return {value}" if names == ["return"] else f"{name} = {value}")
        bound.update(names)
    require(check_return_kept(final_return, lines))
    return _constants_after_their_readers(lines), bound


def _constants_after_their_readers(lines: list[str]) -> list[str]:
    """The kernel arm with each constant binding (``logits = None``) moved after the last arm
    line that reads its name: what the arm reads is the value from before the range, and a head
    may read its input from the name its output gets (DistilBERT's masked-LM head, ``x =
    self.vocab_projector(x)``: ``x = None`` first would hand the loss kernel ``None``)."""
    arm = [(line, _one_statement(line)) for line in lines]
    for entry in list(arm):
        statement = entry[1]
        if not (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)):
            continue
        names = {target.id for target in statement.targets if isinstance(target, ast.Name)}
        at = arm.index(entry)
        readers = [
            i
            for i, (_, other) in enumerate(arm)
            if i > at and other is not None and names & read_names(other)
        ]
        if not readers:
            continue
        require(check_constant_not_returned_over(names, arm[readers[-1]][1]))
        arm.insert(readers[-1], arm.pop(at))  # the readers move up by one
    return [line for line, _ in arm]


def _one_statement(line: str) -> ast.stmt | None:
    try:
        body = ast.parse(line.strip()).body
    except SyntaxError:
        return None
    return body[0] if len(body) == 1 else None


def _kept_around(step: FlowStep, statement: ast.stmt, earlier: list[ast.stmt]) -> ast.stmt | None:
    """``statement`` when the matched value of ``step`` is the head of the receiver chain of a
    one-line statement's value, as ``attn @ v`` in ``x = (attn @ v).transpose(1, 2).reshape(
    B, N, C)``: evaluated before anything else of it, so the statement may stay as written with
    the kernel call in its place, provided the rest of it reads nothing the ``earlier``
    statements of the range bind (they are gone from the kernel arm). ``None`` otherwise (a
    plain ``name = value`` or ``return value`` needs no keeping)."""
    node = step_expression(step)
    if step.statement is not statement or statement.lineno != statement.end_lineno:
        return None
    if not isinstance(statement, (ast.Assign, ast.Return)) or statement.value is node:
        return None
    current = statement.value
    while current is not node:
        if isinstance(current, ast.Call) and isinstance(current.func, ast.Attribute):
            current = current.func.value
        elif isinstance(current, (ast.Attribute, ast.Subscript)):
            current = current.value
        else:
            return None
    inside = {id(part) for part in ast.walk(node)}
    read_around = {
        part.id
        for part in ast.walk(statement.value)  # type: ignore[arg-type]
        if isinstance(part, ast.Name) and id(part) not in inside
    }
    if read_around & set().union(set(), *(assigned_names(s) for s in earlier)):
        return None
    return statement


def _with_call_in_place(planner: Planner, statement: ast.stmt, node: ast.expr, call: str) -> str:
    """The one-line ``statement`` as written, with ``call`` where ``node`` stands."""
    line = statement.lineno
    start = planner.source.char_column(line, statement.col_offset)
    text = planner.source.segment(statement)
    first = planner.source.char_column(line, node.col_offset) - start
    last = planner.source.char_column(line, node.end_col_offset) - start  # type: ignore[arg-type]
    return text[:first] + call + text[last:]


def _bound_name(
    step: FlowStep,
    final_return: ast.Return | None,
    planner: Planner | None = None,
    inlined: InlinedHelper | None = None,
    function: ast.FunctionDef | None = None,
) -> str:
    """The name the matched statement of ``step`` binds its value to (``return``: returned);
    for the value a copied submodule returns, the name its call's result is bound to."""
    if inlined is not None and step.function is not function:
        assert planner is not None and function is not None
        holder = planner.statement_containing(function, inlined.call)
        require(check_helper_result_named(step, inlined.result_of, holder, inlined.call))
        return holder.targets[0].id  # type: ignore[attr-defined]
    node = step_expression(step)
    if step.statement is final_return and final_return.value is node:  # type: ignore[union-attr]
        return "return"
    require(check_assigned_plainly(step))
    statement = step.statement
    if isinstance(statement, ast.Assign):
        return statement.targets[0].id  # type: ignore[attr-defined]
    return statement.target.id  # type: ignore[union-attr]


def _root_and_holders(
    planner: Planner, site: Site, steps: list[FlowStep]
) -> tuple[ast.FunctionDef, list[ast.stmt], list[ast.expr], InlinedHelper | None]:
    """The function the replacement edits, the statement of it that runs each matched step,
    the calls of helpers whose matched steps it runs, and the submodule whose work before the
    match the kernel arm copies (see :mod:`.inline`), if any.

    All steps in one function: that function and their statements. Otherwise the function of
    the steps inlined least deep, and for a step in a helper it calls (``self._norm(x)``), the
    statement holding the one call of that helper; a helper must be called once there, lie one
    call deeper, and do nothing but matched work (so the replacement may skip its call), or be
    a submodule's ``forward`` whose work before the match the kernel arm can copy."""
    shallow = min(len(s.inline_chain) for s in steps)
    roots = {id(s.function): s.function for s in steps if len(s.inline_chain) == shallow}
    require(check_one_root(roots))  # type: ignore[arg-type]
    (function,) = roots.values()
    chain = next(s.inline_chain for s in steps if s.function is function)
    matched = [step_expression(s) for s in steps]
    holders: list[ast.stmt] = []
    calls: dict[int, ast.expr] = {}
    inlined: InlinedHelper | None = None
    for step in steps:
        require(check_inlined_alike(step, function, shallow, chain))  # type: ignore[arg-type]
        if step.function is function:
            holders.append(step.statement)  # type: ignore[arg-type]
            continue
        helper = step.function
        assert helper is not None
        call = calls.get(id(helper))
        if call is None:
            deeper = len(step.inline_chain) > shallow + 1  # through delegating forwards
            sites = [] if deeper else _calls_of(function, helper)  # type: ignore[arg-type]
            copied = (
                None if sites else module_helper(planner.source, site, function, helper)  # type: ignore[arg-type]
            )
            if deeper:
                require(check_inlined_through_wrappers(helper, copied))
            if copied is not None:
                require(check_one_copied_helper(helper, inlined))
                inlined = copied
                call = calls[id(helper)] = copied.call
            else:
                require(check_helper_called_once(helper, sites, matched))
                call = calls[id(helper)] = sites[0]
        holders.append(planner.statement_containing(function, call))  # type: ignore[arg-type]
    return function, holders, list(calls.values()), inlined  # type: ignore[return-value]


def _calls_of(function: ast.FunctionDef, helper: ast.FunctionDef) -> list[ast.Call]:
    """The calls of ``helper`` in ``function``, by its name or as a method of ``self``."""
    return [
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
