"""Synthesis, part one: turn a matched site into concrete source edits, or refuse with a reason.

Edits are planned on the ``ast`` tree and only ever touch the statements of one function:

* the expression that produced the replacement's output is replaced by the kernel call;
* the other matched computations disappear: nested ones with that expression, standalone
  ``name = call`` statements are deleted;
* when the first computation sits before an ``if`` and the rest inside one arm (paper Fig. 4),
  the first statement moves into every arm (an ``else:`` is added when missing) and the fusion
  happens in the arm that has both;
* the mirror image: when the last computation follows an ``if`` whose arm ends with the one
  before it (``x = drop(x)``, ``if c: x = x + r``, ``y = norm(x)``), the last statement is
  copied to the end of the other arms and the fused call ends the arm that has them all;
* several outputs (``-> ($q, $k, $v)``) become one tuple assignment in place of the first
  statement.

Anything that would change behaviour on some path — an input that is reassigned before the new
call, a computation with other side effects in the same statement, a match spread over several
methods — is refused with a reason rather than guessed. The planner is a sequence of the two
other parts: each safety check is a named function of :mod:`.checks` (the reason of every skip
comes from one of them), and the text it writes comes from :mod:`.render`, which renders a
replacement with the matched values' *own source text*. A match that starts at the end of a
helper and ends in its caller is planned in :mod:`.across`, a replacement of whole statements
(a guarded one, or ``scope: "block"``) in :mod:`.guarded`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace

from ..dsl.syntax import Step as PatternStep
from ..extract.model import Step as FlowStep
from ..match.matcher import Site
from .across import plan_across_call
from .arms import Spread, closed_arms, plan_tuple_across_arms, plan_tuple_around_branch
from .checks import (
    Refusal,
    check_arm_keeps_values,
    check_between,
    check_between_untouched,
    check_condition_stays,
    check_consecutive,
    check_construction_site,
    check_distinct_calls,
    check_dropped_arguments,
    check_elements_lead,
    check_expanded_by_a_call,
    check_feeds_later,
    check_final_outputs,
    check_fresh_name,
    check_in_function,
    check_in_statements,
    check_inputs_kept_until_read,
    check_last_elements,
    check_last_of_arm,
    check_moved_calls,
    check_moved_keeps_inputs,
    check_nested_removed,
    check_no_elif,
    check_no_extra_arguments,
    check_no_spread,
    check_one_block,
    check_one_branch,
    check_one_chain,
    check_one_condition,
    check_one_guard,
    check_one_holder,
    check_one_result_each,
    check_one_spelling,
    check_outputs_of_pattern,
    check_rest_outside,
    check_rewrites,
    check_runs_with_its_statement,
    check_sequential_call,
    check_sequential_elements,
    check_simple_statement,
    check_single_step,
    check_sinkable,
    check_sinkable_past,
    check_spellings_guardable,
    check_statement_holds,
    check_steps_line_up,
    check_unpacked_reads,
    check_weights_not_kept_unasked,
    first_reads,
    identity_guard,
    input_names,
    path_conditions,
    require,
    spelling_names,
    step_expression,
    step_input_names,
)
from .collected import unasked_collections
from .conditioned import plan_conditioned
from .guarded import plan_guarded
from .render import (
    SEQUENTIAL_INPUT,
    Renderer,
    SequentialPiece,
    assignment_head,
    element_call,
    elements_called,
    moved_with_name,
    statement_with_comment,
    tuple_assignment,
)
from .source import (
    Blocks,
    SourceText,
    assigned_names,
    chain_arms,
    contains,
    is_parallel_assignment,
    is_plain_assignment,
    is_tuple_unpacking,
    names_in,
    read_names,
)


def edit_location(site: Site) -> tuple[int, int]:
    """Where a site's edit goes (line, character column), as reports show it. A match through
    ``nn.Sequential`` elements is located, as a site, at the element (often in a factory
    function that builds the container); its edit, and what a user must look at when it is
    skipped, is the container's call in ``forward``."""
    call = site.container_call()
    if call is not None:
        # ``ast``'s byte column only for a site the matcher did not locate in its file's text
        return call.lineno, site.call_column or call.col_offset + 1
    return site.line, site.column


@dataclass
class Plan:
    """The edits for one site, all inside ``function``."""

    site: Site
    function: ast.FunctionDef
    replace_expressions: list[tuple[ast.expr, str]] = field(default_factory=list)
    replace_statements: list[tuple[ast.stmt, str]] = field(default_factory=list)
    delete_statements: list[ast.stmt] = field(default_factory=list)
    # statements moved into the arms of an ``if``; the arm that fuses them gets none
    hoist: tuple[list[ast.stmt], ast.If, int] | None = None
    # source text of statements copied to the end of the arms that do not fuse
    sunk: list[str] = field(default_factory=list)
    # deleted statements whose comment goes with their copy (``sunk``), not to the next line
    copied_with_comment: list[ast.stmt] = field(default_factory=list)
    # statements copied into every arm of an ``if``/``elif`` chain, fused in some (arms.py)
    spread: Spread | None = None
    # computations written again, once each, as the original arm of an identity-guarded call
    fallback: list[ast.expr] = field(default_factory=list)
    # the kernel call before any identity guard: where an arm makes the spellings one tensor
    # (``encoder_hidden_states = hidden_states``), the call needs no test there
    unguarded_call: str = ""
    sequential: SequentialPiece | None = None
    # a match that starts inside an nn.Sequential call: (call, first matched element, the
    # text of the elements before it called one by one), so pieces before it can merge in
    sequential_prefix: tuple[ast.Call, int, str] | None = None
    merged_pieces: list[SequentialPiece] = field(default_factory=list)
    also_patched: list[Plan] = field(default_factory=list)
    # edits in other functions that only make sense together with this one (a helper's forward)
    companions: list[Plan] = field(default_factory=list)
    insert_before: list[tuple[ast.stmt, str]] = field(default_factory=list)
    keyword_parameters: list[str] = field(default_factory=list)  # added to ``function``
    # a replacement of whole statements: (the statements, the guard's text - ``None``: no
    # guard, the statements are replaced - the kernel arm's statements, one indentation step)
    wrap: tuple[list[ast.stmt], str | None, list[str], str] | None = None
    # statements of a guarded range that take no part in the match, run by the kernel arm
    # too: (their positions in the range, the kernel-arm line they go before)
    wrap_copies: tuple[tuple[int, ...], int] = ((), 0)
    instance_of: Site | None = None  # another call of a site already reported
    imports: set[str] = field(default_factory=set)
    kernel_calls: list[str] = field(default_factory=list)  # local kernel names, one per call
    touched: list[ast.AST] = field(default_factory=list)
    statements: list[ast.stmt] = field(default_factory=list)  # every statement edited
    summary: str = ""
    # the edit writes code other rules may match anew (see FileRewrite.reopened)
    reopens: bool = False


class Planner:
    """Plans the rewrite of sites of one file."""

    def __init__(
        self,
        source: SourceText,
        taken_names: set[str],
        imported_kernels: dict[str, str] | None = None,
        tree: ast.Module | None = None,
    ) -> None:
        self.source = source
        self.render = Renderer(source, taken_names, imported_kernels)
        self._blocks: dict[int, Blocks] = {}
        self._tree = tree
        self._unasked: list[int] | None = None

    def unasked_weights(self) -> list[int]:
        """The lines where the file keeps attention probabilities nobody asked for."""
        if self._unasked is None:
            self._unasked = unasked_collections(self._tree) if self._tree is not None else []
        return self._unasked

    @property
    def aliases(self) -> dict[str, str]:
        """The local name of each kernel the file imports (or will)."""
        return self.render.aliases

    def blocks(self, function: ast.FunctionDef) -> Blocks:
        found = self._blocks.get(id(function))
        if found is None:
            found = self._blocks[id(function)] = Blocks(function)
        return found

    def statement_containing(self, function: ast.FunctionDef, node: ast.AST) -> ast.stmt:
        """The innermost statement of ``function`` whose span holds ``node``."""
        best: ast.stmt | None = None
        for body, index, _, _ in self.blocks(function).where.values():
            statement = body[index]
            if contains(statement, node) and (best is None or contains(best, statement)):
                best = statement
        require(check_statement_holds(best, node))
        return best  # type: ignore[return-value]

    # -- entry -------------------------------------------------------------------------------
    def plan(self, site: Site) -> Plan:
        self.render.moved_calls = []
        self.render.var_text = {}
        require(check_expanded_by_a_call(site))
        rule = site.rule
        init_replacement = rule.init.replacement if rule.init else None
        forward_replacement = rule.forward.replacement if rule.forward else None
        require(check_rewrites(init_replacement, forward_replacement))
        require(check_weights_not_kept_unasked(rule.kernel, self.unasked_weights()))
        if isinstance(init_replacement, tuple) and init_replacement:
            return self.plan_construction(site, init_replacement)
        assert rule.forward is not None and isinstance(forward_replacement, tuple)
        if rule.forward.guard is not None or rule.scope == "block":
            return plan_guarded(self, site, rule.forward.guard, forward_replacement)
        return self.plan_forward(site, forward_replacement)

    # -- __init__ replacements ---------------------------------------------------------------
    def plan_construction(self, site: Site, replacement: tuple[PatternStep, ...]) -> Plan:
        require(check_single_step(replacement, "construction"))
        (new_step,) = replacement
        assert site.rule.init is not None
        variable = next((t.name for t in new_step.targets), None)
        construction = site.constructions.get(variable or "")
        require(check_construction_site(construction, site.path))
        assert construction is not None and construction.function is not None
        call = construction.node
        assert isinstance(call, ast.Call)
        pattern = next(
            step for step in site.rule.init.steps if variable in {t.name for t in step.targets}
        )
        plan = Plan(site=site, function=construction.function)
        text = self.render.construction(new_step, site, plan, pattern, construction)
        plan.replace_expressions.append((call, text))
        plan.touched.append(call)
        plan.statements.append(self.statement_containing(plan.function, call))
        plan.summary = f"{self.source.segment(call)} -> {text}"
        return plan

    # -- forward replacements ----------------------------------------------------------------
    def plan_forward(self, site: Site, replacement: tuple[PatternStep, ...]) -> Plan:
        assert site.rule.forward is not None
        pattern = site.rule.forward.steps
        steps = site.steps
        require(check_steps_line_up(site))
        functions = {id(step.function) for step in steps}
        if len(functions) != 1 or len({step.inline_chain for step in steps}) != 1:
            return plan_across_call(self, site, replacement)
        require(check_in_function(steps))
        guard = identity_guard(site)
        if guard is None or len(replacement) != 1 or any(step.synthetic for step in steps):
            require(check_one_spelling(site))
        plan = Plan(site=site, function=steps[0].function)  # type: ignore[arg-type]
        if any(step.synthetic for step in steps):
            return self.plan_sequential(site, replacement, plan)
        require(check_single_step(replacement, "forward"))
        (new_step,) = replacement
        producer_of = {
            target.name: index for index, step in enumerate(pattern) for target in step.targets
        }
        targets = [t.name for t in new_step.targets]
        require(check_outputs_of_pattern(targets, producer_of))
        final_index = max(producer_of[t] for t in targets)
        require(check_dropped_arguments(self.source, site, pattern, new_step, final_index))
        call_text = self.render.call(new_step, site, plan, pattern[final_index], steps[final_index])
        require(check_in_statements(steps))
        plan.unguarded_call = call_text
        if guard is not None:
            require(check_spellings_guardable(site, targets, len(pattern)))
            call_text = self.identity_guarded(site, plan, call_text, targets, producer_of)
        if len(targets) > 1:
            call_text = self.condition_guarded(site, plan, call_text, targets, producer_of)
            return self.plan_tuple(site, plan, call_text, targets, producer_of)
        try:
            return self.fuse_statements(plan, site, steps, final_index, call_text)
        except Refusal:
            # the norm and the activation each under an ``if`` of its own: the kernel where
            # every test holds (conditioned.py); otherwise the refusal stands
            conditioned = plan_conditioned(self, site, plan, final_index, call_text)
            if conditioned is None:
                raise
            return conditioned

    def condition_guarded(
        self,
        site: Site,
        plan: Plan,
        call_text: str,
        targets: list[str],
        producer_of: dict[str, int],
    ) -> str:
        """``call_text`` where each projection runs whenever its statement does; with one in an
        arm of a conditional expression (Gemma 4's ``self.v_proj(h) if self.v_proj is not None
        else key_states``), the kernel where that arm is taken and, elsewhere, the other
        projections alone, ``None`` in its place (its statement takes the other arm there)."""
        steps = [site.steps[producer_of[t]] for t in targets]
        conditions = [path_conditions(step) for step in steps]
        if not any(conditions):
            return call_text
        require(check_one_condition(plan.function, conditions))
        require(check_one_guard(identity_guard(site)))
        test, arm = next(c for c in conditions if c)[0]
        text = self.source.segment(test)
        guard = text if arm else f"not ({text})"
        nodes = [step_expression(step) for step in steps]
        plan.fallback.extend(n for n, c in zip(nodes, conditions, strict=True) if not c)
        original = [
            "None" if c else self.source.segment(n) for n, c in zip(nodes, conditions, strict=True)
        ]
        return f"(\n    {call_text}\n    if {guard}\n    else ({', '.join(original)})\n)"

    def identity_guarded(
        self,
        site: Site,
        plan: Plan,
        call_text: str,
        targets: list[str],
        producer_of: dict[str, int],
    ) -> str:
        """``call_text`` where every input of ``site`` has one spelling; with an input that is
        one tensor on some paths only (checked by check_spellings_guardable), the kernel where
        the spellings are one object and the original computations, in the results' order,
        everywhere else."""
        guard = identity_guard(site)
        if guard is None:
            return call_text
        nodes = [step_expression(site.steps[producer_of[t]]) for t in targets]
        plan.fallback.extend(nodes)
        original = [self.source.segment(node) for node in nodes]
        # on lines of their own, as a formatter would split it
        return f"(\n    {call_text}\n    if {guard}\n    else ({', '.join(original)})\n)"

    def fuse_statements(
        self,
        plan: Plan,
        site: Site,
        steps: list[FlowStep],
        final_index: int,
        call_text: str,
        extra_inputs: frozenset[str] = frozenset(),
    ) -> Plan:
        """Replace the final computation by ``call_text`` and remove the other matched ones.

        ``extra_inputs``: names the kernel call reads besides the matched values.
        """
        blocks = self.blocks(plan.function)
        final_statement = steps[final_index].statement
        assert final_statement is not None
        final_node = step_expression(steps[final_index])
        plan.replace_expressions.append((final_node, call_text))
        plan.touched.append(final_node)
        deleted = self.removed_statements(plan.function, steps, final_index, final_node)
        anchor = self.sink_into_branch(plan, deleted, final_statement, final_node, blocks)
        self.place(plan, site, deleted, anchor, blocks, extra_inputs)
        require(check_moved_calls(plan, self.render.moved_calls, deleted, anchor, blocks))
        plan.statements.extend([final_statement, *deleted])
        if anchor is not final_statement:
            plan.statements.append(anchor)
        if plan.hoist is not None:
            plan.statements.append(plan.hoist[1])
        plan.summary = f"{self.source.segment(final_node)} -> {call_text}"
        return plan

    def removed_statements(
        self,
        function: ast.FunctionDef,
        steps: list[FlowStep],
        final_index: int,
        final_node: ast.expr,
    ) -> list[ast.stmt]:
        """The statements that go with the matched computations, in source order.

        A matched computation disappears when its expression is the value of a statement that
        is deleted, or lies inside an expression that is (the replaced one included)."""
        removed_values: list[ast.expr] = [final_node]
        deleted: list[ast.stmt] = []
        nested: list[FlowStep] = []
        matched_nodes = {id(step_expression(step)) for step in steps}
        for index, step in enumerate(steps):
            if index == final_index:
                continue
            node = step_expression(step)
            statement = step.statement
            assert statement is not None
            if any(contains(value, node) for value in removed_values):
                continue
            # ``gate, up = proj(x).chunk(2, dim=-1)``: the halves are matched intermediates,
            # and the statement goes when nothing else reads them (check_unpacked_reads).
            unpacking = is_tuple_unpacking(statement, node)
            if unpacking:
                require(check_unpacked_reads(function, statement, steps))
            if (
                unpacking
                or is_plain_assignment(statement, node)
                or is_parallel_assignment(statement, node, matched_nodes)
            ):
                if statement not in deleted:
                    deleted.append(statement)
                removed_values.append(node)
            else:
                nested.append(step)
        require(check_nested_removed(self.source, nested, removed_values))
        deleted.sort(key=lambda statement: (statement.lineno, statement.col_offset))
        return deleted

    def sink_into_branch(
        self,
        plan: Plan,
        deleted: list[ast.stmt],
        final_statement: ast.stmt,
        final_node: ast.expr,
        blocks: Blocks,
    ) -> ast.stmt:
        """Where the fused call goes: the final statement itself, or, when the statement before
        it in the match ends an arm of the ``if`` just above it, that arm's last statement.

        ``x = drop(x); if c: x = x + r; y = norm(x)`` runs drop, add and norm only when ``c``
        holds; otherwise drop then norm. The norm statement is copied to the end of the other
        arms (an ``else:`` is added when missing), the fused call replaces the add, and
        :meth:`place` moves the drop into the other arms as in Fig. 4.
        """
        block, index, _, _ = blocks.block_of(final_statement)
        if index == 0 or not isinstance(block[index - 1], ast.If):
            return final_statement
        branch = block[index - 1]
        in_arms = [statement for statement in deleted if blocks.block_of(statement)[0] is not block]
        if not in_arms:
            return final_statement
        last = in_arms[-1]
        tests, bodies = chain_arms(self.source.lines, branch)
        arm = next((i for i, body in enumerate(bodies) if any(last is s for s in body)), None)
        if arm is None:
            return final_statement  # deeper nesting: place() refuses with its reason
        require(check_last_of_arm(bodies[arm], last))
        require(check_sinkable(final_statement, final_node))
        head = assignment_head(self.source, final_statement, final_node)
        ((_, call_text),) = plan.replace_expressions
        plan.replace_expressions.clear()
        plan.touched.remove(final_node)
        plan.replace_statements.append((last, head + call_text))
        plan.touched.extend([last, final_statement])
        plan.copied_with_comment.append(final_statement)
        plan.reopens = True  # the copies may complete a match in another arm
        if len(tests) > 1:
            # an ``elif`` chain (xLSTM's feed-forward: the gated product in the ``if`` arm, the
            # down projection after the chain): the statement closes every other arm that
            # falls through, as the copies after a chain do (see arms.py)
            plan.spread = Spread(
                moved=[final_statement],
                branch=branch,
                arms=len(bodies),
                has_else=bool(bodies[-1]),
                fused={arm: []},
                after=True,
                closed=closed_arms(bodies),
                late=[final_statement],
            )
        else:
            plan.delete_statements.append(final_statement)
            plan.sunk = [statement_with_comment(self.source, final_statement)]
            plan.hoist = ([], branch, arm)
        deleted.remove(last)
        return last

    def place(
        self,
        plan: Plan,
        site: Site,
        deleted: list[ast.stmt],
        final_statement: ast.stmt,
        blocks: Blocks,
        extra_inputs: frozenset[str] = frozenset(),
    ) -> None:
        """Delete the fused statements, moving one into the branches when Fig. 4 applies, and
        check that every input still means the same value where the kernel call now sits."""
        final_block = blocks.block_of(final_statement)[0]
        reads = first_reads(site)
        inputs = set(reads) | extra_inputs
        for statement in deleted:
            block = blocks.block_of(statement)[0]
            if block is final_block:
                require(check_feeds_later(blocks, statement, final_statement))
                require(check_between(statement, final_statement, deleted, inputs, blocks, reads))
                plan.delete_statements.append(statement)
                plan.touched.append(statement)
                continue
            # the fused call sunk into an ``elif`` chain's arm moves nothing else into it
            require(check_no_spread(statement, plan.spread))
            branch = _enclosing_branch(final_statement, block, blocks)
            require(check_one_branch(statement, branch, plan.hoist))
            if_statement, arm = branch  # type: ignore[misc]
            require(check_between(statement, if_statement, deleted, inputs, blocks))
            arm_body = if_statement.body if arm == 0 else if_statement.orelse
            require(check_arm_keeps_values(arm_body, final_statement, inputs, statement))
            require(check_no_elif(self.source, if_statement))
            require(check_condition_stays(if_statement, statement))
            moved = plan.hoist[0] if plan.hoist else []
            plan.hoist = ([*moved, statement], if_statement, arm)
            plan.touched.append(statement)

    # -- several outputs ---------------------------------------------------------------------
    def plan_tuple(
        self,
        site: Site,
        plan: Plan,
        call_text: str,
        targets: list[str],
        producer_of: dict[str, int],
    ) -> Plan:
        """``q = a(x); k = b(x); v = c(x)`` -> ``q, k, v = kernel(x, a, b, c)``."""
        for match in [site, *site.alternatives]:  # the fused call runs each projection ahead
            producers = [match.steps[producer_of[target]] for target in targets]
            require(check_distinct_calls(producers))
            for step in producers:
                require(check_runs_with_its_statement(step))
        blocks = self.blocks(plan.function)
        statements: list[ast.stmt] = []
        names: list[str] = []
        for target in targets:
            step = site.steps[producer_of[target]]
            statement = step.statement
            assert statement is not None
            if not is_plain_assignment(statement, step_expression(step)):
                return self.plan_tuple_nested(site, plan, call_text, targets, producer_of)
            names.append(self.source.segment(statement.targets[0]))  # type: ignore[attr-defined]
            statements.append(statement)
        if check_one_block(statements, blocks, "assignments") is not None:
            return plan_tuple_across_arms(self, site, plan, targets, producer_of)
        ordered = sorted(statements, key=lambda s: blocks.block_of(s)[1])
        aliases, names = _absorb_aliases(
            blocks, ordered, statements, names, names_in(plan.function)
        )
        alias_names = {a.targets[0].id for a in aliases}  # type: ignore[attr-defined]
        watched = set(names) | input_names(site) | spelling_names(site) | alias_names
        if check_between_untouched(blocks, ordered, watched, skip=aliases) is not None:
            # a statement among them uses a result (``qk = cat([q, k])`` before the values):
            # the results get names of their own and each assignment stays where it is
            return self.plan_tuple_nested(site, plan, call_text, targets, producer_of)
        text = tuple_assignment(names, call_text)
        plan.replace_statements.append((ordered[0], text))
        plan.delete_statements.extend([*ordered[1:], *aliases])
        plan.touched.extend([*ordered, *aliases])
        plan.statements.extend([*ordered, *aliases])
        plan.summary = f"{len(ordered)} assignments -> {text}"
        return plan

    def plan_tuple_nested(
        self,
        site: Site,
        plan: Plan,
        call_text: str,
        targets: list[str],
        producer_of: dict[str, int],
    ) -> Plan:
        """Outputs used inside larger statements
        (``q = self.q_proj(h).view(shape).transpose(1, 2)``): the kernel's results get new names
        in a statement just before the first of them, and each computation reads its name."""
        blocks = self.blocks(plan.function)
        steps = [site.steps[producer_of[target]] for target in targets]
        statements: list[ast.stmt] = []
        for step in steps:
            require(check_simple_statement(step))
            if not any(step.statement is s for s in statements):
                statements.append(step.statement)  # type: ignore[arg-type]
        if check_one_block(statements, blocks, "computations") is not None:
            return plan_tuple_across_arms(self, site, plan, targets, producer_of)
        ordered = sorted(statements, key=lambda s: blocks.block_of(s)[1])
        reads: dict[int, set[str]] = {}
        for target in targets:
            statement = site.steps[producer_of[target]].statement
            names = step_input_names(site, producer_of[target])
            reads[id(statement)] = reads.get(id(statement), set()) | names
        kept = check_inputs_kept_until_read(blocks, ordered, reads)
        try:
            moved = self.sunk_to_inputs(blocks, ordered, reads) if kept is not None else []
        except Refusal:
            # an ``if`` between them rebinds the input on some path (sequence reduction):
            # fused in the arms that keep it, when the statements are laid out so
            around = plan_tuple_around_branch(self, site, plan, targets, producer_of, call_text)
            if around is None:
                raise
            return around
        require(kept if moved is None else None)
        moved = moved or []
        anchor = ordered[len(moved)]
        taken = names_in(plan.function)
        names: list[str] = []
        for target in targets:
            name = target if target not in taken else f"fused_{target}"
            require(check_fresh_name(name, taken | set(names), "function"))
            names.append(name)
        plan.insert_before.append((anchor, tuple_assignment(names, call_text) + "\n"))
        require(check_one_result_each(moved, steps))
        for statement in moved:  # moved down to the fused call, in their order, reading results
            step, name = next((t, n) for t, n in zip(steps, names) if t.statement is statement)
            text = moved_with_name(self.source, statement, step_expression(step), name)
            plan.insert_before.append((anchor, text + "\n"))
            plan.delete_statements.append(statement)
        for step, name in zip(steps, names, strict=True):
            if not any(step.statement is m for m in moved):
                node = step_expression(step)
                plan.replace_expressions.append((node, name))
                plan.touched.append(node)
        plan.touched.extend([*moved, anchor])
        plan.statements.extend(ordered)
        plan.summary = f"{', '.join(names)} = {call_text}, read by {len(steps)} computations"
        return plan

    def sunk_to_inputs(
        self, blocks: Blocks, ordered: list[ast.stmt], reads: dict[int, set[str]]
    ) -> list[ast.stmt] | None:
        """The first statements of ``ordered`` to move down to the first one from which every
        input is kept (``query = q_proj(hidden_states)...`` past ``current_states = kv if cross
        else hidden_states``, which the keys read); ``None`` when no such statement exists,
        refused when they may not move."""
        for count in range(1, len(ordered)):
            rest = ordered[count:]
            if check_inputs_kept_until_read(blocks, rest, reads) is not None:
                continue
            early = ordered[:count]
            later = set().union(*(reads.get(id(s), set()) for s in rest))
            for statement in early:  # refused with the reason the move is not allowed
                between = list(blocks.between(statement, rest[0]))
                require(check_sinkable_past(statement, between, early))
                require(check_moved_keeps_inputs(statement, reads.get(id(statement), set()), later))
            return early
        return None

    # -- nn.Sequential -----------------------------------------------------------------------
    def plan_sequential(self, site: Site, replacement: tuple[PatternStep, ...], plan: Plan) -> Plan:
        """A fusion inside an ``nn.Sequential``: call its elements one by one around the kernel
        (``self.proj[2](kernel(x, self.proj[0], self.proj[1]))``), keeping the same modules."""
        steps = site.steps
        call = steps[0].node
        require(check_sequential_call(call, replacement))
        assert isinstance(call, ast.Call)
        inside = [step for step in steps if step.synthetic and step.node is call]
        require(check_elements_lead(steps, inside))
        container = self.source.segment(call.func)
        count, indices = _sequential_indices(inside)
        require(check_consecutive(indices))
        (new_step,) = replacement
        module_text: dict[str | None, str] = {
            step.module: element_call(container, index) for step, index in zip(inside, indices)
        }
        element_calls = [element_call(container, index) for index in range(count)]
        if len(inside) < len(steps):
            require(check_last_elements(indices, count))
            return self.plan_sequential_tail(
                site, plan, new_step, call, element_calls[: indices[0]], module_text
            )
        final_pattern = site.rule.forward.steps[-1]  # type: ignore[union-attr]
        template = self.render.call(
            new_step,
            site,
            plan,
            final_pattern,
            steps[-1],
            module_text=module_text,
            first_input=SEQUENTIAL_INPUT,
        )
        plan.sequential = SequentialPiece(
            call=call,
            first=indices[0],
            last=indices[-1],
            template=template,
            element_calls=element_calls,
        )
        plan.touched.append(call)
        assert steps[0].statement is not None
        plan.statements.append(steps[0].statement)
        return plan

    def plan_sequential_tail(
        self,
        site: Site,
        plan: Plan,
        new_step: PatternStep,
        call: ast.Call,
        before: list[str],
        module_text: dict[str | None, str],
    ) -> Plan:
        """A match that starts with the last elements of an ``nn.Sequential`` and goes on
        outside it (``core = self.net(x)`` ending in Dropout, then ``norm(x + core)``): the
        elements before the match are called one by one and the kernel takes the rest."""
        steps = site.steps
        inside = [step for step in steps if step.synthetic and step.node is call]
        outside = steps[len(inside) :]
        require(check_rest_outside(outside, plan.function))
        require(check_one_chain(steps))
        prefix = elements_called(self.source, call, before)
        pattern = site.rule.forward.steps  # type: ignore[union-attr]
        require(check_final_outputs(site, new_step))
        require(check_no_extra_arguments(site, self.render.forward_rest(pattern[-1], steps[-1])))
        call_text = self.render.call(
            new_step,
            site,
            plan,
            pattern[-1],
            steps[-1],
            module_text=module_text,
            first_input=prefix,
        )
        statement = self.statement_containing(plan.function, call)
        plan.sequential_prefix = (call, len(before), prefix)  # elements before the match
        return self.fuse_through_call(plan, site, inside[-1], call, statement, outside, call_text)

    def fuse_through_call(
        self,
        plan: Plan,
        site: Site,
        produced_by: FlowStep,
        call: ast.Call,
        statement: ast.stmt,
        rest: list[FlowStep],
        call_text: str,
    ) -> Plan:
        """Fuse ``rest`` with ``call`` standing in for the matched computations it runs
        (a helper's forward, an ``nn.Sequential``): ``call_text`` is ``call`` rewritten, and
        it moves to where the kernel runs, so its statement goes and its inputs must still
        hold their values there."""
        self.render.moved_calls.append(statement)
        stand_in = replace(
            produced_by, node=call, statement=statement, function=plan.function, synthetic=False
        )
        return self.fuse_statements(
            plan, site, [stand_in, *rest], len(rest), call_text, frozenset(read_names(call))
        )


def _absorb_aliases(
    blocks: Blocks,
    ordered: list[ast.stmt],
    statements: list[ast.stmt],
    names: list[str],
    taken: set[str],
) -> tuple[list[ast.stmt], list[str]]:
    """Copies of a result among the fused assignments (``residual = hidden_states`` between
    ``hidden_states = residual + hidden_states`` and ``hidden_states = norm(hidden_states)``):
    the statements that go with the tuple assignment, and the name each result is held by
    after the original statements, which the tuple assigns instead. A result that a later
    fused assignment overwrites and no copy keeps (``h = a + b; h = norm(h)``) is dead after
    them: it gets a fresh name, so that the tuple does not assign the dead value last."""
    held: dict[str, int] = {}
    aliases: list[ast.stmt] = []
    for statement in [ordered[0], *blocks.between(ordered[0], ordered[-1]), ordered[-1]]:
        results = [i for i, s in enumerate(statements) if s is statement]
        for index in results:
            held[names[index]] = index
        if results:
            continue
        copied = _copied_name(statement)
        if copied is not None and copied[1] in held:
            held[copied[0]] = held[copied[1]]
            aliases.append(statement)
        else:
            for name in assigned_names(statement):
                held.pop(name, None)
    final: list[str] = []
    for index in range(len(statements)):
        holders = sorted(name for name, result in held.items() if result == index)
        if not holders:
            dead = f"unused_{names[index]}"
            require(check_fresh_name(dead, taken | set(names) | set(final), "function"))
            holders = [dead]
        require(check_one_holder(names[index], holders))
        final.append(holders[0])
    return aliases, final


def _copied_name(statement: ast.stmt) -> tuple[str, str] | None:
    """``(target, source)`` of ``target = source`` between two names, else ``None``."""
    if (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
        and isinstance(statement.value, ast.Name)
    ):
        return statement.targets[0].id, statement.value.id
    return None


def _enclosing_branch(
    statement: ast.stmt, block: list[ast.stmt], blocks: Blocks
) -> tuple[ast.If, int] | None:
    """The ``if`` in ``block`` whose arm holds ``statement`` directly."""
    _, _, parent, field_name = blocks.block_of(statement)
    if not isinstance(parent, ast.If) or blocks.block_of(parent)[0] is not block:
        return None
    return parent, 0 if field_name == "body" else 1


def _sequential_indices(inside: list[FlowStep]) -> tuple[int, list[int]]:
    """The element count of the ``nn.Sequential`` that ``inside`` (steps through its elements)
    runs, and the index of each of those elements, taken from the construction: never counted
    from the steps, which may repeat (an inlined helper) or stand for several modules."""
    require(check_sequential_elements(inside))
    owner = inside[0].construction.owner  # type: ignore[union-attr]
    indices = [s.construction.position for s in inside]  # type: ignore[union-attr]
    return len(owner.elements), indices  # type: ignore[union-attr,return-value]
