"""Synthesis, part one: turn a matched site into concrete source edits, or refuse with a reason.

A rule's replacement is rendered with the matched values' *own source text* (``hidden_states``,
``self.LayerNorm``), so the patched code reads like the original. Edits are planned on the
``ast`` tree and only ever touch the statements of one function:

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
methods — is refused with a reason rather than guessed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace

from ..dsl.syntax import (
    DETECT_ONLY,
    Call,
    Expr,
    Index,
    Keyword,
    Literal,
    Name,
    Positional,
    Rest,
    Var,
    Wildcard,
)
from ..dsl.syntax import Step as PatternStep
from ..extract.model import Construction, Operand
from ..extract.model import Step as FlowStep
from ..extract.names import DROPOUT_FUNCTION
from ..match.matcher import BoundModule, BoundOutput, Site
from .guarded import plan_guarded
from .names import fresh_alias
from .source import Blocks, SourceText, assigned_names, contains, has_call, read_names

KERNEL_PACKAGE = "adopter.kernels"


SEQUENTIAL_INPUT = "\x00input\x00"


@dataclass
class SequentialPiece:
    """A fusion of consecutive elements ``first..last`` of one ``nn.Sequential`` call; several
    pieces of the same call are merged into one expression."""

    call: ast.Call
    first: int
    last: int
    template: str  # the kernel call, with SEQUENTIAL_INPUT standing for its input
    element_calls: list[str]


def sequential_expression(
    source: SourceText, pieces: list[SequentialPiece], upto: int | None = None
) -> str:
    """``self.seq(x)`` written out element by element, fused pieces replaced by kernels
    (its first ``upto`` elements only, when given)."""
    call = pieces[0].call
    expression = source.segment(call.args[0])
    starts = {piece.first: piece for piece in pieces}
    index, count = 0, len(pieces[0].element_calls) if upto is None else upto
    while index < count:
        piece = starts.get(index)
        if piece is not None:
            expression = piece.template.replace(SEQUENTIAL_INPUT, expression)
            index = piece.last + 1
        else:
            expression = f"{pieces[0].element_calls[index]}({expression})"
            index += 1
    return expression


class Refusal(Exception):
    """A site that cannot be rewritten safely; the message says why."""


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


def sequential_indices(inside: list[FlowStep]) -> tuple[int, list[int]]:
    """The element count of the ``nn.Sequential`` that ``inside`` (steps through its elements)
    runs, and the index of each of those elements, taken from the construction: never counted
    from the steps, which may repeat (an inlined helper) or stand for several modules."""
    owners = {id(s.construction.owner) for s in inside if s.construction is not None}
    first = inside[0].construction
    owner = first.owner if first is not None else None
    if owner is None or len(owners) != 1 or any(s.construction is None for s in inside):
        raise Refusal("internal: the nn.Sequential of the matched elements is not known")
    if owner.elements_unknown:
        raise Refusal(
            f"line {owner.line}: the indexes of this nn.Sequential's elements are not known "
            f"statically ({owner.elements_unknown}); not rewritten rather than guessed"
        )
    indices = [s.construction.position for s in inside]  # type: ignore[union-attr]
    if any(index is None for index in indices):
        raise Refusal(f"line {owner.line}: an nn.Sequential element has no static index")
    return len(owner.elements), indices  # type: ignore[return-value]


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
    instance_of: Site | None = None  # another call of a site already reported
    imports: set[str] = field(default_factory=set)
    kernel_calls: list[str] = field(default_factory=list)  # local kernel names, one per call
    touched: list[ast.AST] = field(default_factory=list)
    statements: list[ast.stmt] = field(default_factory=list)  # every statement edited
    summary: str = ""


class Planner:
    """Plans the rewrite of sites of one file."""

    def __init__(
        self,
        source: SourceText,
        taken_names: set[str],
        imported_kernels: dict[str, str] | None = None,
    ) -> None:
        self.source = source
        self.taken_names = taken_names
        # Kernels the module imports already, by their local names: reused, not re-imported.
        self.aliases: dict[str, str] = dict(imported_kernels or {})
        self._blocks: dict[int, Blocks] = {}
        self._moved_calls: list[ast.stmt] = []
        self._var_text: dict[str, str] = {}
        self._extra_keywords: list[str] = []  # keywords a rendered argument adds to the call

    def blocks(self, function: ast.FunctionDef) -> Blocks:
        found = self._blocks.get(id(function))
        if found is None:
            found = self._blocks[id(function)] = Blocks(function)
        return found

    # -- names -------------------------------------------------------------------------------
    def kernel_name(self, dotted: str, plan: Plan) -> str:
        """Local name of a kernel, imported once at the top of the module."""
        package, _, name = dotted.rpartition(".")
        if package != KERNEL_PACKAGE:
            raise Refusal(f"replacement calls {dotted}, which is not in {KERNEL_PACKAGE}")
        local = self.aliases.get(name)
        if local is None:
            taken = self.taken_names | set(self.aliases.values())
            local = name if name not in taken else fresh_alias(name, taken)
            self.aliases[name] = local
        plan.imports.add(name)
        plan.kernel_calls.append(local)
        return local

    # -- entry -------------------------------------------------------------------------------
    def plan(self, site: Site) -> Plan:
        self._moved_calls = []
        self._var_text = {}
        if site.flow is not None and site.flow.report_only:
            raise Refusal(site.flow.report_only)
        rule = site.rule
        init_replacement = rule.init.replacement if rule.init else None
        forward_replacement = rule.forward.replacement if rule.forward else None
        if isinstance(init_replacement, tuple) and init_replacement:
            return self.plan_construction(site, init_replacement)
        if isinstance(forward_replacement, tuple) and forward_replacement:
            guard = rule.forward.guard if rule.forward else None
            if guard is not None or rule.scope == "block":
                return plan_guarded(self, site, guard, forward_replacement)
            return self.plan_forward(site, forward_replacement)
        raise Refusal(
            "the rule only detects (no replacement)"
            if DETECT_ONLY in (init_replacement, forward_replacement)
            else "the rule has no replacement"
        )

    # -- __init__ replacements ---------------------------------------------------------------
    def plan_construction(self, site: Site, replacement: tuple[PatternStep, ...]) -> Plan:
        if len(replacement) != 1:
            raise Refusal("only single-step construction replacements are supported")
        (new_step,) = replacement
        assert site.rule.init is not None
        variable = next((t.name for t in new_step.targets), None)
        construction = site.constructions.get(variable or "")
        if construction is None or construction.node is None or construction.function is None:
            raise Refusal("the matched construction has no source location")
        call = construction.node
        if not isinstance(call, ast.Call):
            raise Refusal("the matched construction is not a call")
        if construction.via is not None:
            raise Refusal(
                f"line {call.lineno}: the module is built inside {construction.via}() in another "
                "file; not rewritten"
            )
        pattern = next(
            step for step in site.rule.init.steps if variable in {t.name for t in step.targets}
        )
        plan = Plan(site=site, function=construction.function)
        original_callee = self.source.segment(call.func)
        pattern_name = _dotted(pattern.callee).rsplit(".", 1)[-1]
        callee = self.render_callee(new_step.callee, plan, {pattern_name: original_callee}, site)
        rest = self.construction_rest(pattern, construction)
        if rest and not any(isinstance(arg, Rest) for arg in new_step.args):
            raise Refusal(
                f"line {call.lineno}: the construction also passes {', '.join(rest)}, which the "
                "replacement would drop"
            )
        arguments = self.render_arguments(new_step.args, site, plan, rest=rest)
        text = f"{callee}({', '.join(arguments)})"
        plan.replace_expressions.append((call, text))
        plan.touched.append(call)
        plan.statements.append(self.statement_containing(plan.function, call))
        plan.summary = f"{self.source.segment(call)} -> {text}"
        return plan

    def statement_containing(self, function: ast.FunctionDef, node: ast.AST) -> ast.stmt:
        """The innermost statement of ``function`` whose span holds ``node``."""
        best: ast.stmt | None = None
        for body, index, _, _ in self.blocks(function).where.values():
            statement = body[index]
            if contains(statement, node) and (best is None or contains(best, statement)):
                best = statement
        if best is None:
            raise Refusal(f"line {node.lineno}: no statement holds the edit")  # type: ignore[attr-defined]
        return best

    def construction_rest(self, pattern: PatternStep, construction: Construction) -> list[str]:
        """Source text of the arguments a construction pattern did not name (for ``...``)."""
        named_positions = sum(isinstance(a, Positional) for a in pattern.args)
        named_keywords = {a.key for a in pattern.args if isinstance(a, Keyword)}
        call = construction.node
        assert isinstance(call, ast.Call)
        rest = [self.source.segment(a) for a in call.args[named_positions:]]
        for keyword in call.keywords:
            if keyword.arg not in named_keywords:
                prefix = f"{keyword.arg}=" if keyword.arg else "**"
                rest.append(prefix + self.source.segment(keyword.value))
        return rest

    # -- forward replacements ----------------------------------------------------------------
    def plan_forward(self, site: Site, replacement: tuple[PatternStep, ...]) -> Plan:
        rule = site.rule
        assert rule.forward is not None
        pattern = rule.forward.steps
        steps = site.steps
        if len(steps) != len(pattern):
            raise Refusal("internal: matched steps do not line up with the pattern")
        functions = {id(step.function) for step in steps}
        if len(functions) != 1 or len({step.inline_chain for step in steps}) != 1:
            return self.plan_across_call(site, replacement)
        if steps[0].function is None:
            raise Refusal("a matched computation is not inside a function")
        self.check_one_spelling(site)
        plan = Plan(site=site, function=steps[0].function)
        if any(step.synthetic for step in steps):
            return self.plan_sequential(site, replacement, plan)
        if len(replacement) != 1:
            raise Refusal("only single-step forward replacements are supported")
        (new_step,) = replacement
        producer_of = {
            target.name: index for index, step in enumerate(pattern) for target in step.targets
        }
        targets = [t.name for t in new_step.targets]
        if not targets or any(t not in producer_of for t in targets):
            raise Refusal("the replacement's outputs are not values of the pattern")
        final_index = max(producer_of[t] for t in targets)
        self.check_dropped_arguments(site, pattern, new_step, final_index)
        call_text = self.render_call(new_step, site, plan, pattern[final_index], steps[final_index])
        blocks = self.blocks(plan.function)
        statements = [step.statement for step in steps]
        if any(statement is None for statement in statements):
            raise Refusal("a matched computation is not inside a statement")
        if len(targets) > 1:
            return self.plan_tuple(site, plan, call_text, targets, producer_of, blocks)
        return self.fuse_statements(plan, site, steps, final_index, call_text)

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
        final = steps[final_index]
        final_statement = final.statement
        assert final_statement is not None
        final_node = _step_expression(final)
        plan.replace_expressions.append((final_node, call_text))
        plan.touched.append(final_node)
        # A matched computation disappears when its expression is the value of a statement that
        # is deleted, or lies inside an expression that is (the replaced one included).
        removed_values: list[ast.expr] = [final_node]
        deleted: list[ast.stmt] = []
        nested: list[FlowStep] = []
        for index, step in enumerate(steps):
            if index == final_index:
                continue
            node = _step_expression(step)
            statement = step.statement
            assert statement is not None
            if any(contains(value, node) for value in removed_values):
                continue
            if _is_plain_assignment(statement, node):
                if statement not in deleted:
                    deleted.append(statement)
                removed_values.append(node)
            else:
                nested.append(step)
        for step in nested:
            node = _step_expression(step)
            if not any(contains(value, node) for value in removed_values):
                raise Refusal(
                    f"line {step.line}: the matched `{self.source.segment(node)}` shares its "
                    "statement with other work"
                )
        deleted.sort(key=lambda statement: (statement.lineno, statement.col_offset))
        anchor = self.sink_into_branch(plan, deleted, final_statement, final_node, blocks)
        self.place(plan, site, deleted, anchor, blocks, extra_inputs)
        self.check_moved_calls(plan, deleted, anchor, blocks)
        plan.statements.extend([final_statement, *deleted])
        if anchor is not final_statement:
            plan.statements.append(anchor)
        if plan.hoist is not None:
            plan.statements.append(plan.hoist[1])
        plan.summary = f"{self.source.segment(final_node)} -> {call_text}"
        return plan

    # -- a match that starts at the end of a helper and ends in its caller ---------------------
    def plan_across_call(self, site: Site, replacement: tuple[PatternStep, ...]) -> Plan:
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
        why = "the match spans several methods or classes; not rewritten"
        steps = site.steps
        pattern = site.rule.forward.steps  # type: ignore[union-attr]
        helper, chain = steps[0].function, steps[0].inline_chain
        held = 0
        while held < len(steps) and steps[held].function is helper:
            if steps[held].inline_chain != chain:
                break
            held += 1
        inner, outer = steps[:held], steps[held:]
        caller = outer[0].function if outer else None
        if helper is None or caller is None or helper is caller:
            raise Refusal(why)
        if any(s.function is not caller or s.inline_chain != outer[0].inline_chain for s in outer):
            raise Refusal(why)
        if chain[:-1] != outer[0].inline_chain:
            raise Refusal(why)
        if helper.name != "forward" or inner[0].cls == outer[0].cls:
            # A method called on ``self`` may be overridden with the old signature.
            raise Refusal(f"{helper.name}() is a method of the caller's class; not rewritten")
        if len(replacement) != 1 or any(s.synthetic for s in steps):
            raise Refusal(why)
        (new_step,) = replacement
        self.check_final_output_only(site, new_step)
        self.check_dropped_arguments(site, pattern, new_step, len(pattern) - 1)
        insert_at = self.helper_tail(helper, inner)
        self.check_read_before_changed(site, inner)
        call, call_statement = self.helper_call(caller, inner[-1], outer[0])

        # Which replacement inputs the caller has to hand over, and under which names.
        taken = {a.arg for a in ast.walk(helper.args) if isinstance(a, ast.arg)}
        taken |= read_names(helper) | assigned_names(helper)
        handed: dict[str, str] = {}
        for arg in new_step.args:
            value = getattr(arg, "value", None)
            if not isinstance(value, Var) or self.bound_in(site, value.name, inner):
                continue
            name = value.name if value.name not in taken else f"fused_{value.name}"
            if name in taken:
                raise Refusal(f"the helper already uses the name `{name}`")
            handed[value.name] = name
        if not handed:
            raise Refusal(why)

        helper_plan = Plan(site=site, function=helper)
        self._var_text = dict(handed)
        try:
            kernel_call = self.render_call(new_step, site, helper_plan, pattern[-1], steps[-1])
        finally:
            self._var_text = {}
        # An input with a call is evaluated just before its own statement: the same point.
        if any(owner is not insert_at for owner in self._moved_calls):
            raise Refusal(f"{helper.name}(): an input with a call would move")
        self._moved_calls = []
        guard = next(
            (handed[n] for n in handed if isinstance(site.bindings.get(n), BoundModule)),
            next(iter(handed.values())),
        )
        helper_plan.insert_before.append(
            (insert_at, f"if {guard} is not None:\n    return {kernel_call}\n")
        )
        helper_plan.keyword_parameters = list(handed.values())
        helper_plan.touched.append(insert_at)
        helper_plan.statements.extend([helper, insert_at])  # type: ignore[list-item]
        helper_plan.instance_of = site

        caller_plan = Plan(site=site, function=caller)
        arguments = [self.source.segment(a) for a in call.args]
        arguments += [
            ("**" if k.arg is None else f"{k.arg}=") + self.source.segment(k.value)
            for k in call.keywords
        ]
        for variable, name in handed.items():
            arguments.append(f"{name}={self.render_value(Var(variable), site, caller_plan, None)}")
        call_text = f"{self.source.segment(call.func)}({', '.join(arguments)})"
        self.fuse_through_call(caller_plan, site, inner[-1], call, call_statement, outer, call_text)
        caller_plan.companions.append(helper_plan)
        caller_plan.summary = (
            f"{caller_plan.summary}; {helper.name}() returns {kernel_call} when given "
            + ", ".join(handed.values())
        )
        return caller_plan

    def check_one_spelling(self, site: Site) -> None:
        """A value the kernel reads once must be one expression in the code: projections of
        ``hidden_states`` and of ``current_states`` (``kv if cross else hidden_states``), or of
        three parameters a caller fills with one tensor, are one input on some paths only."""
        pattern = site.rule.forward.steps  # type: ignore[union-attr]
        texts: dict[str, list[str]] = {}
        for pattern_step, step in zip(pattern, site.steps, strict=True):
            positional = [a for a in pattern_step.args if isinstance(a, Positional)]
            for position, arg in enumerate(positional):
                if not isinstance(arg.value, Var) or position >= len(step.positional):
                    continue
                if not isinstance(site.bindings.get(arg.value.name), Operand):
                    continue
                operands = step.positional
                if step.id in site.swapped:
                    operands = list(reversed(operands))
                operand = operands[position]
                spelled = texts.setdefault(arg.value.name, [])
                if operand.node is not None and operand.text not in spelled:
                    spelled.append(operand.text)
        for name, spellings in texts.items():
            if len(spellings) > 1:
                shown = ", ".join(f"`{text}`" for text in spellings)
                raise Refusal(
                    f"${name} is read as {shown}: one tensor on some paths only; not rewritten"
                )

    def check_final_output_only(self, site: Site, new_step: PatternStep) -> None:
        """A kernel that takes over computations other code runs must produce exactly what the
        pattern's last computation did, from the arguments the pattern names."""
        pattern = site.rule.forward.steps  # type: ignore[union-attr]
        if [t.name for t in new_step.targets] != [t.name for t in pattern[-1].targets]:
            raise Refusal("the replacement's outputs are not values of the pattern")
        if self.forward_rest(pattern[-1], site.steps[-1]):
            raise Refusal(f"line {site.steps[-1].line}: the final call passes extra arguments")

    def bound_in(self, site: Site, variable: str, steps: list[FlowStep]) -> bool:
        """Whether a matched value or module belongs to one of ``steps``."""
        bound = site.bindings.get(variable)
        if isinstance(bound, BoundModule):
            return any(step.module == bound.path for step in steps)
        return any(operand is bound for step in steps for operand in step.operands())

    def check_read_before_changed(self, site: Site, steps: list[FlowStep]) -> None:
        """The kernel reads every input where the first matched statement stood: no matched
        statement before the one that reads an input may assign a name that input reads."""
        for index, step in enumerate(steps):
            for value in site.bindings.values():
                if not isinstance(value, Operand) or value.node is None:
                    continue
                if not any(operand is value for operand in step.operands()):
                    continue
                names = read_names(value.node)
                for earlier in steps[:index]:
                    if earlier.statement is not None and assigned_names(earlier.statement) & names:
                        raise Refusal(f"line {earlier.line} changes an input of the fused call")

    def helper_tail(self, helper: ast.FunctionDef, steps: list[FlowStep]) -> ast.stmt:
        """The statement before which the helper can return the kernel's result: the first of
        the matched statements, when they end the helper and it returns the last one's value."""
        body = helper.body
        last = body[-1] if body else None
        if not isinstance(last, ast.Return) or last.value is None:
            raise Refusal(f"{helper.name}() does not end by returning the matched value")
        if sum(isinstance(n, ast.Return) for n in ast.walk(helper)) != 1:
            raise Refusal(f"{helper.name}() returns in several places")
        final = steps[-1].node
        returned = last.value is final
        if not returned and isinstance(last.value, ast.Name) and len(body) > 1:
            previous = body[-2]
            returned = (
                isinstance(previous, ast.Assign)
                and _is_plain_assignment(previous, final)  # type: ignore[arg-type]
                and previous.targets[0].id == last.value.id  # type: ignore[attr-defined]
            )
        if not returned:
            raise Refusal(f"{helper.name}() does not end by returning the matched value")
        statements = [step.statement for step in steps]
        first = next((i for i, s in enumerate(body) if s is statements[0]), None)
        if first is None:
            raise Refusal(f"{helper.name}(): the matched computation sits in a nested block")
        for statement in body[first:-1]:
            if not any(statement is s for s in statements):
                raise Refusal(
                    f"line {statement.lineno}: {helper.name}() does more after the matched "
                    "computation starts"
                )
        return body[first]

    def helper_call(
        self, caller: ast.FunctionDef, inner: FlowStep, consumer: FlowStep
    ) -> tuple[ast.Call, ast.stmt]:
        """The call of the helper in the caller, and the statement that holds it."""
        operand = next(
            (o for o in consumer.operands() if any(flow.value == inner.output for flow in o.flows)),
            None,
        )
        if operand is None or operand.node is None:
            raise Refusal("the helper's result reaches the caller in a way not followed")
        node = operand.node
        if isinstance(node, ast.Call):
            return node, self.statement_containing(caller, node)
        if not isinstance(node, ast.Name) or consumer.statement is None:
            raise Refusal("the helper's result reaches the caller in a way not followed")
        blocks = self.blocks(caller)
        holder: ast.stmt | None = consumer.statement
        while holder is not None:  # the nearest assignment before it, in its block or around
            body, index, parent, _ = blocks.block_of(holder)
            for statement in reversed(body[:index]):
                if node.id not in assigned_names(statement):
                    continue
                if (
                    isinstance(statement, ast.Assign)
                    and isinstance(statement.value, ast.Call)
                    and _is_plain_assignment(statement, statement.value)
                    and statement.targets[0].id == node.id  # type: ignore[attr-defined]
                ):
                    return statement.value, statement
                raise Refusal("the helper's result reaches the caller in a way not followed")
            holder = parent if isinstance(parent, ast.If) else None
        raise Refusal("the helper's result reaches the caller in a way not followed")

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
        _, _, parent, field_name = blocks.block_of(last)
        if parent is not branch:
            return final_statement  # deeper nesting: place() refuses with its reason
        arm_body = branch.body if field_name == "body" else branch.orelse
        if arm_body[-1] is not last:
            raise Refusal(f"line {last.lineno}: the fused statement is not the last of its branch")
        if isinstance(final_statement, ast.Return) and final_statement.value is final_node:
            head = "return "
        elif _is_plain_assignment(final_statement, final_node):
            assert isinstance(final_statement, (ast.Assign, ast.AnnAssign))
            target = (
                final_statement.targets[0]
                if isinstance(final_statement, ast.Assign)
                else final_statement.target
            )
            head = f"{self.source.segment(target)} = "
        else:
            raise Refusal(
                f"line {final_statement.lineno}: the statement after the branch does more"
            )
        self.check_no_elif(branch)
        ((_, call_text),) = plan.replace_expressions
        plan.replace_expressions.clear()
        plan.touched.remove(final_node)
        plan.replace_statements.append((last, head + call_text))
        plan.delete_statements.append(final_statement)
        plan.touched.extend([last, final_statement])
        text = self.source.segment(final_statement)
        rest = self.source.lines[final_statement.end_lineno - 1].encode("utf-8")  # type: ignore[operator]
        comment = rest[final_statement.end_col_offset :].decode("utf-8").strip()  # type: ignore[misc]
        plan.sunk = [f"{text}  {comment}" if comment.startswith("#") else text]
        plan.hoist = ([], branch, 0 if field_name == "body" else 1)
        deleted.remove(last)
        return last

    def check_no_elif(self, branch: ast.If) -> None:
        if (
            len(branch.orelse) == 1
            and isinstance(branch.orelse[0], ast.If)
            and self.source.lines[branch.orelse[0].lineno - 1].lstrip().startswith("elif")
        ):
            raise Refusal("the branch continues with `elif`; not rewritten")

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
        final_block, _, _, _ = blocks.block_of(final_statement)
        inputs = self.input_names(site) | extra_inputs
        for statement in deleted:
            block, index, _, _ = blocks.block_of(statement)
            if block is final_block:
                if index > blocks.block_of(final_statement)[1]:
                    raise Refusal("a fused computation comes after the statement it feeds")
                self.check_between(statement, final_statement, deleted, inputs, blocks)
                plan.delete_statements.append(statement)
                plan.touched.append(statement)
                continue
            branch = self.enclosing_branch(final_statement, block, blocks)
            if branch is None or (plan.hoist is not None and plan.hoist[1] is not branch[0]):
                raise Refusal(
                    f"line {statement.lineno}: the fused statements sit in different blocks"
                )
            if_statement, arm = branch
            self.check_between(statement, if_statement, deleted, inputs, blocks)
            arm_body = if_statement.body if arm == 0 else if_statement.orelse
            if arm_body and arm_body[0] is not final_statement:
                for between in arm_body[: arm_body.index(final_statement)]:
                    if assigned_names(between) & (inputs | assigned_names(statement)):
                        raise Refusal(f"line {between.lineno} changes a value the fused call reads")
            self.check_no_elif(if_statement)
            if read_names(if_statement.test) & assigned_names(statement):
                raise Refusal(f"line {if_statement.lineno}: the condition reads what would move")
            if has_call(if_statement.test):
                raise Refusal(f"line {if_statement.lineno}: the condition calls something")
            moved = plan.hoist[0] if plan.hoist else []
            plan.hoist = ([*moved, statement], if_statement, arm)
            plan.touched.append(statement)

    def check_moved_calls(
        self, plan: Plan, deleted: list[ast.stmt], final: ast.stmt, blocks: Blocks
    ) -> None:
        """An input that calls something is now evaluated at the kernel call: allowed only when
        nothing else runs in between (its statement is the fused one, or deleted and adjacent)."""
        for owner in self._moved_calls:
            if owner is final:
                continue
            if plan.hoist is not None and self.moves_whole(plan.hoist, owner, final, blocks):
                continue
            if plan.hoist is not None or not any(owner is d for d in deleted):
                raise Refusal(f"line {owner.lineno}: an input with a call would move")
            if blocks.block_of(owner)[0] is not blocks.block_of(final)[0]:
                raise Refusal(f"line {owner.lineno}: an input with a call would move")
            for between in blocks.between(owner, final):
                if not any(between is d for d in deleted):
                    raise Refusal(
                        f"line {between.lineno} runs between an input with a call and the kernel"
                    )

    def moves_whole(
        self,
        hoist: tuple[list[ast.stmt], ast.If, int],
        owner: ast.stmt,
        final: ast.stmt,
        blocks: Blocks,
    ) -> bool:
        """A statement moved into the arms of the ``if`` right after it runs at the same point
        when the fused statement opens its arm (the condition was checked to call nothing)."""
        moved, branch, arm = hoist
        arm_body = branch.body if arm == 0 else branch.orelse
        return (
            any(owner is statement for statement in moved)
            and bool(arm_body)
            and arm_body[0] is final
            and not list(blocks.between(owner, branch))
        )

    def enclosing_branch(
        self, statement: ast.stmt, block: list[ast.stmt], blocks: Blocks
    ) -> tuple[ast.If, int] | None:
        """The ``if`` in ``block`` whose arm holds ``statement`` directly."""
        _, _, parent, field_name = blocks.block_of(statement)
        if not isinstance(parent, ast.If) or blocks.block_of(parent)[0] is not block:
            return None
        return parent, 0 if field_name == "body" else 1

    def input_names(self, site: Site) -> set[str]:
        names: set[str] = set()
        for value in site.bindings.values():
            if isinstance(value, Operand) and value.node is not None:
                names |= read_names(value.node)
        return names

    def check_between(
        self,
        first: ast.stmt,
        last: ast.stmt,
        deleted: list[ast.stmt],
        inputs: set[str],
        blocks: Blocks,
    ) -> None:
        produced = assigned_names(first)
        for statement in blocks.between(first, last):
            if any(statement is d for d in deleted):
                continue
            if assigned_names(statement) & inputs:
                raise Refusal(f"line {statement.lineno} reassigns an input of the fused call")
            if read_names(statement) & produced and not isinstance(last, ast.If):
                raise Refusal(f"line {statement.lineno} reads a name the fused statement sets")
            if isinstance(last, ast.If) and (read_names(statement) | assigned_names(statement)) & (
                produced | read_names(first)
            ):
                raise Refusal(f"line {statement.lineno} depends on the statement to be moved")

    def plan_tuple(
        self,
        site: Site,
        plan: Plan,
        call_text: str,
        targets: list[str],
        producer_of: dict[str, int],
        blocks: Blocks,
    ) -> Plan:
        """``q = a(x); k = b(x); v = c(x)`` -> ``q, k, v = kernel(x, a, b, c)``."""
        statements: list[ast.stmt] = []
        names: list[str] = []
        for target in targets:
            step = site.steps[producer_of[target]]
            statement = step.statement
            node = _step_expression(step)
            assert statement is not None
            if not _is_plain_assignment(statement, node):
                return self.plan_tuple_nested(site, plan, call_text, targets, producer_of, blocks)
            names.append(self.source.segment(statement.targets[0]))  # type: ignore[attr-defined]
            statements.append(statement)
        blocks_of = {id(blocks.block_of(s)[0]) for s in statements}
        if len(blocks_of) != 1:
            lines = ", ".join(str(s.lineno) for s in statements)
            raise Refusal(f"the fused assignments (lines {lines}) sit in different blocks")
        ordered = sorted(statements, key=lambda s: blocks.block_of(s)[1])
        first, last = ordered[0], ordered[-1]
        watched = set(names) | self.input_names(site)
        for statement in blocks.between(first, last):
            if any(statement is s for s in statements):
                continue
            if (read_names(statement) | assigned_names(statement)) & watched:
                raise Refusal(f"line {statement.lineno} uses a name the fused assignment sets")
        text = f"{', '.join(names)} = {call_text}"
        plan.replace_statements.append((first, text))
        plan.delete_statements.extend(ordered[1:])
        plan.touched.extend(ordered)
        plan.statements.extend(ordered)
        plan.summary = f"{len(ordered)} assignments -> {text}"
        return plan

    def plan_tuple_nested(
        self,
        site: Site,
        plan: Plan,
        call_text: str,
        targets: list[str],
        producer_of: dict[str, int],
        blocks: Blocks,
    ) -> Plan:
        """Outputs used inside larger statements
        (``q = self.q_proj(h).view(shape).transpose(1, 2)``): the kernel's results get new names
        in a statement just before the first of them, and each computation reads its name."""
        steps = [site.steps[producer_of[target]] for target in targets]
        statements: list[ast.stmt] = []
        for step in steps:
            statement = step.statement
            assert statement is not None
            if not isinstance(statement, (ast.Assign, ast.AnnAssign, ast.Expr, ast.Return)):
                raise Refusal(f"line {step.line}: the projection sits in a compound statement")
            if not any(statement is s for s in statements):
                statements.append(statement)
        if len({id(blocks.block_of(s)[0]) for s in statements}) != 1:
            lines = ", ".join(str(s.lineno) for s in statements)
            raise Refusal(f"the fused computations (lines {lines}) sit in different blocks")
        ordered = sorted(statements, key=lambda s: blocks.block_of(s)[1])
        first, last = ordered[0], ordered[-1]
        inputs = self.input_names(site)
        for statement in [first, *blocks.between(first, last)]:
            if assigned_names(statement) & inputs:
                raise Refusal(f"line {statement.lineno} changes an input of the fused call")
        taken = read_names(plan.function) | assigned_names(plan.function)
        taken |= {a.arg for a in ast.walk(plan.function.args) if isinstance(a, ast.arg)}
        names: list[str] = []
        for target in targets:
            name = target if target not in taken else f"fused_{target}"
            if name in taken or name in names:
                raise Refusal(f"the function already uses the name `{name}`")
            names.append(name)
        plan.insert_before.append((first, f"{', '.join(names)} = {call_text}\n"))
        for step, name in zip(steps, names, strict=True):
            node = _step_expression(step)
            plan.replace_expressions.append((node, name))
            plan.touched.append(node)
        plan.touched.append(first)
        plan.statements.extend(ordered)
        plan.summary = f"{', '.join(names)} = {call_text}, read by {len(steps)} computations"
        return plan

    def plan_sequential(self, site: Site, replacement: tuple[PatternStep, ...], plan: Plan) -> Plan:
        """A fusion inside an ``nn.Sequential``: call its elements one by one around the kernel
        (``self.proj[2](kernel(x, self.proj[0], self.proj[1]))``), keeping the same modules."""
        steps = site.steps
        call = steps[0].node
        if len(replacement) != 1 or not isinstance(call, ast.Call) or len(call.args) != 1:
            raise Refusal("only a one-argument nn.Sequential call can be split")
        inside = [step for step in steps if step.synthetic and step.node is call]
        if steps[: len(inside)] != inside:
            raise Refusal("the match mixes nn.Sequential elements and other calls")
        container = self.source.segment(call.func)
        count, indices = sequential_indices(inside)
        if indices != list(range(indices[0], indices[0] + len(indices))):
            raise Refusal("the fused nn.Sequential elements are not consecutive")
        (new_step,) = replacement
        module_text: dict[str | None, str] = {
            step.module: f"{container}[{index}]" for step, index in zip(inside, indices)
        }
        element_calls = [f"{container}[{index}]" for index in range(count)]
        if len(inside) < len(steps):
            if indices[-1] != count - 1:
                raise Refusal("the matched nn.Sequential elements are not its last ones")
            return self.plan_sequential_tail(
                site, plan, new_step, call, element_calls[: indices[0]], module_text
            )
        template = self.render_call(
            new_step,
            site,
            plan,
            site.rule.forward.steps[-1],
            steps[-1],  # type: ignore[union-attr]
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
        if any(step.synthetic or step.function is not plan.function for step in outside):
            raise Refusal("the match mixes nn.Sequential elements and other calls")
        if len({step.inline_chain for step in steps}) != 1:
            raise Refusal("the match spans several methods or classes; not rewritten")
        prefix = self.source.segment(call.args[0])
        for element_call in before:  # the elements before the match, in order
            prefix = f"{element_call}({prefix})"
        self.check_final_output_only(site, new_step)
        pattern = site.rule.forward.steps  # type: ignore[union-attr]
        call_text = self.render_call(
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
        self._moved_calls.append(statement)
        stand_in = replace(
            produced_by, node=call, statement=statement, function=plan.function, synthetic=False
        )
        return self.fuse_statements(
            plan, site, [stand_in, *rest], len(rest), call_text, frozenset(read_names(call))
        )

    # -- rendering ---------------------------------------------------------------------------
    def render_call(
        self,
        new_step: PatternStep,
        site: Site,
        plan: Plan,
        final_pattern: PatternStep,
        final_step: FlowStep,
        module_text: dict[str | None, str] | None = None,
        first_input: str | None = None,
    ) -> str:
        callee = self.render_callee(new_step.callee, plan, {}, site)
        rest = self.forward_rest(final_pattern, final_step)
        self._extra_keywords = []
        arguments = self.render_arguments(
            new_step.args, site, plan, rest=rest, module_text=module_text, first_input=first_input
        )
        arguments += self._extra_keywords
        return f"{callee}({', '.join(arguments)})"

    def render_callee(self, callee: Expr, plan: Plan, renames: dict[str, str], site: Site) -> str:
        if isinstance(callee, Name):
            if callee.dotted in renames:
                return renames[callee.dotted]
            if callee.dotted.startswith(KERNEL_PACKAGE + "."):
                return self.kernel_name(callee.dotted, plan)
            return callee.dotted
        if isinstance(callee, Call):
            base = self.render_callee(callee.base, plan, renames, site)
            args = self.render_arguments(callee.args, site, plan, rest=[], renames=renames)
            return f"{base}({', '.join(args)})"
        raise Refusal(f"cannot render replacement callee {callee}")

    def render_arguments(
        self,
        args: tuple,
        site: Site,
        plan: Plan,
        *,
        rest: list[str],
        renames: dict[str, str] | None = None,
        module_text: dict[str | None, str] | None = None,
        first_input: str | None = None,
    ) -> list[str]:
        rendered: list[str] = []
        for position, arg in enumerate(args):
            if isinstance(arg, Rest):
                rendered.extend(rest)
            elif isinstance(arg, Keyword):
                rendered.append(
                    f"{arg.key}={self.render_value(arg.value, site, plan, module_text)}"
                )
            else:
                if position == 0 and first_input is not None:
                    rendered.append(first_input)
                    continue
                value = arg.value
                if isinstance(value, Name) and renames and value.dotted in renames:
                    rendered.append(renames[value.dotted])
                else:
                    rendered.append(self.render_value(value, site, plan, module_text))
        return rendered

    def render_value(
        self, value: Expr, site: Site, plan: Plan, module_text: dict[str | None, str] | None
    ) -> str:
        if isinstance(value, Literal):
            return repr(value.value)
        if isinstance(value, Name):
            return value.dotted
        if isinstance(value, Wildcard):
            raise Refusal("a replacement cannot pass `_`")
        if isinstance(value, (Index, Call)):
            raise Refusal(f"cannot render replacement argument {value}")
        assert isinstance(value, Var)
        if value.name in self._var_text:
            return self._var_text[value.name]
        bound = site.bindings.get(value.name)
        if isinstance(bound, BoundModule):
            if module_text is not None and bound.path in module_text:
                return module_text[bound.path]
            step = next((s for s in site.steps if s.module == bound.path), None)
            if step is None or not isinstance(step.node, ast.Call):
                raise Refusal(f"${value.name}: the module call is not in the source")
            if bound.construction.kind == DROPOUT_FUNCTION:
                return self.functional_dropout(step.node)
            return self.source.segment(step.node.func)
        if isinstance(bound, Operand):
            if bound.node is None:
                raise Refusal(f"${value.name} has no source text")
            text = self.source.segment(bound.node)
            if has_call(bound.node):
                owner = next(
                    (s for s in site.steps if any(op is bound for op in s.operands())), None
                )
                if owner is None or owner.statement is None:
                    raise Refusal(f"${value.name} (`{text}`) would be evaluated at another point")
                self._moved_calls.append(owner.statement)
            return text if "\n" not in text and "\r" not in text else f"({text})"
        if isinstance(bound, str):
            return bound
        if isinstance(bound, BoundOutput):
            raise Refusal(f"${value.name} is an intermediate value; the kernel must recompute it")
        raise Refusal(f"${value.name} is not bound by the match")

    def functional_dropout(self, call: ast.Call) -> str:
        """``F.dropout(x, p=0.1, training=self.training)`` handed to a kernel that takes a drop
        probability: its ``p``, and its ``training`` flag as a keyword of the kernel call
        (``F.dropout`` drops by default; a kernel given a float would follow the module)."""
        names = ["input", "p", "training", "inplace"]
        given = dict(zip(names, call.args))
        given.update({k.arg: k.value for k in call.keywords if k.arg is not None})
        if any(k.arg is None for k in call.keywords) or set(given) - set(names):
            raise Refusal(f"line {call.lineno}: dropout arguments that cannot be handed over")
        inplace = given.get("inplace")
        if inplace is not None and not (
            isinstance(inplace, ast.Constant) and inplace.value is False
        ):
            raise Refusal(f"line {call.lineno}: an in-place dropout changes its input")
        training = given.get("training")
        self._extra_keywords.append(
            "training=" + (self.source.segment(training) if training is not None else "True")
        )
        p = given.get("p")
        return self.source.segment(p) if p is not None else "0.5"

    def forward_rest(self, pattern: PatternStep, step: FlowStep) -> list[str]:
        """Arguments of the final matched call that its pattern did not name, as keywords."""
        consumed: list[Operand] = []
        positional_patterns = [a for a in pattern.args if isinstance(a, Positional)]
        consumed += step.positional[: len(positional_patterns)]
        consumed += [
            step.arguments[a.key]
            for a in pattern.args
            if isinstance(a, Keyword)
            if a.key in step.arguments
        ]
        # Names come from the call's own signature (``torch.softmax``'s third parameter is
        # ``dtype``, ``F.softmax``'s is ``_stacklevel``), as extraction mapped them.
        name_of = {id(operand): key for key, operand in step.arguments.items()}
        rest: list[str] = []
        for index, operand in enumerate(step.positional):
            if any(operand is c for c in consumed) or operand.node is None:
                continue
            name = name_of.get(id(operand))
            if name is None or name.startswith("_"):
                raise Refusal(f"line {step.line}: positional argument {index + 1} has no name")
            rest.append(f"{name}={self.source.segment(operand.node)}")
        call = step.node
        if isinstance(call, ast.Call):
            for keyword in call.keywords:
                operand = step.arguments.get(keyword.arg or "")
                if keyword.arg is None:
                    rest.append("**" + self.source.segment(keyword.value))
                elif operand is not None and not any(operand is c for c in consumed):
                    rest.append(f"{keyword.arg}={self.source.segment(keyword.value)}")
        return rest

    def check_dropped_arguments(
        self,
        site: Site,
        pattern: tuple[PatternStep, ...],
        new_step: PatternStep,
        final_index: int,
    ) -> None:
        """Refuse when a matched call passes an argument the replacement would silently drop."""
        forwards_rest = any(isinstance(a, Rest) for a in new_step.args)
        for index, (pattern_step, step) in enumerate(zip(pattern, site.steps, strict=True)):
            if index == final_index and forwards_rest:
                continue
            call = step.node
            if not isinstance(call, ast.Call):
                continue
            if step.construction is not None and step.construction.kind == DROPOUT_FUNCTION:
                continue  # its settings are handed over (functional_dropout)
            wanted = sum(isinstance(a, Positional) for a in pattern_step.args) + sum(
                isinstance(a, Keyword) for a in pattern_step.args
            )
            given = len(call.args) + len(call.keywords)
            if given > wanted:
                raise Refusal(
                    f"line {step.line}: `{self.source.segment(call)}` passes arguments the "
                    "replacement would drop"
                )


def _step_expression(step: FlowStep) -> ast.expr:
    node = step.node
    if not isinstance(node, ast.expr):
        raise Refusal(f"line {step.line}: matched computation is not an expression")
    return node


def _is_plain_assignment(statement: ast.stmt, value: ast.expr) -> bool:
    if isinstance(statement, ast.Assign):
        return (
            statement.value is value
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        )
    if isinstance(statement, ast.AnnAssign):
        return statement.value is value and isinstance(statement.target, ast.Name)
    return False


def _dotted(expr: Expr) -> str:
    if isinstance(expr, Name):
        return expr.dotted
    if isinstance(expr, Index):
        return _dotted(expr.base)
    return str(expr)
