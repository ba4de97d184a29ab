"""Lift one changed region to a rule: the removed statements become the pattern, through the same
extraction the scanner runs (so every spelling it folds into one canonical callee is covered),
and the kernel call becomes the replacement.

What is abstracted and what is kept:

* local values (a name, a value read from ``self``, an argument) become rule variables; a value
  the removed code computes is the variable of the step that computes it;
* submodules called by the removed code become ``$module`` callees tied to their ``__init__``
  construction, which is kept as a constraint: its class (or the family extraction names, e.g.
  ``dropout`` for ``nn.Dropout`` and functional dropout, ``activation`` for any activation), the
  flags the kernel's registry entry declares of a submodule it is handed (``Entry.needs``:
  ``linear_bias_activation``'s Linear has ``bias=True``) and, at the ``flags`` level, its
  boolean parameters (``bias=True``, given or by default);
* constants (``dim=-1``, ``2``, ``torch.float32``) stay as they are: one example does not say
  which other values the kernel accepts (a second example that differs makes them variables);
* the kernel call's arguments are bound to the pattern's variables by the text they have in
  BEFORE (``self.dropout`` is the ``$dropout`` module, ``hidden_states`` the input value);
* what the kept code does with the kernel's results becomes ``where`` context when all of them
  (two or more) go through one call family (``split_heads``: each of q, k, v split into heads).
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field, replace

import libcst as cst

from ..dsl import Keyword, Literal, Name, Positional, Rest, Rule, Section, Step, Var
from ..dsl.declared import needed_flags
from ..dsl.syntax import Call, Expr
from ..extract import Construction, FileStructure, FunctionFlow, Operand, analyse_source
from ..extract import Step as FlowStep
from ..extract.names import parameter_names, step_family
from .diff import LearnError, Region

# How much of a construction the pattern keeps: its class alone, also its boolean flags, or
# every parameter whose value is a constant (``kernel_size=3``), given or by default.
CONSTRUCTION_LEVELS = ("class", "flags", "literals")


@dataclass(frozen=True)
class LiftOptions:
    construction_level: str = "class"
    subtract_kept: bool = True  # leave out calls the AFTER code still makes itself
    scope: str = "calls"


@dataclass
class _Vars:
    used: set[str] = field(default_factory=set)

    def fresh(self, base: str) -> Var:
        name = re.sub(r"\W", "_", base).strip("_") or "v"
        if name[0].isdigit():
            name = f"v{name}"
        candidate, number = name, 1
        while candidate in self.used:
            number += 1
            candidate = f"{name}_{number}"
        self.used.add(candidate)
        return Var(candidate)


def _literal_ok(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _normal(text: str) -> str:
    try:
        return ast.unparse(ast.parse(text.strip(), mode="eval"))
    except SyntaxError:
        return text.strip()


class _Lifter:
    def __init__(self, structure: FileStructure, flow: FunctionFlow, options: LiftOptions) -> None:
        self.structure = structure
        self.flow = flow
        self.options = options
        self.vars = _Vars()
        self.outputs: dict[int, Var] = {}  # value id -> var of the step producing it
        self.inputs: dict[object, Var] = {}
        self.by_text: dict[str, Expr] = {}  # BEFORE text -> what the replacement may pass
        self.modules: dict[str, Var] = {}  # submodule path -> its $var
        self.constructions: dict[str, Construction] = {}
        self.callees: set[str] = set()  # dotted callees of the pattern, with their prefixes

    def _imported(self, text: str) -> bool:
        head = text.split(".")[0]
        return head in self.structure.imports or head in ("torch", "math")

    def operand(self, op: Operand) -> Expr:
        if op.module is not None:
            return self.module_var(op.module.path, None)
        if op.flows:
            values = frozenset(f.value for f in op.flows)
            produced = [self.outputs[v] for v in sorted(values) if v in self.outputs]
            if produced:
                return produced[-1]
            var = self.inputs.get(values)
            if var is None:
                base = self.flow.value_names.get(min(values)) or "x"
                var = self.inputs[values] = self.vars.fresh(base)
            self.by_text.setdefault(_normal(op.text), var)
            return var
        if op.is_constant and _literal_ok(op.constant):
            return Literal(op.constant)
        text = op.text
        if re.fullmatch(r"[A-Za-z_][\w.]*", text) and self._imported(text):
            return Name(text)
        key = ("text", _normal(text))
        var = self.inputs.get(key)
        if var is None:
            base = text.rsplit(".", 1)[-1] if "." in text else text
            var = self.inputs[key] = self.vars.fresh(base)
        self.by_text.setdefault(_normal(text), var)
        return var

    def module_var(self, path: str, construction: Construction | None) -> Var:
        var = self.modules.get(path)
        if var is None:
            var = self.modules[path] = self.vars.fresh(path.removeprefix("self.").replace(".", "_"))
            self.by_text[_normal(path)] = var
            # an element of a container: ``self.proj.0`` is written ``self.proj[0]``
            self.by_text.setdefault(_normal(_indexed(path)), var)
        if construction is not None:
            self.constructions.setdefault(path, construction)
        return var

    def step(self, step: FlowStep) -> Step:
        callee: Expr
        if step.module is not None:
            construction = step.construction or (
                step.alternatives[0] if step.alternatives else None
            )
            if construction is None:
                raise LearnError(
                    step.path,
                    step.line,
                    step.column,
                    f"{step.module} is called but not built in __init__: the rule cannot name "
                    "what it is",
                )
            callee = self.module_var(step.module, construction)
        else:
            callee = Name(step.kind)
            parts = step.kind.split(".")
            self.callees.update(".".join(parts[: end + 1]) for end in range(len(parts)))
            if not re.fullmatch(r"[A-Za-z_][\w.]*", step.kind):
                raise LearnError(
                    step.path,
                    step.line,
                    step.column,
                    f"the call `{step.kind}` has no name the DSL can write",
                )
        args: list[Positional | Keyword | Rest] = [
            Positional(self.operand(op)) for op in step.positional
        ]
        positional_ids = {id(op) for op in step.positional}
        defaults = parameter_names(step.kind)[1]
        for key, op in step.arguments.items():
            if id(op) in positional_ids:
                continue
            if op.node is not None:
                args.append(Keyword(key, self.operand(op)))
            elif op.is_constant and key not in defaults and _literal_ok(op.constant):
                args.append(Keyword(key, Literal(op.constant)))  # ``compare(..., op="is not")``
        if isinstance(step.node, ast.Call) and (
            any(k.arg is None for k in step.node.keywords)
            or any(isinstance(a, ast.Starred) for a in step.node.args)
        ):
            args.append(Rest())  # ``**kwargs``: whatever it holds at a site is passed on
        out = self.vars.fresh(self.flow.value_names.get(step.output) or "t")
        self.outputs[step.output] = out
        return Step(callee, tuple(args), (out,))

    def init_steps(self) -> tuple[Step, ...]:
        steps = []
        for path, construction in self.constructions.items():
            var = self.modules[path]
            kind = construction.family or construction.kind
            if not re.fullmatch(r"[A-Za-z_][\w.]*", kind):
                raise LearnError(
                    construction.path,
                    construction.line,
                    construction.column,
                    f"{path} is built as `{construction.kind}`, which the DSL cannot name",
                )
            args: list[Positional | Keyword | Rest] = [Rest()]
            level = self.options.construction_level
            if level != "class" and construction.family is None:
                for key, op in construction.arguments.items():
                    if not op.is_constant or not _literal_ok(op.constant):
                        continue
                    if level == "literals" or isinstance(op.constant, bool):
                        args.append(Keyword(key, Literal(op.constant)))
            steps.append(Step(Name(kind), tuple(args), (var,), construct=True))
        return tuple(steps)


def _flow_of(structure: FileStructure, region: Region, path: str) -> FunctionFlow:
    if region.owner is None:
        flow = structure.functions.get(region.method)
    else:
        info = structure.classes.get(region.owner)
        flow = info.flows.get(region.method) if info is not None else None
    if flow is None:
        where = f"{region.owner}.{region.method}" if region.owner else region.method
        raise LearnError(
            path,
            region.removed[0],
            1,
            f"{where} is not a method extraction analyses (an nn.Module's method or a "
            "module-level function)",
        )
    return flow


class _Opaque(cst.CSTVisitor):
    """Methods the removed code calls by name: the pattern names them rather than their
    inlined bodies (``self._split_heads(x)``, ``attn.get_attention_scores(q, k, m)``)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
            if func.value.value == "self":
                self.names.add(func.attr.value)
            else:
                self.names.add(f"method.{func.attr.value}")


def opaque_methods(region: Region) -> set[str]:
    visitor = _Opaque()
    for node in region.removed_nodes:
        node.visit(visitor)
    return visitor.names


def _kept_calls(region: Region, after: str, after_path: str, opaque: set[str]) -> list[str]:
    """The calls the AFTER block still makes itself, outside the kernel call (``self.conv(x)``
    moved into an ``else`` arm), as ``kind|text`` keys."""
    structure = analyse_source(after, after_path, opaque)
    try:
        flow = _flow_of(structure, region, after_path)
    except LearnError:
        return []
    module = cst.Module([])
    kernel_text = _normal(module.code_for_node(region.call.node))
    first_line = min(_line_of(after, region.after_code), 10**9)
    last_line = first_line + region.after_code.strip("\n").count("\n")
    kept = []
    for step in flow.steps:
        if step.inline_chain or step.transparent or not first_line <= _call_line(step) <= last_line:
            continue
        text = _normal(ast.unparse(step.node)) if step.node is not None else ""
        if text and text not in kernel_text:
            kept.append(_kept_key(step))
    return kept


def _indexed(path: str) -> str:
    """``self.proj.0`` (extraction's path of a container element) as code writes it."""
    return re.sub(r"\.(\d+)(?=\.|\[|$)", r"[\1]", path)


def _call_line(step: FlowStep) -> int:
    """The line of the call in the method: an ``nn.Sequential`` element's step is located at
    the element in ``__init__``, its call is the container's call."""
    if step.synthetic and step.node is not None and hasattr(step.node, "lineno"):
        return step.node.lineno  # type: ignore[attr-defined]
    return step.line


def _kept_key(step: FlowStep) -> str:
    """What identifies a call in BEFORE and AFTER alike: the submodule it calls (an element
    of a container is called through another expression after the edit), else its text."""
    if step.module is not None:
        return f"{step.kind}|{_indexed(step.module)}"
    text = _normal(ast.unparse(step.node)) if step.node is not None else ""
    return f"{step.kind}|{text}"


def _line_of(text: str, snippet: str) -> int:
    index = text.find(snippet.strip("\n"))
    if index < 0:
        return 10**9
    return text.count("\n", 0, index) + 1


def lift_forward(
    region: Region,
    before: str,
    before_path: str,
    after: str,
    after_path: str,
    options: LiftOptions,
) -> Rule:
    """The rule one forward region stands for (a spelling; ``learn`` names it)."""
    opaque = opaque_methods(region)
    structure = analyse_source(before, before_path, opaque)
    flow = _flow_of(structure, region, before_path)
    first, last = region.removed
    handed_modules = _handed_modules(region)
    selected = [
        s
        for s in flow.steps
        if first <= _call_line(s) <= last
        and not s.inline_chain
        and (not s.transparent or _module_handed(s, handed_modules))
    ]
    if options.subtract_kept and region.guard is None:  # a guard's else arm is the original
        for key in _kept_calls(region, after, after_path, opaque):
            for step in selected:
                if _kept_key(step) == key:
                    selected.remove(step)
                    break
    # A call whose whole text the kernel is handed (``hidden_states[:, slice_indices, :]``) is
    # one of the kernel's inputs, not part of the computation it replaces.
    module = cst.Module([])
    handed = {
        _normal(module.code_for_node(arg.value)) for arg in region.call.node.args if not arg.star
    }
    selected = [
        step
        for step in selected
        if step.node is None or _normal(ast.unparse(step.node)) not in handed
    ]
    if not selected:
        raise LearnError(
            before_path,
            first,
            1,
            "the removed statements make no call the scanner sees, so there is nothing for a "
            "pattern to match",
        )
    lifter = _Lifter(structure, flow, options)
    forward = tuple(lifter.step(step) for step in selected)
    for step in selected:
        # A submodule of a class of this file, inlined by extraction, that the kernel is handed:
        # the call is one ``$module`` step, and what its inlined body returns is its result.
        for value in flow.call_results.get(step.output, ()):
            lifter.outputs.setdefault(value, lifter.outputs[step.output])
    replacement = _replacement(region, lifter, flow, selected, after_path)
    guard = None
    if region.guard is not None:
        guard_args = _arguments(region.guard, lifter, after_path, region.guard_name or "")
        guard = Step(Name(region.guard_name or ""), guard_args)
        blanks = tuple(
            Step(
                Literal(None),
                (),
                (_named_output(name, region, lifter, flow, selected, after_path),),
            )
            for name in region.none_targets
        )
        replacement = blanks + replacement
    init = lifter.init_steps()
    where = _consumer_constraints(flow, selected, lifter, replacement[-1].targets)
    rule = Rule(
        id="learned",
        name="learned",
        kernel=region.call.kernel,
        init=Section("init", init) if init else None,
        forward=Section("forward", forward, where, replacement=replacement, guard=guard),
        scope=options.scope,
    )
    return _with_kernel_needs(rule, lifter)


def _with_kernel_needs(rule: Rule, lifter: _Lifter) -> Rule:
    """The rule with the flags the kernel's registry entry declares for the submodules it is
    handed (``Entry.needs``: ``linear_bias_activation``'s Linear has ``bias=True``) asked of
    their constructions. One example cannot say them: its ``nn.Linear(a, b)`` is biased by
    default, but whether an unbiased one would do is the kernel's to say, not the example's, and
    keeping every flag the example shows would also keep those the kernel does not care about
    (paper.9's ``bias=False`` projections, which its kernel fuses biased or not). An example
    whose own construction gives the flag another constant contradicts the kernel: an error."""
    needed = needed_flags(rule, rule.kernel)
    if not needed or rule.init is None:
        return rule
    built = {lifter.modules[path].name: c for path, c in lifter.constructions.items()}
    added: dict[str, list[Keyword]] = {}
    for flag in needed:
        target = flag.construction.targets[0].name
        construction = built.get(target)
        operand = construction.arguments.get(flag.key) if construction is not None else None
        if construction is not None and operand is not None and operand.is_constant:
            if operand.constant is not flag.value:
                raise LearnError(
                    construction.path,
                    construction.line,
                    construction.column,
                    f"`{construction.kind}` is built with {flag.key}={operand.constant!r}, but "
                    f"{rule.kernel} is declared (adopter/kernels/registry.py) for a "
                    f"`{flag.parameter}` with {flag.key}={flag.value}: {flag.why}",
                )
        if not flag.asked:
            added.setdefault(target, []).append(Keyword(flag.key, Literal(flag.value)))
    steps = tuple(
        replace(step, args=(*step.args, *added[step.targets[0].name]))
        if step.construct and step.targets and step.targets[0].name in added
        else step
        for step in rule.init.steps
    )
    return replace(rule, init=replace(rule.init, steps=steps))


def _consumer_constraints(
    flow: FunctionFlow, selected: list[FlowStep], lifter: _Lifter, targets: tuple[Var, ...]
) -> tuple[Step, ...]:
    """``where`` steps for what the kept code does with the kernel's results: when every
    result (two or more) is next handed, as its first argument, to a call of one family that
    names many spellings (``split_heads``: ``view``, ``reshape``, ``transpose``, a helper doing
    one), the example says the results are used alike, and the rule asks the same of a site
    (paper.9's q, k and v each split into heads). A consumer of another kind, or one result
    consumed differently, says nothing general, so nothing is asked."""
    if len(targets) < 2:
        return ()
    chosen = {step.id for step in selected}
    by_id = {step.id: step for step in flow.steps}
    value_of = {lifter.outputs[step.output].name: step.output for step in selected}
    common: set[str] | None = None
    for target in targets:
        value = value_of.get(target.name)
        if value is None:
            return ()
        families = set()
        for use in flow.consumers(value):
            consumer = by_id.get(use.step) if use.step is not None else None
            if consumer is None or consumer.id in chosen or not consumer.positional:
                continue
            family = step_family(consumer.kind)
            if family and any(f.value == value for f in consumer.positional[0].flows):
                families.add(family)
        common = families if common is None else common & families
    return tuple(
        Step(Name(family), (Positional(target), Rest()))
        for family in sorted(common or ())
        for target in targets
    )


def _handed_modules(region: Region) -> set[str]:
    """The texts of the kernel's arguments that name a ``self`` attribute (a submodule)."""
    module = cst.Module([])
    texts = {_normal(module.code_for_node(arg.value)) for arg in region.call.node.args}
    return {text for text in texts if re.fullmatch(r"self(\.\w+)+", text)}


def _module_handed(step: FlowStep, handed: set[str]) -> bool:
    """A transparent step (the call of a submodule whose class extraction inlined) that the
    kernel takes whole: it is handed that submodule."""
    return step.module is not None and _indexed(step.module) in handed


def _final_names(region: Region, flow: FunctionFlow, selected: list[FlowStep]) -> dict[str, int]:
    """The selected step (by index) whose result each name holds after the removed
    statements: ``name = <call>`` binds the name to the call's step, ``alias = name`` copies
    the binding (``residual = hidden_states`` keeps the sum the next statement overwrites).
    Calls are paired with steps by their text, in order."""
    pending: dict[str, list[int]] = {}
    for index, step in enumerate(selected):
        if step.node is not None:
            pending.setdefault(_normal(ast.unparse(step.node)), []).append(index)
    module = cst.Module([])
    held: dict[str, int] = {}
    for node in region.removed_nodes:
        try:
            tree = ast.parse(textwrap.dedent(module.code_for_node(node)))
        except SyntaxError:
            return {}
        for statement in tree.body:
            _bind(statement, pending, held)
    return held


def _bind(statement: ast.stmt, pending: dict[str, list[int]], held: dict[str, int]) -> None:
    if not isinstance(statement, ast.Assign):
        return
    names = [t.id for t in statement.targets if isinstance(t, ast.Name)]
    value = statement.value
    if isinstance(value, ast.Name):
        source = held.get(value.id)
    else:
        queue = pending.get(_normal(ast.unparse(value)))
        source = queue.pop(0) if queue else None
    for name in names:
        if source is None:
            held.pop(name, None)
        else:
            held[name] = source


def _replacement(
    region: Region,
    lifter: _Lifter,
    flow: FunctionFlow,
    selected: list[FlowStep],
    after_path: str,
) -> tuple[Step, ...]:
    call = region.call
    args = _arguments(call.node, lifter, after_path, call.kernel)
    targets = _targets(region, lifter, flow, selected, after_path)
    return (Step(Name(call.kernel), args, targets),)


def _arguments(
    node: cst.Call, lifter: _Lifter, after_path: str, callee: str
) -> tuple[Positional | Keyword | Rest, ...]:
    module = cst.Module([])
    args: list[Positional | Keyword | Rest] = []
    for position, arg in enumerate(node.args, 1):
        if arg.star:
            args.append(Rest())
            continue
        text = module.code_for_node(arg.value)
        value = _argument(text, lifter)
        if value is None:
            start = 1
            raise LearnError(
                after_path,
                start,
                1,
                f"argument {position} of {callee.rsplit('.', 1)[-1]} (`{text}`) is none of "
                "the values the removed code reads, a submodule it calls, or a constant",
            )
        if arg.keyword is not None:
            args.append(Keyword(arg.keyword.value, value))
        else:
            args.append(Positional(value))
    return tuple(args)


def _argument(text: str, lifter: _Lifter) -> Expr | None:
    normal = _normal(text)
    if normal in lifter.by_text:
        return lifter.by_text[normal]
    try:
        value = ast.literal_eval(normal)
    except (ValueError, SyntaxError):
        value = ...
    if value is not ... and _literal_ok(value):
        return Literal(value)
    if re.fullmatch(r"[A-Za-z_][\w.]*", normal) and (
        lifter._imported(normal) or normal in lifter.callees
    ):
        return Name(normal)  # ``torch.float32``; ``self.loss_function`` the pattern calls
    return None


def _targets(
    region: Region,
    lifter: _Lifter,
    flow: FunctionFlow,
    selected: list[FlowStep],
    after_path: str,
) -> tuple[Var, ...]:
    chosen = {step.id for step in selected}
    escaping = [
        step
        for step in selected
        if any(use.step not in chosen for use in flow.consumers(step.output))
    ]
    if len(region.targets) <= 1:
        if region.targets:
            named = [s for s in selected if flow.value_names.get(s.output) == region.targets[0]]
            if named and named[-1] in escaping:
                return (lifter.outputs[named[-1].output],)
        if escaping:
            return (lifter.outputs[escaping[-1].output],)
        return (lifter.outputs[selected[-1].output],)
    targets = []
    final = _final_names(region, flow, selected)
    for name in region.targets:
        named = [s for s in selected if flow.value_names.get(s.output) == name]
        if name in final:
            named = [selected[final[name]]]
        if not named:
            raise LearnError(
                after_path,
                region.call.line,
                region.call.column,
                f"the kernel's result `{name}` is no value the removed code computes",
            )
        targets.append(lifter.outputs[named[-1].output])
    return tuple(targets)


def _named_output(
    name: str,
    region: Region,
    lifter: _Lifter,
    flow: FunctionFlow,
    selected: list[FlowStep],
    after_path: str,
) -> Var:
    named = [s for s in selected if flow.value_names.get(s.output) == name]
    if not named:
        raise LearnError(
            after_path,
            region.call.line,
            region.call.column,
            f"`{name} = None` names no value the removed code computes",
        )
    return lifter.outputs[named[-1].output]


def lift_init(region: Region, before: str, before_path: str) -> Rule:
    """The rule of an edit in ``__init__`` that wraps a submodule's class in a kernel factory:
    ``self.attn = Attention(config)`` becomes ``self.attn = factory(Attention)(config)``."""
    call = region.call
    if call.wrapped is None:
        raise LearnError(
            before_path,
            region.removed[0],
            1,
            f"the change in {region.owner}.__init__ calls {call.kernel} on no class: an edit in "
            "__init__ is learnt when it wraps the class a submodule is built from "
            "(kernel(Class)(arguments))",
        )
    structure = analyse_source(before, before_path)
    info = structure.classes.get(region.owner or "")
    first, last = region.removed
    found: tuple[str, Construction] | None = None
    if info is not None:
        for attribute, constructions in info.bindings.items():
            for construction in constructions:
                if (
                    first <= construction.line <= last
                    and construction.kind.rsplit(".", 1)[-1] == call.wrapped.rsplit(".", 1)[-1]
                ):
                    found = (attribute, construction)
    if found is None:
        raise LearnError(
            before_path,
            first,
            1,
            f"no submodule built from {call.wrapped} in the removed statements of "
            f"{region.owner}.__init__",
        )
    attribute, construction = found
    names = _Vars()
    target = names.fresh(attribute.rsplit(".", 1)[-1])
    module = cst.Module([])
    before_args = {}
    for index, op in enumerate(construction.positional):
        before_args[("pos", index)] = _normal(op.text)
    for key, op in construction.arguments.items():
        if op.node is not None and all(op is not p for p in construction.positional):
            before_args[("key", key)] = _normal(op.text)
    pattern_args: list[Positional | Keyword | Rest] = []
    replacement_args: list[Positional | Keyword | Rest] = []
    positional_index = 0
    for arg in call.node.args:
        text = _normal(module.code_for_node(arg.value))
        if arg.keyword is not None:
            key = arg.keyword.value
            if before_args.get(("key", key)) != text:
                raise LearnError(
                    before_path,
                    construction.line,
                    construction.column,
                    f"`{key}=` differs between the construction and the kernel's: learn "
                    "takes a factory that passes the construction's arguments through",
                )
            var = names.fresh(key)
            pattern_args.append(Keyword(key, var))
            replacement_args.append(Keyword(key, var))
        else:
            if before_args.get(("pos", positional_index)) != text:
                raise LearnError(
                    before_path,
                    construction.line,
                    construction.column,
                    f"argument {positional_index + 1} differs between the construction and "
                    "the kernel's",
                )
            var = names.fresh(text if text.isidentifier() else f"arg{positional_index + 1}")
            pattern_args.append(Positional(var))
            replacement_args.append(Positional(var))
            positional_index += 1
    pattern_args.append(Rest())
    replacement_args.append(Rest())
    kind = call.wrapped
    pattern = Step(Name(kind), tuple(pattern_args), (target,), construct=True)
    factory = Call(Name(call.kernel), (Positional(Name(kind)),))
    replacement = Step(factory, tuple(replacement_args), (target,), construct=True)
    forward = None
    if info is not None and any(
        step.module == f"self.{attribute}"
        for flow in info.flows.values()
        if flow.method != "__init__"
        for step in flow.steps
    ):
        forward = Section("forward", (Step(target, (Rest(),), (names.fresh("output"),)),))
    return Rule(
        id="learned",
        name="learned",
        kernel=call.kernel,
        site="init",
        init=Section("init", (pattern,), replacement=(replacement,)),
        forward=forward,
    )
