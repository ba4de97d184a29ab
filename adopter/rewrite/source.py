"""Source text addressed the way :mod:`ast` addresses it (1-based lines, UTF-8 byte columns), so
that edits planned on the ``ast`` tree can be applied to the text exactly."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..extract.source import line_ending, split_lines


class SourceText:
    """A file's text with fast segment lookup by ``ast`` positions."""

    def __init__(self, text: str) -> None:
        self.text = text
        # Numbered as ``ast`` numbers them: ``str.splitlines`` would also break at form feeds,
        # U+2028 and the like inside comments and strings, and shift every later line.
        self.lines = split_lines(text)
        self.newline = line_ending(text)
        self._encoded: dict[int, bytes] = {}

    def _line_bytes(self, line: int) -> bytes:
        cached = self._encoded.get(line)
        if cached is None:
            cached = self._encoded[line] = self.lines[line - 1].encode("utf-8")
        return cached

    def char_column(self, line: int, byte_column: int) -> int:
        """Code-point column of an ``ast`` byte column (they differ after non-ASCII text)."""
        return len(self._line_bytes(line)[:byte_column].decode("utf-8", errors="replace"))

    def segment(self, node: ast.AST) -> str:
        """The exact source text of a node, as written (comments and line breaks included)."""
        start, end = node.lineno, node.end_lineno  # type: ignore[attr-defined]
        first, last = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        if start == end:
            return self._line_bytes(start)[first:last].decode("utf-8")
        parts = [self._line_bytes(start)[first:]]
        parts += [self._line_bytes(line) for line in range(start + 1, end)]
        parts.append(self._line_bytes(end)[:last])
        return b"".join(parts).decode("utf-8")

    def indentation(self, line: int) -> str:
        text = self.lines[line - 1]
        return text[: len(text) - len(text.lstrip(" \t"))]


def contains(outer: ast.AST, inner: ast.AST) -> bool:
    """True when ``inner``'s source span lies within ``outer``'s."""
    start = (outer.lineno, outer.col_offset)  # type: ignore[attr-defined]
    end = (outer.end_lineno, outer.end_col_offset)  # type: ignore[attr-defined]
    inner_start = (inner.lineno, inner.col_offset)  # type: ignore[attr-defined]
    inner_end = (inner.end_lineno, inner.end_col_offset)  # type: ignore[attr-defined]
    return start <= inner_start and inner_end <= end


def chain_arms(
    source_lines: list[str], branch: ast.If
) -> tuple[list[ast.If], list[list[ast.stmt]]]:
    """The ``if`` statements of an ``if``/``elif`` chain and the bodies of its arms, in order
    (the ``else`` body last; empty when the chain has none). ``else: if`` is not an ``elif``:
    that inner ``if`` belongs to the ``else`` arm."""
    tests: list[ast.If] = []
    bodies: list[list[ast.stmt]] = []
    node = branch
    while True:
        tests.append(node)
        bodies.append(node.body)
        orelse = node.orelse
        if (
            len(orelse) == 1
            and isinstance(orelse[0], ast.If)
            and source_lines[orelse[0].lineno - 1].lstrip().startswith("elif")
        ):
            node = orelse[0]
            continue
        bodies.append(orelse)
        return tests, bodies


def encloses(outer: ast.stmt, statement: ast.stmt) -> bool:
    """``statement`` is ``outer`` or nested in it (identity, not position)."""
    return any(node is statement for node in ast.walk(outer))


def outer_block(blocks: Blocks, statements: list[ast.stmt]) -> list[ast.stmt] | None:
    """The block holding some of ``statements`` and, nested in its other statements, the rest
    (the block of an ``if`` whose arms hold the others); ``None`` when there is none."""
    for statement in statements:
        block = blocks.block_of(statement)[0]
        if all(any(encloses(s, other) for s in block) for other in statements):
            return block
    return None


def function_start(function: ast.FunctionDef) -> int:
    """First line of a function including its decorators."""
    return min([function.lineno] + [d.lineno for d in function.decorator_list])


class Blocks:
    """Where each statement of a function sits: its block (a statement list) and index."""

    def __init__(self, function: ast.FunctionDef) -> None:
        self.where: dict[int, tuple[list[ast.stmt], int, ast.stmt | None, str]] = {}
        self._walk(function.body, function, "body")

    def _walk(self, body: list[ast.stmt], owner: ast.AST, field: str) -> None:
        for index, statement in enumerate(body):
            parent = owner if isinstance(owner, ast.stmt) else None
            self.where[id(statement)] = (body, index, parent, field)
            for name in ("body", "orelse", "finalbody"):
                inner = getattr(statement, name, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    self._walk(inner, statement, name)
            for handler in getattr(statement, "handlers", []) or []:
                self._walk(handler.body, handler, "body")
            for case in getattr(statement, "cases", []) or []:
                self._walk(case.body, case, "body")

    def block_of(self, statement: ast.stmt) -> tuple[list[ast.stmt], int, ast.stmt | None, str]:
        return self.where[id(statement)]

    def between(self, first: ast.stmt, last: ast.stmt) -> Iterator[ast.stmt]:
        """Statements strictly between two statements of the same block."""
        body, start, _, _ = self.where[id(first)]
        _, end, _, _ = self.where[id(last)]
        yield from body[start + 1 : end]


def assigned_names(statement: ast.AST) -> set[str]:
    """Names a statement (or anything nested in it) binds."""
    names: set[str] = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def mutated_names(statement: ast.AST) -> set[str]:
    """Names whose object a statement changes in place without rebinding them: an in-place
    tensor method (``x.mul_(2)``, torch's trailing-underscore convention), an item or
    attribute stored into (``x[0] = 0``, ``x.data = y``, ``x[0] += 1``)."""
    names: set[str] = set()
    for node in ast.walk(statement):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.attr.endswith("_")
            and not node.func.attr.startswith("__")
        ):
            names.add(node.func.value.id)
        elif (
            isinstance(node, (ast.Subscript, ast.Attribute))
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
        ):
            names.add(node.value.id)
    return names


def read_names(node: ast.AST) -> set[str]:
    return {
        child.id
        for child in ast.walk(node)
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load)
    }


def free_reads(statements: list[ast.stmt], bound: frozenset[str] = frozenset()) -> set[str]:
    """Names a run of statements reads before binding them itself. A name bound in a nested
    block counts as bound only for what follows it in that block (the block may not run), so
    the answer may hold more names than a run reads from outside, never fewer."""
    known = set(bound)
    found: set[str] = set()
    for statement in statements:
        blocks = [
            value
            for _, value in ast.iter_fields(statement)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt)
        ]
        handlers = getattr(statement, "handlers", [])
        if not blocks and not handlers:
            found |= read_names(statement) - known
            if isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
                found |= {statement.target.id} - known
            known |= assigned_names(statement)
            continue
        inner = frozenset(known)
        for _, value in ast.iter_fields(statement):
            if isinstance(value, ast.AST) and not isinstance(value, ast.stmt):
                found |= read_names(value) - known
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.withitem):
                        found |= read_names(item.context_expr) - known
        for block in blocks:
            found |= free_reads(block, inner)
        for handler in handlers:
            found |= free_reads(handler.body, inner)
    return found


def names_in(function: ast.FunctionDef) -> set[str]:
    """Every name a function reads, binds or takes as a parameter."""
    taken = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
    return taken | read_names(function) | assigned_names(function)


# Builtins whose call reads its arguments and changes nothing: ``len(self.layers)`` in a test
# (SAM 3's ``if i < len(self.layers) - 1``) can move past a projection or after it as freely
# as a comparison can. A module that rebinds one of these names is not looked for.
EFFECT_FREE_BUILTINS = frozenset({"len", "isinstance", "issubclass", "callable"})


def has_call(node: ast.AST, exempt: frozenset[str] = frozenset()) -> bool:
    """``node`` holds a call (or an ``await``/``yield``), other than one of a builtin named in
    ``exempt`` by its plain name (whose arguments are looked at in turn)."""
    for child in ast.walk(node):
        if isinstance(child, (ast.Await, ast.Yield, ast.YieldFrom)):
            return True
        if isinstance(child, ast.Call) and not (
            isinstance(child.func, ast.Name) and child.func.id in exempt
        ):
            return True
    return False


def calls_effectful(node: ast.AST) -> bool:
    """``node`` holds a call that might see or change state: any call but one of
    :data:`EFFECT_FREE_BUILTINS`."""
    return has_call(node, EFFECT_FREE_BUILTINS)


def is_plain_assignment(statement: ast.stmt, value: ast.expr) -> bool:
    """``name = value`` (annotated or not), with ``value`` that very node."""
    if isinstance(statement, ast.Assign):
        return (
            statement.value is value
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        )
    if isinstance(statement, ast.AnnAssign):
        return statement.value is value and isinstance(statement.target, ast.Name)
    return False


def is_parallel_assignment(statement: ast.stmt, value: ast.expr, matched: set[int]) -> bool:
    """``a, b = x[..., ::2], x[..., 1::2]`` where every element on the right is matched: the
    statement goes with them."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
        return False
    target, values = statement.targets[0], statement.value
    if not (isinstance(target, ast.Tuple) and isinstance(values, ast.Tuple)):
        return False
    if len(target.elts) != len(values.elts) or not all(
        isinstance(name, ast.Name) for name in target.elts
    ):
        return False
    return any(v is value for v in values.elts) and all(id(v) in matched for v in values.elts)


def is_tuple_unpacking(statement: ast.stmt, value: ast.expr) -> bool:
    """``a, b = value``: one tuple (or list) of plain names bound to the value."""
    if not isinstance(statement, ast.Assign) or statement.value is not value:
        return False
    if len(statement.targets) != 1 or not isinstance(statement.targets[0], (ast.Tuple, ast.List)):
        return False
    return all(isinstance(element, ast.Name) for element in statement.targets[0].elts)
