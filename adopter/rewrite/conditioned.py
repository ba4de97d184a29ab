"""A match whose later calls each sit in an ``if`` of their own (MobileNet's and MobileViT's
conv layer: the norm and the activation are optional modules), or that skips an ``if`` among
them (Gemma 3n's gate, passed through a top-k only when sparsity is configured)::

    features = self.convolution(features)
    if self.normalization is not None:
        features = self.normalization(features)
    if self.activation is not None:
        features = self.activation(features)

The match holds on the path where every test holding a matched statement is true and every
skipped one is false; the kernel runs there and the original statements everywhere else,
tested where the first matched statement was::

    if self.normalization is not None and self.activation is not None:
        features = conv_bn_act(features, self.convolution, self.normalization, self.activation)
    else:
        features = self.convolution(features)
        ...

Allowed only where testing first means the same: each ``if`` has no ``else`` and holds only
matched statements or none, nothing else sits among them, each test calls nothing and reads nothing
the statements before it assign, the matched statements do only matched work, and the final
one binds the only name read after them.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from ..match.matcher import Site
from .checks import (
    check_arm_sets_what_is_read,
    check_assigned_plainly,
    check_condition_first,
    check_inputs_not_moved,
    check_only_matched_work,
    require,
    step_expression,
)
from .guarded import AlreadyPatched

if TYPE_CHECKING:
    from .plan import Plan, Planner


def plan_conditioned(
    planner: Planner, site: Site, plan: Plan, final_index: int, call_text: str
) -> Plan | None:
    """The guarded plan of ``site`` whose matched statements after the first sit in ``if``
    statements of their own; ``None`` when the match is not laid out so."""
    from .plan import Plan

    steps = site.steps
    function = plan.function
    blocks = planner.blocks(function)
    statements = [step.statement for step in steps]
    if any(s is None for s in statements):
        return None
    block = blocks.block_of(statements[0])[0]  # type: ignore[arg-type]
    holders = [_holder(blocks, block, s) for s in statements]  # type: ignore[arg-type]
    if any(h is None for h in holders):
        return None
    indices = sorted({block.index(h) for h in holders})  # type: ignore[arg-type]
    wrapped = block[indices[0] : indices[-1] + 1]
    matched_statements = [s for s in statements if s is not None]
    # an ``if`` among them that holds none of the matched statements is one the match's path
    # skips (Gemma 3n's optional top-k of the gate): the kernel runs where its test is false
    skipped = [
        s
        for s in wrapped
        if not any(s is h for h in holders) and isinstance(s, ast.If) and not s.orelse
    ]
    if len(wrapped) != len(indices) + len(skipped):  # another statement among them
        return None
    if not skipped and not any(isinstance(h, ast.If) for h in holders):
        return None
    for holder in wrapped:
        if any(holder is k for k in skipped):
            continue
        if isinstance(holder, ast.If) and any(
            not any(s is m for m in matched_statements) for s in holder.body
        ):
            return None
    parent, field = blocks.block_of(wrapped[0])[2:]
    if _inside_own_kernel(planner, parent, field, site):
        raise AlreadyPatched("already guarded by its kernel (patched before)")
    tests = [
        _negated(planner.source.segment(h.test), h.test)
        if any(h is k for k in skipped)
        else _operand(planner.source.segment(h.test), h.test)
        for h in wrapped
        if isinstance(h, ast.If)
    ]
    for index, holder in enumerate(wrapped):
        if isinstance(holder, ast.If):
            require(check_condition_first(holder, wrapped[:index]))
    final = steps[final_index]
    matched = [step_expression(s) for s in steps]
    returned = final.statement if isinstance(final.statement, ast.Return) else None
    if returned is not None and returned.value is matched[final_index]:
        line, bound = f"return {call_text}", set()  # TextNet's ``return act(main + ...)``
    else:
        require(check_assigned_plainly(final))
        name = final.statement.targets[0].id  # type: ignore[union-attr]
        line, bound, returned = f"{name} = {call_text}", {name}, None
    require(check_only_matched_work(planner.source, _unique(matched_statements), matched, returned))
    require(check_arm_sets_what_is_read(function, wrapped, bound, blocks))
    require(check_inputs_not_moved(planner.render.moved_calls))
    conditioned = Plan(site=site, function=function)
    conditioned.imports, conditioned.kernel_calls = plan.imports, plan.kernel_calls
    guard = " and ".join(tests)
    outer = planner.source.indentation(function.lineno)
    inner = planner.source.indentation(function.body[0].lineno)
    conditioned.wrap = (wrapped, guard, [line], inner[len(outer) :] or "    ")
    conditioned.statements.extend(wrapped)
    conditioned.touched.extend(matched)
    conditioned.summary = f"if {guard}: {line}"
    conditioned.reopens = True  # the else arm keeps the original, where other paths may fuse
    return conditioned


def _holder(blocks, block: list[ast.stmt], statement: ast.stmt) -> ast.stmt | None:
    """The statement of ``block`` that is ``statement`` or the ``if`` (without ``else``) whose
    body holds it directly."""
    inner, _, parent, field = blocks.block_of(statement)
    if inner is block:
        return statement
    if (
        isinstance(parent, ast.If)
        and field == "body"
        and not parent.orelse
        and blocks.block_of(parent)[0] is block
    ):
        return parent
    return None


def _inside_own_kernel(planner: Planner, parent: ast.stmt | None, field: str, site: Site) -> bool:
    """The statements are the ``else`` arm of a guard whose body calls the rule's kernel: the
    site was patched before."""
    if not isinstance(parent, ast.If) or field != "orelse" or not site.rule.kernel:
        return False
    kernel = site.rule.kernel.rpartition(".")[2]
    names = {kernel, planner.aliases.get(kernel), f"adopter_{kernel}"}
    return any(
        isinstance(node, ast.Call) and planner.source.segment(node.func) in names
        for statement in parent.body
        for node in ast.walk(statement)
    )


def _unique(statements: list[ast.stmt]) -> list[ast.stmt]:
    seen: list[ast.stmt] = []
    for statement in statements:
        if not any(statement is s for s in seen):
            seen.append(statement)
    return seen


_OPPOSITE: dict[type, type] = {
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
}


def _negated(text: str, test: ast.expr) -> str:
    """``not`` of a test, as an operand of ``and`` (``x is not None`` becomes ``x is None``)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _operand(text[len("not") :].strip(), test.operand)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _OPPOSITE:
        opposite = ast.Compare(test.left, [_OPPOSITE[type(test.ops[0])]()], test.comparators)
        return ast.unparse(opposite)
    atom = isinstance(test, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
    return f"not {text}" if atom else f"not ({text})"


def _operand(text: str, test: ast.expr) -> str:
    """A test as an operand of ``and``."""
    if isinstance(test, (ast.BoolOp, ast.IfExp, ast.NamedExpr, ast.Lambda)):
        return f"({text})"
    return text
