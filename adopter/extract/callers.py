"""Layer classes a constructor parameter receives from the file's own constructions.

timm and transformers pass layer classes down a model's constructors: ``RepVit(act_layer=
nn.GELU)`` builds ``RepVitStage(..., act_layer)``, which builds ``RepVitMlp(..., act_layer)``,
whose ``__init__`` does ``self.act = act_layer()`` with no default of its own. Read alone, that
``__init__`` cannot say what ``self.act`` is. Read with the file's constructions of the class,
it can: when every place in the file's classes that builds the class (their methods; calls in
module-level functions are not looked at) hands the parameter a layer class
(written out, or the constructing class's own parameter, followed the same way up to a default),
the parameter is one of those classes.

Classes built nowhere in the file, or by a call whose argument is anything else (a variable, a
call, ``**kwargs`` that may carry it), get nothing: the parameter stays unknown, as before. A
class built elsewhere with another layer only costs a site that the kernel, which checks its
modules when it runs, then runs unfused.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from .names import ImportTable, function_parameters

# Constructions followed upwards through constructor parameters, at most this many classes deep.
MAX_DEPTH = 8
_UNKNOWN = ast.Constant(value=None)  # an argument that may be anything


@dataclass(frozen=True)
class _Building:
    """One call that builds a local class, and the constructor it sits in (if any)."""

    call: ast.Call
    owner: str | None  # the class whose ``__init__`` makes the call


class CallerClasses:
    """Per local class, the constructor parameters its builders in this file fill with layer
    classes (computed on first use)."""

    def __init__(self, class_nodes: dict[str, ast.ClassDef], imports: ImportTable) -> None:
        self.class_nodes = class_nodes
        self.imports = imports
        self._buildings: dict[str, list[_Building]] | None = None
        self._cache: dict[tuple[str, str], tuple[str, ...] | None] = {}

    def parameters(self, name: str) -> dict[str, tuple[str, ...]]:
        """``{parameter: layer classes}`` for the ``__init__`` parameters of class ``name`` that
        have no default and that every construction of the class in this file fills with a
        layer class."""
        init = _init_of(self.class_nodes.get(name))
        if init is None:
            return {}
        found = {}
        for parameter, default in _parameters(init):
            if default is not None:
                continue  # the default already says (InitAnalyzer.parameter_defaults)
            kinds = self._classes(name, parameter, 0)
            if kinds:
                found[parameter] = kinds
        return found

    # -- the search ------------------------------------------------------------------------------
    def _classes(self, name: str, parameter: str, depth: int) -> tuple[str, ...] | None:
        """The layer classes ``parameter`` of ``name.__init__`` receives; None when unknown."""
        key = (name, parameter)
        if key in self._cache:
            return self._cache[key]
        self._cache[key] = None  # a cycle of constructions says nothing
        result = self._search(name, parameter, depth)
        self._cache[key] = result
        return result

    def _search(self, name: str, parameter: str, depth: int) -> tuple[str, ...] | None:
        init = _init_of(self.class_nodes.get(name))
        buildings = self.buildings().get(name, [])
        if init is None or not buildings or depth > MAX_DEPTH:
            return None
        index, default = _position(init, parameter)
        kinds: dict[str, None] = {}
        for building in buildings:
            argument = _argument(building.call, parameter, index)
            if argument is None:
                argument = default
            if argument is None:
                return None
            found = self._value(argument, building.owner, depth)
            if not found:
                return None
            kinds.update(dict.fromkeys(found))
        return tuple(kinds)

    def _value(self, node: ast.expr, owner: str | None, depth: int) -> tuple[str, ...] | None:
        """The layer classes an argument names: a class written out, or a parameter of the
        constructor making the call (its default, or what that class's builders pass)."""
        if isinstance(node, ast.Name) and owner is not None:
            init = _init_of(self.class_nodes.get(owner))
            parameters = dict(_parameters(init)) if init is not None else {}
            if node.id in parameters:
                default = parameters[node.id]
                if default is not None:
                    return self._value(default, None, depth)
                return self._classes(owner, node.id, depth + 1)
        kind = self.imports.resolve(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if kind is not None and kind.rsplit(".", 1)[-1][:1].isupper():
            return (kind,)
        return None

    def buildings(self) -> dict[str, list[_Building]]:
        """Every call in the file that names a local class, by class."""
        if self._buildings is None:
            self._buildings = {}
            for owner, node in _functions(self.class_nodes):
                for call in ast.walk(node):
                    if (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Name)
                        and call.func.id in self.class_nodes
                    ):
                        self._buildings.setdefault(call.func.id, []).append(_Building(call, owner))
        return self._buildings


def _functions(class_nodes: dict[str, ast.ClassDef]) -> Iterator[tuple[str | None, ast.AST]]:
    """Each class's methods, with the class when the method is its ``__init__`` (the only
    constructor whose parameters are followed)."""
    for name, node in class_nodes.items():
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield (name if item.name == "__init__" else None), item


def _init_of(node: ast.ClassDef | None) -> ast.FunctionDef | None:
    if node is None:
        return None
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            return item
    return None


def _parameters(init: ast.FunctionDef) -> list[tuple[str, ast.expr | None]]:
    """``(name, default)`` of each parameter after ``self``."""
    return function_parameters(init)[1:]


def _position(init: ast.FunctionDef, parameter: str) -> tuple[int | None, ast.expr | None]:
    """The parameter's index among the positional ones (None: keyword-only) and its default."""
    positional = [p.arg for p in [*init.args.posonlyargs, *init.args.args][1:]]
    default = dict(_parameters(init)).get(parameter)
    return (positional.index(parameter) if parameter in positional else None), default


def _argument(call: ast.Call, parameter: str, index: int | None) -> ast.expr | None:
    """What the call passes for the parameter: its keyword, or its position when no starred
    argument comes first. ``**kwargs`` may carry any parameter: then nothing is known, and the
    argument it is ``_UNKNOWN``, a value no layer class resolves to."""
    for keyword in call.keywords:
        if keyword.arg == parameter:
            return keyword.value
    if index is not None:
        for position, argument in enumerate(call.args):
            if isinstance(argument, ast.Starred):
                return _UNKNOWN
            if position == index:
                return argument
    if any(keyword.arg is None for keyword in call.keywords):
        return _UNKNOWN
    return None
