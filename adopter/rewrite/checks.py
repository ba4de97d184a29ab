"""The safety checks of the rewrite: each a named, pure function that returns ``None`` when a
site passes it, or a :class:`Refusal` with the reason the site is skipped.

Every refusal of the planner comes from exactly one check here: :func:`check` stamps it with
the name of the check that made it, so a skip can be traced back to the rule of safety it broke
(as torch.fx's ``match_filters`` name the filters a match must pass). A few checks share a
reason's text (:data:`SPANS_METHODS`, which reports pin); the stamped name tells them apart. The
planner (``plan.py``, ``across.py``, ``guarded.py``) and the renderer (``render.py``) call
them in order with :func:`require`; a check never edits a plan, so calling one twice, or one
more, changes nothing but the answer.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ParamSpec

from ..dsl.declared import kernel_entry
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
from .source import (
    Blocks,
    SourceText,
    assigned_names,
    calls_effectful,
    chain_arms,
    contains,
    encloses,
    has_call,
    is_plain_assignment,
    mutated_names,
    outer_block,
    read_names,
)

if TYPE_CHECKING:
    from .plan import Plan

KERNEL_PACKAGE = "adopter.kernels"
# Shared by the checks that find a match running in more than one method.
SPANS_METHODS = "the match spans several methods or classes; not rewritten"


class Refusal(Exception):
    """A site that cannot be rewritten safely; the message says why and ``check`` names the
    check that refused (empty for a refusal made outside this module)."""

    def __init__(self, reason: str, check: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.check = check


Params = ParamSpec("Params")
Check = Callable[..., Refusal | None]
# Every check, by name: what a refusal's ``check`` can be.
CHECKS: dict[str, Check] = {}


def check(function: Callable[Params, Refusal | None]) -> Callable[Params, Refusal | None]:
    """Register a check and stamp each refusal it returns with its name."""

    @functools.wraps(function)
    def named(*args: Params.args, **kwargs: Params.kwargs) -> Refusal | None:
        refusal = function(*args, **kwargs)
        if refusal is not None:
            refusal.check = function.__name__
        return refusal

    CHECKS[function.__name__] = named
    return named


def require(refusal: Refusal | None) -> None:
    """Stop planning with the refusal a check returned, if it returned one."""
    if refusal is not None:
        raise refusal


def step_expression(step: FlowStep) -> ast.expr:
    """The expression a matched computation is (refused when it is not one)."""
    require(check_expression(step))
    return step.node  # type: ignore[return-value]


def input_names(site: Site) -> set[str]:
    """Every name the matched input values read."""
    return set(first_reads(site))


def first_reads(site: Site) -> dict[str, tuple[int, int]]:
    """Every name the matched input values read, with where the earliest of them reads it."""
    reads: dict[str, tuple[int, int]] = {}
    for value in site.bindings.values():
        if isinstance(value, Operand) and value.node is not None:
            where = (value.node.lineno, value.node.col_offset)
            for name in read_names(value.node):
                reads[name] = min(reads.get(name, where), where)
    return reads


# -- the rule and the match ------------------------------------------------------------------
@check
def check_rewrites(init_replacement: object, forward_replacement: object) -> Refusal | None:
    """A rule rewrites only when it has steps to write instead of the matched ones."""
    if isinstance(init_replacement, tuple) and init_replacement:
        return None
    if isinstance(forward_replacement, tuple) and forward_replacement:
        return None
    if DETECT_ONLY in (init_replacement, forward_replacement):
        return Refusal("the rule only detects (no replacement)")
    return Refusal("the rule has no replacement")


@check
def check_weights_not_kept_unasked(kernel: str | None, unasked: Sequence[int]) -> Refusal | None:
    """A kernel that returns attention probabilities only when they are asked for (the
    registry's ``weights_when_asked``) is not written into a file that keeps its layers'
    probabilities whether asked or not (``unasked``: the lines that do, rewrite/collected.py):
    its model would return ``None`` where it returned them."""
    name = (kernel or "").rpartition(".")[2]
    entry = kernel_entry(name) if unasked else None
    if entry is None or not entry.weights_when_asked:
        return None
    return Refusal(
        f"the file keeps its layers' attention probabilities whether or not they are asked "
        f"for (line {unasked[0]}), and {name} returns them only when asked"
    )


@check
def check_single_step(replacement: tuple[PatternStep, ...], where: str) -> Refusal | None:
    """The planner writes one call in place of a match (``where``: construction or forward)."""
    if len(replacement) != 1:
        return Refusal(f"only single-step {where} replacements are supported")
    return None


@check
def check_steps_line_up(site: Site) -> Refusal | None:
    """One matched computation per pattern step."""
    if len(site.steps) != len(site.rule.forward.steps):  # type: ignore[union-attr]
        return Refusal("internal: matched steps do not line up with the pattern")
    return None


@check
def check_in_function(steps: list[FlowStep]) -> Refusal | None:
    if steps[0].function is None:
        return Refusal("a matched computation is not inside a function")
    return None


@check
def check_in_statements(steps: list[FlowStep]) -> Refusal | None:
    if any(step.statement is None for step in steps):
        return Refusal("a matched computation is not inside a statement")
    return None


@check
def check_expression(step: FlowStep) -> Refusal | None:
    if not isinstance(step.node, ast.expr):
        return Refusal(f"line {step.line}: matched computation is not an expression")
    return None


@check
def check_statement_holds(statement: ast.stmt | None, node: ast.AST) -> Refusal | None:
    """An edit lies inside a statement of its function (``statement``: the one found)."""
    if statement is None:
        return Refusal(f"line {node.lineno}: no statement holds the edit")  # type: ignore[attr-defined]
    return None


@check
def check_outputs_of_pattern(targets: list[str], producer_of: dict[str, int]) -> Refusal | None:
    """The replacement's outputs are values the pattern computes."""
    if not targets or any(t not in producer_of for t in targets):
        return Refusal("the replacement's outputs are not values of the pattern")
    return None


@check
def check_final_outputs(site: Site, new_step: PatternStep) -> Refusal | None:
    """A kernel that takes over computations other code runs must produce exactly what the
    pattern's last computation did."""
    pattern = site.rule.forward.steps  # type: ignore[union-attr]
    if [t.name for t in new_step.targets] != [t.name for t in pattern[-1].targets]:
        return Refusal("the replacement's outputs are not values of the pattern")
    return None


@check
def check_no_extra_arguments(site: Site, rest: list[str]) -> Refusal | None:
    """... from the arguments the pattern names (``rest``: the final call's other arguments)."""
    if rest:
        return Refusal(f"line {site.steps[-1].line}: the final call passes extra arguments")
    return None


def operand_spellings(site: Site) -> dict[str, list[Operand]]:
    """Each matched input variable's operands, one per distinct spelling, in match order
    (``hidden_states`` and ``current_states`` for ``kv if cross else hidden_states``)."""
    pattern = site.rule.forward.steps  # type: ignore[union-attr]
    spellings: dict[str, list[Operand]] = {}
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
            spelled = spellings.setdefault(arg.value.name, [])
            if operand.node is not None and all(o.text != operand.text for o in spelled):
                spelled.append(operand)
    return spellings


def _several_spellings(site: Site) -> dict[str, list[Operand]]:
    return {name: ops for name, ops in operand_spellings(site).items() if len(ops) > 1}


@check
def check_one_spelling(site: Site) -> Refusal | None:
    """A value the kernel reads once must be one expression in the code: projections of
    ``hidden_states`` and of ``current_states`` (``kv if cross else hidden_states``), or of
    three parameters a caller fills with one tensor, are one input on some paths only."""
    for name, spellings in _several_spellings(site).items():
        shown = ", ".join(f"`{operand.text}`" for operand in spellings)
        return Refusal(f"${name} is read as {shown}: one tensor on some paths only; not rewritten")
    return None


@check
def check_spellings_guardable(site: Site, targets: list[str], steps: int) -> Refusal | None:
    """An input spelled several ways (one tensor on some paths only) is fused only behind a
    run-time identity test (:func:`identity_guard`), with the original calls in the other arm
    of a conditional expression: so every spelling is a plain name (testing it runs nothing)
    and every matched computation is one of the kernel's results (the other arm recomputes
    exactly them)."""
    for name, spellings in _several_spellings(site).items():
        shown = ", ".join(f"`{operand.text}`" for operand in spellings)
        if not all(isinstance(operand.node, ast.Name) for operand in spellings):
            return Refusal(
                f"${name} is read as {shown}: one tensor on some paths only, and not every "
                "spelling is a plain name to test; not rewritten"
            )
        if len(targets) < 2 or len(targets) != steps:
            return Refusal(
                f"${name} is read as {shown}: one tensor on some paths only, and the kernel's "
                "results are not all the matched values; not rewritten"
            )
    return None


def identity_guard(site: Site) -> str | None:
    """``current_states is hidden_states`` (``and`` for more): true exactly on the paths where
    the spellings of each input are one tensor; ``None`` when every input has one spelling."""
    tests = [
        f"{operand.text} is {spellings[0].text}"
        for spellings in _several_spellings(site).values()
        for operand in spellings[1:]
    ]
    return " and ".join(tests) or None


def spellings_made_one(body: list[ast.stmt], site: Site) -> bool:
    """Whether, at the end of an arm, every spelling of each input names one tensor: the arm's
    last binding of each later spelling is a plain copy of the first
    (``encoder_hidden_states = hidden_states``, diffusers' self-attention arm) and nothing after
    that copy rebinds or changes either name."""
    several = _several_spellings(site)
    if not several:
        return False
    for spellings in several.values():
        first = spellings[0].text
        for operand in spellings[1:]:
            copies = [
                index
                for index, statement in enumerate(body)
                if isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and statement.targets[0].id == operand.text
                and isinstance(statement.value, ast.Name)
                and statement.value.id == first
            ]
            if not copies:
                return False
            for statement in body[copies[-1] + 1 :]:
                changed = assigned_names(statement) | mutated_names(statement)
                if {first, operand.text} & changed:
                    return False
    return True


def spelling_names(site: Site) -> set[str]:
    """The names read by every spelling of the matched inputs (:func:`input_names` reads the
    bound, first one only)."""
    names: set[str] = set()
    for spellings in operand_spellings(site).values():
        for operand in spellings:
            names |= read_names(operand.node)  # type: ignore[arg-type]
    return names


@check
def check_dropped_arguments(
    source: SourceText,
    site: Site,
    pattern: tuple[PatternStep, ...],
    new_step: PatternStep,
    final_index: int,
) -> Refusal | None:
    """A matched call may not pass an argument the replacement would silently drop."""
    forwards_rest = any(isinstance(a, Rest) for a in new_step.args)
    for index, (pattern_step, step) in enumerate(zip(pattern, site.steps, strict=True)):
        if index == final_index and forwards_rest:
            continue
        call = step.node
        if not isinstance(call, ast.Call):
            continue
        if step.construction is not None and step.construction.kind == DROPOUT_FUNCTION:
            continue  # its settings are handed over (render.Renderer.functional_dropout)
        if step.kind == "getitem":
            continue  # ``first, second = torch.chunk(...)``: an element of the call's result
        wanted = sum(isinstance(a, Positional) for a in pattern_step.args) + sum(
            isinstance(a, Keyword) for a in pattern_step.args
        )
        given = len(call.args) + len(call.keywords)
        if given > wanted:
            return Refusal(
                f"line {step.line}: `{source.segment(call)}` passes arguments the "
                "replacement would drop"
            )
    return None


@check
def check_read_before_changed(site: Site, steps: list[FlowStep]) -> Refusal | None:
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
                    return Refusal(f"line {earlier.line} changes an input of the fused call")
    return None


# -- __init__ constructions -------------------------------------------------------------------
@check
def check_construction_site(construction: Construction | None, path: str) -> Refusal | None:
    """The matched construction is a call of this file (``path``), with its source."""
    if construction is None or construction.node is None or construction.function is None:
        return Refusal("the matched construction has no source location")
    if construction.path != path:
        return Refusal(
            f"the module is built in another file ({construction.path}:{construction.line}); "
            "not rewritten"
        )
    call = construction.node
    if not isinstance(call, ast.Call):
        return Refusal("the matched construction is not a call")
    if construction.via is not None:
        return Refusal(
            f"line {call.lineno}: the module is built inside {construction.via}() in another "
            "file; not rewritten"
        )
    return None


@check
def check_construction_rest_kept(
    call: ast.Call, rest: list[str], new_step: PatternStep
) -> Refusal | None:
    """Arguments the pattern did not name (``rest``) go on only through a ``...``."""
    if rest and not any(isinstance(arg, Rest) for arg in new_step.args):
        return Refusal(
            f"line {call.lineno}: the construction also passes {', '.join(rest)}, which the "
            "replacement would drop"
        )
    return None


# -- rendering the replacement ----------------------------------------------------------------
@check
def check_kernel_package(dotted: str) -> Refusal | None:
    if dotted.rpartition(".")[0] != KERNEL_PACKAGE:
        return Refusal(f"replacement calls {dotted}, which is not in {KERNEL_PACKAGE}")
    return None


@check
def check_renderable_callee(callee: Expr) -> Refusal | None:
    if not isinstance(callee, (Name, Call)):
        return Refusal(f"cannot render replacement callee {callee}")
    return None


@check
def check_expanded_by_a_call(site: Site) -> Refusal | None:
    """An ``nn.Sequential`` whose elements no forward call expands has a flow of its own that
    only reports its sites: which module the attribute holds is known at run time only."""
    if site.flow is not None and site.flow.report_only:
        return Refusal(site.flow.report_only)
    return None


@check
def check_renderable_value(value: Expr) -> Refusal | None:
    if isinstance(value, Wildcard):
        return Refusal("a replacement cannot pass `_`")
    if isinstance(value, (Index, Call)):
        return Refusal(f"cannot render replacement argument {value}")
    return None


@check
def check_bound(name: str, bound: object) -> Refusal | None:
    """A replacement argument names a module, an input or a constant of the match."""
    if isinstance(bound, (BoundModule, Operand, str)):
        return None
    if isinstance(bound, BoundOutput):
        return Refusal(f"${name} is an intermediate value; the kernel must recompute it")
    return Refusal(f"${name} is not bound by the match")


@check
def check_module_call_in_source(name: str, step: FlowStep | None) -> Refusal | None:
    """``step``: the matched call of the module ``$name`` stands for."""
    if step is None or not isinstance(step.node, ast.Call):
        return Refusal(f"${name}: the module call is not in the source")
    return None


@check
def check_operand_has_text(name: str, operand: Operand) -> Refusal | None:
    if operand.node is None:
        return Refusal(f"${name} has no source text")
    return None


@check
def check_evaluated_in_place(name: str, text: str, owner: FlowStep | None) -> Refusal | None:
    """An input with a call moves to the kernel call with the statement that evaluated it
    (``owner``: the matched computation that reads it)."""
    if owner is None or owner.statement is None:
        return Refusal(f"${name} (`{text}`) would be evaluated at another point")
    return None


@check
def check_dropout_handed_over(call: ast.Call, given: dict[str, ast.expr]) -> Refusal | None:
    """``F.dropout``'s arguments (``given``, by parameter) can be handed to a kernel."""
    names = ["input", "p", "training", "inplace"]
    if any(k.arg is None for k in call.keywords) or set(given) - set(names):
        return Refusal(f"line {call.lineno}: dropout arguments that cannot be handed over")
    inplace = given.get("inplace")
    if inplace is not None and not (isinstance(inplace, ast.Constant) and inplace.value is False):
        return Refusal(f"line {call.lineno}: an in-place dropout changes its input")
    return None


@check
def check_argument_named(step: FlowStep, index: int, name: str | None) -> Refusal | None:
    """A positional argument handed on as a keyword needs its parameter's name."""
    if name is None or name.startswith("_"):
        return Refusal(f"line {step.line}: positional argument {index + 1} has no name")
    return None


# -- where the fused call goes ----------------------------------------------------------------
@check
def check_nested_removed(
    source: SourceText, nested: list[FlowStep], removed_values: list[ast.expr]
) -> Refusal | None:
    """A matched computation that is not a statement of its own disappears only inside an
    expression that does (``nested``: those computations)."""
    for step in nested:
        node = step.node
        if not any(contains(value, node) for value in removed_values):  # type: ignore[arg-type]
            return Refusal(
                f"line {step.line}: the matched `{source.segment(node)}` shares its "  # type: ignore[arg-type]
                "statement with other work"
            )
    return None


@check
def check_last_of_arm(arm_body: list[ast.stmt], last: ast.stmt) -> Refusal | None:
    """The fused call may end an arm of an ``if`` only where the matched statement does."""
    if arm_body[-1] is not last:
        return Refusal(f"line {last.lineno}: the fused statement is not the last of its branch")
    return None


@check
def check_sinkable(final_statement: ast.stmt, final_node: ast.expr) -> Refusal | None:
    """A statement copied into the other arms does nothing but return or assign its value."""
    if isinstance(final_statement, ast.Return) and final_statement.value is final_node:
        return None
    if is_plain_assignment(final_statement, final_node):
        return None
    return Refusal(f"line {final_statement.lineno}: the statement after the branch does more")


@check
def check_no_elif(source: SourceText, branch: ast.If) -> Refusal | None:
    if (
        len(branch.orelse) == 1
        and isinstance(branch.orelse[0], ast.If)
        and source.lines[branch.orelse[0].lineno - 1].lstrip().startswith("elif")
    ):
        return Refusal("the branch continues with `elif`; not rewritten")
    return None


@check
def check_feeds_later(blocks: Blocks, statement: ast.stmt, final: ast.stmt) -> Refusal | None:
    """A fused statement of the final one's block comes before it."""
    if blocks.block_of(statement)[1] > blocks.block_of(final)[1]:
        return Refusal("a fused computation comes after the statement it feeds")
    return None


@check
def check_between(
    first: ast.stmt,
    last: ast.stmt,
    deleted: list[ast.stmt],
    inputs: set[str],
    blocks: Blocks,
    reads: dict[str, tuple[int, int]] | None = None,
) -> Refusal | None:
    """Nothing between a fused statement and where its work now happens (``last``: the fused
    statement, or the ``if`` it moves into) changes the values involved. With ``reads`` (where
    the matched code first reads each input name), a name set before the matched code reads it
    is no change: the match took the new value, and the kernel call reads it too (DeepSeek-V2's
    ``freqs_cis = freqs_cis.unsqueeze(1)`` between the two halves of its rotation)."""
    produced = assigned_names(first)
    for statement in blocks.between(first, last):
        if any(statement is d for d in deleted):
            continue
        end = (statement.end_lineno or statement.lineno, statement.end_col_offset or 0)
        changed = {
            name
            for name in assigned_names(statement) & inputs
            if reads is None or name not in reads or reads[name] < end
        }
        if changed:
            return Refusal(f"line {statement.lineno} reassigns an input of the fused call")
        if read_names(statement) & produced and not isinstance(last, ast.If):
            return Refusal(f"line {statement.lineno} reads a name the fused statement sets")
        if isinstance(last, ast.If) and _depends(statement, first):
            return Refusal(f"line {statement.lineno} depends on the statement to be moved")
    return None


def _depends(statement: ast.stmt, moved: ast.stmt) -> bool:
    """Whether two statements may not change places: one writes (binds, or changes in place)
    a name the other reads or writes. Reading the same names is no dependency."""
    moved_writes = assigned_names(moved) | mutated_names(moved)
    writes = assigned_names(statement) | mutated_names(statement)
    return bool(
        writes & (moved_writes | read_names(moved))
        or moved_writes & (read_names(statement) | writes)
    )


@check
def check_no_spread(statement: ast.stmt, spread: object | None) -> Refusal | None:
    """A statement of the match in another block than the final one moves into a branch's arm
    only beside a final statement sunk into an ``if``/``else`` (paper Fig. 4), not into an arm
    of an ``elif`` chain."""
    if spread is not None:
        return Refusal(
            f"line {statement.lineno}: the fused statements sit in different arms of an "
            "`elif` chain"
        )
    return None


@check
def check_one_branch(
    statement: ast.stmt,
    branch: tuple[ast.If, int] | None,
    hoist: tuple[list[ast.stmt], ast.If, int] | None,
) -> Refusal | None:
    """A fused statement outside the final one's block sits just before the ``if`` whose arm
    holds it (``branch``), the same ``if`` as any other moved statement."""
    if branch is None or (hoist is not None and hoist[1] is not branch[0]):
        return Refusal(f"line {statement.lineno}: the fused statements sit in different blocks")
    return None


@check
def check_arm_keeps_values(
    arm_body: list[ast.stmt], final: ast.stmt, inputs: set[str], moved: ast.stmt
) -> Refusal | None:
    """The statements of the arm before the fused one change neither an input nor what the
    statement moved into the arm sets."""
    if arm_body and arm_body[0] is not final:
        for between in arm_body[: arm_body.index(final)]:
            if assigned_names(between) & (inputs | assigned_names(moved)):
                return Refusal(f"line {between.lineno} changes a value the fused call reads")
    return None


@check
def check_condition_stays(branch: ast.If, moved: ast.stmt) -> Refusal | None:
    """A statement moved after an ``if``'s test must not change what the test computes."""
    if read_names(branch.test) & assigned_names(moved):
        return Refusal(f"line {branch.lineno}: the condition reads what would move")
    if calls_effectful(branch.test):
        return Refusal(f"line {branch.lineno}: the condition calls something")
    return None


@check
def check_moved_calls(
    plan: Plan,
    moved_calls: Sequence[ast.stmt],
    deleted: list[ast.stmt],
    final: ast.stmt,
    blocks: Blocks,
) -> Refusal | None:
    """An input that calls something is now evaluated at the kernel call (``moved_calls``: the
    statements of those inputs): allowed only when nothing else runs in between (its statement
    is the fused one, or deleted and adjacent)."""
    for owner in moved_calls:
        if owner is final:
            continue
        if plan.hoist is not None and _moves_whole(plan.hoist, owner, final, blocks):
            continue
        if plan.hoist is not None or not any(owner is d for d in deleted):
            return Refusal(f"line {owner.lineno}: an input with a call would move")
        if blocks.block_of(owner)[0] is not blocks.block_of(final)[0]:
            return Refusal(f"line {owner.lineno}: an input with a call would move")
        for between in blocks.between(owner, final):
            if not any(between is d for d in deleted):
                return Refusal(
                    f"line {between.lineno} runs between an input with a call and the kernel"
                )
    return None


def _moves_whole(
    hoist: tuple[list[ast.stmt], ast.If, int], owner: ast.stmt, final: ast.stmt, blocks: Blocks
) -> bool:
    """A statement moved into the arms of the ``if`` after it runs at the same point when the
    fused statement opens its arm: only statements that move too lie between them (the
    residual add after a helper's call), and the condition was checked to call nothing."""
    moved, branch, arm = hoist
    arm_body = branch.body if arm == 0 else branch.orelse
    return (
        any(owner is statement for statement in moved)
        and bool(arm_body)
        and arm_body[0] is final
        and all(any(s is m for m in moved) for s in blocks.between(owner, branch))
    )


# -- several outputs --------------------------------------------------------------------------
@check
def check_one_block(statements: list[ast.stmt], blocks: Blocks, what: str) -> Refusal | None:
    """The statements one tuple of results replaces (``what`` they are) share one block."""
    if len({id(blocks.block_of(s)[0]) for s in statements}) != 1:
        lines = ", ".join(str(s.lineno) for s in statements)
        return Refusal(f"the fused {what} (lines {lines}) sit in different blocks")
    return None


@check
def check_arm_chain(
    source: SourceText, blocks: Blocks, statements_of: list[list[ast.stmt | None]]
) -> Refusal | None:
    """Statements of several results that sit in different blocks are rewritten across arms
    (paper Fig. 4) only in one shape: each match's statements either sit in one block (the
    shared ones), all before or all after an ``if``/``elif`` chain of that block, each holding
    one result, the same statements for every match, or directly in one arm of that chain, a
    different arm for each match."""
    first_match = statements_of[0]
    lines = ", ".join(str(s.lineno) for s in first_match if s is not None)
    different = f"the fused assignments (lines {lines}) sit in different blocks"
    if any(s is None for match in statements_of for s in match):
        return Refusal(different)
    block = outer_block(blocks, first_match)  # type: ignore[arg-type]
    if block is None:
        return Refusal(f"{different}, not in the arms of one `if` beside the others")
    shared = [s for s in first_match if blocks.block_of(s)[0] is block]  # type: ignore[arg-type]
    if len({id(s) for s in shared}) != len(shared):
        return Refusal(f"{different}, and one statement holds two of them")
    rest = [s for s in first_match if not any(s is m for m in shared)]
    branch = next((s for s in block if encloses(s, rest[0])), None) if rest else None  # type: ignore[arg-type]
    if not isinstance(branch, ast.If):
        return Refusal(f"{different}, not in the arms of one `if` beside the others")
    where = block.index(branch)
    sides = {blocks.block_of(s)[1] < where for s in shared}  # type: ignore[arg-type]
    if len(sides) != 1:
        return Refusal(f"{different}, on both sides of the branch at line {branch.lineno}")
    _, bodies = chain_arms(source.lines, branch)
    used: set[int] = set()
    for match in statements_of:
        if [id(s) for s in match if blocks.block_of(s)[0] is block] != [id(s) for s in shared]:  # type: ignore[arg-type]
            return Refusal(f"{different}, and the matches in other arms share other statements")
        in_arm = [s for s in match if blocks.block_of(s)[0] is not block]  # type: ignore[arg-type]
        arms = {
            index
            for index, body in enumerate(bodies)
            for s in in_arm
            if any(s is statement for statement in body)
        }
        held = sum(any(s is statement for body in bodies for statement in body) for s in in_arm)
        if not in_arm or len(arms) != 1 or held != len(in_arm):
            return Refusal(
                f"{different}, not all directly in one arm of the branch at line {branch.lineno}"
            )
        if arms & used:
            return Refusal(f"{different}; two matches share the arm of line {in_arm[0].lineno}")  # type: ignore[union-attr]
        used |= arms
    return None


@check
def check_some_arm_fuses(branch: ast.If, fused: list[int]) -> Refusal | None:
    """Of the arms of the ``if`` between the projections, one at least keeps the input (and
    falls through): there the three are one tensor's."""
    if not fused:
        return Refusal(
            f"line {branch.lineno}: every arm of the branch between the projections changes "
            "their input"
        )
    return None


@check
def check_carried(statement: ast.stmt, inputs: set[str]) -> Refusal | None:
    """A statement that moves into the arms with the shared ones (it uses what they set) is a
    simple one, and changes no input of the fused call: the fused call, which now runs before
    it, reads the inputs the arms' projections read after it."""
    simple = isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr))
    if not simple or any(isinstance(n, CONTROL_STATEMENTS) for n in ast.walk(statement)):
        return Refusal(f"line {statement.lineno} uses what would move, and is not a simple line")
    if (assigned_names(statement) | mutated_names(statement)) & inputs:
        return Refusal(f"line {statement.lineno} changes an input of the fused call")
    return None


@check
def check_arm_keeps_inputs(body: list[ast.stmt], inputs: set[str]) -> Refusal | None:
    """A statement after a chain that is fused at the start of an arm ran after the whole arm:
    no statement of the arm may change an input (rebound, or changed in place)."""
    for statement in body:
        if (assigned_names(statement) | mutated_names(statement)) & inputs:
            return Refusal(f"line {statement.lineno} changes an input of the fused call")
    return None


@check
def check_chain_conditions(tests: list[ast.If], moved: list[ast.stmt]) -> Refusal | None:
    """Statements copied from before an ``if``/``elif`` chain into its arms now run after its
    conditions: no condition may read what they set, change what they read, or call anything
    (a call could see or change state the statements touch)."""
    for branch in tests:
        for statement in moved:
            if read_names(branch.test) & assigned_names(statement):
                return Refusal(f"line {branch.lineno}: the condition reads what would move")
            if assigned_names(branch.test) & read_names(statement):
                return Refusal(f"line {branch.lineno}: the condition sets what would move")
        if calls_effectful(branch.test):
            return Refusal(f"line {branch.lineno}: the condition calls something")
    return None


@check
def check_between_untouched(
    blocks: Blocks, ordered: list[ast.stmt], watched: set[str], skip: list[ast.stmt] = ()
) -> Refusal | None:
    """No other statement among the fused assignments (``ordered``) uses a name they set or
    the kernel reads (``watched``); ``skip``: statements the rewrite removes with them."""
    for statement in blocks.between(ordered[0], ordered[-1]):
        if any(statement is s for s in [*ordered, *skip]):
            continue
        if (read_names(statement) | assigned_names(statement)) & watched:
            return Refusal(f"line {statement.lineno} uses a name the fused assignment sets")
    return None


@check
def check_one_holder(name: str, holders: list[str]) -> Refusal | None:
    """After copies among the fused assignments (``residual = hidden_states``), each result
    is held by exactly one name, which the tuple assignment then sets."""
    if len(holders) != 1:
        return Refusal(
            f"a copy of `{name}` among the fused assignments leaves it under {len(holders)} names"
        )
    return None


@check
def check_distinct_calls(steps: list[FlowStep]) -> Refusal | None:
    """The results come from calls of their own: three projections that are one call of a
    wrapper module reached three times (``return self.linear(x)`` in the module each of
    ``q_proj``, ``k_proj`` and ``v_proj`` is) have no three places to fuse."""
    if len({id(step.node) for step in steps}) != len(steps):
        line = steps[0].line
        return Refusal(
            f"line {line}: the projections are one call of a module reached once for each; "
            "not rewritten"
        )
    return None


@check
def check_runs_with_its_statement(step: FlowStep) -> Refusal | None:
    """A result the fused call computes ahead of its statement is computed whenever that
    statement runs, or in one arm of a conditional expression (see :func:`path_conditions`):
    not after a short-circuit operand, nor in a lambda or comprehension."""
    statement, node = step.statement, step_expression(step)
    if statement is None:
        return None
    path = _path_to(statement, node)
    for parent, child in zip(path, path[1:]):
        conditional = (
            (isinstance(parent, ast.BoolOp) and child is not parent.values[0])
            or isinstance(parent, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp))
            or isinstance(parent, ast.GeneratorExp)
        )
        if conditional:
            return Refusal(f"line {step.line}: the projection runs only on some paths of its line")
    return None


def path_conditions(step: FlowStep) -> list[tuple[ast.expr, bool]]:
    """The tests of the conditional expressions whose arm holds the step's call, each with the
    arm (``True``: the body): ``v = self.v_proj(h) if self.v_proj is not None else k`` calls
    ``v_proj`` only where its test holds."""
    statement, node = step.statement, step_expression(step)
    if statement is None:
        return []
    path = _path_to(statement, node)
    return [
        (parent.test, child is parent.body)
        for parent, child in zip(path, path[1:])
        if isinstance(parent, ast.IfExp) and child is not parent.test
    ]


@check
def check_one_guard(identity: str | None) -> Refusal | None:
    """A fused call guarded by a conditional projection's test has no identity test besides."""
    if identity is not None:
        return Refusal("a conditional projection and an input chosen on some paths: not rewritten")
    return None


@check
def check_one_condition(
    function: ast.FunctionDef, conditions: list[list[tuple[ast.expr, bool]]]
) -> Refusal | None:
    """The projections that run in an arm of a conditional expression all run in the same arm
    of the same test, one level deep, and that test can be evaluated where the fused call is:
    it calls nothing and reads nothing the function assigns (``self.v_proj is not None``)."""
    held = [c for c in conditions if c]
    if any(len(c) != 1 for c in held) or len({(ast.dump(c[0][0]), c[0][1]) for c in held}) != 1:
        return Refusal("the projections run in the arms of different conditional expressions")
    test = held[0][0][0]
    if has_call(test) or read_names(test) & assigned_names(function):
        return Refusal(
            f"line {test.lineno}: the conditional projection's test cannot be evaluated ahead"  # type: ignore[attr-defined]
        )
    return None


def _path_to(root: ast.AST, node: ast.AST) -> list[ast.AST]:
    """The nodes from ``root`` down to ``node`` (empty when it is not inside)."""
    if root is node:
        return [root]
    for child in ast.iter_child_nodes(root):
        found = _path_to(child, node)
        if found:
            return [root, *found]
    return []


@check
def check_simple_statement(step: FlowStep) -> Refusal | None:
    """A result read inside a larger statement gets its name in a statement before it: one of
    a kind that runs once, in order."""
    if not isinstance(step.statement, (ast.Assign, ast.AnnAssign, ast.Expr, ast.Return)):
        return Refusal(f"line {step.line}: the projection sits in a compound statement")
    return None


@check
def check_inputs_kept(blocks: Blocks, ordered: list[ast.stmt], inputs: set[str]) -> Refusal | None:
    """The kernel runs before the first of ``ordered``: none of them, nor what runs between
    them, may change an input."""
    first, last = ordered[0], ordered[-1]
    for statement in [first, *blocks.between(first, last)]:
        if (assigned_names(statement) | mutated_names(statement)) & inputs:
            return Refusal(f"line {statement.lineno} changes an input of the fused call")
    return None


@check
def check_inputs_kept_until_read(
    blocks: Blocks, ordered: list[ast.stmt], reads: dict[int, set[str]]
) -> Refusal | None:
    """The kernel runs before the first of ``ordered`` and reads every input there; each
    statement of ``ordered`` read its own (``reads``, by statement id) when it ran. So nothing
    from the first to the last may change an input a later one reads, and none may change its
    own in place (a plain assignment binds its target only after its value is computed:
    ``query = self.q_proj(query).view(s)`` then ``key = self.k_proj(key)`` is fine)."""
    first, last = ordered[0], ordered[-1]
    span = [first, *blocks.between(first, last), last] if first is not last else [first]
    for index, statement in enumerate(span):
        later: set[str] = set()
        for after in span[index + 1 :]:
            later |= reads.get(id(after), set())
        changed = assigned_names(statement) | mutated_names(statement)
        own = reads.get(id(statement), set())
        plain = isinstance(statement, (ast.Assign, ast.AnnAssign)) and not any(
            isinstance(node, ast.NamedExpr) for node in ast.walk(statement)
        )
        if changed & later or (mutated_names(statement) if plain else changed) & own:
            return Refusal(f"line {statement.lineno} changes an input of the fused call")
    return None


@check
def check_sinkable_past(
    statement: ast.stmt, between: list[ast.stmt], moving: list[ast.stmt]
) -> Refusal | None:
    """A statement moved down to the fused call (past ``between``) is one simple line, and
    changes places only with statements it does not depend on, nor they on it (the others
    ``moving`` keep their order)."""
    if statement.lineno != statement.end_lineno or not isinstance(
        statement, (ast.Assign, ast.AnnAssign)
    ):
        return Refusal(f"line {statement.lineno} would move, and is not one simple line")
    for other in between:
        if any(other is m for m in moving):
            continue
        if _depends(other, statement) or not _plain_call_free(other):
            return Refusal(f"line {other.lineno} depends on the statement to be moved")
    return None


def _plain_call_free(statement: ast.stmt) -> bool:
    """A statement whose calls cannot see the moved one run: only ``isinstance``, ``len`` and
    ``getattr`` of names (the rest may read state a projection changed, e.g. hooks)."""
    for node in ast.walk(statement):
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "len", "getattr")
        ):
            return False
    return True


@check
def check_one_result_each(moved: list[ast.stmt], steps: list[FlowStep]) -> Refusal | None:
    """A statement moved down to the fused call holds one of the kernel's results."""
    for statement in moved:
        holding = [step for step in steps if step.statement is statement]
        if len(holding) != 1:
            return Refusal(f"line {statement.lineno} would move, and holds several projections")
    return None


@check
def check_moved_keeps_inputs(statement: ast.stmt, own: set[str], later: set[str]) -> Refusal | None:
    """A statement moved to just after the fused call changes no input a later projection
    reads, nor its own in place."""
    changed = assigned_names(statement) | mutated_names(statement)
    if changed & later or mutated_names(statement) & own:
        return Refusal(f"line {statement.lineno} changes an input of the fused call")
    return None


def step_input_names(site: Site, index: int) -> set[str]:
    """The names matched step ``index`` reads through its input variables (``$x``)."""
    pattern_step = site.rule.forward.steps[index]  # type: ignore[union-attr]
    step = site.steps[index]
    operands = step.positional
    if step.id in site.swapped:
        operands = list(reversed(operands))
    names: set[str] = set()
    positional = [a for a in pattern_step.args if isinstance(a, Positional)]
    for position, arg in enumerate(positional):
        if position >= len(operands) or not isinstance(arg.value, Var):
            continue
        if isinstance(site.bindings.get(arg.value.name), Operand):
            node = operands[position].node
            names |= read_names(node) if node is not None else set()
    return names


@check
def check_fresh_name(name: str, taken: set[str], owner: str) -> Refusal | None:
    """A name the rewrite adds to a function (``owner``: helper or function) is unused there."""
    if name in taken:
        return Refusal(f"the {owner} already uses the name `{name}`")
    return None


# -- nn.Sequential ----------------------------------------------------------------------------
@check
def check_sequential_call(call: ast.AST, replacement: tuple[PatternStep, ...]) -> Refusal | None:
    if len(replacement) != 1 or not isinstance(call, ast.Call) or len(call.args) != 1:
        return Refusal("only a one-argument nn.Sequential call can be split")
    return None


@check
def check_elements_lead(steps: list[FlowStep], inside: list[FlowStep]) -> Refusal | None:
    """The matched elements of the container (``inside``) come first in the match."""
    if steps[: len(inside)] != inside:
        return Refusal("the match mixes nn.Sequential elements and other calls")
    return None


@check
def check_rest_outside(outside: list[FlowStep], function: ast.FunctionDef) -> Refusal | None:
    """After the container's elements the match goes on in the container's caller."""
    if any(step.synthetic or step.function is not function for step in outside):
        return Refusal("the match mixes nn.Sequential elements and other calls")
    return None


@check
def check_one_chain(steps: list[FlowStep]) -> Refusal | None:
    if len({step.inline_chain for step in steps}) != 1:
        return Refusal(SPANS_METHODS)
    return None


@check
def check_sequential_elements(inside: list[FlowStep]) -> Refusal | None:
    """The matched elements belong to one ``nn.Sequential`` whose indexes are static."""
    owners = {id(s.construction.owner) for s in inside if s.construction is not None}
    first = inside[0].construction
    owner = first.owner if first is not None else None
    if owner is None or len(owners) != 1 or any(s.construction is None for s in inside):
        return Refusal("internal: the nn.Sequential of the matched elements is not known")
    if owner.elements_unknown:
        return Refusal(
            f"line {owner.line}: the indexes of this nn.Sequential's elements are not known "
            f"statically ({owner.elements_unknown}); not rewritten rather than guessed"
        )
    if any(s.construction.position is None for s in inside):  # type: ignore[union-attr]
        return Refusal(f"line {owner.line}: an nn.Sequential element has no static index")
    return None


@check
def check_consecutive(indices: list[int]) -> Refusal | None:
    if indices != list(range(indices[0], indices[0] + len(indices))):
        return Refusal("the fused nn.Sequential elements are not consecutive")
    return None


@check
def check_last_elements(indices: list[int], count: int) -> Refusal | None:
    """A match that goes on after the container must take its last elements."""
    if indices[-1] != count - 1:
        return Refusal("the matched nn.Sequential elements are not its last ones")
    return None


# -- a match that starts at the end of a helper and ends in its caller ------------------------
@check
def check_across_call(
    steps: list[FlowStep], held: int, replacement: tuple[PatternStep, ...]
) -> Refusal | None:
    """The first ``held`` steps end one helper, the others run in the one method that called
    it, of another class: ``forward``, so no override keeps the old signature."""
    helper, chain = steps[0].function, steps[0].inline_chain
    inner, outer = steps[:held], steps[held:]
    caller = outer[0].function if outer else None
    if helper is None or caller is None or helper is caller:
        return Refusal(SPANS_METHODS)
    if any(s.function is not caller or s.inline_chain != outer[0].inline_chain for s in outer):
        return Refusal(SPANS_METHODS)
    if chain[:-1] != outer[0].inline_chain:
        return Refusal(SPANS_METHODS)
    if helper.name != "forward" or inner[0].cls == outer[0].cls:
        # A method called on ``self`` may be overridden with the old signature.
        return Refusal(f"{helper.name}() is a method of the caller's class; not rewritten")
    if len(replacement) != 1 or any(s.synthetic for s in steps):
        return Refusal(SPANS_METHODS)
    return None


@check
def check_helper_returns(helper: ast.FunctionDef, final: ast.AST | None) -> Refusal | None:
    """The helper ends by returning the matched value (``final``), and returns only there."""
    body = helper.body
    last = body[-1] if body else None
    if not isinstance(last, ast.Return) or last.value is None:
        return Refusal(f"{helper.name}() does not end by returning the matched value")
    if sum(isinstance(n, ast.Return) for n in ast.walk(helper)) != 1:
        return Refusal(f"{helper.name}() returns in several places")
    returned = last.value is final
    if not returned and isinstance(last.value, ast.Name) and len(body) > 1:
        previous = body[-2]
        returned = (
            isinstance(previous, ast.Assign)
            and is_plain_assignment(previous, final)  # type: ignore[arg-type]
            and previous.targets[0].id == last.value.id  # type: ignore[attr-defined]
        )
    if not returned:
        return Refusal(f"{helper.name}() does not end by returning the matched value")
    return None


@check
def check_helper_tail(
    helper: ast.FunctionDef, statements: list[ast.stmt | None], first: int | None
) -> Refusal | None:
    """The matched ``statements`` are the helper's last ones (``first``: the index of the first
    of them in its body)."""
    if first is None:
        return Refusal(f"{helper.name}(): the matched computation sits in a nested block")
    for statement in helper.body[first:-1]:
        if not any(statement is s for s in statements):
            return Refusal(
                f"line {statement.lineno}: {helper.name}() does more after the matched "
                "computation starts"
            )
    return None


# -- a submodule's work copied into the caller (rewrite/inline.py) ---------------------------
@check
def check_module_helper_call(owner: str, calls: list[ast.Call]) -> Refusal | None:
    """The submodule whose work the kernel arm copies is called once by the edited function
    (the kernel arm replaces that one call)."""
    if len(calls) != 1:
        how = "not called directly" if not calls else "called more than once"
        return Refusal(f"{owner}() is {how} by the function the replacement edits")
    return None


@check
def check_same_file(
    helper: ast.FunctionDef, inner: list[FlowStep], outer: list[FlowStep]
) -> Refusal | None:
    """The submodule is a class of the edited file: the globals its copied statements read
    are the caller's."""
    if len({step.path for step in [*inner, *outer]}) != 1:
        return Refusal(f"{helper.name}() belongs to a class of another file; not copied")
    return None


@check
def check_helper_ends_with_match(
    helper: ast.FunctionDef, tail: list[ast.stmt], statements: list[ast.stmt], final: ast.expr
) -> Refusal | None:
    """From its first matched statement on, the helper does only matched work, or names the
    matched value again (``prediction_scores = hidden_states``), and returns the last matched
    value (``final``) there, its only ``return``."""
    if sum(isinstance(n, ast.Return) for n in ast.walk(helper)) != 1:
        return Refusal(f"{helper.name}() returns in several places")
    aliases: dict[str, ast.expr] = {}
    for statement in tail[:-1]:
        if any(statement is s for s in statements):
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                target = statement.targets[0]
                if isinstance(target, ast.Name):
                    aliases[target.id] = statement.value
            continue
        if (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
            and isinstance(statement.value, ast.Name)
        ):
            aliases[statement.targets[0].id] = aliases.get(statement.value.id, statement.value)
            continue
        return Refusal(
            f"line {statement.lineno}: {helper.name}() does more after the matched "
            "computation starts"
        )
    last = tail[-1] if tail else None
    returned = last.value if isinstance(last, ast.Return) else None
    while isinstance(returned, ast.Name) and returned.id in aliases:
        returned = aliases.pop(returned.id)
    if returned is not final:
        return Refusal(f"{helper.name}() does not end by returning the matched value")
    return None


_NOT_COPIED = (
    ast.Lambda,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
    ast.NamedExpr,
    ast.Yield,
    ast.YieldFrom,
    ast.Await,
    ast.Starred,
)


@check
def check_copyable_prefix(helper: ast.FunctionDef, prefix: list[ast.stmt]) -> Refusal | None:
    """The helper's statements before the match can be copied into the caller: each binds one
    name to a value (no other scope, no control flow), and ``self`` only reaches attributes."""
    for statement in prefix:
        plain = (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ) or (
            isinstance(statement, ast.AnnAssign)
            and statement.value is not None
            and isinstance(statement.target, ast.Name)
        )
        parents = {
            id(child): node for node in ast.walk(statement) for child in ast.iter_child_nodes(node)
        }
        bare_self = any(
            isinstance(node, ast.Name)
            and node.id == "self"
            and not isinstance(parents.get(id(node)), ast.Attribute)
            for node in ast.walk(statement)
        )
        if not plain or bare_self or any(isinstance(n, _NOT_COPIED) for n in ast.walk(statement)):
            return Refusal(
                f"line {statement.lineno}: {helper.name}() does work before the match that is "
                "not copied into its caller"
            )
    return None


@check
def check_operand_copyable(variable: str, node: ast.expr, later: set[str]) -> Refusal | None:
    """A helper's value the kernel arm reads is computed by the statements copied before the
    match, not by the matched ones (``later``: the names those bind)."""
    late = read_names(node) & later
    if late:
        names = ", ".join(f"`{n}`" for n in sorted(late))
        return Refusal(f"${variable} reads {names}, which the submodule sets among the matched")
    return None


@check
def check_helper_arguments(
    helper: ast.FunctionDef,
    call: ast.Call,
    wanted: list[str],
    given: dict[str, ast.expr],
    defaults: dict[str, ast.expr],
) -> Refusal | None:
    """The kernel arm evaluates the call's arguments as the call did, once: none may call
    anything (one it does not read would not run at all), none is unpacked, and each parameter
    the copied statements read (``wanted``) is given or left at a constant default."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return Refusal(f"line {call.lineno}: {helper.name}() is called with unpacked arguments")
    for name, value in given.items():
        if has_call(value):
            return Refusal(
                f"line {call.lineno}: the argument for `{name}` of {helper.name}() calls "
                "something; not copied"
            )
    for name in wanted:
        if name not in given and not isinstance(defaults.get(name), ast.Constant):
            return Refusal(
                f"line {call.lineno}: {helper.name}() reads `{name}`, which the call does not give"
            )
    return None


@check
def check_globals_kept(
    helper: ast.FunctionDef, globals_read: set[str], caller_bound: set[str]
) -> Refusal | None:
    """No global the copied statements read is a local of the caller."""
    shadowed = globals_read & caller_bound
    if shadowed:
        names = ", ".join(f"`{n}`" for n in sorted(shadowed))
        return Refusal(f"the caller binds {names}, which {helper.name}() reads as a global")
    return None


# -- a match whose later calls each sit in an ``if`` (rewrite/conditioned.py) ----------------
@check
def check_condition_first(branch: ast.If, before: list[ast.stmt]) -> Refusal | None:
    """An ``if`` around a matched statement is tested before the first of them now: its test
    calls nothing and reads nothing the statements before it assign."""
    if calls_effectful(branch.test):
        return Refusal(f"line {branch.lineno}: the condition calls something")
    changed = set().union(set(), *(assigned_names(s) | mutated_names(s) for s in before))
    read = read_names(branch.test) & changed
    if read:
        names = ", ".join(f"`{n}`" for n in sorted(read))
        return Refusal(
            f"line {branch.lineno}: the condition reads {names}, set by the matched statements"
        )
    return None


@check
def check_inputs_not_moved(moved_calls: list[ast.stmt]) -> Refusal | None:
    """The kernel's inputs are values, not calls it would evaluate in the test's place."""
    if moved_calls:
        return Refusal(f"line {moved_calls[0].lineno}: an input with a call would move")
    return None


@check
def check_one_copied_helper(helper: ast.FunctionDef, earlier: object) -> Refusal | None:
    """At most one submodule's work is copied into a kernel arm."""
    if earlier is not None:
        return Refusal(f"{helper.name}(): a second submodule's work would be copied; not rewritten")
    return None


@check
def check_helper_result_named(
    step: FlowStep, result_of: FlowStep | None, holder: ast.stmt, call: ast.Call
) -> Refusal | None:
    """A value the kernel arm binds that a copied submodule computed is the one it returns,
    and the caller binds that call's result to one name (``scores = self.lm_head(x)``)."""
    if step is not result_of:
        return Refusal(f"line {step.line}: the kernel arm would bind a value local to a submodule")
    if not (
        isinstance(holder, ast.Assign)
        and holder.value is call
        and len(holder.targets) == 1
        and isinstance(holder.targets[0], ast.Name)
    ):
        return Refusal(f"line {holder.lineno}: the submodule's result is not bound to a name")
    return None


@check
def check_arguments_unchanged(
    wrapped: list[ast.stmt], holder: ast.stmt, call: ast.Call
) -> Refusal | None:
    """The kernel arm runs where the range starts and its copied statements read the call's
    arguments: nothing of the range before the call may rebind them."""
    names = set().union(set(), *(read_names(a) for a in [*call.args, *call.keywords]))
    for statement in wrapped:
        if contains(statement, holder):
            return None
        if assigned_names(statement) & names:
            return Refusal(f"line {statement.lineno} rebinds an argument of the submodule's call")
    return None


@check
def check_result_followed(found: object) -> Refusal | None:
    """The call of the helper whose result the caller's matched computation reads was found."""
    if found is None:
        return Refusal("the helper's result reaches the caller in a way not followed")
    return None


@check
def check_hands_over(handed: dict[str, str]) -> Refusal | None:
    """The caller hands the helper at least one value of its own."""
    if not handed:
        return Refusal(SPANS_METHODS)
    return None


@check
def check_inputs_stay(
    helper: ast.FunctionDef, moved_calls: Sequence[ast.stmt], insert_at: ast.stmt
) -> Refusal | None:
    """An input with a call is evaluated just before its own statement: the same point."""
    if any(owner is not insert_at for owner in moved_calls):
        return Refusal(f"{helper.name}(): an input with a call would move")
    return None


# -- a replacement of whole statements (guarded.py) -------------------------------------------
# Statements after which the kernel arm could not stand in for the range.
CONTROL_STATEMENTS = (
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
# Shared by the checks that find matched calls spread over functions in another way.
SPANS_FUNCTIONS = "the matched calls span functions in a way not rewritten"


@check
def check_statements_matched(steps: list[FlowStep]) -> Refusal | None:
    if any(s.synthetic or s.statement is None or s.function is None for s in steps):
        return Refusal("a replacement of statements needs each matched call in a statement")
    return None


@check
def check_one_root(roots: dict[int, ast.FunctionDef]) -> Refusal | None:
    """The steps inlined least deep run in one function (``roots``), the one edited."""
    if len(roots) != 1:
        return Refusal(SPANS_FUNCTIONS)
    return None


@check
def check_inlined_alike(
    step: FlowStep, function: ast.FunctionDef, shallow: int, chain: tuple[str, ...]
) -> Refusal | None:
    """A step runs in the edited ``function`` (inlined along its ``chain``, ``shallow`` deep) or
    in a helper it calls directly."""
    if step.function is function:
        if step.inline_chain != chain:
            return Refusal(SPANS_FUNCTIONS)
        return None
    # deeper only through forwards that hand their input on (module_helper checks them)
    if len(step.inline_chain) < shallow + 1 or step.inline_chain[:shallow] != chain:
        return Refusal(SPANS_FUNCTIONS)
    return None


@check
def check_inlined_through_wrappers(helper: ast.FunctionDef, copied: object) -> Refusal | None:
    """A matched step two or more calls deep is rewritten only as a submodule's ``forward``
    reached through forwards that hand their input on, whose work the kernel arm copies."""
    if copied is None:
        return Refusal(f"{helper.name}(): {SPANS_FUNCTIONS}")
    return None


@check
def check_helper_called_once(
    helper: ast.FunctionDef, calls: list[ast.Call], matched: list[ast.expr]
) -> Refusal | None:
    """The replacement may skip a helper's one call (``calls``: its calls in the edited
    function) when the helper does only matched work."""
    if len(calls) != 1 or not _only_matched_work(helper, matched):
        return Refusal(f"{helper.name}(): called more than once or does other work")
    return None


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


@check
def check_in_block(step: FlowStep, holder: int | None, first: int) -> Refusal | None:
    """Each matched call is held by a statement of the first one's block, from the first on
    (``holder``: that statement's index, ``first``: the first one's)."""
    if holder is None or holder < first:
        return Refusal(f"line {step.line}: the matched calls are not in one block")
    return None


@check
def check_whole_lines(
    source: SourceText, block: list[ast.stmt], first: int, last: int
) -> Refusal | None:
    """The replaced statements must be whole lines: the kernel arm takes their place, so a
    statement sharing a line with them (``a; b``) or a one-line body (``if c: a; b``) would be
    wrapped or dropped with them."""
    start, end = block[first], block[last]
    prefix = source.lines[start.lineno - 1].encode("utf-8")[: start.col_offset]
    joined = (first > 0 and block[first - 1].end_lineno == start.lineno) or (
        last + 1 < len(block) and block[last + 1].lineno == end.end_lineno
    )
    if joined or prefix.strip():
        return Refusal(
            f"line {start.lineno}: the matched statements share a line with other code "
            "(joined statements or a one-line body); not rewritten"
        )
    return None


def _computes(node: ast.AST) -> bool:
    """A call or an arithmetic operator: work the kernel arm would drop if it were not matched
    (``attn_weights * head_mask`` in an arm the pattern did not take)."""
    if isinstance(node, ast.UnaryOp):
        return not isinstance(node.op, ast.Not)
    return isinstance(node, (ast.Call, ast.BinOp, ast.AugAssign))


@check
def check_unpacked_reads(
    function: ast.FunctionDef, statement: ast.stmt, steps: list[FlowStep]
) -> Refusal | None:
    """The names a deleted ``a, b = value`` binds may be read only by the matched
    computations: another arm (``a * act(b) if c else act(a) * b``) would lose them."""
    assert isinstance(statement, ast.Assign)
    target = statement.targets[0]
    assert isinstance(target, (ast.Tuple, ast.List))
    names = {element.id for element in target.elts if isinstance(element, ast.Name)}
    matched = [step_expression(step) for step in steps]
    end = (statement.end_lineno or statement.lineno, statement.end_col_offset or 0)
    # Reads that may see the binding: after it, or anywhere in a loop around it.
    loops = [
        node
        for node in ast.walk(function)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and contains(node, statement)
    ]
    rebound = {} if loops else _rebound_after(function, statement, names)
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load):
            later = (node.lineno, node.col_offset) >= end
            if not later and not any(contains(loop, node) for loop in loops):
                continue
            if node.id in rebound and any(contains(s, node) for s in rebound[node.id]):
                continue  # reads a later binding of the name (``h = act(g) * h`` then ``fc2(h)``)
            if not any(contains(m, node) for m in matched):
                return Refusal(
                    f"line {node.lineno}: `{node.id}`, unpacked at line {statement.lineno}, "
                    "is also read where the match does not run"
                )
    return None


def _rebound_after(
    function: ast.FunctionDef, statement: ast.stmt, names: set[str]
) -> dict[str, list[ast.stmt]]:
    """For each of ``names``, the statements of ``statement``'s block after the first plain
    assignment there that rebinds it: whatever they read of it is that later binding."""
    body, index, _, _ = Blocks(function).block_of(statement)
    found: dict[str, list[ast.stmt]] = {}
    for position in range(index + 1, len(body)):
        later = body[position]
        if isinstance(later, (ast.Assign, ast.AnnAssign)):
            for name in assigned_names(later) & names:
                found.setdefault(name, body[position + 1 :])
    return found


def _unmatched_value(node: ast.AST, matched: list[ast.expr]) -> bool:
    """An assignment of a value that is neither a constant nor one of the matched calls."""
    if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or node.value is None:
        return False
    value = node.value
    if isinstance(value, ast.Constant) or isinstance(node, ast.AugAssign):
        return isinstance(node, ast.AugAssign)
    return not any(contains(m, value) for m in matched)


@check
def check_only_matched_work(
    source: SourceText,
    wrapped: list[ast.stmt],
    matched: list[ast.expr],
    final_return: ast.Return | None,
    *,
    guarded: bool = False,
    kept: ast.stmt | None = None,
) -> Refusal | None:
    """The range does nothing but the matched work (and the calls of helpers that do only
    matched work); a ``return`` may end it (``final_return``) when it returns the
    replacement's value, and its last statement may be ``kept`` as written around the
    replacement's call. In a guarded range (``guarded``) no statement assigns a value the
    match did not compute either."""
    for statement in wrapped:
        if statement is kept:
            continue
        # a local variable's annotation is never evaluated (``loss: Tensor | None = None``)
        annotations = {
            id(part)
            for node in ast.walk(statement)
            if isinstance(node, ast.AnnAssign)
            for part in ast.walk(node.annotation)
        }
        for node in ast.walk(statement):
            if node is final_return or id(node) in annotations:
                continue
            if isinstance(node, CONTROL_STATEMENTS) or isinstance(
                node, (ast.FunctionDef, ast.ClassDef)
            ):
                return Refusal(
                    f"line {node.lineno}: the matched statements also hold "  # type: ignore[attr-defined]
                    f"`{type(node).__name__.lower()}`; not rewritten"
                )
            if guarded and _unmatched_value(node, matched):
                # ``if cond: logits = logits * scale`` between head and loss: the kernel arm
                # would skip the scale (a match reached the loss through the unscaled path).
                return Refusal(
                    f"line {node.lineno}: `{source.segment(node)}` computes among the "  # type: ignore[attr-defined]
                    "matched statements; not rewritten"
                )
            if _computes(node) and not any(contains(m, node) for m in matched):
                return Refusal(
                    f"line {node.lineno}: `{source.segment(node)}` runs among the "
                    "matched statements; not rewritten"
                )
    return None


@check
def check_targets_named(new_step: PatternStep, producer: dict[str, object]) -> Refusal | None:
    """Each step of the kernel arm binds values of the pattern (``producer``: by name)."""
    if not new_step.targets or any(t.name not in producer for t in new_step.targets):
        return Refusal("a replacement step must name values of the pattern")
    return None


@check
def check_assigned_plainly(step: FlowStep) -> Refusal | None:
    """The kernel arm binds a value under the name its matched statement assigned it to."""
    if not is_plain_assignment(step.statement, step.node):  # type: ignore[arg-type]
        return Refusal(f"line {step.line}: the value is not assigned to a plain name")
    return None


@check
def check_return_last(
    names: list[str], new_step: PatternStep, body: tuple[PatternStep, ...]
) -> Refusal | None:
    """Only the last step of the kernel arm (``body``) may give the returned value."""
    if "return" in names and (len(names) > 1 or new_step is not body[-1]):
        return Refusal("only the last replacement step may give the returned value")
    return None


@check
def check_renderable_step(new_step: PatternStep) -> Refusal | None:
    if not isinstance(new_step.callee, (Literal, Name)):
        return Refusal(f"cannot render replacement step {new_step}")
    return None


@check
def check_return_kept(final_return: ast.Return | None, lines: list[str]) -> Refusal | None:
    """A range that ends in a ``return`` is replaced by a kernel arm that returns too."""
    if final_return is not None and not lines[-1].startswith("return "):
        return Refusal(f"line {final_return.lineno}: the matched statements end in a `return`")
    return None


@check
def check_constant_not_returned_over(names: set[str], reader: ast.stmt | None) -> Refusal | None:
    """A constant the kernel arm binds (``logits = None``) moves after the arm's last line that
    reads its name (that read means the value from before the range); where that line is the
    arm's ``return``, nothing can follow it."""
    if isinstance(reader, ast.Return):
        shown = ", ".join(f"`{name}`" for name in sorted(names))
        return Refusal(f"the kernel arm's return reads {shown} after binding it to a constant")
    return None


@check
def check_arm_sets_what_is_read(
    function: ast.FunctionDef, wrapped: list[ast.stmt], bound: set[str], blocks: Blocks
) -> Refusal | None:
    """Every name the range binds that is read anywhere else in the function (or again by a
    loop around it) is bound by the kernel arm (``bound``)."""
    assigned = set().union(*(assigned_names(s) for s in wrapped))
    elsewhere = read_names(function) - set().union(*(read_names(s) for s in wrapped))
    unset = (assigned - bound) & (elsewhere | _read_in_range_loops(blocks, wrapped))
    if unset:
        return Refusal(
            "the matched statements also set "
            + ", ".join(f"`{n}`" for n in sorted(unset))
            + ", which the kernel arm would leave unset"
        )
    return None


def _read_in_range_loops(blocks: Blocks, wrapped: list[ast.stmt]) -> set[str]:
    """Names read by a loop around the range (a later iteration reads them again)."""
    found: set[str] = set()
    parent = blocks.block_of(wrapped[0])[2]
    while parent is not None:
        if isinstance(parent, (ast.For, ast.AsyncFor, ast.While)):
            found |= read_names(parent)
        parent = blocks.block_of(parent)[2] if id(parent) in blocks.where else None
    return found


@check
def check_arm_reads_unchanged(
    site: Site,
    holders: list[ast.stmt],
    wrapped: list[ast.stmt],
    guard: PatternStep | None,
    body: tuple[PatternStep, ...],
    computed: frozenset[str] = frozenset(),
) -> Refusal | None:
    """The kernel arm runs where the range starts: each value it reads must be the one the
    matched call that read it saw (no statement of the range assigns it before that call),
    unless the kernel arm computes it first itself (``computed``: the cap read from the
    configuration)."""
    changed = _changed_before_read(site, site.steps, holders, wrapped, guard, body) - computed
    if changed:
        return Refusal(
            "the kernel arm reads "
            + ", ".join(f"`{n}`" for n in sorted(changed))
            + ", which the matched statements assign before it is read"
        )
    return None


def _changed_before_read(
    site: Site,
    steps: list[FlowStep],
    holders: list[ast.stmt],
    wrapped: list[ast.stmt],
    guard: PatternStep | None,
    body: tuple[PatternStep, ...],
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


# -- the edit ---------------------------------------------------------------------------------
WRAPPER = "if True:"  # as apply._edit_span parses an indented span


def _fragment(text: str, indented: bool) -> ast.Module:
    """Whole statements of one block, parsed alone (under ``if True:`` when indented)."""
    return ast.parse((WRAPPER + "\n" if indented else "") + text)


@check
def check_edit(
    source: SourceText, start: int, end: int, new_lines: list[str], plans: list[Plan]
) -> Refusal | None:
    """The post-condition of every edit: the new lines call each planned kernel once more than
    the old ones did, and hold none of the statements and expressions the plans replaced (a
    statement moved into the arms of an ``if`` at most as often as before). Otherwise the
    edit is refused, never written."""
    try:
        indented = bool(source.indentation(start))  # as _edit_span parsed them
        old = _fragment("".join(source.lines[start - 1 : end]), indented)
        new = _fragment("".join(new_lines), indented)
    except SyntaxError as error:
        return Refusal(f"lines {start}-{end}: the edit does not parse ({error.msg})")
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
            return Refusal(f"lines {start}-{end}: the edit does not call {name} as planned")
    removed: dict[str, int] = {}
    kept: dict[str, int] = {}  # moved or copied into other arms: no more often than before
    allowed: dict[str, int] = {}
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
        for node in plan.fallback:  # the original arm of an identity-guarded kernel call
            allowed[ast.dump(node)] = allowed.get(ast.dump(node), 0) + 1
        for node in moved:
            kept.setdefault(ast.dump(node), 0)
        if plan.spread is not None:
            # copied unchanged into each arm that does not fuse (the carried ones into every
            # arm): one arm runs on a path
            copies = plan.spread.arms - len(plan.spread.fused)
            for node in plan.spread.moved:
                dumped = ast.dump(node)
                carried = any(node is c for c in plan.spread.carried)
                extra = plan.spread.arms if carried else copies
                kept[dumped] = kept.get(dumped, 0) + extra - 1
    before = _dump_counts(old, set(removed) | set(kept))
    after = _dump_counts(new, set(removed) | set(kept))
    for dumped, count in removed.items():
        if after[dumped] > before[dumped] - count + allowed.get(dumped, 0):
            return Refusal(f"lines {start}-{end}: the edit keeps a computation the kernel replaces")
    for dumped, extra in kept.items():
        if after[dumped] > before[dumped] + extra:
            return Refusal(f"lines {start}-{end}: the edit runs a moved statement twice")
    return None


def _dump_counts(tree: ast.AST, wanted: set[str]) -> dict[str, int]:
    counts = dict.fromkeys(wanted, 0)
    for node in ast.walk(tree):
        if isinstance(node, (ast.stmt, ast.expr)):
            dumped = ast.dump(node)
            if dumped in counts:
                counts[dumped] += 1
    return counts


# Where a part of a statement runs only on some paths through it: the arms of an ``if`` or a
# conditional expression, a loop's body, the operands after the first of ``and`` / ``or``, a
# ``try`` body's handlers, a comprehension's element.
def _conditional_parts(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, (ast.If, ast.While)):
        return [*node.body, *node.orelse]
    if isinstance(node, ast.IfExp):
        return [node.body, node.orelse]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return [*node.body, *node.orelse]
    if isinstance(node, ast.BoolOp):
        return node.values[1:]
    if isinstance(node, ast.Try):
        return [*node.handlers, *node.orelse, *node.finalbody]
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        return list(ast.iter_child_nodes(node))
    return []


def _optional_input(branch: ast.If | ast.IfExp, matched: list[ast.expr]) -> bool:
    """``if mask is not None: scores = scores + mask``: the arm that skips the matched work is
    the one where an input it reads is ``None``, which the kernel, handed that input, takes as
    absent (a mask, a position bias: the rules' documented contract)."""
    test = branch.test
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Is, ast.IsNot))
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    ):
        return False
    body, orelse = (branch.body, branch.orelse)
    taken, skipped = (body, orelse) if isinstance(test.ops[0], ast.IsNot) else (orelse, body)
    taken = taken if isinstance(taken, list) else [taken]
    skipped = skipped if isinstance(skipped, list) else [skipped]
    tested = ast.dump(test.left)
    inside = [m for m in matched if any(contains(part, m) for part in taken)]
    return (
        not any(contains(part, m) for part in skipped for m in matched)
        and bool(inside)
        and any(ast.dump(n) == tested for m in inside for n in ast.walk(m))
    )


def _given_by_guard(
    branch: ast.If | ast.IfExp, matched: list[ast.expr], given: frozenset[str]
) -> bool:
    """``if labels is not None:`` around the loss in a guarded range, where the guard holds only
    for given labels (``given``: the dumps of the rule's ``given:`` inputs): the matched work
    sits in the arm the guard always takes. The test is ``g is not None`` (or ``g is None``,
    the work in its ``else``), or an ``and`` of such tests, each of a given input. (Labels
    rebound in the range before the test are refused by ``check_arm_reads_unchanged``: the
    kernel arm reads them too.)"""
    test = branch.test
    tests = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    negated = len(tests) == 1 and isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.Is)
    for part in tests:
        if not (
            isinstance(part, ast.Compare)
            and len(part.ops) == 1
            and isinstance(part.ops[0], ast.Is if negated else ast.IsNot)
            and isinstance(part.comparators[0], ast.Constant)
            and part.comparators[0].value is None
            and ast.dump(part.left) in given
        ):
            return False
    skipped = branch.body if negated else branch.orelse
    skipped = skipped if isinstance(skipped, list) else [skipped]
    return not any(contains(part, m) for part in skipped for m in matched)


@check
def check_matched_on_every_path(
    wrapped: list[ast.stmt],
    matched: list[ast.expr],
    decided: list[ast.expr],
    given: frozenset[str] = frozenset(),
) -> Refusal | None:
    """The kernel replaces the range on every path through it (a guarded one: on every path
    its guard takes), so each matched call must run on every path (``if self.with_scale: out =
    out * self.weight`` would make the weight the kernel always applies optional), unless the
    condition that decides it is part of the match itself (``decided``: T5's ``if
    self.weight.dtype in (...)``, a ``where`` step) or, in a guarded range, a test the guard
    always passes (``given``: ``if labels is not None:`` around the loss)."""
    for statement in wrapped:
        for node in ast.walk(statement):
            parts = _conditional_parts(node)
            if not parts:
                continue
            test = getattr(node, "test", None)
            if test is not None and any(contains(test, d) for d in decided):
                continue
            if isinstance(node, (ast.If, ast.IfExp)) and (
                _optional_input(node, matched) or _given_by_guard(node, matched, given)
            ):
                continue
            for part in parts:
                inner = next((m for m in matched if contains(part, m)), None)
                if inner is not None:
                    return Refusal(
                        f"line {inner.lineno}: `{ast.unparse(inner)}` runs only on some paths "
                        f"through line {node.lineno} (`{type(node).__name__.lower()}`), and the "
                        "kernel would run it on all; not rewritten"
                    )
    return None
