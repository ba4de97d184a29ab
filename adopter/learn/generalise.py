"""Several examples of one rule: anti-unification of their spellings.

Two spellings with the same shape (the same callees in the same order, the same data flow, the
same replacement) become one whose differences are variables: a constant that is ``-1`` in one
example and ``1`` in the other is a variable, a construction flag they disagree on is no longer
checked, a ``where`` context (what the kept code does with the results) that only one of them
shows is no longer asked. Spellings of different shapes stay separate variants of the rule.
"""

from __future__ import annotations

from dataclasses import replace

from ..dsl import Keyword, Literal, Name, Positional, Rest, Rule, Section, Step, Var
from ..dsl.syntax import Attribute, Call, Expr, Index


class _Mismatch(Exception):
    pass


class _AntiUnifier:
    def __init__(self, used: set[str]) -> None:
        self.pairs: dict[str, str] = {}  # var of the first spelling -> var of the second
        self.generalised: dict[tuple[str, str], Var] = {}
        self.used = set(used)

    def _fresh(self, base: str) -> Var:
        name, number = base, 1
        while name in self.used:
            number += 1
            name = f"{base}_{number}"
        self.used.add(name)
        return Var(name)

    def expr(self, first: Expr, second: Expr) -> Expr:
        if isinstance(first, Var) and isinstance(second, Var):
            bound = self.pairs.setdefault(first.name, second.name)
            if bound != second.name:
                raise _Mismatch
            return first
        if isinstance(first, Literal) and isinstance(second, Literal):
            if first.value == second.value and type(first.value) is type(second.value):
                return first
            key = (repr(first.value), repr(second.value))
            var = self.generalised.get(key)
            if var is None:
                var = self.generalised[key] = self._fresh("value")
            return var
        if isinstance(first, Var) and isinstance(second, (Literal, Name)):
            return first  # the variable already takes any value
        if isinstance(first, (Literal, Name)) and isinstance(second, Var):
            raise _Mismatch  # data flow differs: a value in one example, a constant in the other
        if isinstance(first, Name) and isinstance(second, Name):
            if first.dotted != second.dotted:
                raise _Mismatch
            return first
        if isinstance(first, Call) and isinstance(second, Call):
            return Call(self.expr(first.base, second.base), self.args(first.args, second.args))
        if isinstance(first, Index) and isinstance(second, Index):
            return Index(self.expr(first.base, second.base), self.expr(first.item, second.item))
        if isinstance(first, Attribute) and isinstance(second, Attribute):
            if first.name != second.name:
                raise _Mismatch
            base = self.expr(first.base, second.base)
            assert isinstance(base, Var)
            return Attribute(base, first.name)
        if type(first) is type(second) and first == second:
            return first
        raise _Mismatch

    def args(self, first: tuple, second: tuple, construct: bool = False) -> tuple:
        if construct:
            return self._construction_args(first, second)
        if len(first) != len(second):
            raise _Mismatch
        out = []
        for a, b in zip(first, second, strict=True):
            if type(a) is not type(b):
                raise _Mismatch
            if isinstance(a, Rest):
                out.append(a)
            elif isinstance(a, Keyword):
                if a.key != b.key:
                    raise _Mismatch
                out.append(Keyword(a.key, self.expr(a.value, b.value)))
            else:
                out.append(Positional(self.expr(a.value, b.value)))
        return tuple(out)

    def _construction_args(self, first: tuple, second: tuple) -> tuple:
        """Construction constraints: keep the flags both examples agree on."""
        if not any(isinstance(a, Rest) for a in first) or not any(
            isinstance(a, Rest) for a in second
        ):
            return self.args(first, second)
        theirs = {a.key: a.value for a in second if isinstance(a, Keyword)}
        kept: list = [Rest()]
        for arg in first:
            if isinstance(arg, Keyword) and theirs.get(arg.key) == arg.value:
                kept.append(arg)
        return tuple(kept)

    def step(self, first: Step, second: Step) -> Step:
        if first.construct != second.construct or len(first.targets) != len(second.targets):
            raise _Mismatch
        callee = self.expr(first.callee, second.callee)
        args = self.args(first.args, second.args, construct=first.construct)
        targets = tuple(self.expr(a, b) for a, b in zip(first.targets, second.targets, strict=True))
        return replace(first, callee=callee, args=args, targets=targets)  # type: ignore[arg-type]

    def steps(self, first: tuple[Step, ...], second: tuple[Step, ...]) -> tuple[Step, ...]:
        if len(first) != len(second):
            raise _Mismatch
        return tuple(self.step(a, b) for a, b in zip(first, second, strict=True))

    def section(self, first: Section | None, second: Section | None) -> Section | None:
        if first is None or second is None:
            if first is not second:
                raise _Mismatch
            return None
        if first.kind != second.kind:
            raise _Mismatch
        replacement = first.replacement
        if isinstance(first.replacement, tuple) and isinstance(second.replacement, tuple):
            replacement = self.steps(first.replacement, second.replacement)
        elif first.replacement != second.replacement:
            raise _Mismatch
        steps = self.steps(first.steps, second.steps)
        return replace(
            first, steps=steps, where=self.where(first.where, second.where), replacement=replacement
        )

    def where(self, first: tuple[Step, ...], second: tuple[Step, ...]) -> tuple[Step, ...]:
        """The context both spellings ask for: a ``where`` one example has and the other lacks
        (the fused results split into heads in one, used as they are in the other) is dropped,
        the least general rule asks neither."""
        saved = (dict(self.pairs), dict(self.generalised), set(self.used))
        try:
            return self.steps(first, second)
        except _Mismatch:
            self.pairs, self.generalised, self.used = saved
            return ()


def _variables(spelling: Rule) -> set[str]:
    names: set[str] = set()
    for section in (spelling.init, spelling.forward):
        if section is None:
            continue
        steps = [*section.steps, *section.where]
        if isinstance(section.replacement, tuple):
            steps += list(section.replacement)
        for step in steps:
            names.update(t.name for t in step.targets)
            for arg in step.args:
                value = getattr(arg, "value", None)
                if isinstance(value, Var):
                    names.add(value.name)
            if isinstance(step.callee, Var):
                names.add(step.callee.name)
    return names


def anti_unify(first: Rule, second: Rule) -> Rule | None:
    """The least general spelling of which both are instances; None when their shapes differ."""
    if (first.site, first.scope, first.kernel) != (second.site, second.scope, second.kernel):
        return None
    unifier = _AntiUnifier(_variables(first))
    try:
        init = unifier.section(first.init, second.init)
        forward = unifier.section(first.forward, second.forward)
    except _Mismatch:
        return None
    return replace(first, init=init, forward=forward)


def generalise(spellings: list[Rule]) -> list[Rule]:
    """Spellings merged where they anti-unify, in the order first seen."""
    merged: list[Rule] = []
    for spelling in spellings:
        for index, known in enumerate(merged):
            general = anti_unify(known, spelling)
            if general is not None:
                merged[index] = general
                break
        else:
            merged.append(spelling)
    return merged


def as_rule(spellings: list[Rule], rule_id: str, name: str, description: str) -> Rule:
    """One rule whose first spelling carries the metadata and the others are its variants."""
    head, *rest = spellings
    variants = tuple(replace(s, id=rule_id, name=name, description=description) for s in rest)
    return replace(head, id=rule_id, name=name, description=description, variants=variants)


# At most this many orders of one spelling's independent calls are written out as variants.
MAX_ORDERS = 6


def _orders(steps: tuple[Step, ...]) -> list[tuple[Step, ...]]:
    """The orders of ``steps`` that keep each value computed before it is used (the example's
    first), up to ``MAX_ORDERS``: two projections of one input may come in either order."""
    produced = {t.name: index for index, step in enumerate(steps) for t in step.targets}

    def needs(step: Step) -> set[int]:
        found: set[int] = set()
        values = [getattr(a, "value", None) for a in step.args] + [step.callee]
        for value in values:
            if isinstance(value, Var) and value.name in produced:
                found.add(produced[value.name])
        return found

    before = [needs(step) for step in steps]
    orders: list[tuple[int, ...]] = []

    def extend(order: list[int], left: set[int]) -> None:
        if len(orders) >= MAX_ORDERS:
            return
        if not left:
            orders.append(tuple(order))
            return
        for index in sorted(left):
            if before[index] <= set(order):
                extend([*order, index], left - {index})

    extend([], set(range(len(steps))))
    return [tuple(steps[i] for i in order) for order in orders]


def with_orders(spellings: list[Rule]) -> list[Rule]:
    """Each spelling followed by the other orders of its independent calls, as variants."""
    out: list[Rule] = []
    for spelling in spellings:
        out.append(spelling)
        forward = spelling.forward
        if forward is None or spelling.site == "init" or len(forward.steps) > 8:
            continue
        for order in _orders(forward.steps)[1:]:
            out.append(replace(spelling, forward=replace(forward, steps=order)))
    return out
