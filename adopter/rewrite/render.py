"""Rendering: the text a plan writes, from the rule's replacement and the matched code.

A replacement is rendered with the matched values' *own source text* (``hidden_states``,
``self.LayerNorm``), so the patched code reads like the original. What may not be rendered
safely is refused through the checks of :mod:`.checks`; the planner decides where the text
goes.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dsl.syntax import (
    Attribute,
    Call,
    Expr,
    Index,
    Keyword,
    Literal,
    Name,
    Positional,
    Rest,
    Var,
)
from ..dsl.syntax import Step as PatternStep
from ..extract.model import Construction, Operand, Reciprocal
from ..extract.model import Step as FlowStep
from ..extract.names import DROPOUT_FUNCTION
from ..match.matcher import BoundModule, Site
from .checks import (
    KERNEL_PACKAGE,
    check_argument_named,
    check_bound,
    check_construction_rest_kept,
    check_dropout_handed_over,
    check_evaluated_in_place,
    check_kernel_package,
    check_module_call_in_source,
    check_operand_has_text,
    check_renderable_callee,
    check_renderable_value,
    require,
)
from .names import fresh_alias
from .source import SourceText, has_call, read_names

if TYPE_CHECKING:
    from .plan import Plan

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


def elements_called(source: SourceText, call: ast.Call, before: list[str]) -> str:
    """The input of an ``nn.Sequential`` call passed through the elements ``before``, in order."""
    text = source.segment(call.args[0])
    for element_call in before:
        text = f"{element_call}({text})"
    return text


def element_call(container: str, index: int) -> str:
    """An element of an ``nn.Sequential`` by its index (``self.proj[2]``)."""
    return f"{container}[{index}]"


def tuple_assignment(names: list[str], call_text: str) -> str:
    """The statement that binds a kernel's several results."""
    return f"{', '.join(names)} = {call_text}"


def call_with_keywords(source: SourceText, call: ast.Call, keywords: dict[str, str]) -> str:
    """``call`` as written, with ``keywords`` (name: value text) added at the end."""
    arguments = [source.segment(a) for a in call.args]
    arguments += [
        ("**" if k.arg is None else f"{k.arg}=") + source.segment(k.value) for k in call.keywords
    ]
    arguments += [f"{name}={value}" for name, value in keywords.items()]
    return f"{source.segment(call.func)}({', '.join(arguments)})"


def guarded_return(guard: str, kernel_call: str) -> str:
    """The lines a helper gains: the kernel's result when the caller hands over its values."""
    return f"if {guard} is not None:\n    return {kernel_call}\n"


def assignment_head(source: SourceText, statement: ast.stmt, value: ast.expr) -> str:
    """What comes before ``value`` in its statement, a return or a plain assignment."""
    if isinstance(statement, ast.Return) and statement.value is value:
        return "return "
    assert isinstance(statement, (ast.Assign, ast.AnnAssign))
    target = statement.targets[0] if isinstance(statement, ast.Assign) else statement.target
    return f"{source.segment(target)} = "


def statement_with_comment(source: SourceText, statement: ast.stmt) -> str:
    """A statement's text with the comment that ends its last line, to be copied elsewhere."""
    text = source.segment(statement)
    rest = source.lines[statement.end_lineno - 1].encode("utf-8")  # type: ignore[operator]
    comment = rest[statement.end_col_offset :].decode("utf-8").strip()  # type: ignore[misc]
    return f"{text}  {comment}" if comment.startswith("#") else text


def moved_with_name(source: SourceText, statement: ast.stmt, node: ast.expr, name: str) -> str:
    """A one-line ``statement``'s text, with its comment, where ``node`` reads ``name``."""
    line = source.lines[statement.lineno - 1].encode("utf-8")
    before = line[statement.col_offset : node.col_offset].decode("utf-8")  # type: ignore[misc]
    after = line[node.end_col_offset : statement.end_col_offset].decode("utf-8")  # type: ignore[misc]
    comment = line[statement.end_col_offset :].decode("utf-8").strip()  # type: ignore[misc]
    text = f"{before}{name}{after}"
    return f"{text}  {comment}" if comment.startswith("#") else text


def pattern_callee_name(expr: Expr) -> str:
    """The last part of a pattern's callee (``LayerNorm`` of ``torch.nn.LayerNorm``)."""
    return _dotted(expr).rsplit(".", 1)[-1]


def _dotted(expr: Expr) -> str:
    if isinstance(expr, Name):
        return expr.dotted
    if isinstance(expr, Index):
        return _dotted(expr.base)
    return str(expr)


class Renderer:
    """Renders the replacement calls of one file's sites and names the kernels they import."""

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
        # The statements of inputs with a call that a rendered call now evaluates: the
        # planner must check that nothing runs between them and the call.
        self.moved_calls: list[ast.stmt] = []
        # Text for variables the caller of a helper hands over under a name of its own.
        self.var_text: dict[str, str] = {}
        self.name_text: dict[str, str] = {}  # names the replacement spells out, rendered so
        self._extra_keywords: list[str] = []  # keywords a rendered argument adds to the call

    def kernel_name(self, dotted: str, plan: Plan) -> str:
        """Local name of a kernel, imported once at the top of the module."""
        local = self.local_kernel_name(dotted)
        plan.imports.add(dotted.rpartition(".")[2])
        plan.kernel_calls.append(local)
        return local

    def local_kernel_name(self, dotted: str) -> str:
        """The name a kernel of ``adopter.kernels`` has in this module (an alias where its own
        name is taken), the same for every edit of the file."""
        require(check_kernel_package(dotted))
        name = dotted.rpartition(".")[2]
        local = self.aliases.get(name)
        if local is None:
            taken = self.taken_names | set(self.aliases.values())
            local = name if name not in taken else fresh_alias(name, taken)
            self.aliases[name] = local
        return local

    def call(
        self,
        new_step: PatternStep,
        site: Site,
        plan: Plan,
        final_pattern: PatternStep,
        final_step: FlowStep,
        module_text: dict[str | None, str] | None = None,
        first_input: str | None = None,
        unbound: frozenset[str] = frozenset(),
    ) -> str:
        """A replacement step as a call; ``...`` stands for the final matched call's arguments
        its pattern did not name, less those that read a name of ``unbound`` (a guard runs
        before the statements that bind them), ``first_input`` (given) for the first
        argument."""
        callee = self.callee(new_step.callee, plan, {}, site)
        rest = self.forward_rest(final_pattern, final_step, unbound)
        self._extra_keywords = []
        arguments = self.arguments(
            new_step.args, site, plan, rest=rest, module_text=module_text, first_input=first_input
        )
        arguments += self._extra_keywords
        return f"{callee}({', '.join(arguments)})"

    def construction(
        self,
        new_step: PatternStep,
        site: Site,
        plan: Plan,
        pattern: PatternStep,
        construction: Construction,
    ) -> str:
        """A construction's replacement; the pattern's callee name stands for the original."""
        call = construction.node
        assert isinstance(call, ast.Call)
        renames = {pattern_callee_name(pattern.callee): self.source.segment(call.func)}
        callee = self.callee(new_step.callee, plan, renames, site)
        rest = self.construction_rest(pattern, construction)
        require(check_construction_rest_kept(call, rest, new_step))
        arguments = self.arguments(new_step.args, site, plan, rest=rest)
        return f"{callee}({', '.join(arguments)})"

    def callee(self, callee: Expr, plan: Plan, renames: dict[str, str], site: Site) -> str:
        require(check_renderable_callee(callee))
        if isinstance(callee, Name):
            if callee.dotted in renames:
                return renames[callee.dotted]
            if callee.dotted.startswith(KERNEL_PACKAGE + "."):
                return self.kernel_name(callee.dotted, plan)
            return callee.dotted
        assert isinstance(callee, Call)
        base = self.callee(callee.base, plan, renames, site)
        args = self.arguments(callee.args, site, plan, rest=[], renames=renames)
        return f"{base}({', '.join(args)})"

    def arguments(
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
                rendered.append(f"{arg.key}={self.value(arg.value, site, plan, module_text)}")
            else:
                if position == 0 and first_input is not None:
                    rendered.append(first_input)
                    continue
                value = arg.value
                if isinstance(value, Name) and renames and value.dotted in renames:
                    rendered.append(renames[value.dotted])
                else:
                    rendered.append(self.value(value, site, plan, module_text))
        return rendered

    def value(
        self, value: Expr, site: Site, plan: Plan, module_text: dict[str | None, str] | None
    ) -> str:
        """One argument: a literal, a name, or what a variable of the match stands for."""
        require(check_renderable_value(value))
        if isinstance(value, Literal):
            return repr(value.value)
        if isinstance(value, Name):
            return self.name_text.get(value.dotted, value.dotted)
        if isinstance(value, Attribute):  # ``$owner.vocab_size``: the attribute of what it binds
            return f"{self.value(value.base, site, plan, module_text)}.{value.name}"
        assert isinstance(value, Var)
        if value.name in self.var_text:
            return self.var_text[value.name]
        bound = site.bindings.get(value.name)
        require(check_bound(value.name, bound))
        if isinstance(bound, BoundModule):
            if module_text is not None and bound.path in module_text:
                return module_text[bound.path]
            step = next((s for s in site.steps if s.module == bound.path), None)
            require(check_module_call_in_source(value.name, step))
            assert step is not None and isinstance(step.node, ast.Call)
            if bound.construction.kind == DROPOUT_FUNCTION:
                return self.functional_dropout(step.node)
            return self.source.segment(step.node.func)
        if isinstance(bound, Operand):
            return self.operand(value.name, bound, site)
        assert isinstance(bound, str)
        return bound

    def operand(self, name: str, bound: Operand, site: Site) -> str:
        """A matched input's own text; one with a call moves with it (see ``moved_calls``)."""
        require(check_operand_has_text(name, bound))
        written = bound.of if isinstance(bound, Reciprocal) else bound  # what the source holds
        assert written is not None and written.node is not None
        text = self.source.segment(written.node)
        if has_call(written.node):
            owner = next((s for s in site.steps if any(op is written for op in s.operands())), None)
            require(check_evaluated_in_place(name, text, owner))
            self.moved_calls.append(owner.statement)  # type: ignore[union-attr,arg-type]
        atom = isinstance(
            written.node, (ast.Name, ast.Attribute, ast.Call, ast.Constant, ast.Subscript)
        )
        if "\n" in text or "\r" in text:
            text, atom = f"({text})", True
        if isinstance(bound, Reciprocal):
            # ``x / s`` read as ``x * (1 / s)``: the divisor, bracketed unless it is one atom
            return f"1 / {text}" if atom else f"1 / ({text})"
        return text

    def functional_dropout(self, call: ast.Call) -> str:
        """``F.dropout(x, p=0.1, training=self.training)`` handed to a kernel that takes a drop
        probability: its ``p``, and its ``training`` flag as a keyword of the kernel call
        (``F.dropout`` drops by default; a kernel given a float would follow the module)."""
        names = ["input", "p", "training", "inplace"]
        given = dict(zip(names, call.args))
        given.update({k.arg: k.value for k in call.keywords if k.arg is not None})
        require(check_dropout_handed_over(call, given))
        training = given.get("training")
        self._extra_keywords.append(
            "training=" + (self.source.segment(training) if training is not None else "True")
        )
        p = given.get("p")
        return self.source.segment(p) if p is not None else "0.5"

    def forward_rest(
        self, pattern: PatternStep, step: FlowStep, unbound: frozenset[str] = frozenset()
    ) -> list[str]:
        """Arguments of the final matched call that its pattern did not name, as keywords,
        less those that read a name of ``unbound``."""
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
            if read_names(operand.node) & unbound:
                continue
            name = name_of.get(id(operand))
            require(check_argument_named(step, index, name))
            rest.append(f"{name}={self.source.segment(operand.node)}")
        call = step.node
        if isinstance(call, ast.Call):
            for keyword in call.keywords:
                operand = step.arguments.get(keyword.arg or "")
                if read_names(keyword.value) & unbound:
                    continue
                if keyword.arg is None:
                    rest.append("**" + self.source.segment(keyword.value))
                elif operand is not None and not any(operand is c for c in consumed):
                    rest.append(f"{keyword.arg}={self.source.segment(keyword.value)}")
        return rest

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
