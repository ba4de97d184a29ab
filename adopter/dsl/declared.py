"""A rule calls only the kernel it declares: checked when rules are loaded, for every command.

A rule's replacement is code that ``apply --write`` writes into the user's files and that
``adopter run`` / ``adopter.patch`` compile into the running process, so what it may call is
fixed before anything is matched:

* ``kernel:`` names either a registered kernel of ``adopter.kernels`` (the registry's
  :data:`~adopter.kernels.registry.ENTRIES`, kernels and attention factories, not helpers) or a
  third-party function, ``package.function``, whose top-level package is on the import path (and
  not in the standard library: ``os.system`` is no kernel);
* the replacement calls that kernel (``kernel(...)``, or ``kernel(Class)(...)`` for a factory),
  the rule's ``$variables`` and their public methods (``$x.view(...)``), nothing else; a guard
  (``=> if k(...) {``) calls ``kernel.attribute`` or a function of the kernel's own module (for
  ``adopter.kernels``: a registered helper defined beside the kernel, ``fused_loss_applies``);
* a name passed as an argument is one the rule's own patterns mention (``BertSelfAttention``,
  ``self.weight``): code the matched source already runs, never a new reference;
* a submodule handed to a kernel of ``adopter.kernels`` whose entry declares what it must be
  built with (``Entry.needs``: ``linear_bias_activation``'s Linear has ``bias=True``) is tied to
  a construction that asks it (``@torch.nn.Linear(..., bias=True)``), so the registry is the
  one place that says where a kernel applies and every rule, hand-written or learnt, agrees.

Anything else is a :class:`DslError` at the place in the ``.adopt`` file.
"""

from __future__ import annotations

import difflib
import importlib.util
import keyword
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import DslError
from .syntax import (
    Attribute,
    Call,
    Expr,
    Index,
    Keyword,
    Literal,
    Name,
    Positional,
    Rest,
    Rule,
    Step,
    Var,
    Wildcard,
)

__all__ = [
    "KERNEL_PACKAGE",
    "NeededFlag",
    "check_declared_kernels",
    "kernel_entry",
    "needed_flags",
    "registered_kernels",
]

KERNEL_PACKAGE = "adopter.kernels"

# The registry is read from its file, not imported as ``adopter.kernels.registry``: importing any
# submodule first runs ``adopter/kernels/__init__.py``, which imports every kernel and so torch,
# and scan and apply never need torch. ``registry.py`` itself imports only the standard library
# (its docstring says so and ``tests/dsl/test_declared_kernels.py`` checks that loading it this
# way leaves torch unimported), so executing it alone gives the one list of kernels without a
# second copy of it. ``kernels/`` is a leaf of the pipeline, so the DSL may read its name table.
_REGISTRY_PATH = Path(__file__).resolve().parent.parent / "kernels" / "registry.py"


@cache
def _registry() -> ModuleType:
    already = sys.modules.get(f"{KERNEL_PACKAGE}.registry")
    if already is not None:
        return already
    name = "adopter._kernel_registry_names"  # private: not the package's own module object
    spec = importlib.util.spec_from_file_location(name, _REGISTRY_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


@cache
def registered_kernels() -> dict[str, tuple[str, str]]:
    """``{name: (role, module)}`` of every public name of ``adopter.kernels``, without torch."""
    return {entry.name: (str(entry.role), entry.module) for entry in _registry().ENTRIES}


@dataclass(frozen=True)
class NeededFlag:
    """A flag the kernel's registry entry asks of a construction the rule hands it."""

    construction: Step  # the ``init`` step that builds the submodule
    key: str
    value: bool
    parameter: str  # the kernel's parameter the submodule is passed as
    why: str

    @property
    def asked(self) -> bool:
        """Whether the construction already asks it (``bias=True``, nothing looser)."""
        return any(
            isinstance(arg, Keyword)
            and arg.key == self.key
            and isinstance(arg.value, Literal)
            and type(arg.value.value) is bool
            and arg.value.value == self.value
            for arg in self.construction.args
        )


def _names_kind(name: str, kind: str) -> bool:
    """``nn.Linear`` (as a rule may write it) names ``torch.nn.Linear``, as the matcher reads
    a construction's class."""
    return kind == name or kind.endswith("." + name)


def _handed(call: Step, position: int, parameter: str) -> Expr | None:
    """The value a replacement call passes as the kernel's argument ``position`` or
    ``parameter=``; None past a ``...`` (the positions after it are not known)."""
    index = 0
    for arg in call.args:
        if isinstance(arg, Rest):
            break
        if isinstance(arg, Positional):
            if index == position:
                return arg.value
            index += 1
    for arg in call.args:
        if isinstance(arg, Keyword) and arg.key == parameter:
            return arg.value
    return None


def needed_flags(spelling: Rule, kernel: str) -> list[NeededFlag]:
    """Every flag the registry entry of ``kernel`` (``adopter.kernels.<name>``) declares for a
    submodule the spelling's replacement hands it, at that submodule's construction: the
    constructions of the declared class only (a submodule built as another class, or named by a
    family, is one the declaration says nothing about)."""
    package, _, name = kernel.rpartition(".")
    if package != KERNEL_PACKAGE or spelling.init is None:
        return []
    entry = kernel_entry(name)
    if entry is None or not entry.needs:
        return []
    constructions = {
        step.targets[0].name: step
        for step in spelling.init.steps
        if step.construct and len(step.targets) == 1 and isinstance(step.callee, Name)
    }
    found: list[NeededFlag] = []
    for call, _guard in _replacement_steps(spelling):
        if not (isinstance(call.callee, Name) and call.callee.dotted == kernel):
            continue
        for need in entry.needs:
            value = _handed(call, need.position, need.parameter)
            construction = constructions.get(value.name) if isinstance(value, Var) else None
            if construction is None:
                continue
            assert isinstance(construction.callee, Name)
            if not _names_kind(construction.callee.dotted, need.kind):
                continue
            for key, flag in need.flags:
                needed = NeededFlag(construction, key, flag, need.parameter, need.why)
                if needed not in found:
                    found.append(needed)
    return found


@cache
def _entries() -> dict[str, Any]:
    return {entry.name: entry for entry in _registry().ENTRIES}


def kernel_entry(name: str) -> Any | None:
    """The registry entry of ``adopter.kernels.<name>`` (``None``: no such kernel), read
    without torch: the rewrite consults the entries and must not import the kernels."""
    return _entries().get(name)


_CALLABLE_ROLES = ("kernel", "attention factory")
# What a call-site rule (``Rule.call``: training code) may call: what builds an optimizer.
_CALL_SITE_ROLES = ("optimizer",)


def check_declared_kernels(rules: Iterable[Rule]) -> None:
    """Raise :class:`DslError`, at the place in the rule file, for the first rule whose kernel
    is unknown or whose replacement calls anything but its declared kernel."""
    for rule in rules:
        _check_kernel(rule)
        for spelling in rule.spellings:
            _check_replacements(rule, spelling)
            _check_needs(rule, spelling)


def _check_needs(rule: Rule, spelling: Rule) -> None:
    for needed in needed_flags(spelling, rule.kernel):
        if needed.asked:
            continue
        step = needed.construction
        raise DslError(
            spelling.source,
            step.line,
            step.column + 1,  # past the ``@``
            f"rule {rule.id}: {rule.kernel} is declared (adopter/kernels/registry.py) for a "
            f"`{needed.parameter}` built with {needed.key}={needed.value}: {needed.why}; the "
            f"construction `{step.callee}` -> {step.targets[0]} must ask "
            f"`{needed.key}={needed.value}`",
        )


def _error_at_kernel(rule: Rule, message: str) -> DslError:
    line, column = rule.kernel_at if rule.kernel_at[0] else (rule.line, 1)
    return DslError(rule.source, line, column, f"rule {rule.id}: {message}")


def _check_kernel(rule: Rule) -> None:
    kernel = rule.kernel
    if not kernel:
        return  # a rule without a kernel may only detect; _check_replacements says so
    parts = kernel.split(".")
    if len(parts) < 2 or not all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        raise _error_at_kernel(
            rule,
            f"kernel {kernel!r} is not a dotted name module.function "
            "(e.g. adopter.kernels.softmax, or flash_attn.flash_attn_func for a third-party one)",
        )
    package, _, name = kernel.rpartition(".")
    if package == KERNEL_PACKAGE:
        known = registered_kernels()
        if name not in known:
            near = difflib.get_close_matches(name, list(known), n=1)
            hint = f"; did you mean {KERNEL_PACKAGE}.{near[0]}?" if near else ""
            raise _error_at_kernel(
                rule, f"kernel {kernel!r} is not a registered kernel of {KERNEL_PACKAGE}{hint}"
            )
        roles = _CALL_SITE_ROLES if rule.call is not None else _CALLABLE_ROLES
        if known[name][0] not in roles:
            what = "a call-site rule's kernel" if rule.call is not None else "a kernel"
            raise _error_at_kernel(
                rule, f"{kernel!r} is a {known[name][0]} of {KERNEL_PACKAGE}, not {what}"
            )
        return
    top = parts[0]
    if top == "adopter":
        raise _error_at_kernel(
            rule, f"kernel {kernel!r}: Adopter's kernels are {KERNEL_PACKAGE}.<name>"
        )
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        raise _error_at_kernel(
            rule, f"kernel {kernel!r} is in the standard library ({top}), not a kernel"
        )
    if not _on_import_path(top):
        raise _error_at_kernel(
            rule, f"third-party kernel {kernel!r}: package {top!r} is not on the import path"
        )


def _on_import_path(top_level: str) -> bool:
    """Whether a top-level package or module can be imported, without importing it.

    ``importlib.util.find_spec`` of a dotted name imports every parent package (running their
    ``__init__``), so only the top-level name is looked up: for it, the finders on
    ``sys.meta_path`` locate the package's files (or return the spec of an already imported
    module) and run none of its code. The rest of the kernel's name (submodules, the function)
    cannot be checked without importing the package; a missing one fails where it is imported.
    """
    try:
        return importlib.util.find_spec(top_level) is not None
    except (ImportError, ValueError):  # a module in sys.modules without a spec, a broken finder
        return False


# -- what a replacement calls ---------------------------------------------------------------------


def _replacement_steps(spelling: Rule) -> Iterator[tuple[Step, bool]]:
    """Every step of the spelling's replacements, with whether it is a guard."""
    for section in (spelling.init, spelling.forward):
        if section is None or not isinstance(section.replacement, tuple):
            continue
        if section.guard is not None:
            yield section.guard, True
        for step in section.replacement:
            yield step, False


def _pattern_names(spelling: Rule) -> set[str]:
    """Every dotted name the spelling's patterns mention, with each dotted prefix of them."""
    found: set[str] = set()
    for section in (spelling.init, spelling.forward):
        if section is None:
            continue
        for step in section.steps + section.where:
            for expr in _expressions(Call(step.callee, step.args)):
                if isinstance(expr, Name):
                    parts = expr.dotted.split(".")
                    found.update(".".join(parts[: end + 1]) for end in range(len(parts)))
    return found


def _expressions(expr: Expr) -> Iterator[Expr]:
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Index):
            stack += [node.base, node.item]
        elif isinstance(node, Call):
            stack.append(node.base)
            stack += [a.value for a in node.args if isinstance(a, (Positional, Keyword))]


def _callee_text(callee: Expr) -> str:
    return str(callee.base) if isinstance(callee, Call) else str(callee)


def _check_replacements(rule: Rule, spelling: Rule) -> None:
    names = _pattern_names(spelling)
    for step, guard in _replacement_steps(spelling):
        if isinstance(step.callee, Literal) and not step.args:
            continue  # ``None -> $logits``: a value, no call
        column = step.column + (1 if step.construct else 0)  # past the ``@``
        where = (spelling.source, step.line, column)
        if not rule.kernel:
            raise DslError(
                *where,
                f"rule {rule.id}: the replacement calls `{_callee_text(step.callee)}`, but the "
                'rule declares no kernel (add `kernel: "module.function"`)',
            )
        if guard:
            allowed = _allowed_guard(rule.kernel, step.callee)
        else:
            allowed = _allowed_call(rule.kernel, step.callee)
        if not allowed:
            raise DslError(
                *where,
                f"rule {rule.id}: the replacement calls `{_callee_text(step.callee)}`; it may "
                f"call only its declared kernel `{rule.kernel}` and the rule's $variables",
            )
        arguments = list(step.args)
        if isinstance(step.callee, Call):  # ``kernel(Class)(...)``: the factory's arguments too
            arguments += list(step.callee.args)
        for argument in arguments:
            if isinstance(argument, (Positional, Keyword)):
                _check_argument(rule, spelling, step, argument.value, names)


def _allowed_call(kernel: str, callee: Expr) -> bool:
    if isinstance(callee, Name):
        return callee.dotted == kernel
    if isinstance(callee, Call):  # an attention factory: ``kernel(Class)(args)``
        return isinstance(callee.base, Name) and callee.base.dotted == kernel
    return _bound_method(callee)


def _bound_method(callee: Expr) -> bool:
    """``$module(...)`` or ``$x.view(...)``: a value the pattern bound, or its public method."""
    if isinstance(callee, Var):
        return True
    return isinstance(callee, Attribute) and not callee.name.startswith("_")


def _allowed_guard(kernel: str, callee: Expr) -> bool:
    """The kernel's run-time test: ``kernel.applies``, or a function of the kernel's module
    (of ``adopter.kernels``: a registered name defined in the same submodule as the kernel)."""
    if not isinstance(callee, Name):
        return False
    module, _, name = callee.dotted.rpartition(".")
    if module == kernel:
        return True
    kernel_module, _, kernel_name = kernel.rpartition(".")
    if module != kernel_module:
        return False
    if module != KERNEL_PACKAGE:
        return True
    known = registered_kernels()
    return name in known and known[name][1] == known[kernel_name][1]


def _check_argument(rule: Rule, spelling: Rule, step: Step, value: Expr, names: set[str]) -> None:
    """An argument is a $variable (or its attribute), a literal, ``_``, or a name the patterns
    mention; a call or subscript would run code the declared kernel does not."""
    if isinstance(value, (Var, Attribute, Literal, Wildcard)):
        return
    if isinstance(value, Name) and value.dotted in names:
        return
    what = (
        "a call or subscript"
        if isinstance(value, (Call, Index))
        else "a name its patterns do not mention"
    )
    raise DslError(
        spelling.source,
        step.line,
        step.column,
        f"rule {rule.id}: the replacement passes `{value}`, {what}; it passes the rule's "
        "$variables, literals and names its patterns match",
    )
