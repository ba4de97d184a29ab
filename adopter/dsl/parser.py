"""Parse DSL text into :mod:`adopter.dsl.syntax` trees, with errors located at ``file:line:col``."""

from __future__ import annotations

import ast
from dataclasses import replace
from functools import cache

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from .errors import DslError
from .loading import GRAMMAR_PATH
from .syntax import (
    DETECT_ONLY,
    SCOPES,
    Arg,
    Attribute,
    Call,
    Expr,
    Index,
    Keyword,
    Literal,
    Name,
    Positional,
    Rest,
    Rule,
    Section,
    Step,
    Var,
    Wildcard,
)

_KEYWORD_LITERALS = {"True": True, "False": False, "None": None}
_TOKEN_DESCRIPTIONS = {
    "VAR": "a $variable",
    "NAME": "a name",
    "RULE_ID": "a rule id such as paper.1",
    "STRING": "a quoted string",
    "META_KEY": "name/description/kernel/message/site",
    "SECTION_KIND": "init or forward",
    "SEMICOLON": "';'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COLON": "':'",
    "COMMA": "','",
    "__ANON_0": "'->'",
    "__ANON_1": "'=>'",
}


@cache
def _parser(start: str) -> Lark:
    return Lark(
        GRAMMAR_PATH.read_text(encoding="utf-8"),
        start=start,
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=False,
        cache=True,  # the LALR tables are rebuilt only when the grammar changes
    )


def _expected(error: UnexpectedInput) -> str:
    names = sorted(getattr(error, "expected", None) or getattr(error, "allowed", None) or [])
    words = sorted({_TOKEN_DESCRIPTIONS.get(name, name.strip("'\"").lower()) for name in names})
    return ", ".join(words[:8]) if words else "something else"


@v_args(inline=True)
class _ToSyntax(Transformer):
    """Turns Lark's parse tree into syntax dataclasses."""

    def VAR(self, token: Token) -> Var:  # noqa: N802 - Lark names terminals in capitals
        return Var(str(token)[1:])

    def name(self, token: Token) -> Expr:
        text = str(token)
        if text in _KEYWORD_LITERALS:
            return Literal(_KEYWORD_LITERALS[text])
        return Name(text)

    def literal(self, token: Token) -> Expr:
        if token.type == "WILDCARD":
            return Wildcard()
        return Literal(ast.literal_eval(str(token)))

    def positional(self, value: Expr) -> Arg:
        return Positional(value)

    def keyword(self, key: Token, value: Expr) -> Arg:
        return Keyword(str(key), value)

    def rest(self, _token: Token) -> Arg:
        return Rest()

    def call(self, *args: Arg) -> tuple[str, tuple[Arg, ...]]:
        return ("call", tuple(a for a in args if a is not None))

    def index(self, item: Arg) -> tuple[str, Expr]:
        return ("index", item.value if isinstance(item, Positional) else Wildcard())

    def attr(self, token: Token) -> tuple[str, str]:
        return ("attr", str(token))

    def expr(self, base: Expr, *trailers: tuple) -> Expr:
        return _apply_trailers(base, list(trailers))


MAX_NESTING = 50
"""Deepest expression a step may hold (calls, subscripts, arguments); real rules need 3."""


def _too_deep() -> str:
    return f"expression nested too deeply (more than {MAX_NESTING} levels)"


def _nesting(expr: Expr) -> int:
    """Depth of an expression tree, without recursion (the tree may be thousands deep)."""
    deepest = 0
    stack: list[tuple[Expr, int]] = [(expr, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, Index):
            stack += [(node.base, depth + 1), (node.item, depth + 1)]
        elif isinstance(node, Call):
            stack.append((node.base, depth + 1))
            values = [arg.value for arg in node.args if isinstance(arg, (Positional, Keyword))]
            stack += [(value, depth + 1) for value in values]
    return deepest


def _apply_trailers(base: Expr, trailers: list[tuple]) -> Expr:
    for kind, payload in trailers:
        if kind == "attr":
            if isinstance(base, Var):
                base = Attribute(base, payload)
                continue
            if not isinstance(base, Name):
                raise ValueError(f"attribute .{payload} only follows a dotted name or $variable")
            base = Name(f"{base.dotted}.{payload}")
        elif kind == "index":
            base = Index(base, payload)
        else:
            base = Call(base, payload)
    return base


class RuleParser:
    """Parses rule files; one instance per source text so errors can name the file."""

    def __init__(self, text: str, path: str = "<string>") -> None:
        self.text = text
        self.path = path

    def error(self, node: Tree | Token | None, message: str) -> DslError:
        line = getattr(getattr(node, "meta", node), "line", 1) or 1
        column = getattr(getattr(node, "meta", node), "column", 1) or 1
        return DslError(self.path, line, column, message)

    def _parse_tree(self, start: str) -> Tree:
        try:
            return _parser(start).parse(self.text)
        except UnexpectedEOF as error:
            lines = self.text.splitlines() or [""]
            raise DslError(
                self.path,
                len(lines),
                len(lines[-1]) + 1,
                f"unexpected end of input; expected {_expected(error)}",
            ) from None
        except UnexpectedToken as error:
            if error.token.type == "$END":
                lines = self.text.splitlines() or [""]
                line, column, found = len(lines), len(lines[-1]) + 1, "end of input"
            else:
                line, column, found = error.line, error.column, repr(str(error.token))
            raise DslError(
                self.path, line, column, f"unexpected {found}; expected {_expected(error)}"
            ) from None
        except UnexpectedCharacters as error:
            char = self.text[error.pos_in_stream] if error.pos_in_stream < len(self.text) else ""
            raise DslError(
                self.path,
                error.line,
                error.column,
                f"unexpected character {char!r}; expected {_expected(error)}",
            ) from None

    def rules(self) -> list[Rule]:
        tree = self._parse_tree("rule_file")
        rules = [self._rule(node) for node in tree.children]
        seen: dict[str, Rule] = {}
        for rule in rules:
            if rule.id in seen:
                raise DslError(self.path, rule.line, 1, f"rule id {rule.id!r} defined twice")
            seen[rule.id] = rule
        return rules

    def sequence(self) -> list[Step]:
        tree = self._parse_tree("sequence_file")
        if not tree.children:
            return []
        return self._steps(tree.children[0])

    def _steps(self, step_list: Tree, *, literals: bool = False) -> list[Step]:
        return [self._step(node, literals) for node in step_list.children]

    def _step(self, node: Tree, literal: bool = False) -> Step:
        children = list(node.children)
        construct = bool(children) and isinstance(children[0], Token) and children[0].type == "AT"
        if construct:
            children = children[1:]
        expr_node = children[0]
        target_node = children[1] if len(children) > 1 else None
        try:
            expr = _ToSyntax().transform(expr_node)
        except RecursionError:
            raise self.error(node, _too_deep()) from None
        except Exception as exc:  # Lark wraps transformer errors
            cause = getattr(exc, "orig_exc", exc)
            if isinstance(cause, RecursionError):
                raise self.error(node, _too_deep()) from None
            raise self.error(node, str(cause)) from None
        if _nesting(expr) > MAX_NESTING:
            # Everything after parsing (matching, printing, caching) walks expressions
            # recursively; a bound here keeps all of it within Python's recursion limit.
            raise self.error(node, _too_deep())
        if construct and isinstance(expr, Index):
            # `@ACT2FN[$name] -> $act`: a module looked up rather than constructed.
            expr = Call(expr, (Rest(),))
            lookup = True
        else:
            lookup = False
        targets: tuple[Var, ...] = ()
        if target_node is not None:
            targets = tuple(Var(str(t)[1:]) for t in target_node.children if t.type == "VAR")
        if literal and isinstance(expr, Literal) and not construct:
            # ``None -> $logits`` in a replacement: the value a name takes on the kernel's path
            if len(targets) != 1:
                raise self.error(node, "a literal step names exactly one target: `None -> $x`")
            return Step(expr, (), targets, line=node.meta.line, column=node.meta.column)
        if isinstance(expr, Var) or not isinstance(expr, Call):
            raise self.error(node, f"a step must be a call such as `f($x) -> $y`, got `{expr}`")
        return Step(
            callee=expr.base,
            args=expr.args,
            targets=targets,
            construct=construct,
            lookup=lookup,
            line=node.meta.line,
            column=node.meta.column,
        )

    def _rule(self, node: Tree) -> Rule:
        rule_id = str(node.children[0])
        meta: dict[str, str] = {}
        kernel_at = (node.meta.line, 1)
        pairs: list[tuple[Section | None, Section | None]] = []
        waiting: Section | None = None  # an init section not yet paired with its forward
        for child in node.children[1:]:
            if child.data == "meta":
                key, value = str(child.children[0]), ast.literal_eval(str(child.children[1]))
                if key in meta:
                    raise self.error(child, f"{key!r} given twice in rule {rule_id}")
                meta[key] = value
                if key == "kernel":
                    kernel_at = (child.children[1].line, child.children[1].column)
                continue
            section = self._section(child, rule_id)
            if section.kind == "init":
                if waiting is not None:
                    raise self.error(child, f"section 'init' given twice in {rule_id}")
                waiting = section
            else:
                pairs.append((waiting, section))
                waiting = None
        if waiting is not None:
            if pairs:
                raise self.error(
                    node, f"rule {rule_id}: the last 'init' section has no 'forward' section"
                )
            pairs.append((waiting, None))
        if not pairs:
            raise self.error(node, f"rule {rule_id} has neither an init nor a forward section")
        # Each init/forward pair after the first is a variant: another spelling of the same
        # computation, with its own patterns and replacement.
        spellings = [
            replace(self._spelling(node, rule_id, meta, init, forward), kernel_at=kernel_at)
            for init, forward in pairs
        ]
        for name in spellings[0].reciprocal:
            if not any(_multiplies_by(spelling, name) for spelling in spellings):
                raise self.error(
                    node, f"rule {rule_id}: reciprocal ${name} is no mul step's second operand"
                )
        for name in spellings[0].optional:
            if not any(_hands_kernel(spelling, name) for spelling in spellings):
                raise self.error(
                    node, f"rule {rule_id}: optional {name} is handed to no replacement"
                )
        for name in spellings[0].given:
            if not all(_guard_reads(spelling, name) for spelling in spellings):
                raise self.error(
                    node, f"rule {rule_id}: given ${name} is not handed to every spelling's guard"
                )
        return replace(spellings[0], variants=tuple(spellings[1:]))

    def _spelling(
        self,
        node: Tree,
        rule_id: str,
        meta: dict[str, str],
        init: Section | None,
        forward: Section | None,
    ) -> Rule:
        sections = {s.kind: s for s in (init, forward) if s is not None}
        site = meta.get("site", "forward" if "forward" in sections else "init")
        if site not in sections:
            raise self.error(node, f"rule {rule_id}: site {site!r} names no section of the rule")
        scope = meta.get("scope", "calls")
        if scope not in SCOPES:
            raise self.error(node, f"rule {rule_id}: scope is one of {', '.join(SCOPES)}")
        if scope == "block" and (forward is None or not isinstance(forward.replacement, tuple)):
            raise self.error(node, f"rule {rule_id}: scope 'block' needs a forward replacement")
        reciprocal = _variable_list(meta, "reciprocal")
        # a variable (``$weight``) or a name the replacement spells out (``self.weight``)
        optional = tuple(n.strip() for n in meta.get("optional", "").split(",") if n.strip())
        given = _variable_list(meta, "given")
        rule = Rule(
            id=rule_id,
            name=meta.get("name", rule_id),
            description=meta.get("description", ""),
            kernel=meta.get("kernel", ""),
            message=meta.get("message", meta.get("description", "")),
            site=site,
            init=init,
            forward=forward,
            scope=scope,
            reciprocal=reciprocal,
            optional=optional,
            given=given,
            source=self.path,
            line=node.meta.line,
        )
        self._check_variables(rule, node)
        return rule

    def _section(self, node: Tree, rule_id: str) -> Section:
        kind = str(node.children[0])
        steps: list[Step] = []
        where: list[Step] = []
        replacement: tuple[Step, ...] | str | None = None
        guard: Step | None = None
        for child in node.children[1:]:
            if child.data == "step_list":
                steps = self._steps(child)
            elif child.data == "where_clause":
                where = self._steps(child.children[0]) if child.children else []
            elif child.data == "replacement":
                inner = child.children[0] if child.children else None
                if isinstance(inner, Token) and inner.type == "WILDCARD":
                    replacement = DETECT_ONLY
                elif isinstance(inner, Tree) and inner.data == "guarded":
                    guard, replacement = self._guarded(inner, rule_id)
                else:
                    replacement = tuple(self._steps(inner)) if inner is not None else ()
        if not steps:
            raise self.error(node, f"rule {rule_id}: section {kind!r} has no steps")
        if kind == "init" and guard is not None:
            raise self.error(node, f"rule {rule_id}: an 'init' replacement cannot be guarded")
        for step in steps + where:
            if (kind == "init") != step.construct:
                expect = "must" if kind == "init" else "must not"
                raise DslError(
                    self.path,
                    step.line,
                    step.column,
                    f"rule {rule_id}: a step in {kind!r} {expect} be marked with '@'",
                )
        return Section(kind, tuple(steps), tuple(where), replacement, guard)

    def _guarded(self, node: Tree, rule_id: str) -> tuple[Step, tuple[Step, ...]]:
        """``=> if kernel.applies($x, ...) { kernel($x) -> $y; None -> $z }``: the run-time
        test (a call) and the steps that run where it holds."""
        try:
            expr = _ToSyntax().transform(node.children[0])
        except Exception as exc:  # Lark wraps transformer errors
            raise self.error(node, str(getattr(exc, "orig_exc", exc))) from None
        if not isinstance(expr, Call) or _nesting(expr) > MAX_NESTING:
            raise self.error(node, f"rule {rule_id}: a guard is a call such as `k.applies($x)`")
        guard = Step(expr.base, expr.args, line=node.meta.line, column=node.meta.column)
        body = node.children[1] if len(node.children) > 1 else None
        steps = tuple(self._steps(body, literals=True)) if body is not None else ()
        if not any(isinstance(step.callee, Name) for step in steps):
            raise self.error(node, f"rule {rule_id}: a guarded replacement calls no kernel")
        return guard, steps

    def _check_variables(self, rule: Rule, node: Tree) -> None:
        bound: set[str] = set()
        for section in (rule.init, rule.forward):
            if section is None:
                continue
            for step in section.steps + section.where:
                bound.update(_vars_in_step(step))
        for section in (rule.init, rule.forward):
            if section is None or not isinstance(section.replacement, tuple):
                continue
            guard = (section.guard,) if section.guard is not None else ()
            for step in (*guard, *section.replacement):
                used = _vars_in_step(step, include_targets=False)
                unknown = sorted(used - bound)
                if unknown:
                    raise DslError(
                        self.path,
                        step.line,
                        step.column,
                        f"rule {rule.id}: replacement uses unbound variable(s) "
                        + ", ".join(f"${name}" for name in unknown),
                    )


def _vars_in_expr(expr: Expr) -> set[str]:
    if isinstance(expr, Var):
        return {expr.name}
    if isinstance(expr, Attribute):
        return {expr.base.name}
    if isinstance(expr, Index):
        return _vars_in_expr(expr.base) | _vars_in_expr(expr.item)
    if isinstance(expr, Call):
        found = _vars_in_expr(expr.base)
        for arg in expr.args:
            if isinstance(arg, (Positional, Keyword)):
                found |= _vars_in_expr(arg.value)
        return found
    return set()


def _vars_in_step(step: Step, include_targets: bool = True) -> set[str]:
    found = _vars_in_expr(Call(step.callee, step.args))
    if include_targets:
        found |= {t.name for t in step.targets}
    return found


def parse_rules(text: str, path: str = "<string>") -> list[Rule]:
    """Parse the text of a rule file; raises :class:`DslError` with the place of any problem."""
    return RuleParser(text, path).rules()


def parse_sequence(text: str, path: str = "<string>") -> list[Step]:
    """Parse a bare model-structure sequence, e.g. ``torch.nn.Linear($x) -> $h; ...``."""
    return RuleParser(text, path).sequence()


__all__ = ["parse_rules", "parse_sequence"]


def _multiplies_by(rule: Rule, name: str) -> bool:
    """Whether a forward step of ``rule`` is ``mul(..., $name)``: what ``reciprocal:`` widens."""
    steps = rule.forward.steps if rule.forward is not None else ()
    for step in steps:
        positional = [a for a in step.args if isinstance(a, Positional)]
        if (
            isinstance(step.callee, Name)
            and step.callee.dotted == "mul"
            and len(positional) == 2
            and isinstance(positional[1].value, Var)
            and positional[1].value.name == name
        ):
            return True
    return False


def _hands_kernel(rule: Rule, name: str) -> bool:
    """Whether a forward replacement step of ``rule`` is handed ``$name``: what ``optional:``
    may make ``None``."""
    forward = rule.forward
    steps = forward.replacement if forward is not None else None
    if not isinstance(steps, tuple):
        return False
    return any(_handed(step, name) for step in steps)


def _guard_reads(rule: Rule, name: str) -> bool:
    """Whether ``rule``'s guard (``=> if kernel.applies(...)``) is handed ``$name``: what
    ``given:`` may name."""
    guard = rule.forward.guard if rule.forward is not None else None
    return guard is not None and _handed(guard, "$" + name)


def _handed(step: Step, name: str) -> bool:
    """Whether an argument of ``step`` is ``name`` (``$var`` or a dotted name)."""
    return any(
        isinstance(arg, (Positional, Keyword)) and _names(arg.value, name) for arg in step.args
    )


def _variable_list(meta: dict[str, str], key: str) -> tuple[str, ...]:
    """The variables a metadata entry names (``"$a, $b"`` -> ``("a", "b")``)."""
    return tuple(
        name.strip().removeprefix("$") for name in meta.get(key, "").split(",") if name.strip()
    )


def _names(value: Expr, name: str) -> bool:
    if isinstance(value, Var):
        return "$" + value.name == name
    return isinstance(value, Name) and value.dotted == name
