"""``__init__`` analysis: which call builds each submodule attribute.

Handles conditionals (each arm gives an alternative binding with its context), local aliases
(``act = ACT2FN[...]; self.act = act``), ``nn.ModuleList``/``nn.ModuleDict``/``nn.Sequential``
containers (list literals, comprehensions and ``append``), ``ACT2FN[...]`` lookups, helper
methods called from ``__init__`` and module-level factory functions that return a module.

An ``nn.Sequential`` gets exactly one element per position, whatever builds it: arguments,
starred lists (literal or a local list grown with ``append``/``extend``/``+=``), an
``OrderedDict``, ``add_module``/``append`` after construction, or a subclass of
``nn.Sequential`` filling itself through ``super().__init__``/``add_module``. A position whose
module depends on a condition (``nn.ReLU() if act else nn.Identity()``) is one opaque element,
never one per alternative. Where the number of elements before a position is not the same on
every path (a comprehension, an ``append`` in a loop or under an ``if``, a list from elsewhere),
the container says why in ``elements_unknown`` and its elements carry no ``position``: the
rewrite then refuses to index them instead of guessing.

Layer classes passed around as values are followed too: a constructor parameter with a default
(``act_layer=nn.GELU``, ``norm_layer: Type[nn.Module] = nn.BatchNorm2d``), a local name bound to
a class (``layer = partial(nn.Conv2d, kernel_size=1) if use_conv else nn.Linear``,
``act_layer = act_layer or nn.GELU``) and ``functools.partial`` of one; calling such a name
builds that class, with the partial's arguments. The default is what the class builds when its
caller passes nothing else; kernels check the module they get at run time.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from .evaluate import UNKNOWN, Undecided, evaluate_factory, package_signature
from .model import EMPTY_CONTEXT, NOT_CONSTANT, BranchPoint, Construction, Context, Operand
from .names import (
    ImportTable,
    activation_family,
    construction_family,
    function_parameters,
    parameter_names,
)
from .project import Definition, Project

MAX_FACTORY_DEPTH = 3
LIST_CONTAINERS = {"torch.nn.ModuleList", "torch.nn.ModuleDict", "torch.nn.ParameterList"}
SEQUENTIAL = "torch.nn.Sequential"


def constant_value(node: ast.AST | None) -> object:
    """The value of a literal expression (``-1``, ``"gelu"``, ``(1, 2)``), else NOT_CONSTANT."""
    if node is None:
        return NOT_CONSTANT
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        # checked element by element: most tuples in model code hold names (``(b, t, -1)``)
        values = tuple(constant_value(element) for element in node.elts)
        return NOT_CONSTANT if any(v is NOT_CONSTANT for v in values) else values
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = node.operand  # a signed number literal, as ``ast.literal_eval`` takes it
        if isinstance(operand, ast.Constant) and type(operand.value) in (int, float, complex):
            return -operand.value if isinstance(node.op, ast.USub) else +operand.value
    return NOT_CONSTANT


def normalise_arguments(
    kind: str, positional: list[Operand], keywords: dict[str, Operand]
) -> dict[str, Operand]:
    """Map a call's arguments onto the callee's parameter names, filling known defaults."""
    names, defaults = parameter_names(kind)
    arguments = dict(keywords)
    for name, operand in zip(names, positional):
        arguments.setdefault(name, operand)
    for name, default in defaults.items():
        if name not in arguments:
            arguments[name] = Operand(constant=default, label=repr(default))
    return arguments


def call_kind(node: ast.expr, imports: ImportTable) -> str | None:
    """Canonical name of what a call calls: ``torch.nn.Linear``, ``ACT2FN[config.hidden_act]``."""
    if isinstance(node, ast.Subscript):
        base = imports.resolve(node.value)
        if base is None:
            return None
        return f"{base}[{ast.unparse(node.slice)}]"
    return imports.resolve(node)


@dataclass(frozen=True)
class ClassRef:
    """A layer class held in a variable, with the arguments a ``functools.partial`` bound."""

    kind: str
    positional: tuple[ast.expr, ...] = ()
    keywords: tuple[tuple[str, ast.expr], ...] = ()
    context: Context = EMPTY_CONTEXT


PARTIAL = {"functools.partial", "partial"}


@dataclass
class InitContext:
    """What ``__init__`` analysis needs to know about the rest of the file."""

    imports: ImportTable
    path: str
    functions: dict[str, ast.FunctionDef]
    methods: Callable[[str], ast.FunctionDef | None]
    next_branch: Callable[[], int]
    branch_labels: dict[int, BranchPoint] = field(default_factory=dict)
    # The file's classes by name: a local subclass of ``nn.Sequential`` is a container too.
    class_nodes: dict[str, ast.ClassDef] = field(default_factory=dict)
    project: Project | None = None  # the package on disk, for helpers in other files
    module_path: Path | None = None  # the file these imports belong to
    # Parameters of the analysed ``__init__`` that the file's constructions of its class fill
    # with layer classes (``extract.callers``), for those without a default. Called only when
    # the ``__init__`` reads such a parameter as a class: finding the constructions walks the
    # file, and most parameters (``config``) are never read so.
    passed_classes: Callable[[], dict[str, tuple[str, ...]]] | None = None


@dataclass
class _Elements:
    """The elements of an ``nn.Sequential`` being built (or of a local list that becomes one),
    one per position, and why their indexes are not static ("" when they are)."""

    items: list[Construction]
    context: Context  # where the sequence was started: growing it elsewhere is conditional
    unknown: str = ""

    def mark_unknown(self, why: str) -> None:
        if not self.unknown:
            self.unknown = why


@dataclass(frozen=True)
class _Built:
    """What an external factory returns, independent of where it is called."""

    kind: str
    family: str | None
    arguments: tuple[tuple[str, Operand], ...]
    positional: tuple[Operand, ...]
    elements: tuple[Construction, ...]
    container: str | None
    elements_unknown: str = ""


_SUMMARIES: dict[tuple, tuple[tuple[_Built, ...], tuple[ClassRef, ...]]] = {}


class InitAnalyzer:
    """Walks one ``__init__`` (and the helpers it calls) and records attribute bindings."""

    def __init__(self, ctx: InitContext, inherited: dict[str, list[Construction]]) -> None:
        self.ctx = ctx
        self.bindings: dict[str, list[Construction]] = {k: list(v) for k, v in inherited.items()}
        self.locals: dict[str, list[Construction]] = {}
        self.classes: dict[str, list[ClassRef]] = {}  # names bound to layer classes
        self.context: Context = EMPTY_CONTEXT
        self.method_stack: list[str] = []
        self.function_stack: list[ast.FunctionDef] = []
        self.lists: dict[str, _Elements] = {}  # local lists of modules (``layers = []``)
        # Analysing the ``__init__`` of an ``nn.Sequential`` subclass: its own elements.
        self.own_elements: _Elements | None = None
        # Parameters without a default whose classes ``ctx.passed_classes`` may give, not yet
        # asked for; what they are bound to counts from the context they were entered in.
        self.pending: set[str] = set()
        self.pending_context: Context = EMPTY_CONTEXT

    # -- statements --------------------------------------------------------------------------
    def run(self, function: ast.FunctionDef) -> dict[str, list[Construction]]:
        self.method_stack.append(function.name)
        self.function_stack.append(function)
        self.parameter_defaults(function)
        if self.ctx.passed_classes is not None:
            self.pending = {p for p, d in function_parameters(function)[1:] if d is None}
            self.pending -= self.classes.keys()
            self.pending_context = self.context
        self.block(function.body)
        self.function_stack.pop()
        self.method_stack.pop()
        return self.bindings

    def parameter_defaults(self, function: ast.FunctionDef) -> None:
        """Parameters whose default is a layer class (``act_layer=nn.GELU``)."""
        for parameter, default in function_parameters(function):
            if default is None:
                continue
            refs = self.class_refs(default)
            if refs:
                self.classes[parameter] = refs

    def known_classes(self, name: str) -> list[ClassRef] | None:
        """The layer classes ``name`` is bound to, if any (a parameter the class's builders
        fill is looked up the first time one is read)."""
        if name in self.pending:
            self.passed_parameters()
        return self.classes.get(name)

    def passed_parameters(self) -> None:
        """Parameters the class's builders in this file fill with layer classes
        (``RepVitMlp(..., act_layer)`` all the way up to ``act_layer=nn.GELU``); several
        classes are alternatives of one branch point."""
        assert self.ctx.passed_classes is not None
        pending, self.pending = self.pending, set()
        for parameter, kinds in self.ctx.passed_classes().items():
            if parameter not in pending:
                continue
            point = None
            if len(kinds) > 1:
                point = self.ctx.next_branch()
                label = f"the layer classes this file's constructions pass as `{parameter}`"
                self.ctx.branch_labels[point] = BranchPoint(label, None, len(kinds))
            context = self.pending_context
            self.classes[parameter] = [
                ClassRef(kind, context=context | ({(point, arm)} if point else set()))
                for arm, kind in enumerate(kinds)
            ]

    def class_refs(self, value: ast.expr, depth: int = 0) -> list[ClassRef]:
        """The layer classes an expression may evaluate to (empty when it names none)."""
        if depth > MAX_FACTORY_DEPTH:
            return []
        if isinstance(value, ast.Name) and (known := self.known_classes(value.id)) is not None:
            return list(known)
        if isinstance(value, (ast.Name, ast.Attribute)):
            if isinstance(value, ast.Name) and value.id in self.locals:
                return []
            kind = self.ctx.imports.resolve(value)
            if kind is not None and kind.rsplit(".", 1)[-1][:1].isupper():
                return [ClassRef(kind, context=self.context)]
            return []
        if isinstance(value, ast.IfExp):
            point = self.ctx.next_branch()
            self.ctx.branch_labels[point] = BranchPoint("if", value.test)
            found = []
            for arm, sub in enumerate((value.body, value.orelse)):
                found += [
                    ClassRef(r.kind, r.positional, r.keywords, r.context | {(point, arm)})
                    for r in self.class_refs(sub, depth + 1)
                ]
            return found
        if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.Or):
            # ``act_layer or nn.GELU``: whichever is set
            return [r for sub in value.values for r in self.class_refs(sub, depth + 1)]
        if isinstance(value, ast.Call) and (external := self.external_factory(value)):
            evaluated = self.evaluated(external, value, depth)
            if evaluated is not None:
                return [replace(r, context=self.context) for r in evaluated]
            _, refs = self.summary(external, value, depth)
            return self.fresh_alternatives(refs, f"{external.name}()")
        if (
            isinstance(value, ast.Call)
            and value.args
            and self.ctx.imports.resolve(value.func) in PARTIAL
            and not any(isinstance(a, ast.Starred) for a in value.args)
        ):
            bound = tuple((k.arg, k.value) for k in value.keywords if k.arg is not None)
            return [
                ClassRef(r.kind, (*r.positional, *value.args[1:]), (*r.keywords, *bound), r.context)
                for r in self.class_refs(value.args[0], depth + 1)
            ]
        return []

    def block(self, statements: list[ast.stmt]) -> None:
        for statement in statements:
            self.statement(statement)

    def statement(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self.assign(target, node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self.assign(node.target, node.value)
        elif (
            isinstance(node, ast.AugAssign)
            and isinstance(node.op, ast.Add)
            and isinstance(node.target, ast.Name)
            and node.target.id in self.lists
        ):
            self.grow(self.lists[node.target.id], node.value, node)
        elif isinstance(node, ast.If):
            self.branch([node.body, node.orelse], BranchPoint("if", node.test))
        elif isinstance(node, ast.For):
            self.branch([node.body + node.orelse, []], BranchPoint("loop", node.iter))
        elif isinstance(node, ast.While):
            self.branch([node.body + node.orelse, []], BranchPoint("while", node.test))
        elif isinstance(node, ast.Try):
            arms = [node.body + node.orelse] + [h.body for h in node.handlers]
            self.branch(arms, BranchPoint("try", None, len(arms)))
            self.block(node.finalbody)
        elif isinstance(node, ast.With):
            self.block(node.body)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            self.expression_call(node.value)

    def branch(self, arms: list[list[ast.stmt]], branch: BranchPoint) -> None:
        point = self.ctx.next_branch()
        self.ctx.branch_labels[point] = branch
        outer = self.context
        for arm, statements in enumerate(arms):
            self.context = outer | {(point, arm)}
            self.block(statements)
        self.context = outer

    def expression_call(self, call: ast.Call) -> None:
        func = call.func
        growing = ("append", "extend", "add_module", "insert")
        # layers.append(Block(...)) on a local list that becomes an nn.Sequential
        if (
            isinstance(func, ast.Attribute)
            and func.attr in growing
            and isinstance(func.value, ast.Name)
            and func.value.id in self.lists
        ):
            self.grow(self.lists[func.value.id], call, call, func.attr)
            return
        # super().__init__(conv, bn) / self.add_module("conv", conv) in an nn.Sequential subclass
        if self.own_elements is not None and self.fills_self(call):
            return
        # self.add_module("conv", nn.Conv2d(...)) binds self.conv
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "add_module"
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
            and len(call.args) == 2
            and isinstance(name := constant_value(call.args[0]), str)
        ):
            self.assign(ast.Attribute(ast.Name("self"), name), call.args[1])
            return
        # self.layers.append(Layer(...)) / self.layers.extend([...])
        if (
            isinstance(func, ast.Attribute)
            and func.attr in growing
            and (attr := self_attribute(func.value)) is not None
        ):
            for container in self.bindings.get(attr, []):
                if container.container == "sequential":
                    elements = _Elements(list(container.elements), container.context)
                    elements.unknown = container.elements_unknown
                    self.grow(elements, call, call, func.attr)
                    _fill(container, elements)
                    continue
                if container.container is None:
                    continue
                values = call.args[-1:] if func.attr != "extend" else []
                if func.attr == "extend" and call.args:
                    values = list(_list_items(call.args[0]))
                for value in values:
                    container.elements.extend(self.construct(value))
            return
        # self._build_layers(config): a helper that binds attributes itself.
        if (name := self_attribute(func)) is not None and len(self.method_stack) < 4:
            method = self.ctx.methods(name)
            if method is not None and name not in self.method_stack:
                self.method_stack.append(name)
                self.function_stack.append(method)
                self.block(method.body)
                self.function_stack.pop()
                self.method_stack.pop()

    def assign(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                for sub_target, sub_value in zip(target.elts, value.elts):
                    self.assign(sub_target, sub_value)
            return
        if isinstance(target, ast.Name):
            refs = self.class_refs(value)
            if refs:
                self.pending.discard(target.id)
                self.classes[target.id] = refs
                self.locals.pop(target.id, None)
                return
            if not self.context:  # in a branch the class it held may still be there after
                self.pending.discard(target.id)
                self.classes.pop(target.id, None)
            if isinstance(value, (ast.List, ast.Tuple, ast.ListComp, ast.BinOp)):
                started = _Elements([], self.context)
                self.add_iterable(started, value)
                self.lists[target.id] = started
            else:
                self.lists.pop(target.id, None)
        constructions = self.construct(value)
        if isinstance(target, ast.Name):
            if constructions:
                self.locals[target.id] = constructions
            else:
                self.locals.pop(target.id, None)
            return
        attr = self_attribute(target)
        if attr is None:
            return
        if not constructions:
            if not self.context:
                self.bindings.pop(attr, None)
            return
        if self.context:
            self.bindings.setdefault(attr, []).extend(constructions)
        else:
            self.bindings[attr] = constructions

    # -- expressions -------------------------------------------------------------------------
    def construct(self, value: ast.expr, depth: int = 0) -> list[Construction]:
        """The constructions an expression may evaluate to (empty when it is no module)."""
        if isinstance(value, ast.Name):
            return list(self.locals.get(value.id, []))
        if (attr := self_attribute(value)) is not None:
            return list(self.bindings.get(attr, []))
        if isinstance(value, ast.IfExp):
            point = self.ctx.next_branch()
            self.ctx.branch_labels[point] = BranchPoint("if", value.test)
            outer = self.context
            found = []
            for arm, sub in enumerate((value.body, value.orelse)):
                self.context = outer | {(point, arm)}
                found += self.construct(sub, depth)
            self.context = outer
            return found
        if isinstance(value, ast.Subscript):
            kind = call_kind(value, self.ctx.imports)
            if (
                kind is None
                or isinstance(value.value, ast.Attribute)
                and self_attribute(value.value)
            ):
                return []
            return [self.make(kind, value, [], {})]
        if not isinstance(value, ast.Call):
            return []
        func = value.func
        if isinstance(func, ast.Name) and (known := self.known_classes(func.id)) is not None:
            return [self.from_class(ref, value) for ref in known]
        kind = call_kind(value.func, self.ctx.imports)
        if kind is None:
            return []
        positional = [Operand(node=a, constant=constant_value(a)) for a in value.args]
        keywords = {
            k.arg: Operand(node=k.value, constant=constant_value(k.value))
            for k in value.keywords
            if k.arg is not None
        }
        if kind == SEQUENTIAL:
            container = self.make(kind, value, positional, keywords)
            container.container = "sequential"
            _fill(container, self.sequence(value.args, depth))
            return [container]
        if kind in LIST_CONTAINERS:
            container = self.make(kind, value, positional, keywords)
            container.container = "list"
            for item in _list_items(value.args[0]) if value.args else iter(()):
                if isinstance(item, ast.Starred):
                    continue
                container.elements.extend(self.construct(item, depth) or [_opaque(item, self)])
            return [container]
        subclass_init = self.sequential_subclass(kind)
        if subclass_init is not None and depth < MAX_FACTORY_DEPTH:
            container = self.make(kind, value, positional, keywords)
            container.container = "sequential"
            _fill(container, self.subclass_elements(kind, subclass_init))
            return [container]
        external = self.external_factory(value) if depth < MAX_FACTORY_DEPTH else None
        if external is not None and activation_family(kind) is None:
            built, _ = self.summary(external, value, depth)
            if built:
                return self.from_factory(built, value, external.name)
        factory = self.factory(value, kind)
        if factory is not None and depth < MAX_FACTORY_DEPTH:
            self.function_stack.append(factory)
            returned = [
                construction
                for node in _returned_values(factory)
                for construction in self.construct(node, depth + 1)
            ]
            self.function_stack.pop()
            if returned:
                return returned
        return [self.make(kind, value, positional, keywords)]

    # -- nn.Sequential elements ---------------------------------------------------------------
    def sequence(self, arguments: Iterable[ast.expr], depth: int = 0) -> _Elements:
        """The elements of ``nn.Sequential(*arguments)``: modules, starred lists, or one
        ``OrderedDict``."""
        arguments = list(arguments)
        elements = _Elements([], self.context)
        if (
            len(arguments) == 1
            and isinstance(arguments[0], ast.Call)
            and call_kind(arguments[0].func, self.ctx.imports) == "collections.OrderedDict"
        ):
            ordered = arguments[0]
            if ordered.args:
                self.add_iterable(elements, ordered.args[0], depth, pairs=True)
            return elements
        for argument in arguments:
            self.add_item(elements, argument, depth)
        return elements

    def add_item(self, elements: _Elements, item: ast.expr, depth: int = 0) -> None:
        if isinstance(item, ast.Starred):
            self.add_iterable(elements, item.value, depth)
        else:
            elements.items.append(self.element(item, depth))

    def add_iterable(
        self, elements: _Elements, node: ast.expr, depth: int = 0, pairs: bool = False
    ) -> None:
        """Append the modules an iterable expression yields (``pairs``: ``(name, module)``)."""
        if isinstance(node, (ast.List, ast.Tuple)):
            for item in node.elts:
                if pairs and not isinstance(item, ast.Starred):
                    if isinstance(item, ast.Tuple) and len(item.elts) == 2:
                        item = item.elts[1]
                    else:
                        elements.mark_unknown(f"line {item.lineno}: not a (name, module) pair")
                        elements.items.append(_opaque(item, self))
                        continue
                self.add_item(elements, item, depth)
        elif isinstance(node, ast.Dict) and pairs:
            for key, value in zip(node.keys, node.values):
                if key is None:  # ``**other``: unknown entries
                    elements.mark_unknown(f"line {value.lineno}: entries unpacked from a mapping")
                    elements.items.append(_opaque(value, self))
                else:
                    elements.items.append(self.element(value, depth))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            self.add_iterable(elements, node.left, depth, pairs)
            self.add_iterable(elements, node.right, depth, pairs)
        elif isinstance(node, ast.Name) and node.id in self.lists:
            listed = self.lists[node.id]
            if not listed.context <= self.context:
                elements.mark_unknown(f"line {node.lineno}: `{node.id}` is built under a condition")
            if listed.unknown:
                elements.mark_unknown(listed.unknown)
            elements.items.extend(listed.items)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "filter"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value is None
            and isinstance(node.args[1], (ast.List, ast.Tuple))
            and not pairs
        ):
            # ``filter(None, [conv, aa if aa_layer else None, norm, act])``: an element that is
            # ``None`` on some path is dropped; the elements are those of the path without the
            # optional ones, and their indexes are not static (the rewrite refuses them).
            elements.mark_unknown(f"line {node.lineno}: `filter(None, ...)` drops elements")
            for item in node.args[1].elts:
                if isinstance(item, ast.IfExp) and any(
                    isinstance(arm, ast.Constant) and arm.value is None
                    for arm in (item.body, item.orelse)
                ):
                    continue
                if isinstance(item, ast.Constant) and item.value is None:
                    continue
                self.add_item(elements, item, depth)
        elif isinstance(node, (ast.ListComp, ast.GeneratorExp)) and not pairs:
            # One element stands for all the comprehension builds (zero or more of them).
            elements.mark_unknown(f"line {node.lineno}: elements built by a comprehension")
            elements.items.append(self.element(node.elt, depth))
        else:
            text = ast.unparse(node)
            text = text if len(text) <= 40 else text[:37] + "..."
            elements.mark_unknown(f"line {node.lineno}: elements taken from `{text}`")
            elements.items.append(_opaque(node, self))

    def element(self, item: ast.expr, depth: int = 0) -> Construction:
        """The module at one position: opaque when it is not one known construction on every
        path through this position (``nn.ReLU() if act else nn.Identity()``)."""
        found = self.construct(item, depth)
        if len(found) == 1 and found[0].context <= self.context:
            return found[0]
        opaque = _opaque(item, self)
        if found:
            opaque.condition = "one of " + ", ".join(sorted({c.kind for c in found}))
        return opaque

    def grow(self, elements: _Elements, node: ast.AST, where: ast.AST, how: str = "+=") -> None:
        """``elements`` grown by ``+= node``, or by the call ``node`` (``append``,
        ``extend``, ``add_module``, ``insert``)."""
        line = getattr(where, "lineno", 0)
        if self.context != elements.context:
            elements.mark_unknown(f"line {line}: `{how}` inside a loop or under a condition")
        if how == "+=":
            assert isinstance(node, ast.expr)
            self.add_iterable(elements, node)
            return
        assert isinstance(node, ast.Call)
        if how == "extend":
            if node.args:
                self.add_iterable(elements, node.args[0])
            return
        if how == "insert":
            elements.mark_unknown(f"line {line}: an element inserted before others")
        if node.args:
            elements.items.append(self.element(node.args[-1]))

    def fills_self(self, call: ast.Call) -> bool:
        """Handle a call that fills an ``nn.Sequential`` subclass being analysed; False when
        the call is something else."""
        func = call.func
        own = self.own_elements
        assert own is not None
        if not isinstance(func, ast.Attribute):
            return False
        arguments: list[ast.expr] | None = None
        if func.attr == "__init__" and _is_super(func.value):
            arguments = list(call.args)
        elif (
            func.attr == "__init__"
            and call_kind(func.value, self.ctx.imports) == SEQUENTIAL
            and call.args
        ):
            arguments = list(call.args[1:])  # nn.Sequential.__init__(self, ...)
        if arguments is not None:
            if self.context != own.context:
                own.mark_unknown(f"line {call.lineno}: `__init__` called under a condition")
            filled = self.sequence(arguments)
            own.items[:0] = filled.items
            if filled.unknown:
                own.mark_unknown(filled.unknown)
            return True
        if isinstance(func.value, ast.Name) and func.value.id == "self":
            if func.attr in ("append", "extend", "add_module", "insert"):
                self.grow(own, call, call, func.attr)
                return True
        return False

    def sequential_subclass(self, kind: str) -> ast.FunctionDef | None:
        """The ``__init__`` of a local ``nn.Sequential`` subclass that keeps
        ``nn.Sequential.forward`` (one of its own would not call the elements in order)."""
        chain: list[ast.ClassDef] = []
        name: str | None = kind
        while name is not None and name in self.ctx.class_nodes and len(chain) < 8:
            node = self.ctx.class_nodes[name]
            if node in chain:
                return None
            chain.append(node)
            bases = [self.ctx.imports.resolve(base) for base in node.bases]
            local = [b for b in bases if b in self.ctx.class_nodes]
            if SEQUENTIAL in bases:
                name = None
            elif len(local) == 1 and len(bases) == 1:
                name = local[0]
            else:
                return None
        if not chain or name is not None:
            return None
        methods = [
            item for node in chain for item in node.body if isinstance(item, ast.FunctionDef)
        ]
        if any(m.name in ("forward", "__call__") for m in methods):
            return None
        # The nearest ``__init__``; its ``super().__init__`` must reach nn.Sequential itself.
        init = next((m for m in methods if m.name == "__init__"), None)
        if init is None or init not in chain[-1].body:
            return None
        return init

    def subclass_elements(self, kind: str, init: ast.FunctionDef) -> _Elements:
        """Run the subclass's ``__init__`` to see what it puts into itself."""
        node = self.ctx.class_nodes[kind]

        def method(name: str) -> ast.FunctionDef | None:
            return next(
                (i for i in node.body if isinstance(i, ast.FunctionDef) and i.name == name), None
            )

        context = replace(self.ctx, methods=method, passed_classes=None)
        analyzer = InitAnalyzer(context, {})
        analyzer.own_elements = _Elements([], EMPTY_CONTEXT)
        analyzer.run(init)
        return analyzer.own_elements

    def from_class(self, ref: ClassRef, call: ast.Call) -> Construction:
        """``act_layer(inplace=True)`` where ``act_layer`` holds ``ref``."""
        arguments = [*ref.positional, *call.args]
        positional = [Operand(node=a, constant=constant_value(a)) for a in arguments]
        keywords = {
            key: Operand(node=node, constant=constant_value(node))
            for key, node in [*ref.keywords, *((k.arg, k.value) for k in call.keywords)]
            if key is not None
        }
        outer = self.context
        self.context = outer | ref.context
        try:
            return self.make(ref.kind, call, positional, keywords)
        finally:
            self.context = outer

    # -- helpers in other files --------------------------------------------------------------
    def external_factory(self, call: ast.Call) -> Definition | None:
        """A function of another file of the package that ``call`` calls by its imported name."""
        project = self.ctx.project
        if project is None or not isinstance(call.func, ast.Name):
            return None
        name = call.func.id
        if (
            name in self.locals
            or self.known_classes(name) is not None
            or name in self.ctx.functions
        ):
            return None
        if self.ctx.module_path is None or name not in self.ctx.imports.origins:
            return None
        found = project.lookup(self.ctx.imports, self.ctx.module_path, name)
        if found is None or not isinstance(found.node, ast.FunctionDef):
            return None
        return found

    def summary(
        self, external: Definition, call: ast.Call, depth: int
    ) -> tuple[tuple[_Built, ...], tuple[ClassRef, ...]]:
        """What the factory builds and which layer classes it returns, for the layer classes
        this call passes it (analysed in the factory's own file, once per argument pattern)."""
        function = external.node
        assert isinstance(function, ast.FunctionDef)
        arguments = function.args
        params = [*arguments.posonlyargs, *arguments.args]
        passed: dict[str, list[ClassRef]] = {}
        for param, arg in zip(params, call.args):
            if refs := self.class_refs(arg, depth + 1):
                passed[param.arg] = refs
        for keyword in call.keywords:
            if keyword.arg is not None and (refs := self.class_refs(keyword.value, depth + 1)):
                passed[keyword.arg] = refs
        key = (
            str(external.module.path),
            function.name,
            tuple(sorted((name, tuple(r.kind for r in refs)) for name, refs in passed.items())),
        )
        if key in _SUMMARIES:
            return _SUMMARIES[key]
        _SUMMARIES[key] = ((), ())  # a factory that reaches itself builds nothing more
        context = InitContext(
            imports=external.module.imports,
            path=str(external.module.path),
            functions=external.module.functions,
            methods=lambda name: None,
            next_branch=self.ctx.next_branch,
            branch_labels=self.ctx.branch_labels,
            project=self.ctx.project,
            module_path=external.module.path,
        )
        inner = InitAnalyzer(context, {})
        inner.method_stack.append(function.name)
        inner.function_stack.append(function)
        inner.parameter_defaults(function)
        for name, refs in passed.items():
            inner.classes[name] = [ClassRef(r.kind, r.positional, r.keywords) for r in refs]
        inner.block(function.body)
        built: list[_Built] = []
        refs: list[ClassRef] = []
        for node in _returned_values(function):
            for construction in inner.construct(node, depth + 1):
                if construction.kind != "?":
                    built.append(_built(construction))
            refs += [ClassRef(r.kind, r.positional, r.keywords) for r in inner.class_refs(node)]
        result = (tuple(built), tuple(dict.fromkeys(refs)))
        _SUMMARIES[key] = result
        return result

    def evaluated(
        self, external: Definition, call: ast.Call, depth: int
    ) -> tuple[ClassRef, ...] | None:
        """The layer class the factory returns for this call's arguments, run statically
        (:mod:`adopter.extract.evaluate`); ``None`` when that is undecided. Each argument must
        be one layer class, a literal, or is unknown to the run."""
        function = external.node
        assert isinstance(function, ast.FunctionDef)
        if any(isinstance(a, ast.Starred) for a in call.args):
            return None
        values: list[object] = []
        for argument in [*call.args, *(k.value for k in call.keywords)]:
            refs = self.class_refs(argument, depth + 1)
            if len(refs) > 1:
                return None
            if refs:
                if not refs[0].context <= self.context:  # a class on some paths only
                    return None
                values.append(ClassRef(refs[0].kind, refs[0].positional, refs[0].keywords))
                continue
            constant = constant_value(argument)
            values.append(UNKNOWN if constant is NOT_CONSTANT else constant)
        if any(k.arg is None for k in call.keywords):
            return None
        names = [str(k.arg) for k in call.keywords]
        positional = values[: len(call.args)]
        keywords = dict(zip(names, values[len(call.args) :]))
        try:
            result = evaluate_factory(
                ClassRef, function, external.module, self.ctx.project, positional, keywords
            )
        except (Undecided, RecursionError):
            return None
        return (result,) if isinstance(result, ClassRef) else ()

    def fresh_alternatives(self, refs: tuple[ClassRef, ...], label: str) -> list[ClassRef]:
        """The factory's results as alternatives of one new branch point of this file."""
        if len(refs) <= 1:
            return [ClassRef(r.kind, r.positional, r.keywords, self.context) for r in refs]
        point = self.ctx.next_branch()
        self.ctx.branch_labels[point] = BranchPoint(f"result of {label}", None, len(refs))
        return [
            ClassRef(r.kind, r.positional, r.keywords, self.context | {(point, arm)})
            for arm, r in enumerate(refs)
        ]

    def from_factory(
        self, built: tuple[_Built, ...], call: ast.Call, name: str
    ) -> list[Construction]:
        """Constructions an external factory returns, located at the call in this file."""
        point = None
        if len(built) > 1:
            point = self.ctx.next_branch()
            self.ctx.branch_labels[point] = BranchPoint(f"result of {name}()", None, len(built))
        found = []
        for arm, item in enumerate(built):
            construction = self.make(item.kind, call, list(item.positional), {})
            construction.arguments = dict(item.arguments)
            construction.family = item.family
            construction.via = name
            construction.container = item.container
            construction.elements = [_relocated(e, construction) for e in item.elements]
            construction.elements_unknown = item.elements_unknown
            if point is not None:
                construction.context = construction.context | {(point, arm)}
            found.append(construction)
        return found

    def factory(self, call: ast.Call, kind: str) -> ast.FunctionDef | None:
        """A module-level function or own method that builds and returns a module."""
        if (name := self_attribute(call.func)) is not None:
            return self.ctx.methods(name)
        if isinstance(call.func, ast.Name):
            return self.ctx.functions.get(call.func.id)
        return None

    def make(
        self,
        kind: str,
        node: ast.expr,
        positional: list[Operand],
        keywords: dict[str, Operand],
    ) -> Construction:
        arguments = normalise_arguments(kind, positional, keywords)
        if (signature := package_signature(kind)) is not None:
            # a package class the factory evaluation returned: its own ``__init__`` defaults
            names, defaults = signature
            for name, operand in zip(names, positional):
                arguments.setdefault(name, operand)
            for name, default in defaults.items():
                arguments.setdefault(name, Operand(constant=default, label=repr(default)))
        return Construction(
            kind=kind,
            arguments=arguments,
            positional=positional,
            path=self.ctx.path,
            line=node.lineno,
            column=node.col_offset + 1,
            context=self.context,
            node=node,
            method=self.method_stack[-1] if self.method_stack else "__init__",
            function=self.function_stack[-1] if self.function_stack else None,
            family=construction_family(kind),
        )


def _built(construction: Construction) -> _Built:
    return _Built(
        kind=construction.kind,
        family=construction.family,
        arguments=tuple(construction.arguments.items()),
        positional=tuple(construction.positional),
        elements=tuple(construction.elements),
        container=construction.container,
        elements_unknown=construction.elements_unknown,
    )


def _relocated(element: Construction, owner: Construction) -> Construction:
    """An element of a container built in another file, located at the call in this one (its
    index in the container kept, the container now the one built here)."""
    relocated = Construction(
        kind=element.kind,
        arguments=element.arguments,
        positional=element.positional,
        path=owner.path,
        line=owner.line,
        column=owner.column,
        context=owner.context,
        node=owner.node,
        elements=[_relocated(e, owner) for e in element.elements],
        container=element.container,
        method=owner.method,
        function=owner.function,
        family=element.family,
        via=owner.via,
        position=element.position,
        elements_unknown=element.elements_unknown,
    )
    relocated.elements = [replace(e, owner=relocated) for e in relocated.elements]
    if element.owner is not None:
        relocated.owner = owner
    return relocated


def _opaque(node: ast.expr, analyzer: InitAnalyzer) -> Construction:
    return analyzer.make("?", node, [], {})


def _fill(container: Construction, elements: _Elements) -> None:
    """Give ``container`` its elements, each a copy that knows its index (when static)."""
    container.elements_unknown = elements.unknown
    container.elements = [
        replace(element, position=None if elements.unknown else index, owner=container)
        for index, element in enumerate(elements.items)
    ]


def _is_super(node: ast.expr) -> bool:
    """``super()`` or ``super(Cls, self)``."""
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def self_attribute(node: ast.expr) -> str | None:
    """``x`` for ``self.x``."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "self":
            return node.attr
    return None


def _list_items(node: ast.expr) -> Iterator[ast.expr]:
    if isinstance(node, (ast.List, ast.Tuple)):
        yield from node.elts
    elif isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        yield node.elt
    elif isinstance(node, ast.Dict):
        yield from (v for v in node.values if v is not None)
    elif isinstance(node, ast.DictComp):
        yield node.value
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        yield from itertools.chain(_list_items(node.left), _list_items(node.right))


def _returned_values(function: ast.FunctionDef) -> Iterator[ast.expr]:
    """Values of the ``return`` statements of a function, not of functions nested in it."""
    pending: list[ast.AST] = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Return):
            if node.value is not None:
                yield node.value
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            pending.extend(ast.iter_child_nodes(node))
