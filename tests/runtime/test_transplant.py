"""Swapping patched code into live functions: what is found, what is refused, what is undone."""

from __future__ import annotations

import importlib
import textwrap

import pytest

from adopter.runtime.transplant import Unpatchable, apply_transplant, plan_transplant

ORIGINAL = """
import functools


def keep(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapper


def opaque(function):
    return lambda *args: function(*args)


class Base:
    def value(self):
        return 1


class Child(Base):
    def value(self):
        return super().value() + 10

    @keep
    def wrapped(self, x):
        return x + 1

    @property
    def twice(self):
        return 2

    @staticmethod
    def helper(x):
        return x


def module_function(x, *, scale=1):
    return x * scale


@opaque
def hidden(x):
    return x
"""


def _module(make_package, source: str, name: str):
    make_package(name, {"code.py": source})
    return importlib.import_module(f"{name}.code")


def _patched(module, original: str, patched: str):
    transplant = plan_transplant(original, patched, module.__file__)
    return transplant, apply_transplant(module, transplant, module.__file__)


def test_methods_behind_super_decorators_properties_and_staticmethods(make_package):
    original = textwrap.dedent(ORIGINAL).lstrip()
    module = _module(make_package, original, "tp_methods")
    patched = (
        original.replace("super().value() + 10", "super().value() + 20")
        .replace("return x + 1", "return x + 2")
        .replace("return 2\n", "return 4\n")
        .replace("def helper(x):\n        return x", "def helper(x):\n        return -x")
    )
    transplant, applied = _patched(module, original, patched)
    assert sorted(f.label for f in transplant.functions) == [
        "Child.helper",
        "Child.twice",
        "Child.value",
        "Child.wrapped",
    ]
    child = module.Child()
    assert (child.value(), child.wrapped(1), child.twice, module.Child.helper(3)) == (21, 3, 4, -3)
    applied.undo()
    assert (child.value(), child.wrapped(1), child.twice, module.Child.helper(3)) == (11, 2, 2, 3)


def test_added_keyword_parameters_get_their_defaults_and_lose_them_on_undo(make_package):
    original = textwrap.dedent(ORIGINAL).lstrip()
    module = _module(make_package, original, "tp_keywords")
    patched = original.replace(
        "def module_function(x, *, scale=1):\n    return x * scale",
        "def module_function(x, *, scale=1, residual=None):\n"
        "    out = x * scale\n"
        "    return out if residual is None else out + residual",
    )
    _, applied = _patched(module, original, patched)
    assert module.module_function(2, scale=3) == 6
    assert module.module_function(2, residual=5) == 7
    assert module.module_function.__kwdefaults__ == {"scale": 1, "residual": None}
    applied.undo()
    assert module.module_function.__kwdefaults__ == {"scale": 1}
    with pytest.raises(TypeError):
        module.module_function(2, residual=5)


def test_kernel_imports_become_module_globals(make_package):
    original = "def probabilities(x):\n    return x\n"
    module = _module(make_package, original, "tp_kernels")
    patched = (
        "from adopter.kernels import softmax as fused_softmax\n"
        "def probabilities(x):\n    return fused_softmax(x, dim=-1)\n"
    )
    transplant, applied = _patched(module, original, patched)
    assert transplant.kernels == {"fused_softmax": "softmax"}
    import torch

    assert module.probabilities(torch.zeros(2)).tolist() == [0.5, 0.5]
    applied.undo()
    assert not hasattr(module, "fused_softmax")


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        ("import functools\n", "import functools\nX = 1\n", "outside function bodies"),
        ("def module_function(x, *, scale=1)", "def module_function(y, *, scale=1)", "parameters"),
        ("def module_function(x, *, scale=1)", "def module_function(x, *, scale=2)", "parameters"),
        (
            "def module_function(x, *, scale=1)",
            "def module_function(x, *, scale=1, r=x)",
            "constant",
        ),
    ],
)
def test_rewrites_beyond_function_bodies_are_refused(old, new, reason):
    original = textwrap.dedent(ORIGINAL).lstrip()
    patched = original.replace(old, new)
    assert patched != original
    with pytest.raises(Unpatchable, match=reason):
        plan_transplant(original, patched, "code.py")


def test_a_module_is_patched_all_or_nothing(make_package):
    original = textwrap.dedent(ORIGINAL).lstrip()
    module = _module(make_package, original, "tp_all_or_nothing")
    before = module.Base.value.__code__
    patched = original.replace("return 1\n", "return 100\n").replace(
        "def hidden(x):\n    return x", "def hidden(x):\n    return -x"
    )
    transplant = plan_transplant(original, patched, module.__file__)
    with pytest.raises(Unpatchable, match="hidden is not reachable"):
        apply_transplant(module, transplant, module.__file__)
    assert module.Base.value.__code__ is before  # nothing was swapped
