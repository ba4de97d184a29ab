"""How model code reads its configuration, read statically from its text: which ``config``
fields a condition tests (``if config.use_cache``, ``self.x`` set from ``config.y`` in
``__init__``, a local set from ``config.y``), and with which constants.

verify's site finder (:mod:`adopter.models.sites`) notes these reads as the guards of a patched
site; the transformers adapter sets them when a site has not run. Only the ``config.<field>``
convention is assumed, nothing of one library.
"""

from __future__ import annotations

import ast
from typing import Any

from ..extract.names import attribute_chain
from .interface import PER_ELEMENT

__all__ = ["config_reads", "locals_from_config", "self_attributes_from_config"]


def _config_field(
    node: ast.expr, from_init: dict[str, set[str]], local: dict[str, set[str]] | None = None
) -> list[str]:
    """The configuration fields an expression reads: ``config.x``, ``self.config.x``, a
    ``self.x`` that ``__init__`` set from ``config.y`` (and, as a guess, ``x`` itself), or a
    local variable the function set from ``config.y``."""
    chain = attribute_chain(node)
    if chain is None:
        return []
    if len(chain) >= 2 and chain[-2] == "config":
        return [chain[-1]]
    if len(chain) == 2 and chain[0] == "self":
        return sorted(from_init.get(chain[1], set()) | {chain[1]})
    if len(chain) == 1 and local:
        return sorted(local.get(chain[0], set()))
    return []


def _compared_constants(node: ast.Compare) -> list[Any]:
    """The constants a comparison compares with; for an integer threshold or count also its
    neighbours: the branch taken by ``x > 1``, or by the other arm of ``x == 1``, needs a
    neighbour of the constant, not the constant itself."""
    constants = [
        value
        for operand in (node.left, *node.comparators)
        for value in _constants(operand)
        if isinstance(value, (str, int, bool)) or value is None
    ]
    numbers = [c for c in constants if isinstance(c, int) and not isinstance(c, bool)]
    if numbers and not all(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
        neighbours = [n + 1 for n in numbers]
        if any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops):
            neighbours += [n - 1 for n in numbers if n > 0]
        constants += [n for n in neighbours if n not in constants]
    return constants


def config_reads(
    test: ast.expr, from_init: dict[str, set[str]], local: dict[str, set[str]] | None = None
) -> dict[str, list[Any]]:
    """Fields read by a condition, with the constants each is compared with (``x[]``: an
    element of list field ``x``, :data:`~adopter.models.interface.PER_ELEMENT`)."""
    found: dict[str, list[Any]] = {}
    # ``self.config`` inside ``self.config.x`` is not a field read of its own
    inner = {id(n.value) for n in ast.walk(test) if isinstance(n, ast.Attribute)}
    for node in ast.walk(test):
        if id(node) in inner:
            continue
        if isinstance(node, ast.Compare):
            constants = _compared_constants(node)
            for operand in (node.left, *node.comparators):
                for name in _config_field(operand, from_init, local):
                    found.setdefault(name, []).extend(constants)
                if isinstance(operand, ast.Subscript):  # ``config.layer_types[layer_idx]``
                    for name in _config_field(operand.value, from_init, local):
                        found.setdefault(name + PER_ELEMENT, []).extend(constants)
        elif isinstance(node, (ast.Attribute, ast.Name)):
            for name in _config_field(node, from_init, local):
                found.setdefault(name, [])
    return found


def _constants(node: ast.expr) -> list[Any]:
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    return []


def _config_attributes_read(value: ast.expr) -> set[str]:
    """The ``config.y`` fields an expression reads."""
    return {
        chain[-1]
        for sub in ast.walk(value)
        if isinstance(sub, ast.Attribute)
        and (chain := attribute_chain(sub)) is not None
        and len(chain) >= 2
        and chain[-2] == "config"
    }


def locals_from_config(node: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, set[str]]:
    """``x = ... config.y ...`` in a function: x -> {y}. A forward argument that defaults to a
    configuration value (``output_router_logits = output_router_logits if output_router_logits
    is not None else self.config.output_router_logits``) guards code by that value."""
    found: dict[str, set[str]] = {}
    for statement in ast.walk(node):
        if isinstance(statement, ast.Assign):
            read = _config_attributes_read(statement.value)
            for target in statement.targets:
                if read and isinstance(target, ast.Name):
                    found.setdefault(target.id, set()).update(read)
    return found


def self_attributes_from_config(node: ast.ClassDef) -> dict[str, set[str]]:
    """``self.x = ... config.y ...`` in the class's ``__init__``: x -> {y}."""
    found: dict[str, set[str]] = {}
    for item in node.body:
        if not (isinstance(item, ast.FunctionDef) and item.name == "__init__"):
            continue
        for statement in ast.walk(item):
            if not isinstance(statement, (ast.Assign, ast.AnnAssign)) or statement.value is None:
                continue
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            read = _config_attributes_read(statement.value)
            for target in targets:
                chain = attribute_chain(target)
                if read and chain is not None and len(chain) == 2 and chain[0] == "self":
                    found.setdefault(chain[1], set()).update(read)
    return found
