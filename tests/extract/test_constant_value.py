"""``constant_value`` reads the literals ``ast.literal_eval`` reads among constants, signed
numbers and tuples (it is checked element by element for speed, so it must agree)."""

from __future__ import annotations

import ast

import pytest

from adopter.extract.constructions import constant_value
from adopter.extract.model import NOT_CONSTANT

CASES = [
    "-1", "+2.5", "-1j", "(1, -2.5)", "((1, 2), 3)", "()", "(1,)", "'gelu'", "None",
    "(a, 1)", "-x", "not 1", "~1", "+True", "-'a'", "--1", "(-True,)", "[1, 2]", "a.b",
]  # fmt: skip


@pytest.mark.parametrize("text", CASES)
def test_constant_value_agrees_with_literal_eval(text):
    node = ast.parse(text, mode="eval").body
    try:
        expected = ast.literal_eval(node) if not isinstance(node, ast.List) else NOT_CONSTANT
    except ValueError:
        expected = NOT_CONSTANT
    value = constant_value(node)
    assert value == expected
    assert type(value) is type(expected)
