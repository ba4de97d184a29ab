"""A guarded replacement whose first matched call sits in a submodule's ``forward`` that does
more before it: a masked-LM head (``self.lm_head(sequence_output)``: dense, activation and norm,
then the vocabulary projection) whose logits the caller's loss reads.

The kernel arm replaces the caller's call of the submodule, so it must compute what the
submodule computed before its matched call. Those statements are copied into the kernel arm
in the caller's terms: ``self`` becomes the submodule (``self.lm_head``), each parameter the
caller's argument, each local a name the caller does not use::

    if fused_loss_applies(self.lm_head.decoder, labels):
        x = self.lm_head.dense(sequence_output)
        x = gelu(x)
        x = self.lm_head.layer_norm(x)
        prediction_scores = None
        masked_lm_loss = causal_lm_loss(x, self.lm_head.decoder, labels, ...)
    else:
        prediction_scores = self.lm_head(sequence_output)
        ...

The submodule's own code is not edited (its other callers still run it). Copying is allowed
only where it means the same: the submodule is a class of the same file (its globals are the
caller's), called once by the caller through an attribute of ``self``, its statements before
the matched ones plain assignments of names that use ``self`` only to reach its attributes,
each parameter they read given by the call as a name or an attribute (or left at a constant
default), no global they read bound by the caller, and it returns the last matched value.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ..extract.flow import delegates
from ..extract.model import Operand
from ..extract.model import Step as FlowStep
from ..match.matcher import BoundModule, Site
from .checks import (
    check_copyable_prefix,
    check_globals_kept,
    check_helper_arguments,
    check_helper_ends_with_match,
    check_module_helper_call,
    check_operand_copyable,
    check_same_file,
    require,
    step_expression,
)
from .source import SourceText, assigned_names, contains, names_in, read_names


@dataclass
class InlinedHelper:
    """A submodule's ``forward`` whose work before the match the kernel arm copies."""

    call: ast.Call  # its one call in the edited function
    lines: list[str]  # its statements before the matched ones, in the caller's terms
    bound: set[str] = field(default_factory=set)  # the names those lines bind
    var_text: dict[str, str] = field(default_factory=dict)  # pattern variables it binds
    module_text: dict[str | None, str] = field(default_factory=dict)  # modules it calls
    result_of: FlowStep | None = None  # the matched step whose value it returns


def module_helper(
    source: SourceText,
    site: Site,
    function: ast.FunctionDef,
    helper: ast.FunctionDef,
) -> InlinedHelper | None:
    """The plan of copying ``helper``'s work into ``function``'s kernel arm; ``None`` when
    ``helper`` is not a submodule's ``forward`` called through an attribute of ``self``."""
    inner = [s for s in site.steps if s.function is helper]
    owner = _self_path(source, inner)
    if helper.name != "forward" or owner is None:
        return None
    calls, handed = _caller_call(source, site, function, owner)
    require(check_module_helper_call(owner, calls))
    (call,) = calls
    outer = [s for s in site.steps if s.function is function]
    require(check_same_file(helper, inner, outer))
    body = _without_docstring(helper.body)
    statements = [s.statement for s in inner]
    # the matched statements sit in the helper's own body (check_inlined_alike: one call deep)
    first = next((i for i, s in enumerate(body) if any(s is t for t in statements)), len(body))
    final = inner[-1]
    tail = body[first:]
    require(check_helper_ends_with_match(helper, tail, statements, step_expression(final)))  # type: ignore[arg-type]
    prefix = body[:first]
    require(check_copyable_prefix(helper, prefix))
    inside = {id(node) for node in ast.walk(helper)}
    # the helper's values the kernel arm reads (its norm's output as the head's input)
    operands = {
        variable: value.node
        for variable, value in site.bindings.items()
        if isinstance(value, Operand) and value.node is not None and id(value.node) in inside
    }
    for variable, node in operands.items():
        # names the matched statements bind before the one reading the value
        reader = next((i for i, s in enumerate(tail) if contains(s, node)), len(tail))
        later = set().union(set(), *(assigned_names(s) for s in tail[:reader]))
        require(check_operand_copyable(variable, node, later))
    parameters = _parameters(helper)
    read = set().union(set(), *(read_names(s) for s in [*prefix, *operands.values()]))
    given = _arguments(source, helper, _handed_on(call, handed), parameters, read)
    taken = names_in(function)
    local = set().union(set(), *(assigned_names(s) for s in prefix))
    globals_read = read - local - set(parameters) - {"self"}
    require(check_globals_kept(helper, globals_read, assigned_names(function) | _args(function)))
    names: dict[str, str] = {}  # helper name -> caller text, as it stands before each statement
    lines: list[str] = []
    bound: set[str] = set()
    for parameter, (text, stable) in given.items():
        if stable:  # a name or an attribute: read again where the copies run
            names[parameter] = text
            continue
        # an expression (``outputs.text_features if return_dict else outputs[0]``) is
        # evaluated once, as the call evaluated it, into a name of the kernel arm
        name = _fresh(parameter, owner, taken | bound)
        names[parameter] = name
        bound.add(name)
        lines.append(f"{name} = {text}")
    renamed: dict[str, str] = {}  # each local of the copied statements -> its caller name
    for statement in prefix:
        assert isinstance(statement, (ast.Assign, ast.AnnAssign))
        value = _in_caller(statement.value, names, owner)  # type: ignore[arg-type]
        target = statement.targets[0] if isinstance(statement, ast.Assign) else statement.target
        assert isinstance(target, ast.Name)
        name = renamed.get(target.id) or _fresh(target.id, owner, taken | bound)
        names[target.id] = renamed[target.id] = name
        bound.add(name)
        lines.append(f"{name} = {value}")
    inlined = InlinedHelper(call, lines, bound, result_of=final)
    for value in site.bindings.values():
        if isinstance(value, BoundModule) and any(s.module == value.path for s in inner):
            inlined.module_text[value.path] = value.path  # the path from the caller's self
    for variable, node in operands.items():
        inlined.var_text[variable] = _in_caller(node, names, owner)  # type: ignore[arg-type]
    return inlined


def _calls_of_path(source: SourceText, function: ast.FunctionDef, path: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Call) and source.segment(node.func) == path
    ]


MAX_WRAPPERS = 3  # forwards handing their input on between the caller and the helper


def _caller_call(
    source: SourceText, site: Site, function: ast.FunctionDef, owner: str
) -> tuple[list[ast.Call], list[tuple[ast.FunctionDef, ast.Call]]]:
    """The calls in ``function`` that reach the helper's module ``owner``: of ``owner``
    itself, or of a module whose ``forward`` only hands its input on to it (BERT's
    ``self.cls(x)``, whose forward returns ``self.predictions(x)``), with those forwards and
    their calls, outermost first."""
    handed: list[tuple[ast.FunctionDef, ast.Call]] = []
    path = owner
    while True:
        calls = _calls_of_path(source, function, path)
        if calls or len(handed) == MAX_WRAPPERS or path.count(".") < 2:
            return calls, handed
        # the summary step of the call that reached ``path``: in the forward of its parent
        reaching = [
            step
            for step in (site.flow.steps if site.flow is not None else [])
            if step.transparent
            and step.module == path
            and step.function is not None
            and step.function is not function
            and isinstance(step.node, ast.Call)
        ]
        wrappers = {id(step.function): step for step in reaching}
        if len(wrappers) != 1:
            return [], handed
        (step,) = wrappers.values()
        wrapper = step.function
        assert wrapper is not None and isinstance(step.node, ast.Call)
        if wrapper.name != "forward" or not delegates(wrapper):
            return [], handed
        handed.insert(0, (wrapper, step.node))
        path = path.rsplit(".", 1)[0]


def _handed_on(call: ast.Call, handed: list[tuple[ast.FunctionDef, ast.Call]]) -> ast.Call:
    """The caller's ``call`` as the helper receives it through the forwards that hand their
    input on: each forward's call with its parameters replaced by what it was given."""
    for wrapper, inner in handed:
        arguments = wrapper.args
        positional = [a.arg for a in [*arguments.posonlyargs, *arguments.args]][1:]
        given: dict[str, ast.expr] = dict(zip(positional, call.args, strict=False))
        given.update({k.arg: k.value for k in call.keywords if k.arg is not None})
        # ``delegates`` holds: every argument of ``inner`` is a parameter name; one the
        # caller left out keeps the inner call's own name (the check of the helper's
        # arguments then refuses it unless it is not read)
        call = ast.Call(
            func=inner.func,
            args=[given.get(a.id, a) for a in inner.args],  # type: ignore[attr-defined]
            keywords=[
                ast.keyword(arg=k.arg, value=given.get(k.value.id, k.value))  # type: ignore[attr-defined]
                for k in inner.keywords
            ],
        )
    return call


def _self_path(source: SourceText, steps: list[FlowStep]) -> str | None:
    """``self.lm_head`` for a helper whose ``self.decoder`` call is module ``self.lm_head.decoder``:
    how the caller reaches the helper's module."""
    for step in steps:
        node = step.node
        if step.module is None or not isinstance(node, ast.Call):
            continue
        text = source.segment(node.func)
        if text.startswith("self.") and step.module.endswith(text[len("self") :]):
            owner = step.module[: len(step.module) - len(text) + len("self")]
            if owner.startswith("self.") and all(p.isidentifier() for p in owner.split(".")):
                return owner
    return None


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return body[1:]
    return body


def _parameters(helper: ast.FunctionDef) -> list[str]:
    arguments = helper.args
    names = [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]
    return names[1:] if names and names[0] == "self" else names


def _args(function: ast.FunctionDef) -> set[str]:
    return {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}


def _arguments(
    source: SourceText,
    helper: ast.FunctionDef,
    call: ast.Call,
    parameters: list[str],
    read: set[str],
) -> dict[str, tuple[str, bool]]:
    """The caller's text for each parameter of ``helper`` its copied statements read, and
    whether it is a name or an attribute (read again) rather than an expression (bound once)."""
    arguments = helper.args
    positional = [a.arg for a in [*arguments.posonlyargs, *arguments.args]][1:]
    given: dict[str, ast.expr] = dict(zip(positional, call.args, strict=False))
    given.update({k.arg: k.value for k in call.keywords if k.arg is not None})
    defaults = dict(
        zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults)
    )
    defaults.update(
        {a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None}
    )
    wanted = [p for p in parameters if p in read]
    require(check_helper_arguments(helper, call, wanted, given, defaults))
    return {
        p: (source.segment(given[p]), _stable(given[p]))
        if p in given
        else (ast.unparse(defaults[p]), True)
        for p in wanted
    }


def _stable(node: ast.expr) -> bool:
    """A name, an attribute of one or an item of one at a constant (``outputs[0]``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Constant):
            return False
        node = node.value
    return isinstance(node, ast.Name)


def _in_caller(node: ast.expr, names: dict[str, str], owner: str) -> str:
    """``node`` of the helper as caller text: ``self`` the helper's module, every other name
    the caller's text for it."""
    replacements = {**names, "self": owner}

    class ToCaller(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> ast.expr:  # noqa: N802 - ast visitor name
            text = replacements.get(name.id)
            if text is None:
                return name
            return ast.copy_location(ast.parse(text, mode="eval").body, name)

    copied = ToCaller().visit(ast.parse(ast.unparse(node), mode="eval").body)
    return ast.unparse(copied)


def _fresh(name: str, owner: str, taken: set[str]) -> str:
    """``name`` where the caller does not use it, else ``<module>_<name>`` (numbered)."""
    if name not in taken:
        return name
    base = f"{owner.rsplit('.', 1)[-1]}_{name}"
    candidate, number = base, 2
    while candidate in taken:
        candidate, number = f"{base}_{number}", number + 1
    return candidate
