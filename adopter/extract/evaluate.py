"""Running a layer *factory* on the classes it is passed, statically.

timm picks its layer classes through small functions of another file: ``get_act_layer(nn.ReLU)``
returns its argument when it is not a string, ``get_norm_act_layer(nn.BatchNorm2d, act_layer)``
maps the class by its lower-cased ``__name__`` through a module-level ``dict(...)`` to
``BatchNormAct2d`` (and wraps it in a ``functools.partial``). Read flow-insensitively, such a
function "returns" every class any of its arms ever held - the ``BatchNorm2d`` it was given
included - so the caller's ``self.bn1 = norm_act_layer(...)`` looked like a plain batch norm.

This evaluator executes the factory's body on the values of the call: layer classes (a
``ClassRef``), literals and ``None``. It follows only code whose every step it can decide:
assignments, ``if`` tests (``isinstance`` against ``type``/``str``/``functools.partial``/
``types.FunctionType``, ``is None``, ``in`` a module-level set or dict, truthiness), string
methods, ``dict.get`` / subscripts of module-level mappings, set comprehensions over their
``items()``, ``functools.partial`` and ``return``. Anything else - a call to another function
whose result decides a branch, a loop, a value it cannot name - makes the whole evaluation
undecided, and the caller keeps its flow-insensitive reading. Nothing is imported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .names import ImportTable

if TYPE_CHECKING:
    from .constructions import ClassRef
    from .project import ModuleSource, Project

# Parameter names (after ``self``) and literal defaults of the ``__init__`` of package classes
# the evaluator returned, by kind: a construction of one knows the arguments it omits.
PACKAGE_SIGNATURES: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {}

MAX_STEPS = 400  # statements and expressions one evaluation may take
MAX_CALL_DEPTH = 2  # nested factory calls (``create_norm_act_layer`` -> ``get_norm_act_layer``)


class Undecided(Exception):
    """The evaluation reached something it cannot decide."""


class _Unknown:
    """A value the caller passes that is neither a class nor a literal: any use is undecided."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


class _Returned(Exception):
    def __init__(self, value: object) -> None:
        self.value = value


@dataclass(frozen=True)
class TypeName:
    """A type used as the second argument of ``isinstance`` (``str``, ``functools.partial``)."""

    name: str


@dataclass
class DictValue:
    """A dict whose keys are literals; values are evaluated values or ``ast`` nodes (keywords a
    caller bound with ``functools.partial``)."""

    items: dict[object, object] = field(default_factory=dict)


_BUILTIN_TYPES = {"type", "str", "int", "float", "bool", "dict", "list", "tuple"}
_TYPE_ALIASES = {
    "functools.partial": "functools.partial",
    "partial": "functools.partial",
    "types.FunctionType": "types.FunctionType",
    "types.LambdaType": "types.FunctionType",
}
_STR_METHODS = {"lower", "upper", "replace", "split", "strip", "startswith", "endswith"}


@dataclass
class _Scope:
    module: ModuleSource
    project: Project | None
    depth: int = 0
    cache: dict[str, object] = field(default_factory=dict)  # module-level values evaluated


class Evaluator:
    """Evaluates one factory call; ``run`` returns the value or raises :class:`Undecided`."""

    def __init__(self, class_ref: type[ClassRef]) -> None:
        self.class_ref = class_ref
        self.steps = 0

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise Undecided("too long")

    # -- functions -----------------------------------------------------------------------------
    def call(
        self,
        function: ast.FunctionDef,
        scope: _Scope,
        positional: list[object],
        keywords: dict[str, object],
    ) -> object:
        arguments = function.args
        if arguments.vararg is not None or arguments.posonlyargs:
            raise Undecided("variadic")
        params = arguments.args
        if len(positional) > len(params):
            raise Undecided("too many arguments")
        env: dict[str, object] = {}
        first_default = len(params) - len(arguments.defaults)
        for index, param in enumerate(params):
            if index < len(positional):
                env[param.arg] = positional[index]
            elif param.arg in keywords:
                env[param.arg] = keywords.pop(param.arg)
            elif index >= first_default:
                env[param.arg] = self.expr(arguments.defaults[index - first_default], scope, {})
            else:
                raise Undecided(f"missing argument {param.arg}")
        for param, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
            if param.arg in keywords:
                env[param.arg] = keywords.pop(param.arg)
            elif default is not None:
                env[param.arg] = self.expr(default, scope, {})
            else:
                raise Undecided(f"missing argument {param.arg}")
        if arguments.kwarg is not None:
            env[arguments.kwarg.arg] = DictValue(dict(keywords))
        elif keywords:
            raise Undecided("unknown keyword")
        try:
            self.block(function.body, scope, env)
        except _Returned as returned:
            return returned.value
        return None

    def block(self, statements: list[ast.stmt], scope: _Scope, env: dict[str, object]) -> None:
        for statement in statements:
            self.statement(statement, scope, env)

    def statement(self, node: ast.stmt, scope: _Scope, env: dict[str, object]) -> None:
        self.tick()
        if isinstance(node, ast.Return):
            raise _Returned(None if node.value is None else self.expr(node.value, scope, env))
        if isinstance(node, ast.Assign):
            value = self.expr(node.value, scope, env)
            for target in node.targets:
                self.store(target, value, scope, env)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self.store(node.target, self.expr(node.value, scope, env), scope, env)
        elif isinstance(node, ast.If):
            arm = node.body if truth(self.expr(node.test, scope, env)) else node.orelse
            self.block(arm, scope, env)
        elif isinstance(node, ast.Expr):
            if isinstance(node.value, ast.Constant):  # a docstring
                return
            if not isinstance(node.value, ast.Call):
                raise Undecided("expression statement")
            self.mutation(node.value, scope, env)
        elif isinstance(node, (ast.Assert, ast.Pass)):
            return
        else:
            raise Undecided(type(node).__name__)

    def store(self, target: ast.expr, value: object, scope: _Scope, env: dict[str, object]) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
            return
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            holder = env.get(target.value.id)
            if isinstance(holder, DictValue):
                holder.items[self.key(self.expr(target.slice, scope, env))] = value
                return
        raise Undecided("assignment target")

    def mutation(self, call: ast.Call, scope: _Scope, env: dict[str, object]) -> None:
        """``kwargs.update(...)`` / ``kwargs.setdefault(...)`` on a local dict."""
        func = call.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            raise Undecided("call statement")
        holder = env.get(func.value.id)
        if not isinstance(holder, DictValue) or call.keywords:
            raise Undecided("call statement")
        values = [self.expr(a, scope, env) for a in call.args]
        if func.attr == "update" and len(values) == 1 and isinstance(values[0], DictValue):
            holder.items.update(values[0].items)
        elif func.attr == "setdefault" and len(values) == 2:
            holder.items.setdefault(self.key(values[0]), values[1])
        else:
            raise Undecided("call statement")

    # -- expressions ---------------------------------------------------------------------------
    def expr(self, node: ast.expr, scope: _Scope, env: dict[str, object]) -> object:
        self.tick()
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            return self.global_name(node, scope)
        if isinstance(node, ast.Attribute):
            return self.attribute(node, scope, env)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not truth(self.expr(node.operand, scope, env))
        if isinstance(node, ast.BoolOp):
            result: object = None
            for sub in node.values:
                result = self.expr(sub, scope, env)
                if truth(result) == isinstance(node.op, ast.Or):
                    return result
            return result
        if isinstance(node, ast.IfExp):
            chosen = node.body if truth(self.expr(node.test, scope, env)) else node.orelse
            return self.expr(chosen, scope, env)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left = self.expr(node.left, scope, env)
            right = self.expr(node.comparators[0], scope, env)
            return compare(node.ops[0], left, right)
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self.expr(e, scope, env) for e in node.elts)
        if isinstance(node, ast.Set):
            return frozenset(self.key(self.expr(e, scope, env)) for e in node.elts)
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise Undecided("dict unpacking")
            return DictValue(
                {
                    self.key(self.expr(k, scope, env)): self.expr(v, scope, env)
                    for k, v in zip(node.keys, node.values)
                    if k is not None
                }
            )
        if isinstance(node, ast.SetComp):
            return self.set_comprehension(node, scope, env)
        if isinstance(node, ast.Subscript):
            base = self.expr(node.value, scope, env)
            index = self.expr(node.slice, scope, env)
            return subscript(base, index)
        if isinstance(node, ast.Call):
            return self.call_expr(node, scope, env)
        raise Undecided(type(node).__name__)

    def key(self, value: object) -> object:
        if value is UNKNOWN:
            raise Undecided("unknown key")
        try:
            hash(value)
        except TypeError as error:
            raise Undecided("unhashable") from error
        return value

    def global_name(self, node: ast.Name, scope: _Scope) -> object:
        name = node.id
        if name == "None":
            return None
        if name in scope.cache:
            return scope.cache[name]
        module = scope.module
        if name in module.values:
            scope.cache[name] = self.expr(module.values[name], scope, {})
            return scope.cache[name]
        if name in module.functions:
            raise Undecided(f"function {name}")
        if name in _BUILTIN_TYPES and name not in module.imports.aliases:
            return TypeName(name)
        if scope.project is not None and scope.project.root is not None:
            found = scope.project.lookup_in(module, name)
            if found is not None and isinstance(found.node, ast.ClassDef):
                return self.package_class(found.module.path, scope.project.root, found.node)
        return self.named_class(node, module.imports)

    def package_class(self, path: Path, root: Path, node: ast.ClassDef) -> object:
        """A class defined in the package, named by its file's dotted path (the same name from
        every file that imports it), its ``__init__`` signature noted for the constructions."""
        try:
            parts = list(path.with_suffix("").relative_to(root).parts)
        except ValueError:
            parts = [path.stem]
        if parts and parts[-1] == "__init__":
            parts.pop()
        kind = ".".join([*parts, node.name])
        init = next(
            (i for i in node.body if isinstance(i, ast.FunctionDef) and i.name == "__init__"), None
        )
        if init is not None:
            PACKAGE_SIGNATURES.setdefault(kind, _signature(init))
        return self.class_ref(kind)

    def named_class(self, node: ast.expr, imports: ImportTable) -> object:
        kind = imports.resolve(node)
        if kind is None:
            raise Undecided("unresolved name")
        if kind in _TYPE_ALIASES:
            return TypeName(_TYPE_ALIASES[kind])
        if kind.rsplit(".", 1)[-1][:1].isupper():
            return self.class_ref(kind)
        raise Undecided(f"name {kind}")

    def attribute(self, node: ast.Attribute, scope: _Scope, env: dict[str, object]) -> object:
        head: ast.expr = node
        while isinstance(head, ast.Attribute):
            head = head.value
        if isinstance(head, ast.Name) and head.id not in env and head.id not in scope.module.values:
            return self.named_class(node, scope.module.imports)  # ``nn.BatchNorm2d``
        base = self.expr(node.value, scope, env)
        if isinstance(base, self.class_ref):
            if node.attr == "__name__" and not is_partial(base):
                return base.kind.rsplit(".", 1)[-1]
            if node.attr == "func" and is_partial(base):
                return self.class_ref(base.kind)
            if node.attr == "keywords" and is_partial(base) and not base.positional:
                return DictValue(dict(base.keywords))
        raise Undecided(f"attribute {node.attr}")

    def set_comprehension(self, node: ast.SetComp, scope: _Scope, env: dict[str, object]) -> object:
        if len(node.generators) != 1 or node.generators[0].ifs:
            raise Undecided("comprehension")
        generator = node.generators[0]
        source = generator.iter
        if not (
            isinstance(source, ast.Call)
            and isinstance(source.func, ast.Attribute)
            and source.func.attr in ("items", "values", "keys")
            and not source.args
        ):
            raise Undecided("comprehension")
        mapping = self.expr(source.func.value, scope, env)
        if not isinstance(mapping, DictValue):
            raise Undecided("comprehension")
        found = set()
        for key, value in mapping.items.items():
            item = {"items": (key, value), "values": value, "keys": key}[source.func.attr]
            inner = dict(env)
            self.bind(generator.target, item, inner)
            found.add(self.key(self.expr(node.elt, scope, inner)))
        return frozenset(found)

    def bind(self, target: ast.expr, value: object, env: dict[str, object]) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, ast.Tuple) and isinstance(value, tuple):
            if len(target.elts) != len(value):
                raise Undecided("unpacking")
            for sub, item in zip(target.elts, value):
                self.bind(sub, item, env)
        else:
            raise Undecided("target")

    def call_expr(self, node: ast.Call, scope: _Scope, env: dict[str, object]) -> object:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "isinstance" and len(node.args) == 2:
            value = self.expr(node.args[0], scope, env)
            types = self.expr(node.args[1], scope, env)
            return is_instance(value, types if isinstance(types, tuple) else (types,))
        if isinstance(func, ast.Name) and func.id == "dict" and not node.args:
            return DictValue(self.keyword_values(node, scope, env))
        kind = scope.module.imports.resolve(func) if isinstance(func, ast.Name) else None
        if kind in ("functools.partial", "partial") or (
            isinstance(func, ast.Attribute)
            and scope.module.imports.resolve(func) == "functools.partial"
        ):
            return self.partial(node, scope, env)
        if isinstance(func, ast.Attribute):
            base = self.expr(func.value, scope, env)
            if isinstance(base, str) and func.attr in _STR_METHODS and not node.keywords:
                arguments = [self.expr(a, scope, env) for a in node.args]
                if not all(isinstance(a, str) for a in arguments):
                    raise Undecided("string method")
                result = getattr(base, func.attr)(*arguments)
                return tuple(result) if isinstance(result, list) else result
            if isinstance(base, DictValue) and func.attr == "get" and not node.keywords:
                arguments = [self.expr(a, scope, env) for a in node.args]
                if len(arguments) not in (1, 2):
                    raise Undecided("dict.get")
                default = arguments[1] if len(arguments) == 2 else None
                return base.items.get(self.key(arguments[0]), default)
        if isinstance(func, ast.Name) and scope.depth < MAX_CALL_DEPTH:
            return self.nested_call(node, func.id, scope, env)
        raise Undecided("call")

    def keyword_values(self, node: ast.Call, scope: _Scope, env: dict[str, object]) -> dict:
        values: dict[object, object] = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                extra = self.expr(keyword.value, scope, env)
                if not isinstance(extra, DictValue):
                    raise Undecided("** of an unknown mapping")
                values.update(extra.items)
            else:
                values[keyword.arg] = self.expr(keyword.value, scope, env)
        return values

    def partial(self, node: ast.Call, scope: _Scope, env: dict[str, object]) -> object:
        if not node.args or any(isinstance(a, ast.Starred) for a in node.args):
            raise Undecided("partial")
        target = self.expr(node.args[0], scope, env)
        if not isinstance(target, self.class_ref):
            raise Undecided("partial of a non-class")
        if len(node.args) > 1:
            raise Undecided("partial with positional arguments")
        bound = dict(target.keywords)
        for key, value in self.keyword_values(node, scope, env).items():
            # Keep what the rule may check: literals and keywords the caller bound (ast nodes);
            # a class bound as a keyword (``act_layer``) is not an argument a rule reads.
            if isinstance(value, ast.expr):
                bound[key] = value
            elif value is None or isinstance(value, (bool, int, float, str)):
                bound[key] = ast.Constant(value)
        return self.class_ref(target.kind, target.positional, tuple(bound.items()))

    def nested_call(
        self, node: ast.Call, name: str, scope: _Scope, env: dict[str, object]
    ) -> object:
        """A call to a function of the same file or another file of the package."""
        module = scope.module
        project = scope.project
        function: ast.AST | None = module.functions.get(name)
        target_module = module
        if function is None and project is not None:
            found = project.lookup_in(module, name)
            if found is not None:
                function, target_module = found.node, found.module
        if not isinstance(function, ast.FunctionDef):
            raise Undecided(f"call of {name}")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise Undecided("starred call")
        positional = [self.expr(a, scope, env) for a in node.args]
        keywords = self.keyword_values(node, scope, env)
        inner = _Scope(target_module, project, scope.depth + 1)
        return self.call(function, inner, positional, {str(k): v for k, v in keywords.items()})


def is_partial(ref: object) -> bool:
    return bool(getattr(ref, "positional", ()) or getattr(ref, "keywords", ()))


def truth(value: object) -> bool:
    if value is UNKNOWN:
        raise Undecided("unknown value")
    if isinstance(value, (bool, int, float, str, tuple, frozenset)) or value is None:
        return bool(value)
    if isinstance(value, DictValue):
        return bool(value.items)
    if isinstance(value, TypeName) or hasattr(value, "kind"):
        return True  # a class or a partial of one
    raise Undecided("truth value")


def _same_class(a: object, b: object) -> bool:
    """Two class values name the same class (kinds are resolved per file, so a class imported
    relatively in one file and absolutely in another is compared by its name)."""
    kind_a, kind_b = getattr(a, "kind", None), getattr(b, "kind", None)
    if kind_a is None or kind_b is None:
        return a == b
    if is_partial(a) or is_partial(b):
        return a == b
    return kind_a == kind_b or kind_a.rsplit(".", 1)[-1] == kind_b.rsplit(".", 1)[-1]


def compare(op: ast.cmpop, left: object, right: object) -> bool:
    if left is UNKNOWN or right is UNKNOWN:
        raise Undecided("unknown value")
    if isinstance(op, (ast.Is, ast.IsNot)):
        if left is not None and right is not None:
            if not (isinstance(left, (bool, int)) or isinstance(right, (bool, int))):
                raise Undecided("identity")
        same = left is right if (left is None or right is None) else left == right
        return same if isinstance(op, ast.Is) else not same
    if isinstance(op, (ast.In, ast.NotIn)):
        if isinstance(right, DictValue):
            members: object = list(right.items)
        elif isinstance(right, (frozenset, tuple)):
            members = list(right)
        elif isinstance(right, str) and isinstance(left, str):
            found = left in right
            return found if isinstance(op, ast.In) else not found
        else:
            raise Undecided("membership")
        assert isinstance(members, list)
        found = any(_same_class(left, m) for m in members)
        return found if isinstance(op, ast.In) else not found
    if isinstance(op, (ast.Eq, ast.NotEq)):
        if all(isinstance(v, (bool, int, float, str)) or v is None for v in (left, right)):
            same = left == right
            return same if isinstance(op, ast.Eq) else not same
    raise Undecided("comparison")


def is_instance(value: object, types: tuple) -> bool:
    if value is UNKNOWN:
        raise Undecided("unknown value")
    names = set()
    for entry in types:
        if not isinstance(entry, TypeName):
            raise Undecided("isinstance of an unknown type")
        names.add(entry.name)
    if value is None:
        return False
    if isinstance(value, bool):
        return bool(names & {"bool", "int"})
    if isinstance(value, str):
        return "str" in names
    if isinstance(value, int):
        return "int" in names
    if isinstance(value, float):
        return "float" in names
    if isinstance(value, DictValue):
        return "dict" in names
    if hasattr(value, "kind"):  # a class, or a functools.partial of one
        return ("functools.partial" if is_partial(value) else "type") in names
    raise Undecided("isinstance")


def subscript(base: object, index: object) -> object:
    if isinstance(base, DictValue):
        try:
            return base.items[index]
        except (KeyError, TypeError) as error:
            raise Undecided("missing key") from error
    if isinstance(base, (tuple, str)) and isinstance(index, int):
        try:
            return base[index]
        except IndexError as error:
            raise Undecided("index") from error
    raise Undecided("subscript")


def evaluate_factory(
    class_ref: type[ClassRef],
    function: ast.FunctionDef,
    module: ModuleSource,
    project: Project | None,
    positional: list[object],
    keywords: dict[str, object],
) -> object:
    """What ``function(*positional, **keywords)`` returns; raises :class:`Undecided`."""
    evaluator = Evaluator(class_ref)
    return evaluator.call(function, _Scope(module, project), list(positional), dict(keywords))


def _signature(init: ast.FunctionDef) -> tuple[tuple[str, ...], dict[str, object]]:
    arguments = init.args
    params = [*arguments.posonlyargs, *arguments.args][1:]
    defaults: dict[str, object] = {}
    first_default = len(params) - len(arguments.defaults)
    pairs = [
        (p, arguments.defaults[i - first_default])
        for i, p in enumerate(params)
        if i >= first_default
    ]
    pairs += [(p, d) for p, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d]
    for param, default in pairs:
        if isinstance(default, ast.Constant) and isinstance(default.value, (bool, int, float)):
            defaults[param.arg] = default.value
    return tuple(p.arg for p in params), defaults


def package_signature(kind: str) -> tuple[tuple[str, ...], dict[str, object]] | None:
    """The noted ``__init__`` signature of a package class (see :data:`PACKAGE_SIGNATURES`)."""
    return PACKAGE_SIGNATURES.get(kind)
