"""Synthesis, part two: apply planned edits with LibCST, one function at a time.

Only the functions that change are parsed with LibCST (a whole-file LibCST parse costs ten times
an ``ast`` parse); each is cut out of the file, wrapped in a one-line ``class`` header when it is
indented, transformed, and spliced back. Everything outside the edited nodes — other code,
comments, blank lines, quoting — stays byte-identical. Kernel imports go once to the top of the
module, merged into an existing ``from adopter.kernels import ...`` when there is one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ..extract.source import split_lines
from ..match.matcher import Site
from .calls import LineReplacement, apply_replacements, call_edit, summary
from .checks import KERNEL_PACKAGE, Refusal, check_edit, require
from .guarded import AlreadyPatched
from .names import (
    STAR,
    module_bindings,
    names_a_kernel_import_must_avoid,
    visible_bindings,
)
from .outcome import SiteStatus, SkipReason
from .plan import Plan, Planner, edit_location
from .render import sequential_expression
from .source import SourceText, function_start

WRAPPER = "if True:"  # + the file's line ending


@dataclass
class SiteResult:
    """What happened to one site: made by :meth:`patched`, :meth:`covered` or :meth:`skipped`."""

    site: Site
    status: SiteStatus
    reason: str = ""
    summary: str = ""
    # Where the edit is (1-based line, byte column + 1): the site's own location, except for a
    # match through ``nn.Sequential`` elements, whose site is the element in the factory that
    # built it while the edit is its call in ``forward``.
    line: int = 0
    column: int = 0
    skip: SkipReason | None = None  # the kind of reason, for a skipped site

    def __post_init__(self) -> None:
        # a status given as its text (code that predates SiteStatus) still compares by identity
        self.status = SiteStatus(self.status)
        if not self.line:
            self.line, self.column = edit_location(self.site)

    @classmethod
    def patched(cls, site: Site, summary: str) -> SiteResult:
        return cls(site, SiteStatus.PATCHED, summary=summary)

    @classmethod
    def covered(cls, site: Site, reason: str) -> SiteResult:
        return cls(site, SiteStatus.COVERED, reason)

    @classmethod
    def skipped(cls, site: Site, skip: SkipReason, reason: str) -> SiteResult:
        return cls(site, SiteStatus.SKIPPED, reason, skip=skip)

    def now_skipped(self, skip: SkipReason, reason: str) -> SiteResult:
        """This result, skipped after all (a later stage undid its patch)."""
        return replace(self, status=SiteStatus.SKIPPED, reason=reason, skip=skip)

    def as_record(self) -> dict[str, object]:
        record = self.site.as_record()
        record["status"] = self.status
        if self.reason:
            record["reason"] = self.reason
        if self.summary:
            record["edit"] = self.summary
        return record


@dataclass
class FileRewrite:
    path: str
    original: str
    patched: str
    results: list[SiteResult] = field(default_factory=list)
    error: str | None = None
    # an edit wrote code other rules may match anew (the original kept in the else arm of a
    # guard, a submodule's statements copied into a kernel arm): apply looks once more
    reopened: bool = False

    @property
    def changed(self) -> bool:
        return self.patched != self.original

    def with_status(self, status: SiteStatus) -> list[SiteResult]:
        return [result for result in self.results if result.status is status]

    @property
    def rules_patched(self) -> list[str]:
        """The rules of the sites patched, each once, sorted."""
        return sorted({result.site.rule.id for result in self.with_status(SiteStatus.PATCHED)})


class _ArmStatement(NamedTuple):
    """A statement a fused arm gets: its text, the statement it copies (``None``: new), the
    span of the node of that copy the text replaces, and whether it closes the arm."""

    text: str
    copied: tuple[int, int] | None
    span: tuple[int, ...] | None
    at_end: bool
    plain: bool = False  # the copied statement as it is


class _Spread(NamedTuple):
    """A chain's copies: the statements copied into each arm, the arm count, the fused arms'
    statements, the copies that close the arms instead of opening them (statements after the
    chain) and the arms that never reach what follows the chain."""

    moved: list[tuple[int, int]]
    arms: int
    fused: dict[int, list[_ArmStatement]]
    late: frozenset[tuple[int, int]]
    closed: frozenset[int]


class _FunctionEditor(cst.CSTTransformer):
    """Applies the edits of the plans of one function to its LibCST tree."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, plans: list[Plan], locate, indentation, locate_end) -> None:
        super().__init__()
        self.arm_indents: dict[tuple[int, int], str] = {}
        self.expressions: dict[tuple[int, int, int, int, str], str] = {}
        self.statements: dict[tuple[int, int], str | None] = {}
        # deleted statements whose end-of-line comment is written with a copy of them
        self.comment_copied: set[tuple[int, int]] = set()
        self.hoists: dict[tuple[int, int], tuple[list[tuple[int, int]], int]] = {}
        self.sinks: dict[tuple[int, int], list[str]] = {}
        self.hoisted: dict[tuple[int, int], cst.SimpleStatementLine] = {}
        # an if/elif chain -> its copies (see _Spread)
        self.spreads: dict[tuple[int, int], _Spread] = {}
        # statements after a chain copied into its arms: LibCST reaches them after the chain,
        # so they are taken from the original tree before the walk (visit_Module)
        self.copied_later: set[tuple[int, int]] = set()
        self.inserted: dict[tuple[int, int], list[str]] = {}
        self.new_keywords: dict[tuple[int, int], list[str]] = {}
        # first statement -> (statements wrapped, guard, kernel arm, indentation step,
        # the statements the kernel arm runs too; see Plan.wrap_copies)
        self.wraps: dict[
            tuple[int, int],
            tuple[tuple[int, int], str | None, list[str], str, tuple[tuple[int, ...], int]],
        ] = {}
        for plan in plans:
            if plan.wrap is not None:
                wrapped, guard, kernel_arm, indent = plan.wrap
                # the last statement's position, not a count: joined statements share a line
                self.wraps[locate(wrapped[0])] = (
                    locate(wrapped[-1]),
                    guard,
                    kernel_arm,
                    indent,
                    plan.wrap_copies,
                )
            for statement, text in plan.insert_before:
                self.inserted.setdefault(locate(statement), []).append(text)
            if plan.keyword_parameters:
                self.new_keywords.setdefault(locate(plan.function), []).extend(
                    plan.keyword_parameters
                )
            for node, text in plan.replace_expressions:
                # start *and* end: ``f(x).to(t)`` starts where ``f(x)`` does
                self.expressions[(*locate(node), *locate_end(node), type(node).__name__)] = text
            for statement, text in plan.replace_statements:
                self.statements[locate(statement)] = text
            for statement in plan.delete_statements:
                self.statements[locate(statement)] = None
            self.comment_copied.update(locate(s) for s in plan.copied_with_comment)
            if plan.spread is not None:
                spread = plan.spread
                for statement in spread.moved:
                    self.statements[locate(statement)] = None
                self.spreads[locate(spread.branch)] = _Spread(
                    [locate(s) for s in spread.moved],
                    spread.arms,
                    {
                        arm: [
                            _ArmStatement(
                                start.text,
                                locate(start.copy_of) if start.copy_of is not None else None,
                                (*locate(start.node), *locate_end(start.node))
                                if start.node is not None
                                else None,
                                start.at_end,
                                start.plain,
                            )
                            for start in starts
                        ]
                        for arm, starts in spread.fused.items()
                    },
                    frozenset(locate(s) for s in spread.late),
                    frozenset(spread.closed),
                )
                self.copied_later.update(locate(s) for s in spread.late)
                outer = indentation(spread.branch.lineno)
                inner = indentation(spread.branch.body[0].lineno)
                self.arm_indents[locate(spread.branch)] = inner[len(outer) :] or "    "
            if plan.hoist is not None:
                moved, if_statement, arm = plan.hoist
                for statement in moved:
                    self.statements[locate(statement)] = None
                self.hoists[locate(if_statement)] = ([locate(s) for s in moved], arm)
                self.sinks[locate(if_statement)] = plan.sunk
                outer = indentation(if_statement.lineno)
                inner = indentation(if_statement.body[0].lineno)
                self.arm_indents[locate(if_statement)] = inner[len(outer) :] or "    "

    def _start(self, node: cst.CSTNode) -> tuple[int, int]:
        position = self.get_metadata(PositionProvider, node).start
        return position.line, position.column

    def visit_Module(self, node: cst.Module) -> bool:  # noqa: N802 - LibCST visitor name
        """Keep aside, from the original tree, the statements after a chain that are copied
        into its arms (the chain is rebuilt before the walk reaches them)."""
        if not self.copied_later:
            return True
        editor = self

        class Collect(cst.CSTVisitor):
            def visit_SimpleStatementLine(  # noqa: N802 - LibCST visitor name
                inner,
                line: cst.SimpleStatementLine,  # noqa: N805 - nested visitor
            ) -> bool:
                for small in line.body:
                    key = editor._start(small)
                    if key not in editor.copied_later:
                        continue
                    editor.hoisted[key] = (
                        line
                        if len(line.body) == 1
                        else cst.SimpleStatementLine(
                            body=[small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)]
                        )
                    )
                return False

        node.visit(Collect())
        return True

    _CST_TO_AST = {
        "Call": "Call",
        "BinaryOperation": "BinOp",
        "Subscript": "Subscript",
        "Attribute": "Attribute",
        "Name": "Name",
    }

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):  # type: ignore[override]
        kind = self._CST_TO_AST.get(type(original).__name__)
        if kind is not None and isinstance(original, cst.BaseExpression):
            span = self.get_metadata(PositionProvider, original)
            key = (span.start.line, span.start.column, span.end.line, span.end.column, kind)
            text = self.expressions.get(key)
            if text is not None:
                replacement = cst.parse_expression(text)
                return replacement.with_changes(lpar=updated.lpar, rpar=updated.rpar)
        return super().on_leave(original, updated)

    def leave_SimpleStatementLine(  # noqa: N802 - LibCST visitor name
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ):
        key = self._start(original)
        if any(self._small_key(s) in self.inserted for s in original.body[1:]):
            raise Refusal("an insertion before a statement that shares its line; not rewritten")
        inserted = self.inserted.get(key)
        if inserted:
            new_statements = [cst.parse_statement(text) for text in inserted]
            return cst.FlattenSentinel([*new_statements, self._edited(key, original, updated)])
        return self._edited(key, original, updated)

    def leave_SimpleStatementSuite(  # noqa: N802 - LibCST visitor name
        self, original: cst.SimpleStatementSuite, updated: cst.SimpleStatementSuite
    ):
        """A one-line compound body (``if c: x = f(x)``): its statements are edited one by one;
        a body left empty becomes ``pass``."""
        if any(self._small_key(s) in self.inserted for s in original.body):
            raise Refusal("an insertion into a one-line compound body; not rewritten")
        body = self._edited_small(original.body, updated.body)
        if body is None:
            return updated
        return updated.with_changes(body=body or [cst.Pass()])

    def _small_key(self, statement: cst.CSTNode) -> tuple[int, int]:
        return self._start(statement)

    def _edited_small(
        self,
        original: Sequence[cst.BaseSmallStatement],
        updated: Sequence[cst.BaseSmallStatement],
    ) -> list[cst.BaseSmallStatement] | None:
        """The statements of one line, each deleted or replaced as planned (``None``: none is);
        the statements sharing the line stay, in order."""
        keys = [self._small_key(s) for s in original]
        if not any(key in self.statements for key in keys):
            return None
        body: list[cst.BaseSmallStatement] = []
        for key, before, after in zip(keys, original, updated, strict=True):
            if key not in self.statements:
                body.append(after)
                continue
            if self._moved(key):
                self.hoisted[key] = cst.SimpleStatementLine(
                    body=[before.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)]
                )
            text = self.statements[key]
            if text is None:
                continue
            new = cst.parse_statement(text)
            assert isinstance(new, cst.SimpleStatementLine)
            parts = list(new.body)
            parts[-1] = parts[-1].with_changes(semicolon=after.semicolon)
            body.extend(parts)
        if body:  # the new last statement ends the line as the old last one did
            body[-1] = body[-1].with_changes(semicolon=updated[-1].semicolon)
        return body

    def _edited(
        self,
        key: tuple[int, int],
        original: cst.SimpleStatementLine,
        updated: cst.SimpleStatementLine,
    ) -> cst.SimpleStatementLine:
        if len(original.body) > 1:  # joined statements (``a; b``): edited one by one
            body = self._edited_small(original.body, updated.body)
            if body is None:
                return updated
            return updated.with_changes(body=body) if body else _removed_marker(updated)
        if key not in self.statements:
            return updated
        moved = self._moved(key)
        if moved:
            self.hoisted[key] = original
        text = self.statements[key]
        if text is None:
            keeps_comment = not moved and key not in self.comment_copied
            return _removed_marker(updated, keeps_comment)
        new = cst.parse_statement(text)
        assert isinstance(new, cst.SimpleStatementLine)
        return updated.with_changes(body=new.body)

    def leave_FunctionDef(  # noqa: N802 - LibCST visitor name
        self, original: cst.FunctionDef, updated: cst.FunctionDef
    ):
        names = self.new_keywords.get(self._start(original))
        if not names:
            return updated
        params = updated.params
        tight = cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        )
        added = [
            cst.Param(name=cst.Name(name), default=cst.Name("None"), equal=tight) for name in names
        ]
        star = params.star_arg
        if isinstance(star, cst.MaybeSentinel):
            star = cst.ParamStar()
        return updated.with_changes(
            params=params.with_changes(star_arg=star, kwonly_params=[*params.kwonly_params, *added])
        )

    def _moved(self, key: tuple[int, int]) -> bool:
        """The statement at ``key`` moves into the arms of an ``if``: kept aside to copy."""
        return any(key in targets for targets, _ in self.hoists.values()) or any(
            key in spread.moved for spread in self.spreads.values()
        )

    def _arm_start(
        self, text: str, copied: tuple[int, int] | None, span: tuple[int, ...] | None
    ) -> cst.BaseStatement:
        """A statement opening a fused arm: new, or a moved one with its body or one of its
        expressions replaced (its comment kept)."""
        new = cst.parse_statement(text) if span is None else None
        if copied is None:
            assert new is not None
            return new
        statement = self.hoisted[copied].with_changes(leading_lines=())
        if new is not None:
            assert isinstance(new, cst.SimpleStatementLine)
            return statement.with_changes(body=new.body)
        found: list[cst.CSTNode] = []

        class Find(cst.CSTVisitor):
            def on_visit(inner, node: cst.CSTNode) -> bool:  # noqa: N805 - nested visitor
                kind = self._CST_TO_AST.get(type(node).__name__)
                if kind is not None and not found:
                    where = self.get_metadata(PositionProvider, node, None)
                    if (
                        where is not None
                        and (
                            where.start.line,
                            where.start.column,
                            where.end.line,
                            where.end.column,
                        )
                        == span
                    ):
                        found.append(node)
                        return False
                return not found

        statement.visit(Find())
        if not found:
            raise Refusal(f"line {copied[0]}: the copied statement lost its computation")
        replacement = cst.Name(text).with_changes(
            lpar=getattr(found[0], "lpar", ()), rpar=getattr(found[0], "rpar", ())
        )
        return statement.deep_replace(found[0], replacement)  # type: ignore[return-value]

    def _spread(self, key: tuple[int, int], updated: cst.If) -> cst.If:
        """Every arm of the chain starts with the moved statements (ends with them, for those
        after the chain), or with its fused ones."""
        plan = self.spreads[key]
        indent = self.arm_indents[key]

        def copies(late: bool) -> list[cst.BaseStatement]:
            return [
                self.hoisted[k].with_changes(leading_lines=())
                for k in plan.moved
                if (k in plan.late) == late
            ]

        def statement(start: _ArmStatement) -> cst.BaseStatement:
            if start.plain:
                assert start.copied is not None
                return self.hoisted[start.copied].with_changes(leading_lines=())
            return self._arm_start(*start[:3])

        def opening(arm: int) -> list[cst.BaseStatement]:
            if arm in plan.fused:
                return [statement(s) for s in plan.fused[arm] if not s.at_end]
            return copies(late=False)

        def closing(arm: int) -> list[cst.BaseStatement]:
            if arm in plan.fused:
                return [statement(s) for s in plan.fused[arm] if s.at_end]
            return copies(late=True) if arm not in plan.closed else []

        def extended(block: cst.BaseSuite, arm: int) -> cst.IndentedBlock:
            if isinstance(block, cst.SimpleStatementSuite):
                block = _as_block(block, indent)
            assert isinstance(block, cst.IndentedBlock)
            body = list(block.body)
            comments: Sequence[cst.EmptyLine] = ()
            if len(body) == 1 and _is_pass(body[0], comments=True) and arm in plan.fused:
                # the arm's statements all went into the fused call (their comments stay)
                comments, body = body[0].leading_lines, []  # type: ignore[attr-defined]
            head = opening(arm)
            if head and body and body[0].leading_lines:  # the arm's opening comment stays on top
                head[0] = head[0].with_changes(leading_lines=body[0].leading_lines)
                body[0] = body[0].with_changes(leading_lines=())
            if head and comments:
                head[0] = head[0].with_changes(leading_lines=[*comments, *head[0].leading_lines])
            return block.with_changes(body=[*head, *body, *closing(arm)])

        def arm_chain(node: cst.If, arm: int) -> cst.If:
            orelse = node.orelse
            if isinstance(orelse, cst.If):
                orelse = arm_chain(orelse, arm + 1)
            elif isinstance(orelse, cst.Else):
                orelse = orelse.with_changes(body=extended(orelse.body, arm + 1))
            else:
                block = cst.IndentedBlock(
                    body=[*opening(arm + 1), *closing(arm + 1)]
                    or [cst.SimpleStatementLine([cst.Pass()])],
                    indent=indent,
                )
                orelse = cst.Else(body=block)
            return node.with_changes(body=extended(node.body, arm), orelse=orelse)

        spread = arm_chain(updated, 0)
        if _chain_length(spread) != plan.arms:
            raise Refusal(f"line {key[0]}: the branch's arms are not where the plan has them")
        return spread

    def leave_If(self, original: cst.If, updated: cst.If):  # noqa: N802 - LibCST visitor name
        key = self._start(original)
        if key in self.spreads:
            return self._spread(key, updated)
        hoist = self.hoists.get(key)
        if hoist is None:
            return updated
        statement_keys, fused_arm = hoist
        before = [self.hoisted[k].with_changes(leading_lines=()) for k in statement_keys]
        after = [cst.parse_statement(text) for text in self.sinks.get(key, [])]

        def extended(block: cst.BaseSuite) -> cst.IndentedBlock:
            if isinstance(block, cst.SimpleStatementSuite):
                block = _as_block(block, self.arm_indents[key])
            assert isinstance(block, cst.IndentedBlock)
            return block.with_changes(body=[*before, *block.body, *after])

        if fused_arm == 1:
            return updated.with_changes(body=extended(updated.body))
        orelse = updated.orelse
        if orelse is None:
            block = cst.IndentedBlock(body=[*before, *after], indent=self.arm_indents[key])
            return updated.with_changes(orelse=cst.Else(body=block))
        assert isinstance(orelse, cst.Else)
        return updated.with_changes(orelse=orelse.with_changes(body=extended(orelse.body)))

    def leave_IndentedBlock(  # noqa: N802 - LibCST visitor name
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ):
        updated = self._wrapped(original, updated)
        if not any(_is_removed(statement) for statement in updated.body):
            return updated
        # A removed statement's comments (the lines above it and the one at its end) move to
        # the statement that follows it, or below the block's last statement.
        kept: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []
        for statement in updated.body:
            if _is_removed(statement):
                assert isinstance(statement, cst.SimpleStatementLine)
                carried.extend(line for line in statement.leading_lines if line.comment)
                comment = statement.trailing_whitespace.comment
                if comment is not None:
                    carried.append(cst.EmptyLine(comment=comment))
                continue
            if carried:
                statement = statement.with_changes(
                    leading_lines=[*carried, *statement.leading_lines]
                )
                carried = []
            kept.append(statement)
        if not kept:
            kept = [cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried)]
        elif carried:
            return updated.with_changes(body=kept, footer=[*carried, *updated.footer])
        return updated.with_changes(body=kept)

    def _wrapped(
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        """Replacements of whole statements: the statements moved into the ``else`` arm of the
        guard, or replaced where there is no guard."""
        if not self.wraps or len(original.body) != len(updated.body):
            return updated
        keys = [self._start(statement) for statement in original.body]
        body: list[cst.BaseStatement] = []
        index = 0
        while index < len(keys):
            wrap = self.wraps.get(keys[index])
            if wrap is None:
                body.append(updated.body[index])
                index += 1
                continue
            last, guard, kernel_arm, indent, (copies, copies_at) = wrap
            count = 0
            while index + count < len(keys) and keys[index + count] <= last:
                count += 1
            moved = list(updated.body[index : index + count])
            leading = moved[0].leading_lines
            moved[0] = moved[0].with_changes(leading_lines=())
            arm = [cst.parse_statement(text) for text in kernel_arm]
            # statements that take no part in the match run in the kernel arm too, as written
            arm[copies_at:copies_at] = [moved[i].deep_clone() for i in copies]
            if guard is None:  # the statements replaced; their comment lines kept before them
                comments = [
                    line
                    for statement in moved[1:]
                    for line in getattr(statement, "leading_lines", ())
                    if line.comment
                ]
                leading = [*leading, *comments]
                body.extend([arm[0].with_changes(leading_lines=leading), *arm[1:]])
                index += count
                continue
            body.append(
                cst.If(
                    test=cst.parse_expression(guard),
                    body=cst.IndentedBlock(body=arm, indent=indent),
                    orelse=cst.Else(body=cst.IndentedBlock(body=moved, indent=indent)),
                    leading_lines=leading,
                )
            )
            index += count
        return updated.with_changes(body=body)


_REMOVED = "__adopter_removed__"


def _is_pass(statement: cst.BaseStatement, comments: bool = False) -> bool:
    """A lone ``pass`` (with ``comments``: perhaps under comment lines only)."""
    if not (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Pass)
    ):
        return False
    if not comments:
        return not statement.leading_lines
    return all(line.comment is not None for line in statement.leading_lines)


def _chain_length(node: cst.If) -> int:
    """Arms of an ``if``/``elif``/``else`` chain (its ``else`` counted)."""
    arms = 1
    while isinstance(node.orelse, cst.If):
        node = node.orelse
        arms += 1
    return arms + 1


def _as_block(suite: cst.SimpleStatementSuite, indent: str) -> cst.IndentedBlock:
    """A one-line body (``if c: a; b  # note``) as an indented block, one statement a line; the
    line's comment stays on the header."""
    lines = [
        cst.SimpleStatementLine(body=[s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])
        for s in suite.body
    ]
    return cst.IndentedBlock(body=lines, indent=indent, header=suite.trailing_whitespace)


def _removed_marker(
    statement: cst.SimpleStatementLine, keeps_comment: bool = True
) -> cst.SimpleStatementLine:
    """A deleted statement until its block is rebuilt; with ``keeps_comment`` its end-of-line
    comment stays on the next line (a moved statement's goes with it)."""
    removed = statement.with_changes(body=[cst.Expr(cst.Name(_REMOVED))])
    if keeps_comment:
        return removed
    return removed.with_changes(trailing_whitespace=cst.TrailingWhitespace())


def _is_removed(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.Name)
        and statement.body[0].value.value == _REMOVED
    )


def _edit_span(source: SourceText, start: int, end: int, plans: list[Plan]) -> list[str]:
    """New lines for source lines ``start..end``: whole statements of one block (or a whole
    function), parsed alone with LibCST under a one-line ``if True:`` header when indented.
    Lines come back with the span's own line ending (LibCST takes it from the first line)."""
    lines = source.lines[start - 1 : end]
    for number, line in enumerate(lines, start):
        if "\f" in line[: len(line) - len(line.lstrip(" \t\f"))]:
            # LibCST drops a form feed that starts a statement line, or copies it to the
            # lines after it: the bytes around the edit would change.
            raise Refusal(f"line {number}: a form feed in the indentation; not rewritten")
    newline = source.newline if not lines else lines[0][len(lines[0].rstrip("\r\n")) :]
    newline = newline or source.newline
    header = WRAPPER + newline if source.indentation(start) else ""
    text = header + "".join(lines)
    unterminated = not text.endswith(("\n", "\r"))
    if unterminated:
        text += newline
    offset = start - 1 - (1 if header else 0)

    def locate(node: ast.AST) -> tuple[int, int]:
        line = node.lineno  # type: ignore[attr-defined]
        return line - offset, source.char_column(line, node.col_offset)  # type: ignore[attr-defined]

    def locate_end(node: ast.AST) -> tuple[int, int]:
        line = node.end_lineno  # type: ignore[attr-defined]
        return line - offset, source.char_column(line, node.end_col_offset)  # type: ignore[attr-defined]

    parsed = cst.parse_module(text)
    if parsed.code != text:  # LibCST promises this; never edit through a lossy parse
        raise Refusal(f"lines {start}-{end}: LibCST does not reproduce them exactly; not rewritten")
    module = MetadataWrapper(parsed)
    editor = _FunctionEditor(plans, locate, source.indentation, locate_end)
    new_code = module.visit(editor).code
    new_code = new_code[len(header) :]
    new_lines = split_lines(new_code)
    if unterminated and new_lines:
        new_lines[-1] = new_lines[-1].removesuffix(newline)
    return new_lines


def _spans(plans: list[Plan], planner: Planner) -> list[tuple[int, int, list[Plan]]]:
    """Line spans to rewrite: each plan's statements, merged where they overlap. A merged span
    that does not consist of whole statements of one block grows to its whole function."""
    ranges = sorted(
        (
            (
                min(s.lineno for s in plan.statements),
                max(s.end_lineno or s.lineno for s in plan.statements),
                plan,
            )
            for plan in plans
        ),
        key=lambda item: (item[0], item[1]),
    )
    groups: list[list] = []
    for start, end, plan in ranges:
        if groups and start <= groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], end)
            groups[-1][2].append(plan)
        else:
            groups.append([start, end, [plan]])
    spans: list[tuple[int, int, list[Plan]]] = []
    for start, end, group in groups:
        function = group[0].function
        if not all(p.function is function for p in group) or not _aligned(
            planner, function, start, end
        ):
            start, end = function_start(function), function.end_lineno or function.lineno
        spans.append((start, end, group))
    # Growing to a whole function can swallow neighbouring spans: merge again.
    spans.sort(key=lambda span: span[0])
    merged: list[tuple[int, int, list[Plan]]] = []
    for start, end, group in spans:
        if merged and start <= merged[-1][1]:
            first, last, plans_so_far = merged[-1]
            merged[-1] = (first, max(last, end), plans_so_far + group)
        else:
            merged.append((start, end, group))
    return merged


def _aligned(planner: Planner, function: ast.FunctionDef, start: int, end: int) -> bool:
    """Lines ``start..end`` are exactly consecutive whole statements of one block."""
    for body, index, _, _ in planner.blocks(function).where.values():
        if body[index].lineno != start:
            continue
        for statement in body[index:]:
            statement_end = statement.end_lineno or statement.lineno
            if statement_end == end:
                return True
            if statement_end > end:
                break
    return False


def _host_lines(tree: ast.Module, sites: Sequence[Site]) -> set[int]:
    """Lines of the code the sites' edits land in: the whole class of a method's site (its
    ``__init__`` is edited too), else the site's own line."""
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    lines: set[int] = set()
    for site in sites:
        owner = classes.get(site.cls) if site.cls else None
        if owner is None:
            lines.add(site.line)
        else:
            lines.update(range(owner.lineno, (owner.end_lineno or owner.lineno) + 1))
    return lines


def existing_kernel_imports(tree: ast.Module, shadowed: set[str] | None = None) -> dict[str, str]:
    """Kernels the module already imports at its top level (``from adopter.kernels import
    softmax as sm``: ``{"softmax": "sm"}``), under a name nothing else at module level binds
    and no edited function (``shadowed``) binds: a later ``apply`` calls them by that name
    instead of importing them again."""
    bound = module_bindings(tree)
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == KERNEL_PACKAGE and not node.level:
            for alias in node.names:
                local = alias.asname or alias.name
                if bound.get(local) == 1 and STAR not in bound and local not in (shadowed or ()):
                    found.setdefault(alias.name, local)
    return found


def _import_edit(
    tree: ast.Module,
    source: SourceText,
    aliases: dict[str, str],
    used: set[str],
    first_use: int | None = None,
) -> tuple[int, int, list[str]]:
    """(first line, last line, replacement lines) that add the kernel imports: merged into an
    existing ``from adopter.kernels import`` or inserted after the leading imports, and before
    the statement holding line ``first_use`` (a kernel called at module level). A kernel the
    module imports already (``aliases`` holds its local name) is not imported again."""
    imported = existing_kernel_imports(tree)
    names = sorted(n for n in used if imported.get(n) != aliases[n])
    if not names:
        return 0, 0, []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == KERNEL_PACKAGE and not node.level:
            present = {(a.name, a.asname) for a in node.names}
            wanted = present | {(n, None if aliases[n] == n else aliases[n]) for n in names}
            if wanted == present:
                return 0, 0, []
            statement = cst.parse_statement(source.segment(node))
            assert isinstance(statement, cst.SimpleStatementLine)
            import_from = statement.body[0]
            assert isinstance(import_from, cst.ImportFrom)
            new_aliases = [
                cst.ImportAlias(
                    name=cst.Name(name),
                    asname=cst.AsName(name=cst.Name(alias)) if alias else None,
                )
                for name, alias in sorted(wanted, key=lambda pair: (pair[0], pair[1] or ""))
            ]
            merged = statement.with_changes(
                body=[import_from.with_changes(names=new_aliases, lpar=None, rpar=None)]
            )
            indent = source.indentation(node.lineno)
            ending = _ending(source.lines[(node.end_lineno or node.lineno) - 1])
            code = cst.Module(body=[merged], default_newline=ending or source.newline).code
            if not ending:  # the last line of a file without a final line break
                code = code.removesuffix(source.newline)
            return node.lineno, node.end_lineno or node.lineno, [indent + code]
    anchor = 0
    for node in tree.body:
        if first_use is not None and (node.end_lineno or node.lineno) >= first_use:
            break
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            anchor = node.end_lineno or node.lineno
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and anchor == 0:
            anchor = node.end_lineno or node.lineno
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            break
    # The line ending of the line it follows (files that mix endings keep each region's own).
    ending = _ending(source.lines[anchor - 1]) if anchor else source.newline
    newline = ending or source.newline
    parts = [n if aliases[n] == n else f"{n} as {aliases[n]}" for n in names]
    line = f"from {KERNEL_PACKAGE} import {', '.join(parts)}{newline}"
    if len(line) > 100:
        line = (
            f"from {KERNEL_PACKAGE} import ({newline}"
            + "".join(f"    {p},{newline}" for p in parts)
            + f"){newline}"
        )
    if not ending:  # after the last line of a file without a final line break
        line = newline + line.removesuffix(newline)
    return anchor + 1, anchor, [line]


def _ending(line: str) -> str:
    return line[len(line.rstrip("\r\n")) :]


def _already_fused_classes(tree: ast.Module) -> set[str]:
    """Classes the module already builds through a kernel factory
    (``fused_bert_self_attention(BertSelfAttention)(...)``): a previous ``apply`` replaced them,
    so edits inside them stay skipped and a second run changes nothing."""
    kernel_names = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == KERNEL_PACKAGE
        for alias in node.names
    }
    found: set[str] = set()
    if not kernel_names:
        return found
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Call)
            and isinstance(node.func.func, ast.Name)
            and node.func.func.id in kernel_names
            and node.func.args
            and isinstance(node.func.args[0], ast.Name)
        ):
            found.add(node.func.args[0].id)
    return found


def _merge_sequential(plans: list[Plan], source: SourceText) -> list[Plan]:
    """Fusions inside the same ``nn.Sequential`` call become one expression; fusions before a
    match that starts in the call and ends outside it go into that match's input."""
    merged: list[Plan] = []
    by_call: dict[int, Plan] = {}
    tails = {id(p.sequential_prefix[0]): p for p in plans if p.sequential_prefix is not None}
    before_tail: dict[int, list[Plan]] = {}
    for plan in plans:
        piece = plan.sequential
        if piece is not None and id(piece.call) in tails:
            before_tail.setdefault(id(piece.call), []).append(plan)
            continue
        if piece is None:
            merged.append(plan)
            continue
        owner = by_call.get(id(piece.call))
        if owner is None:
            by_call[id(piece.call)] = plan
            plan.merged_pieces = [piece]
            merged.append(plan)
        else:
            owner.merged_pieces.append(piece)
            owner.imports |= plan.imports
            owner.also_patched.append(plan)
    for plan in by_call.values():
        pieces = sorted(plan.merged_pieces, key=lambda p: p.first)
        text = sequential_expression(source, pieces)
        plan.replace_expressions.append((pieces[0].call, text))
        plan.summary = f"{source.segment(pieces[0].call)} -> {text}"
    for key, piece_plans in before_tail.items():
        tail = tails[key]
        assert tail.sequential_prefix is not None
        _, first, plain = tail.sequential_prefix
        pieces = sorted((p.sequential for p in piece_plans if p.sequential), key=lambda p: p.first)
        prefix = sequential_expression(source, pieces, upto=first)
        tail.replace_expressions = [
            (node, text.replace(plain, prefix, 1)) for node, text in tail.replace_expressions
        ]
        tail.summary = tail.summary.replace(plain, prefix, 1)
        for piece_plan in piece_plans:
            tail.imports |= piece_plan.imports
            tail.also_patched.append(piece_plan)
    return merged


def resolve_overlaps(
    plans: list[Plan], results: list[SiteResult], fused_classes: set[str]
) -> list[Plan]:
    """Deterministically keep one rewrite per place: a rule that replaces a whole attention
    class wins over edits inside that class, and a larger fusion over a smaller one it overlaps.
    Pieces of one ``nn.Sequential`` do not overlap unless they share an element."""
    replaced_classes = set(fused_classes) | {
        c.kind.rsplit(".", 1)[-1]
        for plan in plans
        if plan.site.rule.site == "init"
        for c in plan.site.constructions.values()
    }
    ordered = sorted(
        plans, key=lambda p: (-len(p.site.steps), p.site.rule.id, p.site.line, p.site.column)
    )
    kept: list[Plan] = []
    for plan in ordered:
        site = plan.site
        if site.rule.site != "init" and site.cls in replaced_classes:
            results.append(
                SiteResult.covered(
                    site, f"inside {site.cls}, which a fused-attention rule replaces as a whole"
                )
            )
            continue
        clashes = [k for k in kept if _overlaps(k, plan)]
        larger = next((k for k in clashes if _contains(k.site, site)), None)
        if larger is not None:
            results.append(
                SiteResult.covered(
                    site,
                    f"inside the {larger.site.rule.id} fusion at line "
                    f"{edit_location(larger.site)[0]}, which does this computation too",
                )
            )
            continue
        clash = clashes[0] if clashes else None
        if clash is not None:
            results.append(
                SiteResult.skipped(
                    site,
                    SkipReason.OVERLAP,
                    f"overlaps {clash.site.rule.id} at line "
                    f"{edit_location(clash.site)[0]}, which is applied instead",
                )
            )
            continue
        kept.append(plan)
    return kept


def _calls(site: Site) -> set[tuple[int, str | None]]:
    # the elements of one nn.Sequential call share its node: the module tells them apart
    return {(id(step.node), step.module) for step in site.steps if step.node is not None}


def _contains(larger: Site, smaller: Site) -> bool:
    """Every call ``smaller`` fuses is one that ``larger`` fuses too (conv + batch norm inside
    conv + batch norm + activation): the larger rewrite does the smaller one's work."""
    inner = _calls(smaller)
    return bool(inner) and inner <= _calls(larger)


def _overlaps(first: Plan, second: Plan) -> bool:
    if first.sequential and second.sequential and first.sequential.call is second.sequential.call:
        a, b = first.sequential, second.sequential
        return a.first <= b.last and b.first <= a.last
    for piece_plan, tail in ((first, second), (second, first)):
        piece, prefix = piece_plan.sequential, tail.sequential_prefix
        if piece is not None and prefix is not None and piece.call is prefix[0]:
            return piece.last >= prefix[1]  # elements before the tail's match merge into it

    def spans(plan: Plan) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        return [
            ((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset))  # type: ignore[attr-defined]
            for part in (plan, *plan.companions)
            for n in part.touched
        ]

    for a_start, a_end in spans(first):
        for b_start, b_end in spans(second):
            if a_start < b_end and b_start < a_end:
                return True
    if first.hoist and second.hoist and first.hoist[1] is second.hoist[1]:
        return True
    return False


_GENERATED = re.compile(r"This file was automatically generated from \S*?(modular_\w+\.py)")


def generated_pair(text: str, path: str) -> str | None:
    """Why a file is not the one ``apply`` edits by default, or ``None``.

    transformers 5.x writes each model twice: ``modular_<model>.py``, the source its
    contributors edit (it imports from other models' files), and ``modeling_<model>.py``,
    generated from it, which is what runs. ``apply`` patches what runs; with ``modular=True``
    it patches the modular source instead (for a contributor, who regenerates the modeling
    file) and leaves the generated file alone. ``scan`` reports both."""
    name = Path(path).name
    if name.startswith("modular_") and name.endswith(".py"):
        return f"modular:{name.removeprefix('modular_')}"
    match = _GENERATED.search(text[:2000])
    if match is not None:
        return f"generated:{match.group(1)}"
    return None


def modular_refusal(text: str, path: str, modular: bool) -> str | None:
    """The reason every site of this file is skipped under the chosen policy, or ``None``."""
    pair = generated_pair(text, path)
    if pair is None:
        return None
    kind, _, other = pair.partition(":")
    if kind == "modular" and not modular:
        return (
            f"transformers generates modeling_{other} from this modular file; apply patches the "
            "generated file, which is what runs (--modular patches this one instead)"
        )
    if kind == "generated" and modular:
        return f"generated from {other}; --modular patches that file instead"
    return None


def plan_sites(
    text: str, path: str, sites: Sequence[Site], tree: ast.Module, *, modular: bool = False
) -> tuple[Planner | None, list[Plan], list[SiteResult]] | None:
    """The first, static half of :func:`rewrite_source`, which ``scan`` runs too: every
    applicable site planned from the named checks, or skipped with the reason a check gave (or
    the ``modular`` policy gave: then there is no planner). ``None`` when no site applies.
    Nothing is edited, and no text is rendered to LibCST."""
    refusal = modular_refusal(text, path, modular)
    if refusal is not None:
        skipped = [
            SiteResult.skipped(site, SkipReason.MODULAR_POLICY, refusal)
            for site in sites
            if site.applicable
        ]
        return None, [], skipped
    if not any(site.applicable for site in sites):
        # Most modules an import hook sees have nothing to patch: skip the name analysis.
        return None
    source = SourceText(text)
    # Kernel names must mean the import inside every function the sites edit (see names.py).
    visible = visible_bindings(tree, _host_lines(tree, sites))
    # A replacement calls only its rule's declared kernel (dsl/declared.py): those are the
    # names an import may take, so only their reads need working out.
    declared = [site.rule.kernel for site in sites if site.applicable]
    kernels = {kernel.rpartition(".")[2] for kernel in declared} if all(declared) else None
    avoid = names_a_kernel_import_must_avoid(tree, visible, kernels)
    planner = Planner(source, avoid, existing_kernel_imports(tree, visible), tree)
    results: list[SiteResult] = []
    plans: list[Plan] = []
    for site in sites:
        if not site.applicable or site.call is not None:  # call sites: see _call_edits
            continue
        # A site reached through several calls (an MLM head two task heads call) is edited
        # through each call that allows it; the others keep the original, named in the summary.
        site_plans: list[Plan] = []
        refused: list[tuple[Site, Refusal]] = []
        patched_before = False
        for candidate in (site, *site.instances):
            try:
                site_plans.append(planner.plan(candidate))
            except AlreadyPatched:
                patched_before = True
            except Refusal as refusal:
                refused.append((candidate, refusal))
        if not site_plans:
            if not patched_before:
                results.append(SiteResult.skipped(site, SkipReason.UNSAFE, str(refused[0][1])))
            continue
        main, extras = site_plans[0], site_plans[1:]
        for extra in extras:
            main.imports |= extra.imports
            if _same_helper_edit(main, extra):
                extra.companions = []
            extra.instance_of = site
        if refused:
            main.summary += "".join(f"; not through {_caller(c)}: {r}" for c, r in refused)
        plans.extend(site_plans)
    return planner, plans, results


def _caller(site: Site) -> str:
    """The function a site's match runs from (its steps inlined least deep)."""
    step = min(site.steps, key=lambda s: len(s.inline_chain), default=None)
    if step is None:
        return f"line {site.line}"
    return f"{step.cls}.{step.method}" if step.cls else step.method


def rewrite_source(
    text: str, path: str, sites: Sequence[Site], tree: ast.Module, *, modular: bool = False
) -> FileRewrite:
    """Patch ``text`` for the applicable ``sites`` (found on ``tree``, the same text parsed).
    ``modular``: patch transformers' modular sources rather than the files generated from them
    (see :func:`generated_pair`)."""
    planned = plan_sites(text, path, sites, tree, modular=modular)
    if planned is None:
        return FileRewrite(path, text, text, [])
    planner, plans, results = planned
    if planner is None:
        return FileRewrite(path, text, text, _ordered(results))
    source = planner.source
    call_sites = [site for site in sites if site.applicable and site.call is not None]
    plans = resolve_overlaps(plans, results, _already_fused_classes(tree))
    plans = [part for plan in plans for part in (plan, *plan.companions)]
    plans = _merge_sequential(plans, source)
    if not plans and not call_sites:
        return FileRewrite(path, text, text, _ordered(results))
    lines = list(source.lines)
    spans = _spans(plans, planner)
    call_edits, call_results = _call_edits(call_sites, source, planner, spans)
    results.extend(result for result in call_results if result.status is SiteStatus.SKIPPED)
    patched_calls = [result for result in call_results if result.status is SiteStatus.PATCHED]
    if not plans and not patched_calls:
        return FileRewrite(path, text, text, _ordered(results))
    apply_replacements(lines, call_edits)
    for start, end, group in sorted(spans, key=lambda span: -span[0]):
        try:
            new_lines = _edit_span(source, start, end, group)
            require(check_edit(source, start, end, new_lines, group))
        except (cst.ParserSyntaxError, Refusal, AssertionError, KeyError) as error:
            if any(p.companions or p.instance_of is p.site for p in group):
                # Half of a two-function edit cannot stand alone: plan again without the site.
                failed = {
                    id(p.site): p.site
                    for p in group
                    if p.instance_of is None or p.instance_of is p.site
                }
                retry = rewrite_source(
                    text, path, [s for s in sites if id(s) not in failed], tree, modular=modular
                )
                why = f"synthesis failed: {error}"
                skipped = [
                    SiteResult.skipped(site, SkipReason.SYNTHESIS_FAILED, why)
                    for site in failed.values()
                ]
                return FileRewrite(path, text, retry.patched, _ordered(retry.results + skipped))
            for plan in group:
                results.append(
                    SiteResult.skipped(
                        plan.site, SkipReason.SYNTHESIS_FAILED, f"synthesis failed: {error}"
                    )
                )
            plans = [p for p in plans if p not in group]
            continue
        lines[start - 1 : end] = new_lines
    used = set().union(*(plan.imports for plan in plans)) if plans else set()
    used |= {result.site.rule.kernel.rpartition(".")[2] for result in patched_calls}
    if used:
        # A call at module level runs as the file is imported: the import must come before it.
        module_level = [r.site.line for r in patched_calls if r.site.method == "<module>"]
        first_use = min(module_level, default=None)
        first, last, new = _import_edit(tree, source, planner.aliases, used, first_use)
        if new:
            lines[first - 1 : last] = new
    patched = "".join(lines)
    try:
        compile(patched, path, "exec", dont_inherit=True)
    except SyntaxError as error:
        done = [p.site for group in plans for p in (group, *group.also_patched)]
        for site in done + [result.site for result in patched_calls]:
            results.append(
                SiteResult.skipped(
                    site,
                    SkipReason.DOES_NOT_COMPILE,
                    f"patched code does not compile: "
                    f"{error.msg} (line {error.lineno}); file left unchanged",
                )
            )
        return FileRewrite(path, text, text, _ordered(results))
    for plan in plans:
        for done in (plan, *plan.also_patched):
            if done.instance_of is None:
                results.append(SiteResult.patched(done.site, plan.summary))
    results.extend(patched_calls)
    reopened = any(plan.reopens for plan in plans)
    return FileRewrite(path, text, patched, _ordered(results), reopened=reopened)


def _call_edits(
    sites: list[Site], source: SourceText, planner: Planner, spans: list[tuple[int, int, list]]
) -> tuple[list[LineReplacement], list[SiteResult]]:
    """The replacements of the call-site rules' sites, and each site's result: skipped where
    its call has an unexpected shape or lies in code a model rule's edit replaces (another
    round of ``apply`` takes it on the rewritten text)."""
    edits: list[LineReplacement] = []
    results: list[SiteResult] = []
    for site in sites:
        node = site.call
        assert node is not None
        lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        if any(start <= line <= end for start, end, _ in spans for line in lines):
            why = "the call lies in code another site's rewrite replaces"
            results.append(SiteResult.skipped(site, SkipReason.OVERLAP, why))
            continue
        try:
            kernel = planner.render.local_kernel_name(site.rule.kernel)
            edits.extend(call_edit(site, source, kernel))
        except Refusal as refusal:
            results.append(SiteResult.skipped(site, SkipReason.UNSAFE, str(refusal)))
            continue
        results.append(SiteResult.patched(site, summary(site, kernel)))
    return edits, results


def _same_helper_edit(first: Plan, second: Plan) -> bool:
    """Two callers of one helper need its edit once."""
    edits = [
        [(id(c.function), [(id(s), text) for s, text in c.insert_before]) for c in plan.companions]
        for plan in (first, second)
    ]
    return bool(edits[0]) and edits[0] == edits[1]


def _ordered(results: list[SiteResult]) -> list[SiteResult]:
    return sorted(results, key=lambda r: (r.site.line, r.site.column, r.site.rule.id))
