"""The patched sites of a file, found in the patched text itself: every call of an
``adopter.kernels`` function.

A rewrite reaches a kernel only through such a call, so "every patched site ran" is "every one
of these calls ran" (a class-building kernel, ``fused_bert_self_attention(BertSelfAttention)``,
counts when a module it built runs ``forward``). Each site also carries what guards it - the
conditions of the ``if``/``while``/conditional expressions around it in its function - and the
configuration fields those conditions read, and the classes of the file whose code reaches it
(``hosts``), so that verify can pick the models that build a site's code and the adapters can
flip the options that guard it (``if self.config.use_weighted_layer_sum:``).

This is what a patched file asks of the models, read statically, beside how model code reads
its configuration (:mod:`.config_reads`); the proof records which of these calls ran
(:mod:`adopter.verify.coverage`). Pure ``ast``: no torch, no model code; used by verify's parent
and worker, the adapters and the command line alike.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ..dsl.declared import KERNEL_PACKAGE
from ..extract.names import attribute_chain
from .config_reads import config_reads, locals_from_config, self_attributes_from_config

__all__ = [
    "KERNEL_PACKAGE",
    "PatchedSite",
    "attribute_flips",
    "calls_kernels",
    "find_sites",
    "reaching_names",
]


@dataclass
class PatchedSite:
    """One kernel call in the patched text; ``line``/``column``/``end_*`` are the call's exact
    span there (columns as Python reports them: UTF-8 byte offsets), ``original_line`` the line
    of the code it replaced in the original file."""

    kernel: str
    line: int
    column: int
    end_line: int
    end_column: int
    function: str  # "WhisperForAudioClassification.forward"
    cls: str | None
    guards: list[str] = field(default_factory=list)  # "self.config.use_weighted_layer_sum"
    # configuration fields the guards read -> constants they are compared with (may be empty)
    config_fields: dict[str, list[Any]] = field(default_factory=dict)
    original_line: int | None = None
    file: str = ""  # the file, where sites come from several (plain nn.Module factories)
    # the n-th of ``of`` kernel calls that stand for the same original line (``0``: alone)
    nth: int = 0
    of: int = 0
    # the file's classes whose code reaches the site: its own top-level class, and every class
    # that names its class or function, or names a class that does, and so on (static, by
    # name); the worker narrows it to the file's model classes. ``None``: not worked out.
    hosts: list[str] | None = None
    # configuration fields read by the conditions around those references (``if
    # config.attention_type == "block_sparse": self.self = SparseAttention(config)``) -> the
    # constants they are compared with: the options that decide whether the site is built at all
    caller_fields: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return (
            f"{self.file}:{self.line}:{self.column}" if self.file else f"{self.line}:{self.column}"
        )

    @property
    def position(self) -> tuple[int, int, int, int]:
        """As ``code.co_positions()`` gives it: line, end line, column, end column."""
        return (self.line, self.end_line, self.column, self.end_column)

    @property
    def reached_from(self) -> set[str]:
        """The file's classes whose code reaches the site: its own class and the static
        ``hosts``."""
        return {*(self.hosts or []), *([self.cls] if self.cls else [])}

    def describe(self) -> str:
        where = f"line {self.original_line}" if self.original_line else f"line {self.line}"
        if self.nth:
            where += f" (call {self.nth} of {self.of} there)"
        return f"{self.kernel} at {where} ({self.function})"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PatchedSite:
        return cls(**data)


def _kernel_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> kernel name for ``from adopter.kernels import x [as y]`` anywhere."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == KERNEL_PACKAGE and node.level == 0:
            for alias in node.names:
                if alias.name != "*":
                    names[alias.asname or alias.name] = alias.name
    return names


@dataclass
class _Reference:
    """A top-level name used inside another top-level definition, with the conditions around
    that use and the innermost class there (whose ``__init__`` maps ``self.x`` to config)."""

    source: str  # a top-level name, or "Class.method" for a use of ``self.method``
    target: str
    guards: list[ast.expr]
    cls: str | None
    local: dict[str, set[str]]  # the using function's locals set from config (see _locals)


# Uses of a class that do not run it: type tests (``_init_weights``'s ``isinstance(module,
# SparseAttention)``, in the base class every model inherits, would make every model a host).
_TYPE_TESTS = frozenset({"isinstance", "issubclass"})


class _Finder(ast.NodeVisitor):
    def __init__(self, kernels: dict[str, str], top_names: set[str] | None = None) -> None:
        self.kernels = kernels
        self.scopes: list[ast.AST] = []  # enclosing classes and functions
        self.guards: list[ast.expr] = []  # enclosing conditions, outermost first
        self.negated: list[bool] = []
        self.inits: dict[str, dict[str, set[str]]] = {}  # class -> self.attr -> config fields
        self.found: list[PatchedSite] = []
        self.top_names = top_names or set()
        self.top: str | None = None  # the top-level definition being visited
        self.references: list[_Reference] = []
        self.local: dict[str, set[str]] = {}  # the current function's locals from config
        self.methods: dict[str, set[str]] = {}  # class -> the names of its methods

    # -- references between top-level definitions -------------------------------------------
    def visit_Module(self, node: ast.Module) -> None:  # noqa: N802
        for statement in node.body:
            names = _defined_names(statement)
            self.top = names[0] if len(names) == 1 else None
            self.visit(statement)
        self.top = None

    def visit_Name(self, node: ast.Name) -> None:  # noqa: N802
        if (
            isinstance(node.ctx, ast.Load)
            and self.top is not None
            and node.id != self.top
            and node.id in self.top_names
            # a class-body attribute (``_can_record_outputs = {... SparseAttention ...}``)
            # describes the model; methods and bases are what run
            and not (self.scopes and isinstance(self.scopes[-1], ast.ClassDef))
        ):
            classes = [scope for scope in self.scopes if isinstance(scope, ast.ClassDef)]
            cls = classes[-1].name if classes else None
            guards = list(self.guards)
            self.references.append(_Reference(self.top, node.id, guards, cls, self.local))

    def visit_Attribute(self, node: ast.Attribute) -> None:  # noqa: N802
        """``self.method`` inside a method of the same class: the conditions around that use
        decide whether a site in ``method`` runs (``if self.reorder: self._reordered(...)``)."""
        chain = attribute_chain(node)
        method = self._method()
        if chain is not None and len(chain) == 2 and chain[0] == "self" and method is not None:
            cls, caller = method
            if chain[1] in self.methods.get(cls, set()) and chain[1] != caller:
                self.references.append(
                    _Reference(
                        f"{cls}.{caller}", f"{cls}.{chain[1]}", list(self.guards), cls, self.local
                    )
                )
        self.generic_visit(node)

    def _method(self) -> tuple[str, str] | None:
        """(class, method) of the innermost method being visited (a function in a class)."""
        found = None
        for outer, inner in zip(self.scopes, self.scopes[1:]):
            if isinstance(outer, ast.ClassDef) and isinstance(
                inner, (ast.FunctionDef, ast.AsyncFunctionDef)
            ):
                found = (outer.name, inner.name)
        return found

    # -- scopes ------------------------------------------------------------------------------
    def visit_ClassDef(self, node: ast.ClassDef) -> None:  # noqa: N802 - ast visitor name
        self.inits[node.name] = self_attributes_from_config(node)
        self.methods[node.name] = {
            item.name
            for item in node.body
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        for outer in (*node.decorator_list, *node.bases, *node.keywords):
            self.visit(outer)  # outside the class body: a base class runs in its subclasses
        self.scopes.append(node)
        for statement in node.body:
            if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Name):
                self._class_default(node, statement.value.id)
            self.visit(statement)
        self.scopes.pop()

    def _class_default(self, node: ast.ClassDef, name: str) -> None:
        """``_default_processor_cls = AttnProcessor`` in a class body: a class the class
        makes when it is given none, so the class reaches what that one runs. (A container
        in a class body, ``_can_record_outputs = {...}``, describes the model instead.)"""
        if self.top == node.name and name != node.name and name in self.top_names:
            self.references.append(_Reference(node.name, name, [], node.name, {}))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:  # noqa: N802
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.scopes.append(node)
        saved, saved_negated, saved_local = self.guards, self.negated, self.local
        self.guards, self.negated = [], []  # conditions of outer functions do not guard a body
        self.local = locals_from_config(node)
        for statement in node.body:
            self.visit(statement)
        self.guards, self.negated, self.local = saved, saved_negated, saved_local
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    # -- conditions --------------------------------------------------------------------------
    def _guarded(self, test: ast.expr, negated: bool, nodes: list[ast.AST]) -> None:
        self.guards.append(test)
        self.negated.append(negated)
        for node in nodes:
            self.visit(node)
        self.guards.pop()
        self.negated.pop()

    def visit_If(self, node: ast.If) -> None:  # noqa: N802
        self.visit(node.test)
        self._guarded(node.test, False, list(node.body))
        self._guarded(node.test, True, list(node.orelse))

    def visit_While(self, node: ast.While) -> None:  # noqa: N802
        self.visit(node.test)
        self._guarded(node.test, False, list(node.body) + list(node.orelse))

    def visit_IfExp(self, node: ast.IfExp) -> None:  # noqa: N802
        self.visit(node.test)
        self._guarded(node.test, False, [node.body])
        self._guarded(node.test, True, [node.orelse])

    # -- kernel calls ------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:  # noqa: N802
        if isinstance(node.func, ast.Name) and node.func.id in _TYPE_TESTS:
            return  # a type test runs nothing it names (and calls no kernel)
        kernel = None
        if isinstance(node.func, ast.Name) and node.func.id in self.kernels:
            kernel = self.kernels[node.func.id]
        elif isinstance(node.func, ast.Attribute) and ast.unparse(node.func.value) == (
            KERNEL_PACKAGE
        ):
            kernel = node.func.attr
        if kernel is not None and node.end_lineno is not None and node.end_col_offset is not None:
            self.found.append(self._site(kernel, node))
        self.generic_visit(node)

    def _site(self, kernel: str, node: ast.Call) -> PatchedSite:
        names = [getattr(scope, "name", "?") for scope in self.scopes]
        classes = [scope for scope in self.scopes if isinstance(scope, ast.ClassDef)]
        cls = classes[-1].name if classes else None
        guards = [
            f"not ({ast.unparse(test)})" if negated else ast.unparse(test)
            for test, negated in zip(self.guards, self.negated)
        ]
        fields: dict[str, list[Any]] = {}
        for test in self.guards:
            reads = config_reads(test, self.inits.get(cls or "", {}), self.local)
            for name, constants in reads.items():
                known = fields.setdefault(name, [])
                known.extend(c for c in constants if c not in known)
        return PatchedSite(
            kernel=kernel,
            line=node.lineno,
            column=node.col_offset,
            end_line=node.end_lineno or node.lineno,
            end_column=node.end_col_offset or 0,
            function=".".join(names) or "<module>",
            cls=cls,
            guards=guards,
            config_fields=fields,
        )


def _defined_names(statement: ast.stmt) -> list[str]:
    """The module-level names a top-level statement defines."""
    if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return [statement.name]
    targets: list[ast.expr] = []
    if isinstance(statement, ast.Assign):
        targets = list(statement.targets)
    elif isinstance(statement, ast.AnnAssign):
        targets = [statement.target]
    return [t.id for t in targets if isinstance(t, ast.Name)]


# How many references up from a site's definition its callers are followed: model -> encoder ->
# layer -> attention block -> attention -> the function holding the site, with room to spare.
_MAX_CALLER_DEPTH = 8


def _reached_from(
    function: str,
    references: list[_Reference],
    inits: dict[str, dict[str, set[str]]],
    classes: set[str],
) -> tuple[list[str], dict[str, list[Any]]]:
    """The classes whose code reaches the site's ``function`` (``Class.method``, or a top-level
    function; its class first, then by distance), and the configuration fields the conditions
    around those uses read - the method's uses as ``self.method`` in its class, then the uses
    of its class or function by name - with the constants they are compared with."""
    users: dict[str, list[_Reference]] = {}
    for reference in references:
        users.setdefault(reference.target, []).append(reference)
    parts = function.split(".")
    owner = parts[0]
    reached = [owner]
    if len(parts) > 1 and owner in classes:
        reached.insert(0, f"{owner}.{parts[1]}")
    fields: dict[str, list[Any]] = {}
    frontier = list(reached)
    for _ in range(_MAX_CALLER_DEPTH):
        following: list[str] = []
        for name in frontier:
            for reference in users.get(name, []):
                from_init = inits.get(reference.cls or "", {})
                for test in reference.guards:
                    reads = config_reads(test, from_init, reference.local)
                    for field_name, constants in reads.items():
                        known = fields.setdefault(field_name, [])
                        known.extend(c for c in constants if c not in known)
                if reference.source not in reached:
                    reached.append(reference.source)
                    following.append(reference.source)
        if not following:
            break
        frontier = following
    return [name for name in reached if name in classes], fields


def _original_lines(original: str, patched: str) -> dict[int, int]:
    """Patched line -> the original line it stands for (the first of a replaced block)."""
    old, new = original.splitlines(), patched.splitlines()
    mapping: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for offset, j in enumerate(range(j1, j2)):
            if tag == "equal":
                mapping[j + 1] = i1 + offset + 1
            else:  # replaced: the line at the same offset in the original block (clamped)
                line = i1 + min(offset * max(1, i2 - i1) // max(1, j2 - j1), max(0, i2 - i1 - 1))
                mapping[j + 1] = min(line + 1, max(1, len(old)))
    return mapping


def find_sites(patched: str, original: str | None = None) -> list[PatchedSite]:
    """Every kernel call of the patched text, in source order; with ``original``, each with the
    line of the original file it replaced. Raises ``SyntaxError`` for text that is not Python."""
    tree = ast.parse(patched)
    defined = {name for statement in tree.body for name in _defined_names(statement)}
    finder = _Finder(_kernel_names(tree), defined)
    finder.visit(tree)
    sites = sorted(finder.found, key=lambda s: (s.line, s.column))
    classes = {s.name for s in tree.body if isinstance(s, ast.ClassDef)}
    for site in sites:
        site.hosts, site.caller_fields = _reached_from(
            site.function, finder.references, finder.inits, classes
        )
    if original is not None:
        lines = _original_lines(original, patched)
        for site in sites:
            site.original_line = lines.get(site.line)
    groups: dict[int | None, list[PatchedSite]] = {}
    for site in sites:
        groups.setdefault(site.original_line or site.line, []).append(site)
    for group in groups.values():
        if len(group) > 1:
            for index, site in enumerate(group, 1):
                site.nth, site.of = index, len(group)
    return sites


def calls_kernels(text: str) -> bool:
    """Whether ``text`` calls ``adopter.kernels`` (what ``apply --write`` leaves behind)."""
    try:
        return bool(find_sites(text))
    except (SyntaxError, ValueError):
        return False


def reaching_names(sites: list[PatchedSite]) -> set[str]:
    """The classes and functions of the file whose code holds one of ``sites`` or reaches one:
    the names a library's models must use for a check of them to be worth building."""
    names = {name for site in sites for name in site.reached_from}
    names |= {site.function.split(".")[0] for site in sites if site.cls is None}
    return names


_ATTRIBUTE_GUARD = re.compile(r"^(not \()?self\.(\w+)\)?$")


def attribute_flips(sites: list[PatchedSite]) -> dict[str, bool]:
    """``self.<flag>`` guards of ``sites`` and the value that reaches each (``not
    (self.fused_attn)``: ``fused_attn=False``): a module attribute set at construction from a
    global option (an environment switch of the library) that a comparison can set on both sides."""
    flips: dict[str, bool] = {}
    for site in sites:
        for guard in site.guards:
            match = _ATTRIBUTE_GUARD.match(guard.strip())
            if match:
                flips[match.group(2)] = match.group(1) is None
    return flips
