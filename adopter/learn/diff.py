"""Where a before/after example changed: a structural diff of the two files with LibCST.

Functions are paired by qualified name (``Class.method`` or a module-level ``function``); in a
function whose body changed, the statements are aligned (compared by their Python AST, so
formatting and comments never count) and each replaced block is one *region*: the statements
removed from BEFORE and those added in AFTER, one of which calls the kernel. A block that
replaces several statements by as many kernel calls is split into one region per call.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ..dsl import LocatedError
from ..dsl.declared import registered_kernels

KERNEL_PACKAGE = "adopter.kernels"


class LearnError(LocatedError):
    """An example the learner cannot use, at the place in the file that says why."""


@dataclass(frozen=True)
class KernelCall:
    """The call of the kernel in AFTER: ``kernel(args)`` or, for a factory that wraps a module
    class, ``kernel(Class)(args)``."""

    kernel: str  # dotted: adopter.kernels.rms_norm
    node: cst.Call  # the call whose arguments feed the kernel
    wrapped: str | None  # the class a factory wraps (``BertSelfAttention``), else None
    line: int
    column: int


@dataclass(frozen=True)
class Region:
    """One replaced block of one function."""

    owner: str | None  # the class, None for a module-level function
    method: str
    removed: tuple[int, int]  # first and last line in BEFORE
    removed_nodes: tuple[cst.BaseStatement, ...]
    added: tuple[cst.BaseStatement, ...]
    call: KernelCall
    targets: tuple[str, ...]  # names the AFTER statement assigns the kernel's result to
    returns: bool  # AFTER returns the kernel's result
    before_code: str  # the removed statements' source text
    after_code: str  # the added statements' source text
    # ``if helper(...): <kernel call> else: <the removed code>``: the run-time check, and the
    # names the checked arm sets to ``None`` (values the kernel never computes)
    guard: cst.Call | None = None
    guard_name: str | None = None
    none_targets: tuple[str, ...] = ()


@dataclass
class _Function:
    node: cst.FunctionDef
    owner: str | None


def _parse(text: str, path: str) -> MetadataWrapper:
    try:
        return MetadataWrapper(cst.parse_module(text))
    except cst.ParserSyntaxError as error:
        raise LearnError(path, error.raw_line, error.raw_column + 1, error.message) from None


def _functions(module: cst.Module) -> dict[str, _Function]:
    found: dict[str, _Function] = {}
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            found[statement.name.value] = _Function(statement, None)
        elif isinstance(statement, cst.ClassDef):
            for inner in statement.body.body:
                if isinstance(inner, cst.FunctionDef):
                    found[f"{statement.name.value}.{inner.name.value}"] = _Function(
                        inner, statement.name.value
                    )
    return found


def _key(module: cst.Module, node: cst.CSTNode) -> str:
    """A statement as its AST: formatting and comments do not count."""
    code = module.code_for_node(node)
    try:
        return ast.dump(ast.parse(_dedent(code)))
    except SyntaxError:
        return code.strip()


def _dedent(code: str) -> str:
    lines = code.strip("\n").split("\n")
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return "\n".join(x[indent:] for x in lines)


class _Imports:
    """Local names of AFTER's imports, resolved to dotted paths."""

    def __init__(self, module: cst.Module) -> None:
        self.names: dict[str, str] = {}
        for statement in module.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if isinstance(small, cst.ImportFrom) and not isinstance(
                    small.names, cst.ImportStar
                ):
                    if small.relative:
                        continue
                    base = _dotted(small.module) if small.module is not None else ""
                    for alias in small.names:
                        name = _dotted(alias.name)
                        local = alias.asname.name.value if alias.asname else name  # type: ignore[union-attr]
                        self.names[local] = f"{base}.{name}" if base else name
                elif isinstance(small, cst.Import):
                    for alias in small.names:
                        name = _dotted(alias.name)
                        if alias.asname:
                            self.names[alias.asname.name.value] = name  # type: ignore[union-attr]
                        else:
                            top = name.split(".")[0]
                            self.names[top] = top

    def resolve(self, node: cst.BaseExpression) -> str | None:
        text = _dotted_or_none(node)
        if text is None:
            return None
        head, _, rest = text.partition(".")
        if head not in self.names:
            return None
        return self.names[head] + (f".{rest}" if rest else "")


def _dotted(node: cst.BaseExpression) -> str:
    text = _dotted_or_none(node)
    assert text is not None
    return text


def _dotted_or_none(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted_or_none(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


class _Calls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    visitor = _Calls()
    node.visit(visitor)
    return visitor.calls


def find_regions(before: str, after: str, before_path: str, after_path: str) -> list[Region]:
    """The replaced blocks of the example, in file order. :class:`LearnError` when the files do
    not differ inside a function, when a changed block calls no kernel, or names a kernel that
    is not registered."""
    before_wrapper = _parse(before, before_path)
    after_wrapper = _parse(after, after_path)
    before_module, after_module = before_wrapper.module, after_wrapper.module
    before_positions = before_wrapper.resolve(PositionProvider)
    after_positions = after_wrapper.resolve(PositionProvider)
    imports = _Imports(after_module)
    new_imports = {
        local: dotted
        for local, dotted in imports.names.items()
        if _Imports(before_module).names.get(local) != dotted
    }
    before_functions = _functions(before_module)
    after_functions = _functions(after_module)
    regions: list[Region] = []
    for name, function in before_functions.items():
        other = after_functions.get(name)
        if other is None:
            position = before_positions[function.node].start
            raise LearnError(
                before_path,
                position.line,
                position.column + 1,
                f"{name} is not in {after_path}: learn takes an edit inside functions",
            )
        blocks = _changed_blocks(before_module, after_module, function.node.body, other.node.body)
        for removed, added in blocks:
            regions.extend(
                _regions_of(
                    removed,
                    added,
                    function.owner,
                    name.rsplit(".", 1)[-1],
                    before_module,
                    after_module,
                    before_positions,
                    after_positions,
                    imports,
                    new_imports,
                    after_path,
                )
            )
    for name, function in after_functions.items():
        if name not in before_functions:
            position = after_positions[function.node].start
            raise LearnError(
                after_path,
                position.line,
                position.column + 1,
                f"{name} is not in {before_path}: learn takes an edit inside functions",
            )
    if not regions:
        if _key(before_module, before_module) == _key(after_module, after_module):
            raise LearnError(after_path, 1, 1, f"no change between {before_path} and this file")
        raise LearnError(
            after_path,
            1,
            1,
            "the change is outside every function (only imports or module-level code differ); "
            "learn takes an edit inside a method or function that calls a kernel",
        )
    return regions


def _body(node: cst.BaseSuite) -> list[cst.BaseStatement]:
    if isinstance(node, cst.IndentedBlock):
        return list(node.body)
    return list(node.body)  # type: ignore[arg-type]


def _changed_blocks(
    before_module: cst.Module,
    after_module: cst.Module,
    before_suite: cst.BaseSuite,
    after_suite: cst.BaseSuite,
) -> list[tuple[list[cst.BaseStatement], list[cst.BaseStatement]]]:
    """Aligned statement blocks that differ; a compound statement whose header stayed the same
    is compared arm by arm, so an edit inside an ``if`` is that arm's block."""
    old, new = _body(before_suite), _body(after_suite)
    keys_old = [_key(before_module, s) for s in old]
    keys_new = [_key(after_module, s) for s in new]
    matcher = difflib.SequenceMatcher(a=keys_old, b=keys_new, autojunk=False)
    blocks: list[tuple[list[cst.BaseStatement], list[cst.BaseStatement]]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        removed, added = old[i1:i2], new[j1:j2]
        if len(removed) == len(added) == 1 and _same_header(
            before_module, after_module, removed[0], added[0]
        ):
            for old_arm, new_arm in zip(_arms(removed[0]), _arms(added[0]), strict=True):
                blocks.extend(_changed_blocks(before_module, after_module, old_arm, new_arm))
            continue
        blocks.append((removed, added))
    return blocks


_COMPOUND = (cst.If, cst.For, cst.While, cst.With, cst.Try)


def _arms(node: cst.BaseStatement) -> list[cst.BaseSuite]:
    arms: list[cst.BaseSuite] = [node.body]  # type: ignore[attr-defined]
    orelse = getattr(node, "orelse", None)
    while orelse is not None:
        if isinstance(orelse, cst.If):
            arms.append(orelse.body)
            orelse = orelse.orelse
        else:
            arms.append(orelse.body)
            orelse = None
    for handler in getattr(node, "handlers", ()):
        arms.append(handler.body)
    final = getattr(node, "finalbody", None)
    if final is not None:
        arms.append(final.body)
    return arms


def _same_header(
    before_module: cst.Module, after_module: cst.Module, old: cst.CSTNode, new: cst.CSTNode
) -> bool:
    if type(old) is not type(new) or not isinstance(old, _COMPOUND):
        return False
    if len(_arms(old)) != len(_arms(new)):  # type: ignore[arg-type]
        return False

    def header(module: cst.Module, node: cst.CSTNode) -> str:
        stripped = node.with_changes(
            body=cst.IndentedBlock(body=[cst.SimpleStatementLine([cst.Pass()])])
        )
        if hasattr(stripped, "orelse"):
            stripped = stripped.with_changes(orelse=None)
        if hasattr(stripped, "handlers"):
            stripped = stripped.with_changes(handlers=(), finalbody=None)
            if isinstance(stripped, cst.Try):
                return "try"
        return _key(module, stripped)

    return header(before_module, old) == header(after_module, new)


def _regions_of(
    removed: list[cst.BaseStatement],
    added: list[cst.BaseStatement],
    owner: str | None,
    method: str,
    before_module: cst.Module,
    after_module: cst.Module,
    before_positions,
    after_positions,
    imports: _Imports,
    new_imports: dict[str, str],
    after_path: str,
) -> list[Region]:
    where = f"{owner}.{method}" if owner else method
    with_calls = [
        (statement, _kernel_calls(statement, imports, new_imports)) for statement in added
    ]
    kernel_statements = [(s, calls) for s, calls in with_calls if calls]
    if not kernel_statements:
        anchor = added[0] if added else None
        line, column = (
            (after_positions[anchor].start.line, after_positions[anchor].start.column + 1)
            if anchor is not None
            else (1, 1)
        )
        raise LearnError(
            after_path,
            line,
            column,
            f"the change in {where} is not a recognisable kernel call: the new code calls no "
            f"function of {KERNEL_PACKAGE} (nor of another newly imported package)",
        )
    if not removed:
        statement = kernel_statements[0][0]
        start = after_positions[statement].start
        raise LearnError(
            after_path,
            start.line,
            start.column + 1,
            f"the kernel call in {where} replaces no statement of the original: learn needs the "
            "code the kernel stands for",
        )
    for _statement, calls in kernel_statements:
        for call in calls:
            described = _describe_call(call, imports, new_imports, after_positions)
            check_kernel_name(described.kernel, after_path, described.line, described.column)
    guarded = _guarded(removed, added, imports, new_imports, before_module, after_module)
    if guarded is not None:
        guard, guard_name, body = guarded
        statement, calls = next(
            (s, c) for s, c in ((s, _kernel_calls(s, imports, new_imports)) for s in body) if c
        )
        call = _describe_call(calls[0], imports, new_imports, after_positions)
        targets, returns = _result_targets(statement, calls[0])
        return [
            Region(
                owner,
                method,
                (before_positions[removed[0]].start.line, before_positions[removed[-1]].end.line),
                tuple(removed),
                tuple(added),
                call,
                targets,
                returns,
                "".join(before_module.code_for_node(s) for s in removed),
                "".join(after_module.code_for_node(s) for s in added),
                guard,
                guard_name,
                _none_targets(body),
            )
        ]
    groups: list[tuple[list[cst.BaseStatement], list[cst.BaseStatement]]]
    if len(kernel_statements) > 1 and len(kernel_statements) == len(removed) == len(added):
        groups = [([old], [new]) for old, new in zip(removed, added, strict=True)]
    else:
        groups = [(removed, added)]
    regions: list[Region] = []
    for old_group, new_group in groups:
        statement, calls = next((s, c) for s, c in with_calls if s in new_group and c)
        if len(calls) > 1:
            start = after_positions[calls[1]].start
            raise LearnError(
                after_path,
                start.line,
                start.column + 1,
                f"{where} calls more than one kernel in one statement; learn takes one kernel "
                "call per replaced block",
            )
        call = _describe_call(calls[0], imports, new_imports, after_positions)
        targets, returns = _result_targets(statement, calls[0])
        regions.append(
            Region(
                owner,
                method,
                (
                    before_positions[old_group[0]].start.line,
                    before_positions[old_group[-1]].end.line,
                ),
                tuple(old_group),
                tuple(new_group),
                call,
                targets,
                returns,
                "".join(before_module.code_for_node(s) for s in old_group),
                "".join(after_module.code_for_node(s) for s in new_group),
            )
        )
    return regions


def _helper_name(callee: cst.BaseExpression, imports: _Imports) -> str | None:
    """A registered helper of ``adopter.kernels`` (a run-time check such as
    ``fused_loss_applies``), never a kernel itself."""
    dotted = imports.resolve(callee)
    if dotted is None or not dotted.startswith(KERNEL_PACKAGE + "."):
        return None
    known = registered_kernels().get(dotted.rsplit(".", 1)[-1])
    return dotted if known is not None and known[0] == "helper" else None


def _guarded(
    removed: list[cst.BaseStatement],
    added: list[cst.BaseStatement],
    imports: _Imports,
    new_imports: dict[str, str],
    before_module: cst.Module,
    after_module: cst.Module,
) -> tuple[cst.Call, str, list[cst.BaseStatement]] | None:
    """``if check(...): <new> else: <removed>``: the check, its dotted name and the new arm."""
    if len(added) != 1 or not isinstance(added[0], cst.If):
        return None
    statement = added[0]
    test = statement.test
    if not isinstance(test, cst.Call) or not isinstance(statement.orelse, cst.Else):
        return None
    name = _helper_name(test.func, imports)
    if name is None:
        return None
    kept = _body(statement.orelse.body)
    if [_key(after_module, s) for s in kept] != [_key(before_module, s) for s in removed]:
        return None
    body = _body(statement.body)
    if not any(_kernel_calls(s, imports, new_imports) for s in body):
        return None
    return test, name, body


def _none_targets(body: list[cst.BaseStatement]) -> tuple[str, ...]:
    names = []
    for statement in body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if (
                isinstance(small, cst.Assign)
                and isinstance(small.value, cst.Name)
                and small.value.value == "None"
                and len(small.targets) == 1
            ):
                names.extend(_names(small.targets[0].target))
    return tuple(names)


def _kernel_name(
    callee: cst.BaseExpression, imports: _Imports, new_imports: dict[str, str]
) -> str | None:
    dotted = imports.resolve(callee)
    if dotted is None:
        return None
    if dotted.startswith(KERNEL_PACKAGE + "."):
        return dotted
    head = (_dotted_or_none(callee) or "").split(".")[0]
    if head in new_imports and not dotted.startswith(("torch.", "adopter.")):
        return dotted  # a third-party kernel, imported for this edit
    return None


def _kernel_calls(
    statement: cst.CSTNode, imports: _Imports, new_imports: dict[str, str]
) -> list[cst.Call]:
    found: list[cst.Call] = []
    for call in _calls(statement):
        if _helper_name(call.func, imports) is not None:
            continue  # a run-time check, not the kernel
        if isinstance(call.func, cst.Call) and _kernel_name(call.func.func, imports, new_imports):
            found.append(call)  # factory(Class)(args): the outer call carries the arguments
        elif _kernel_name(call.func, imports, new_imports) and not any(
            outer.func is call for outer in found
        ):
            found.append(call)
    # the factory's inner call is part of the outer one
    inner = {id(c.func) for c in found if isinstance(c.func, cst.Call)}
    return [c for c in found if id(c) not in inner]


def _describe_call(
    call: cst.Call, imports: _Imports, new_imports: dict[str, str], positions
) -> KernelCall:
    start = positions[call].start
    if isinstance(call.func, cst.Call):
        kernel = _kernel_name(call.func.func, imports, new_imports)
        assert kernel is not None
        wrapped = cst.Module([]).code_for_node(call.func.args[0].value) if call.func.args else None
        return KernelCall(kernel, call, wrapped, start.line, start.column + 1)
    kernel = _kernel_name(call.func, imports, new_imports)
    assert kernel is not None
    return KernelCall(kernel, call, None, start.line, start.column + 1)


def check_kernel_name(kernel: str, path: str, line: int, column: int) -> None:
    package, _, name = kernel.rpartition(".")
    if package != KERNEL_PACKAGE:
        return
    known = registered_kernels()
    if name not in known:
        near = difflib.get_close_matches(name, list(known), n=1)
        hint = f"; did you mean {KERNEL_PACKAGE}.{near[0]}?" if near else ""
        raise LearnError(path, line, column, f"unknown kernel {kernel!r}{hint}")
    if known[name][0] not in ("kernel", "attention factory"):
        raise LearnError(
            path, line, column, f"{kernel!r} is a helper of {KERNEL_PACKAGE}, not a kernel"
        )


def _result_targets(statement: cst.BaseStatement, call: cst.Call) -> tuple[tuple[str, ...], bool]:
    if not isinstance(statement, cst.SimpleStatementLine):
        return (), False
    for small in statement.body:
        if isinstance(small, cst.Return):
            return (), True
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            return _names(small.targets[0].target), False
        if isinstance(small, (cst.AnnAssign,)) and small.target is not None:
            return _names(small.target), False
    return (), False


def _names(target: cst.BaseExpression) -> tuple[str, ...]:
    if isinstance(target, (cst.Tuple, cst.List)):
        names: list[str] = []
        for element in target.elements:
            names.extend(_names(element.value))
        return tuple(names)
    text = cst.Module([]).code_for_node(target)
    return (text,)
