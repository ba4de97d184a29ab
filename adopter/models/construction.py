"""Constructor keywords that make a site's ``self.<x> is None`` guard lead to it.

A site behind ``if self.qkv is not None:`` ... ``else: <site>`` runs only in a module built
without ``self.qkv``, and which modules have it was decided in ``__init__`` by one of its
parameters (timm's ``if qkv_fused: self.qkv = nn.Linear(...) else: self.qkv = None``; FasterNet's
``if layer_scale_init_value > 0: self.layer_scale = ...``). No attribute set after the build can
stand for that, so the model is built again with the parameter given (``qkv_fused=False``),
where the library passes it on (timm's ``create_model`` hands its keywords to the model class,
which hands most of them to its blocks). Read statically from the file's text: the ``__init__``
of the site's class, an ``if`` on the parameter alone (``if p:``, ``if not p:``) or compared
with a number (``if p > 0:``), and ``self.<x> = None`` in one arm and another value in the
other; or the parameter stored as it is (``self.gamma = gamma``), given a value of its
annotated type, or for a site behind ``self.dims == 2`` the constant it is compared with.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import Any

from .sites import PatchedSite

__all__ = ["construction_flips"]

_NONE_GUARD = re.compile(r"^(not \()?self\.(\w+) is (not )?None\)?$")


def construction_flips(sites: Iterable[PatchedSite], text: str) -> dict[str, Any]:
    """``parameter -> value`` of the ``__init__`` of ``sites``' classes in ``text`` (the file)
    that builds each guarded attribute the way its site needs: ``None`` for a site behind
    ``not (self.x is not None)``, a value for one behind ``self.x is not None``."""
    wanted: dict[tuple[str, str], bool] = {}  # (class, attribute) -> the site needs it None
    for site in sites:
        for guard in site.guards if site.cls else ():
            match = _NONE_GUARD.match(guard.strip())
            if match:
                negated, is_not = match.group(1) is not None, match.group(3) is not None
                key = (site.cls, match.group(2))
                # Sites in both arms: the one that needs a value, as most such attributes are
                # None by default, and the first build ran that arm already.
                wanted[key] = wanted.get(key, True) and is_not == negated  # type: ignore[index]
    equal = _equality_guards(sites)
    if not wanted and not equal:
        return {}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    inits = {
        node.name: item
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name == "__init__"
    }
    flips: dict[str, Any] = {}
    for (cls, attribute), needs_none in wanted.items():
        if cls in inits:
            flips.update(_choosing(inits[cls], attribute, needs_none))
    for (cls, attribute), value in equal.items():
        stored = _stored_parameter(inits[cls], attribute) if cls in inits else None
        if stored is not None:
            flips[stored[0]] = value
    return flips


def _equality_guards(sites: Iterable[PatchedSite]) -> dict[tuple[str, str], Any]:
    """``(class, attribute) -> constant`` for each site behind ``self.<attribute> == constant``
    (LTX's upsampler: ``if self.dims == 2:``, its ``dims`` given to the constructor)."""
    equal: dict[tuple[str, str], Any] = {}
    for site in sites:
        for guard in site.guards if site.cls else ():
            try:
                test = ast.parse(guard.strip(), mode="eval").body
            except SyntaxError:
                continue
            if (
                isinstance(test, ast.Compare)
                and len(test.ops) == 1
                and isinstance(test.ops[0], ast.Eq)
                and isinstance(test.left, ast.Attribute)
                and isinstance(test.left.value, ast.Name)
                and test.left.value.id == "self"
                and isinstance(test.comparators[0], ast.Constant)
            ):
                equal.setdefault((site.cls, test.left.attr), test.comparators[0].value)  # type: ignore[index]
    return equal


def _choosing(init: ast.FunctionDef, attribute: str, needs_none: bool) -> dict[str, Any]:
    parameters = {a.arg for a in [*init.args.args, *init.args.kwonlyargs]}
    for node in ast.walk(init):
        if not isinstance(node, ast.If):
            continue
        arms = _arm_values(node.test, parameters)
        if arms is None:
            continue
        name, then_value, else_value = arms
        for body, value in ((node.body, then_value), (node.orelse, else_value)):
            assigned = _assigns_none(body, attribute)
            if assigned is not None and assigned == needs_none:
                return {name: value}
    return _passed_through(init, attribute, needs_none)


# A value of each annotated type for a parameter stored as it is (``self.gamma = gamma``,
# ``gamma: Optional[float] = None``): any value that is not None takes the site's arm.
_VALUE_OF_TYPE = (("bool", True), ("float", 2.0), ("int", 2))


def _passed_through(init: ast.FunctionDef, attribute: str, needs_none: bool) -> dict[str, Any]:
    """``{parameter: value}`` where ``__init__`` stores a parameter as ``self.<attribute>``
    unchanged (SimPool's ``self.gamma = gamma``): ``None`` where the site needs it so, else a
    value of the parameter's annotated type; ``{}`` where neither applies."""
    stored = _stored_parameter(init, attribute)
    if stored is None:
        return {}
    name, annotation = stored
    if needs_none:
        return {name: None}
    for type_name, value in _VALUE_OF_TYPE:
        if re.search(rf"\b{type_name}\b", annotation):
            return {name: value}
    return {}


def _stored_parameter(init: ast.FunctionDef, attribute: str) -> tuple[str, str] | None:
    """The ``__init__`` parameter stored unchanged as ``self.<attribute>`` (``self.gamma =
    gamma``) with its annotation's text (``""``: none), or ``None``."""
    annotations = {a.arg: a.annotation for a in [*init.args.args, *init.args.kwonlyargs]}
    for statement in init.body:
        if not (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Name)):
            continue
        name = statement.value.id
        if _stores_to(statement, attribute) and name in annotations:
            annotation = annotations[name]
            return name, ast.unparse(annotation) if annotation is not None else ""
    return None


def _arm_values(test: ast.expr, parameters: set[str]) -> tuple[str, Any, Any] | None:
    """``(parameter, value taking the if arm, value taking the else arm)`` for a test on one
    ``__init__`` parameter, or ``None``."""
    if isinstance(test, ast.Name) and test.id in parameters:
        return test.id, True, False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _arm_values(test.operand, parameters)
        return None if inner is None or inner[1] is not True else (inner[0], False, True)
    if (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id in parameters
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Gt)
        and isinstance(test.comparators[0], ast.Constant)
        and type(test.comparators[0].value) in (int, float)
    ):
        bound = test.comparators[0].value
        return test.left.id, bound + 1, bound
    return None


def _assigns_none(body: list[ast.stmt], attribute: str) -> bool | None:
    """Whether the statements of ``body`` (not nested ones) set ``self.<attribute>`` to
    ``None`` (``True``) or to something else (``False``); ``None`` when they do not set it."""
    for statement in body:
        if isinstance(statement, ast.Assign) and _stores_to(statement, attribute):
            value = statement.value
            return isinstance(value, ast.Constant) and value.value is None
    return None


def _stores_to(statement: ast.Assign, attribute: str) -> bool:
    """Whether ``statement`` assigns ``self.<attribute>`` (among its targets)."""
    return any(
        isinstance(target, ast.Attribute)
        and target.attr == attribute
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
        for target in statement.targets
    )
