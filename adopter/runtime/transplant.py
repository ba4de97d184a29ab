"""Put patched code into an imported module by swapping the code of its functions in place.

The rewrite only edits statements inside functions (``forward``, ``__init__``, helpers) and adds
a kernel import. So instead of executing the patched module into a new namespace and chasing
every reference to its old classes (other modules' ``from ... import``, lazy-module caches,
auto-class registries, subclasses elsewhere, models already built), the functions whose source
changed keep their identity and get the patched *code*: ``function.__code__`` is replaced,
together with the keyword defaults of any keyword-only parameter the rewrite added. Every
holder of the function, the class or the module sees the patch at once, ``isinstance`` and
pickling are unaffected, the module body is not executed a second time (no repeated
registrations), and ``unpatch`` restores the exact original code objects.

Only the changed functions are compiled: each inside empty copies of its enclosing classes (so
its qualified name, private-name mangling and the ``__class__`` cell of ``super()`` are those of
the original), with the module's ``__future__`` imports, under the original file name and with
line numbers mapped back onto the original file (:mod:`.linemap`).

The file is the running module's only while nothing changed it since the import: before any
code is swapped, every function of the file that the live module holds is compared with the
code object the file compiles to now (:func:`stale_functions`), and a module edited after its
import, or upgraded in place, is left unpatched with the reason.

A module is patched all or nothing. It is refused with a reason when the rewrite changes
anything but function bodies and the kernel import, changes a function's positional
parameters or closure, or when a changed function cannot be found in the live module (replaced
by a decorator that does not keep ``__wrapped__``, rebound under another name).
"""

from __future__ import annotations

import ast
import copy
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import CodeType, FunctionType, ModuleType
from typing import Any

from .linemap import LineMap, remap

KERNEL_PACKAGE = "adopter.kernels"
_MISSING = object()
_SCOPES = (ast.If, ast.Try, ast.With, ast.For, ast.While)
if hasattr(ast, "TryStar"):
    _SCOPES = (*_SCOPES, ast.TryStar)


class Unpatchable(Exception):
    """The patched source cannot be put into the live module safely."""


@dataclass
class _Def:
    qualname: tuple[str, ...]
    node: ast.FunctionDef | ast.AsyncFunctionDef

    @property
    def first_line(self) -> int:
        """``co_firstlineno`` of its code: the first decorator's line, else the ``def``'s."""
        return min([d.lineno for d in self.node.decorator_list] + [self.node.lineno])

    @property
    def label(self) -> str:
        return ".".join(self.qualname)


def _defs(body: list[ast.stmt], prefix: tuple[str, ...] = ()) -> Iterator[_Def]:
    """Functions defined directly in a module or class body (also under ``if``/``try``)."""
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield _Def((*prefix, statement.name), statement)
        elif isinstance(statement, ast.ClassDef):
            yield from _defs(statement.body, (*prefix, statement.name))
        elif isinstance(statement, _SCOPES):
            for block in ("body", "orelse", "finalbody"):
                yield from _defs(getattr(statement, block, []) or [], prefix)
            for handler in getattr(statement, "handlers", []) or []:
                yield from _defs(handler.body, prefix)


def _is_kernel_import(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == KERNEL_PACKAGE and not node.level


def _text(lines: list[str], item: _Def) -> list[str]:
    return lines[item.first_line - 1 : item.node.end_lineno]


def _outline(lines: list[str], tree: ast.Module, defs: list[_Def]) -> list[str]:
    """The module's lines with each collected function replaced by one marker line and the
    kernel import left out: two versions with equal outlines differ only inside functions.
    (Text, not ASTs, is compared: the rewrite keeps every byte outside its edits, and comparing
    text costs a fraction of dumping two trees.)"""
    spans = [(d.first_line, d.node.end_lineno or d.node.lineno, f"def {d.label}") for d in defs]
    spans += [(n.lineno, n.end_lineno or n.lineno, "") for n in tree.body if _is_kernel_import(n)]
    outline: list[str] = []
    line = 1
    for start, end, marker in sorted(spans):
        outline.extend(lines[line - 1 : start - 1])
        outline.extend([marker] if marker else [])
        line = end + 1
    outline.extend(lines[line - 1 :])
    return outline


def kernel_imports(tree: ast.Module) -> dict[str, str]:
    """``{bound name: kernel name}`` of the module-level ``from adopter.kernels import``."""
    names: dict[str, str] = {}
    for node in tree.body:
        if _is_kernel_import(node):
            for alias in node.names:  # type: ignore[attr-defined]
                names[alias.asname or alias.name] = alias.name
    return names


@dataclass
class ChangedFunction:
    """One function whose body the rewrite changed, compiled and ready to swap in."""

    qualname: tuple[str, ...]
    first_line: int  # of the original: identifies the live function
    code: CodeType
    added_keywords: dict[str, Any]  # keyword-only parameters the rewrite added: defaults

    @property
    def label(self) -> str:
        return ".".join(self.qualname)


@dataclass
class Transplant:
    """What a rewrite changes in a module, compiled: functions and the kernel names they use."""

    functions: list[ChangedFunction]
    kernels: dict[str, str]  # bound name -> name in adopter.kernels


def plan_transplant(original: str, patched: str, filename: str) -> Transplant:
    """Compile the functions ``patched`` changes relative to ``original`` (a rewrite of it)."""
    old_tree = ast.parse(original, filename)
    new_tree = ast.parse(patched, filename)
    old_defs, new_defs = list(_defs(old_tree.body)), list(_defs(new_tree.body))
    old_lines, new_lines = original.splitlines(), patched.splitlines()
    if _outline(old_lines, old_tree, old_defs) != _outline(new_lines, new_tree, new_defs):
        raise Unpatchable("the rewrite changes code outside function bodies")
    changed = [
        (old, new)
        for old, new in zip(old_defs, new_defs, strict=True)
        if _text(old_lines, old) != _text(new_lines, new)
    ]
    if not changed:
        return Transplant([], {})
    added = [_added_keywords(old, new) for old, new in changed]
    mapped = [(new, _line_map(old_lines, old, new_lines, new)) for old, new in changed]
    codes = _compile_changed(new_tree, mapped, filename)
    functions = [
        ChangedFunction(old.qualname, old.first_line, code, keywords)
        for (old, _), code, keywords in zip(changed, codes, added, strict=True)
    ]
    old_kernels = kernel_imports(old_tree)
    new_kernels = {
        name: kernel
        for name, kernel in kernel_imports(new_tree).items()
        if old_kernels.get(name) != kernel
    }
    return Transplant(functions, new_kernels)


def _added_keywords(old: _Def, new: _Def) -> dict[str, Any]:
    """Defaults of the keyword-only parameters ``new`` adds; anything else must be unchanged."""
    a, b = old.node.args, new.node.args

    def same(x: list[Any], y: list[Any]) -> bool:
        return [ast.dump(n) if n is not None else None for n in x] == [
            ast.dump(n) if n is not None else None for n in y
        ]

    positional_same = (
        same(a.posonlyargs, b.posonlyargs)
        and same(a.args, b.args)
        and same(a.defaults, b.defaults)
        and same([a.vararg], [b.vararg])
        and same([a.kwarg], [b.kwarg])
    )
    count = len(a.kwonlyargs)
    if (
        not positional_same
        or not same(a.kwonlyargs, b.kwonlyargs[:count])
        or not same(a.kw_defaults, b.kw_defaults[:count])
    ):
        raise Unpatchable(f"the rewrite changes the parameters of {old.label}")
    added: dict[str, Any] = {}
    for argument, default in zip(b.kwonlyargs[count:], b.kw_defaults[count:], strict=True):
        if default is None:
            raise Unpatchable(f"{old.label}: added parameter {argument.arg} has no default")
        try:
            added[argument.arg] = ast.literal_eval(default)
        except ValueError:
            raise Unpatchable(f"{old.label}: default of {argument.arg} is not a constant") from None
    return added


def _line_map(old_lines: list[str], old: _Def, new_lines: list[str], new: _Def) -> LineMap:
    """The lines of the patched function ``new`` on those of the original ``old``."""
    return LineMap(_text(old_lines, old), _text(new_lines, new), old.first_line, new.first_line)


def _compile_changed(
    tree: ast.Module, defs: list[tuple[_Def, LineMap]], filename: str
) -> list[CodeType]:
    """Code objects of ``defs``, compiled inside empty copies of their enclosing classes.

    The function nodes of ``tree`` are moved onto the original lines in place, not copied:
    ``tree`` is this plan's own parse, and the functions ``_defs`` collects never nest."""
    body: list[ast.stmt] = [
        copy.deepcopy(node)
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "__future__"
    ]
    classes: dict[tuple[str, ...], ast.ClassDef] = {}

    def block_for(path: tuple[str, ...]) -> list[ast.stmt]:
        if not path:
            return body
        if path not in classes:
            cls = ast.ClassDef(name=path[-1], bases=[], keywords=[], body=[], decorator_list=[])
            if hasattr(ast.ClassDef, "type_params"):
                cls.type_params = []  # type: ignore[attr-defined]
            block_for(path[:-1]).append(cls)
            classes[path] = cls
        return classes[path].body

    for item, lines in defs:
        remap(item.node, lines)
        block_for(item.qualname[:-1]).append(item.node)
    module = ast.Module(body=body, type_ignores=[])
    ast.fix_missing_locations(module)
    compiled = compile(module, filename, "exec", dont_inherit=True)
    found: dict[tuple[tuple[str, ...], int], CodeType] = {}

    def walk(code: CodeType, prefix: tuple[str, ...]) -> None:
        for const in code.co_consts:
            if isinstance(const, CodeType):
                path = (*prefix, const.co_name)
                found.setdefault((path, const.co_firstlineno), const)
                walk(const, path)

    walk(compiled, ())
    result = []
    for item, _ in defs:  # first_line reads the node: the original line, after remap
        code = found.get((item.qualname, item.first_line))
        if code is None:
            raise Unpatchable(f"compiling {item.label} gave no code object")
        result.append(code)
    return result


@dataclass
class _Swap:
    function: FunctionType
    code: CodeType  # the original
    kwdefaults: dict[str, Any] | None
    change: ChangedFunction


@dataclass
class AppliedTransplant:
    """A transplant in effect in one module; :meth:`undo` restores the original exactly."""

    module: ModuleType
    filename: str
    swaps: list[_Swap] = field(default_factory=list)
    injected: dict[str, object] = field(default_factory=dict)  # name -> previous value

    def in_effect(self) -> bool:
        """Whether the module still runs the swapped functions (``importlib.reload`` executes
        the original source again and makes new ones)."""
        for swap in self.swaps:
            live = find_functions(self.module, swap.change, self.filename)
            if swap.function.__code__ is not swap.change.code or swap.function not in live:
                return False
        return True

    def undo(self) -> None:
        for swap in reversed(self.swaps):
            swap.function.__code__ = swap.code
            swap.function.__kwdefaults__ = swap.kwdefaults
        namespace = vars(self.module)
        for name, previous in self.injected.items():
            if previous is _MISSING:
                namespace.pop(name, None)
            else:
                namespace[name] = previous
        self.swaps, self.injected = [], {}


def _own_attribute(item: object, name: str) -> object:
    """An attribute from the object's own ``__dict__``: never runs a ``__getattr__`` (lazy
    modules import on attribute access, and model globals can be anything)."""
    try:
        own = object.__getattribute__(item, "__dict__")
    except AttributeError:
        return None
    return own.get(name) if isinstance(own, dict) else None


def _candidates(value: object) -> Iterator[object]:
    """``value`` and the functions it wraps (methods, properties, ``functools.wraps``)."""
    seen: set[int] = set()
    pending = [value]
    while pending:
        item = pending.pop()
        if item is None or id(item) in seen or isinstance(item, (ModuleType, type)):
            continue
        seen.add(id(item))
        yield item
        if isinstance(item, (staticmethod, classmethod)):
            pending.append(item.__func__)
        elif isinstance(item, property):
            pending.extend([item.fget, item.fset, item.fdel])
        elif isinstance(item, (functools.partial, functools.partialmethod)):
            pending.append(item.func)
        elif isinstance(item, functools.cached_property):
            pending.append(item.func)
        pending.append(_own_attribute(item, "__wrapped__"))


def _same_file(code: CodeType, filename: str) -> bool:
    try:
        return os.path.samefile(code.co_filename, filename)
    except OSError:
        return code.co_filename == filename


def find_functions(
    module: ModuleType, change: ChangedFunction, filename: str
) -> list[FunctionType]:
    """The live function objects ``change`` replaces (found by qualified name, then checked by
    name, file and first line, so an alias or a same-named function elsewhere is never hit)."""
    namespace: dict[str, Any] = vars(module)
    for part in change.qualname[:-1]:
        owner = namespace.get(part)
        if not isinstance(owner, type):
            return []
        namespace = dict(vars(owner))
    found = []
    for item in _candidates(namespace.get(change.qualname[-1])):
        if (
            isinstance(item, FunctionType)
            and item.__code__.co_name == change.qualname[-1]
            and item.__code__.co_firstlineno == change.first_line
            and _same_file(item.__code__, filename)
        ):
            found.append(item)
    return found


def _same_constant(a: object, b: object) -> bool:
    if isinstance(a, CodeType) and isinstance(b, CodeType):
        return same_code(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(map(_same_constant, a, b))  # type: ignore[arg-type]
    if isinstance(a, (float, complex)):
        return repr(a) == repr(b)  # -0.0 is not 0.0, nan is nan
    return a == b


_CODE_FIELDS = (
    "co_code",  # the instructions as compiled (not the interpreter's specialised copy)
    "co_names",
    "co_varnames",
    "co_freevars",
    "co_cellvars",
    "co_argcount",
    "co_posonlyargcount",
    "co_kwonlyargcount",
    "co_flags",
    "co_firstlineno",
    "co_linetable",  # line (and column) of each instruction: a moved line shows here
    "co_exceptiontable",
)


def same_code(a: CodeType, b: CodeType) -> bool:
    """Whether two code objects were compiled from the same source (file name aside)."""
    for name in _CODE_FIELDS:
        if getattr(a, name, None) != getattr(b, name, None):
            return False
    return len(a.co_consts) == len(b.co_consts) and all(
        map(_same_constant, a.co_consts, b.co_consts)
    )


def stale_functions(module: ModuleType, original: str, filename: str) -> list[str]:
    """The functions of ``original`` (the file's text now) whose live code in ``module`` is not
    what that text compiles to: the module was edited after its import, or upgraded in place.

    The file is compiled whole, as the import compiled it (same flags, the interpreter's
    optimisation level), and each function the live module holds under a qualified name of
    the file (``co_qualname``; functions local to a function are compared as constants of it)
    is compared with the code objects of that name (several: a property's getter and
    setter, definitions under ``if``/``else``). Comparing code, not a digest of the file taken at
    import, also covers modules imported before Adopter was, and ``.pyc`` files.
    """
    compiled = compile(original, filename, "exec", dont_inherit=True)
    on_disk: dict[tuple[str, ...], list[CodeType]] = {}
    pending = [compiled]
    while pending:  # module and class bodies hold the functions the live module can reach
        for const in pending.pop().co_consts:
            if isinstance(const, CodeType) and "<" not in const.co_qualname:
                on_disk.setdefault(tuple(const.co_qualname.split(".")), []).append(const)
                pending.append(const)
    stale: list[str] = []
    for qualname, candidates in on_disk.items():
        for function in _live_functions(module, qualname, filename):
            if not any(same_code(function.__code__, code) for code in candidates):
                stale.append(".".join(qualname))
                break
    return list(dict.fromkeys(stale))


def _live_functions(
    module: ModuleType, qualname: tuple[str, ...], filename: str
) -> list[FunctionType]:
    """The live functions under ``qualname`` that came from ``filename`` (any first line)."""
    namespace: dict[str, Any] = vars(module)
    for part in qualname[:-1]:
        owner = namespace.get(part)
        if not isinstance(owner, type):
            return []
        namespace = dict(vars(owner))
    return [
        item
        for item in _candidates(namespace.get(qualname[-1]))
        if isinstance(item, FunctionType)
        and item.__code__.co_name == qualname[-1]
        and _same_file(item.__code__, filename)
    ]


def apply_transplant(
    module: ModuleType, transplant: Transplant, filename: str
) -> AppliedTransplant:
    """Swap the changed functions' code into ``module``: all of them, or none (raises)."""
    planned: list[tuple[FunctionType, ChangedFunction]] = []
    for change in transplant.functions:
        functions = find_functions(module, change, filename)
        if not functions:
            raise Unpatchable(f"{change.label} is not reachable in the imported module")
        for function in functions:
            if function.__code__.co_freevars != change.code.co_freevars:
                raise Unpatchable(f"the rewrite changes the closure of {change.label}")
            planned.append((function, change))
    namespace = vars(module)
    values: dict[str, object] = {}
    if transplant.kernels:
        import importlib

        kernels = importlib.import_module(KERNEL_PACKAGE)
        for name, kernel in transplant.kernels.items():
            value = getattr(kernels, kernel, _MISSING)
            if value is _MISSING:
                raise Unpatchable(f"{KERNEL_PACKAGE} has no {kernel}")
            previous = namespace.get(name, _MISSING)
            if previous is not _MISSING and previous is not value:
                raise Unpatchable(f"the kernel name {name} is already bound in the module")
            values[name] = value
    applied = AppliedTransplant(module, filename)
    for name, value in values.items():
        applied.injected[name] = namespace.get(name, _MISSING)
        namespace[name] = value
    for function, change in planned:
        applied.swaps.append(_Swap(function, function.__code__, function.__kwdefaults__, change))
        if change.added_keywords:
            function.__kwdefaults__ = {**(function.__kwdefaults__ or {}), **change.added_keywords}
        function.__code__ = change.code
    return applied
