"""The kernel registry is the one list of kernels, and everything that enumerates them agrees
with it: the package's names, ``describe_backends``, verify's random-number table, and the
modules that define the kernels."""

from __future__ import annotations

import importlib
import inspect

import pytest

import adopter.kernels as kernels
from adopter.kernels import describe_backends, registry
from adopter.kernels.registry import ENTRIES, Role


def test_names_are_unique():
    names = [entry.name for entry in ENTRIES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry.name)
def test_each_entry_is_the_function_its_module_defines(entry):
    module = importlib.import_module(f"adopter.kernels.{entry.module}")
    defined = getattr(module, entry.name, None)
    assert callable(defined), f"adopter/kernels/{entry.module}.py defines no {entry.name}"
    assert getattr(kernels, entry.name) is defined
    assert defined.__module__ == module.__name__, (
        f"{entry.name} is defined in {defined.__module__}, not {module.__name__}"
    )
    assert inspect.getdoc(defined), f"{entry.name} has no docstring"


def test_package_exports_exactly_the_registry():
    assert kernels.__all__ == registry.names()


def test_describe_backends_describes_every_kernel_and_nothing_else():
    info = describe_backends("cpu")
    described = set(info) - {"device", "triton", "xformers", "flash_attn", "liger_kernel"}
    assert described == set(registry.names(Role.KERNEL, Role.ATTENTION_FACTORY))
    no_backend = (Role.HELPER, Role.OPTIMIZER)
    assert all(entry.backend is None for entry in ENTRIES if entry.role in no_backend)


def test_an_unknown_name_is_a_clear_error():
    with pytest.raises(KeyError, match="no 'softmx'; known: add_rms_norm, apply_rotary"):
        registry.entry("softmx")
    assert registry.entry("softmax").role is Role.KERNEL


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.needs], ids=lambda entry: entry.name)
def test_a_declared_need_names_the_kernels_parameter_at_its_position(entry):
    """Rules are checked against ``Entry.needs`` without importing the kernels, by position;
    the parameter's name, said in the errors, is the signature's at that position."""
    parameters = list(inspect.signature(getattr(kernels, entry.name)).parameters)
    for need in entry.needs:
        assert parameters[need.position] == need.parameter
        assert need.flags and all(isinstance(value, bool) for _, value in need.flags)
