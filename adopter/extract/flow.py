"""``forward`` analysis: the calls a method makes, in three-address form, linked by data flow.

Every call, operator and subscript becomes a :class:`Step` with a fresh output value; variables
map to the values that may reach them (several after an ``if``, each tagged with the branch arm
it came through). Calls into other methods of the class, into module-level functions and into
submodules whose class is defined in the same file are inlined up to a bounded depth, so a
pattern can follow a value across them. Calls to methods that a rule names (``self._split_heads``)
stay opaque steps so the rule can see them.
"""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .constructions import call_kind, constant_value, normalise_arguments, self_attribute
from .model import (
    EMPTY_CONTEXT,
    NOT_CONSTANT,
    BranchPoint,
    ClassInfo,
    Construction,
    Context,
    Flow,
    FunctionFlow,
    ModuleRef,
    Operand,
    Step,
    Use,
)
from .names import (
    ACTIVATION,
    ACTIVATION_FUNCTIONS,
    DROPOUT_FUNCTION,
    activation_family,
    canonical_function,
    construction_family,
    parameter_names,
)
from .ranks import RankTracker

LAST_DIMENSION_OPS = {"torch.nn.functional.softmax"}
# Modules whose call is recorded as the function they compute, with the module's arguments
# (``self.softmax = nn.Softmax(dim=-1)``; ``self.softmax(x)`` is ``softmax(x, dim=-1)``).
MODULE_FUNCTIONS = {"torch.nn.Softmax": "torch.nn.functional.softmax"}

if TYPE_CHECKING:
    from .structure import FileAnalysis

_LOSS_MODULE = re.compile(r"torch\.nn\.[A-Z]\w*Loss")  # torch.nn.CrossEntropyLoss, ...
MAX_CALL_DEPTH = 4  # nested inlined methods / functions
MAX_CLASS_DEPTH = 1  # nested inlined submodule classes
MAX_STEPS = 20000  # per analysed root; beyond it the flow is marked truncated

# ``x ** -0.5``, ``x.pow(-0.5)``, ``torch.pow(x, -0.5)`` are ``torch.rsqrt(x)`` (Gemma 4 writes its
# RMSNorm with ``torch.pow`` to match another framework's numerics; the value is the same op).
POWER_KINDS = frozenset(["pow", "Tensor.pow", "torch.pow"])


def _reciprocal_root(
    kind: str, positional: list[Operand], arguments: dict[str, Operand]
) -> tuple[str, list[Operand], dict[str, Operand]]:
    """A power with the constant exponent -0.5 as the one-argument ``torch.rsqrt``."""
    exponent = positional[1] if len(positional) == 2 else None
    if exponent is None and len(positional) == 1:
        exponent = arguments.get("exponent")
    others = [a for key, a in arguments.items() if key != "exponent" and a is not exponent]
    if exponent is None or exponent.flows or others:
        return kind, positional, arguments
    value = exponent.constant
    if type(value) is float and value == -0.5:
        return "torch.rsqrt", positional[:1], {}
    return kind, positional, arguments


BINARY_OPERATORS = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "truediv",
    ast.FloorDiv: "floordiv",
    ast.Mod: "mod",
    ast.Pow: "pow",
    ast.MatMult: "matmul",
    ast.BitAnd: "and_",
    ast.BitOr: "or_",
    ast.BitXor: "xor",
    ast.LShift: "lshift",
    ast.RShift: "rshift",
}
UNARY_OPERATORS = {ast.USub: "neg", ast.UAdd: "pos", ast.Not: "not_", ast.Invert: "invert"}


def _parallel(node: ast.Assign) -> bool:
    """``a, b = x, y``: one tuple target, a tuple of as many plain elements on the right."""
    if len(node.targets) != 1:
        return False
    target, value = node.targets[0], node.value
    if not (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))):
        return False
    elements = [*target.elts, *value.elts]
    return len(target.elts) == len(value.elts) and not any(
        isinstance(e, ast.Starred) for e in elements
    )


def delegates(function: ast.FunctionDef) -> bool:
    """``forward(self, x)`` whose whole body hands its parameters to one call of an attribute
    of ``self`` (a submodule) and returns what it gives: ``return self.predictions(x)``, or the
    same through one local name."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if len(body) == 2 and isinstance(body[0], ast.Assign) and isinstance(body[1], ast.Return):
        (target,) = body[0].targets if len(body[0].targets) == 1 else (None,)
        returned = body[1].value
        if not (
            isinstance(target, ast.Name)
            and isinstance(returned, ast.Name)
            and returned.id == target.id
        ):
            return False
        call = body[0].value
    elif len(body) == 1 and isinstance(body[0], ast.Return):
        call = body[0].value
    else:
        return False
    if not (isinstance(call, ast.Call) and self_attribute(call.func) is not None):
        return False
    parameters = {a.arg for a in [*function.args.posonlyargs, *function.args.args][1:]}
    parameters |= {a.arg for a in function.args.kwonlyargs}
    values = [*call.args, *(k.value for k in call.keywords if k.arg is not None)]
    if len(values) != len(call.args) + len(call.keywords):
        return False  # ``**kwargs`` passed on
    return bool(values) and all(isinstance(v, ast.Name) and v.id in parameters for v in values)


def _last_dimension_slice(node: ast.expr) -> Operand | None:
    """``x[..., 0::2]``, ``x[..., 1::2]``, ``x[..., :half]``, ``shape[:-1]``,
    ``logits[..., :-1, :]``: slices with constant bounds over the last dimensions (or, without
    ``...``, one slice of the first) are one constant index, written ``..., start:stop:step``
    (``start:stop:step``; ``..., :-1, :`` for several) with omitted parts left out (a start of 0
    folded away), so a rule can name the even and odd elements, the leading sizes or the
    positions a causal LM's shifted logits keep."""
    prefix, slices = "", [node]
    if isinstance(node, ast.Tuple) and len(node.elts) >= 2:
        ellipsis, *slices = node.elts
        if not (isinstance(ellipsis, ast.Constant) and ellipsis.value is Ellipsis):
            return None
        prefix = "..., "
    texts = [_constant_slice(part) for part in slices]
    if any(text is None for text in texts):
        return None
    text = prefix + ", ".join(text for text in texts if text is not None)
    return Operand(node=node, constant=text, label=repr(text))


def _constant_slice(node: ast.expr) -> str | None:
    """``start:stop:step`` of a slice whose bounds are integer constants, else None."""
    if not isinstance(node, ast.Slice):
        return None
    parts = []
    for bound in (node.lower, node.upper, node.step):
        value = None if bound is None else constant_value(bound)
        if bound is not None and (not isinstance(value, int) or isinstance(value, bool)):
            return None
        parts.append(value)
    if parts[0] == 0:
        parts[0] = None
    start, stop, step = ("" if p is None else str(p) for p in parts)
    return f"{start}:{stop}" + (f":{step}" if step else "")


_COMPARE_OPS = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}


class _Terminated(Exception):
    """Raised inside a block after ``return``/``raise`` to skip the rest of it."""


@dataclass
class Frame:
    """One function activation being analysed (the root or an inlined callee)."""

    cls: ClassInfo | None
    self_path: str | None
    method: str
    env: dict[str, tuple[Flow, ...]] = field(default_factory=dict)
    modules: dict[str, ModuleRef] = field(default_factory=dict)
    returns: list[Flow] = field(default_factory=list)
    returned_tuples: list[list[Operand]] = field(default_factory=list)
    class_depth: int = 0
    inlined: bool = False
    scripted: bool = False
    chain: tuple[str, ...] = ()  # methods inlined to reach this frame
    function: ast.FunctionDef | None = None
    # local names that may hold a module-level function of this file (``attention_interface``)
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)


class FlowBuilder:
    """Builds the :class:`FunctionFlow` of one root method or function."""

    def __init__(self, analysis: FileAnalysis, flow: FunctionFlow) -> None:
        self.analysis = analysis
        self.flow = flow
        self.context: Context = EMPTY_CONTEXT
        self.frames: list[Frame] = []
        self.next_value = 0
        self.active: list[ast.FunctionDef] = []
        self.tuples: dict[int, list[Operand]] = {}
        self.statement: ast.stmt | None = None
        self.ranks = RankTracker()
        self.replay: int | None = None  # first step of a loop body being replayed
        self.replay_next = 0
        self.replay_end = 0
        # ``cfg.cap`` read again on a path through an earlier read of the same value: the same
        # value (T5Gemma's ``decoder_config.final_logit_softcapping`` of a configuration an
        # unknown method returned). Keyed by attribute and the base's flows; each entry keeps
        # the context it was read in, and a store to that attribute forgets it.
        self.attribute_reads: dict[tuple[str, tuple[Flow, ...]], tuple[Operand, Context]] = {}
        self.loop_depth = 0  # loop bodies are analysed twice; their reads are not remembered
        # qualified names of the functions defined in an analysed body (``Cls.__call__.f``)
        self.nested_names: dict[int, str] = {}

    # -- entry -------------------------------------------------------------------------------
    def build_root(
        self,
        cls: ClassInfo | None,
        function: ast.FunctionDef,
        modules: dict[str, ClassInfo | ModuleRef] | None = None,
    ) -> FunctionFlow:
        """Analyse ``function``; ``modules`` binds parameters to instances of module classes
        of this file (an attention processor's ``attn``)."""
        frame = Frame(
            cls=cls,
            self_path="self" if cls else None,
            method=function.name,
            scripted=is_scripted(function, self.analysis),
            function=function,
        )
        arguments = function.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            if cls is not None and arg is (arguments.posonlyargs + arguments.args)[:1][0]:
                continue
            owner = (modules or {}).get(arg.arg)
            if isinstance(owner, ModuleRef):  # a module given as it is (an nn.Sequential)
                frame.modules[arg.arg] = owner
                continue
            if owner is not None:
                instance = Construction(
                    kind=owner.name, arguments={}, positional=[], path=self.flow.path,
                    line=arg.lineno, column=arg.col_offset + 1,
                )  # fmt: skip
                frame.modules[arg.arg] = ModuleRef(arg.arg, [instance])
                continue
            frame.env[arg.arg] = (Flow(self.new_value(arg.arg)),)
        for arg in (arguments.vararg, arguments.kwarg):
            if arg is not None:
                frame.env[arg.arg] = (Flow(self.new_value(arg.arg)),)
        self.frames.append(frame)
        self.active.append(function)
        try:
            self.block(function.body)
        except _Terminated:
            pass
        except _Budget:
            self.flow.truncated = True
        return self.flow

    @property
    def frame(self) -> Frame:
        return self.frames[-1]

    @property
    def in_module(self) -> bool:
        """The analysed root is a method of an ``nn.Module`` class."""
        root = self.frames[0].cls
        return root is not None and root.is_module

    def new_value(self, name: str | None = None) -> int:
        self.next_value += 1
        if name is not None:
            self.flow.value_names.setdefault(self.next_value, name)
        return self.next_value

    # -- statements --------------------------------------------------------------------------
    def block(self, statements: Iterable[ast.stmt]) -> None:
        for statement in statements:
            self.statement = statement
            self.stmt(statement)

    def stmt(self, node: ast.stmt) -> None:  # noqa: C901 - one dispatch over statement kinds
        if isinstance(node, ast.Assign) and _parallel(node):
            # ``a, b = x[..., ::2], x[..., 1::2]``: the tuple on the right is never a value of
            # its own, each element goes to its target
            values = [self.expr(element) for element in node.value.elts]  # type: ignore[attr-defined]
            for target, value, element in zip(node.targets[0].elts, values, node.value.elts):  # type: ignore[attr-defined]
                self.assign(target, value, element)
                self.bind_function(target, element)
        elif isinstance(node, ast.Assign):
            value = self.expr(node.value)
            for target in node.targets:
                self.assign(target, value, node.value)
                self.bind_function(target, node.value)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.assign(node.target, self.expr(node.value), node.value)
                self.bind_function(node.target, node.value)
        elif isinstance(node, ast.AugAssign):
            current = self.expr(node.target)
            value = self.expr(node.value)
            kind = BINARY_OPERATORS.get(type(node.op), "binop")
            result = self.emit(kind, node, [current, value], {})
            self.assign(node.target, result, node)
        elif isinstance(node, ast.Expr):
            self.expr(node.value)
        elif isinstance(node, ast.Return):
            if node.value is not None:
                value = self.expr(node.value)
                self.return_value(value, node.value)
            raise _Terminated
        elif isinstance(node, ast.Raise):
            if node.exc is not None:
                self.escape(self.expr(node.exc), "raise")
            raise _Terminated
        elif isinstance(node, ast.If):
            self.escape(self.expr(node.test), "condition")
            self.branches([node.body, node.orelse], BranchPoint("if", node.test))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self.loop_target(node.target, node.iter)
            self.loop(node.body, BranchPoint("loop", node.iter))
            if node.orelse:
                self.block(node.orelse)
        elif isinstance(node, ast.While):
            self.escape(self.expr(node.test), "condition")
            self.loop(node.body, BranchPoint("while", node.test))
            self.block(node.orelse)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                value = self.expr(item.context_expr)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, value, item.context_expr)
            self.block(node.body)
        elif isinstance(node, ast.Try):
            arms = [node.body + node.orelse] + [handler.body for handler in node.handlers]
            self.branches(arms, BranchPoint("try", None, len(arms)))
            self.block(node.finalbody)
        elif isinstance(node, ast.Assert):
            self.escape(self.expr(node.test), "assert")
        elif isinstance(node, (ast.Break, ast.Continue)):
            raise _Terminated
        elif isinstance(node, ast.FunctionDef) and not node.decorator_list and not self.in_module:
            # a function defined in a processor's body (diffusers define their rotary helper
            # there): its calls are inlined like those of a module-level function. In module
            # methods they stay opaque for now: there (``shape``/``unshape`` of BERT-era
            # attention) they would open fused-QKV sites the 2023 benchmark does not count.
            self.frame.env.pop(node.name, None)
            self.frame.modules.pop(node.name, None)
            self.frame.functions[node.name] = node
            outer = self.frame
            owner = f"{outer.cls.name}." if outer.cls is not None else ""
            outer_name = self.nested_names.get(id(outer.function), f"{owner}{outer.method}")
            self.nested_names[id(node)] = f"{outer_name}.{node.name}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.frame.env[node.name] = (Flow(self.new_value(node.name)),)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.frame.env.pop(target.id, None)
        elif isinstance(node, ast.Match):
            self.escape(self.expr(node.subject), "match")
            self.branches(
                [case.body for case in node.cases], BranchPoint("match", None, len(node.cases))
            )

    def branches(self, arms: list[list[ast.stmt]], branch: BranchPoint) -> None:
        """Analyse alternative arms from the same state, then merge what flows out of them."""
        point = self.analysis.next_branch()
        self.flow.branch_labels[point] = branch
        frame = self.frame
        outer_context = self.context
        entry_env, entry_modules = dict(frame.env), dict(frame.modules)
        entry_functions = dict(frame.functions)
        survivors: list[tuple[int, dict[str, tuple[Flow, ...]], dict[str, ModuleRef]]] = []
        functions: dict[str, ast.FunctionDef] = {}
        for arm, statements in enumerate(arms):
            frame.env, frame.modules = dict(entry_env), dict(entry_modules)
            frame.functions = dict(entry_functions)
            self.context = outer_context | {(point, arm)}
            try:
                self.block(statements)
            except _Terminated:
                continue
            survivors.append((arm, frame.env, frame.modules))
            # a function that one arm may leave in a name may be called after the branch
            for name, function in frame.functions.items():
                functions.setdefault(name, function)
        frame.functions = functions
        if not survivors:
            self.context = outer_context
            raise _Terminated
        if len(survivors) == 1:
            arm, frame.env, frame.modules = survivors[0]
            self.context = outer_context | {(point, arm)}
            return
        self.context = outer_context
        merged: dict[str, tuple[Flow, ...]] = {}
        names = {name for _, env, _ in survivors for name in env}
        for name in names:
            versions = [(arm, env.get(name)) for arm, env, _ in survivors]
            first = versions[0][1]
            if all(version is first or version == first for _, version in versions):
                if first is not None:
                    merged[name] = first
                continue
            flows: list[Flow] = []
            for arm, version in versions:
                for flow in version or ():
                    flows.append(Flow(flow.value, flow.context | {(point, arm)}))
            merged[name] = tuple(dict.fromkeys(flows))
        frame.env = merged
        frame.modules = {
            name: ref
            for name, ref in survivors[0][2].items()
            if all(modules.get(name) is ref for _, _, modules in survivors)
        }

    def loop(self, body: list[ast.stmt], branch: BranchPoint) -> None:
        """A loop body runs zero or more times. After analysing it once, replay it with the
        values that flow round the loop, adding only the uses that the next iteration makes of
        this one's results (a value fused away in one iteration may be read by the next)."""
        start = len(self.flow.steps)
        self.loop_depth += 1
        try:
            self.branches([body, []], branch)
        finally:
            self.loop_depth -= 1
        end = len(self.flow.steps)
        if self.replay is not None or end == start:
            return
        frame = self.frame
        saved = (dict(frame.env), dict(frame.modules), self.context, self.statement)
        self.replay, self.replay_next, self.replay_end = start, start, end
        try:
            self.block(body)
        except (_Terminated, _ReplayDiverged):
            pass
        finally:
            self.replay = None
            frame.env, frame.modules, self.context, self.statement = saved

    def loop_target(self, target: ast.expr, iterable: ast.expr) -> None:
        """Bind the loop variable; iterating a ModuleList binds it to the list's elements."""
        source = iterable
        element_target = target
        if (
            isinstance(iterable, ast.Call)
            and isinstance(iterable.func, ast.Name)
            and iterable.func.id == "enumerate"
            and iterable.args
            and isinstance(target, ast.Tuple)
            and len(target.elts) == 2
        ):
            source, element_target = iterable.args[0], target.elts[1]
            self.assign(target.elts[0], Operand(flows=(Flow(self.new_value()),)), iterable)
        ref = self.module_ref(source)
        if ref is not None and isinstance(element_target, ast.Name):
            elements = [e for c in ref.constructions for e in c.elements]
            self.frame.modules[element_target.id] = ModuleRef(f"{ref.path}[*]", elements)
            self.frame.env.pop(element_target.id, None)
            return
        value = self.expr(iterable)
        element = self.emit("iter", iterable, [value], {})
        self.assign(target, element, iterable)

    def bind_function(self, target: ast.expr, value: ast.expr) -> None:
        """``attention_interface = eager_attention_forward`` or
        ``= ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager_attention_forward)`` (a registry
        lookup with this file's function as its default): calling the name may run it."""
        if not isinstance(target, ast.Name):
            return
        frame = self.frame
        function = self.function_named(value)
        if (
            function is None
            and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in ("get_interface", "get")
            and value.args
        ):
            function = self.function_named(value.args[-1])
        if function is not None:
            frame.functions[target.id] = function
        else:
            frame.functions.pop(target.id, None)

    def function_named(self, node: ast.expr) -> ast.FunctionDef | None:
        if not isinstance(node, ast.Name):
            return None
        frame = self.frame
        if node.id in frame.functions:
            return frame.functions[node.id]
        if node.id in frame.env or node.id in frame.modules:
            return None
        return self.analysis.functions.get(node.id)

    def assign(self, target: ast.expr, value: Operand, value_node: ast.AST) -> None:
        frame = self.frame
        if isinstance(target, ast.Name):
            if value.module is not None:
                frame.modules[target.id] = value.module
                frame.env.pop(target.id, None)
                return
            frame.modules.pop(target.id, None)
            frame.env[target.id] = value.flows
            for flow in value.flows:
                self.flow.value_names.setdefault(flow.value, target.id)
            return
        if isinstance(target, (ast.Tuple, ast.List)):
            elements = self.tuple_elements(value, len(target.elts), value_node)
            for index, sub_target in enumerate(target.elts):
                if isinstance(sub_target, ast.Starred):
                    sub_target = sub_target.value
                self.assign(sub_target, elements[index], value_node)
            return
        if isinstance(target, ast.Starred):
            self.assign(target.value, value, value_node)
            return
        # self.x = value, obj[i] = value: the value escapes into state we do not follow.
        self.escape(value, "store")
        if isinstance(target, ast.Subscript):
            self.escape(self.expr(target.value), "store")
            self.escape(self.expr(target.slice), "store")
        elif isinstance(target, ast.Attribute) and self_attribute(target) is None:
            self.escape(self.expr(target.value), "store")
        if isinstance(target, ast.Attribute):
            self.attribute_reads = {
                key: read for key, read in self.attribute_reads.items() if key[0] != target.attr
            }

    def tuple_elements(self, value: Operand, count: int, node: ast.AST) -> list[Operand]:
        """Elements of a value unpacked into ``count`` targets."""
        if len(value.flows) == 1 and value.flows[0].value in self.tuples:
            elements = self.tuples[value.flows[0].value]
            if len(elements) == count and not any(e is None for e in elements):
                return elements
        return [
            self.emit("getitem", node, [value], {"index": Operand(constant=i, label=str(i))})
            for i in range(count)
        ]

    def return_value(self, value: Operand, node: ast.AST) -> None:
        frame = self.frame
        if frame.inlined:
            frame.returns.extend(Flow(f.value, f.context | self.context) for f in value.flows)
            if len(value.flows) == 1 and value.flows[0].value in self.tuples:
                frame.returned_tuples.append(self.tuples[value.flows[0].value])
            else:
                frame.returned_tuples.append([])  # not a tuple we know: no elementwise merge
        else:
            self.escape(value, "return")

    # -- uses --------------------------------------------------------------------------------
    def escape(self, operand: Operand, where: str) -> None:
        for flow in operand.flows:
            self.flow.uses.setdefault(flow.value, []).append(
                Use(None, self.context | flow.context, where)
            )

    def emit(
        self,
        kind: str,
        node: ast.AST,
        positional: list[Operand],
        arguments: dict[str, Operand],
        *,
        module: ModuleRef | None = None,
        transparent: bool = False,
        synthetic_at: Construction | None = None,
    ) -> Operand:
        if kind in POWER_KINDS:
            kind, positional, arguments = _reciprocal_root(kind, positional, arguments)
        if self.replay is not None:
            return self.replayed(kind, [*positional, *arguments.values()])
        if len(self.flow.steps) >= MAX_STEPS:
            raise _Budget
        output = self.new_value()
        frame = self.frame
        location = synthetic_at.node if synthetic_at is not None else node
        step = Step(
            id=len(self.flow.steps),
            kind=kind,
            positional=positional,
            arguments=arguments,
            output=output,
            line=getattr(location, "lineno", 0),
            column=getattr(location, "col_offset", -1) + 1,
            context=self.context,
            cls=frame.cls.name if frame.cls else None,
            method=frame.method,
            path=self.flow.path,
            node=node,
            statement=self.statement,
            module=module.path if module else None,
            construction=module.constructions[0] if module and module.constructions else None,
            alternatives=list(module.constructions) if module else [],
            transparent=transparent,
            synthetic=synthetic_at is not None,
            scripted=frame.scripted,
            function=frame.function,
            inline_chain=frame.chain,
        )
        rank = (
            self.ranks.infer_getitem(positional[0], node.slice)
            if kind == "getitem" and isinstance(node, ast.Subscript) and positional
            else self.ranks.infer(kind, node, positional, self.tuples)
        )
        if rank is not None:
            self.ranks.ranks[output] = rank
            if kind in LAST_DIMENSION_OPS:
                self.normalise_last_dimension(step, rank)
        elif kind in LAST_DIMENSION_OPS and positional:
            input_rank = self.ranks.rank_of(positional[0])
            if input_rank is not None:
                self.normalise_last_dimension(step, input_rank)
        self.flow.steps.append(step)
        self.flow.producers[output] = step.id
        for operand in step.operands():
            for flow in operand.flows:
                self.flow.uses.setdefault(flow.value, []).append(
                    Use(step.id, self.context | flow.context)
                )
        return Operand(node=node, flows=(Flow(output),))

    def attribute_read(self, node: ast.Attribute, base: Operand) -> Operand:
        """``base.attr``: the value an earlier read of it produced when that read ran on every
        path to this one, else a new ``getattr.attr`` step."""
        key = (node.attr, base.flows)
        remember = self.loop_depth == 0 and self.replay is None
        earlier = self.attribute_reads.get(key) if remember else None
        if earlier is not None and earlier[1] <= self.context:
            return Operand(node=node, flows=earlier[0].flows)
        value = self.emit(f"getattr.{node.attr}", node, [base], {})
        if remember:
            self.attribute_reads[key] = (value, self.context)
        return value

    def normalise_last_dimension(self, step: Step, rank: int) -> None:
        """``softmax(x, dim=3)`` on a 4-D ``x`` is a softmax over the last dimension."""
        dim = step.arguments.get("dim")
        if dim is not None and isinstance(dim.constant, int) and dim.constant == rank - 1 >= 0:
            # In place: the operand is also the call's positional argument, and rewriting
            # keeps its source text.
            dim.label = dim.text
            dim.constant = -1

    def replayed(self, kind: str, operands: list[Operand]) -> Operand:
        """During a loop replay: the step this call produced the first time round, now also
        recorded as a use of whatever flows into it from the previous iteration."""
        if self.replay_next >= self.replay_end:
            raise _ReplayDiverged
        step = self.flow.steps[self.replay_next]
        if step.kind != kind:
            raise _ReplayDiverged
        self.replay_next += 1
        for operand in operands:
            for flow in operand.flows:
                uses = self.flow.uses.setdefault(flow.value, [])
                if not any(use.step == step.id for use in uses):
                    uses.append(Use(step.id, self.context | flow.context, "next iteration"))
        return Operand(node=step.node, flows=(Flow(step.output),))

    # -- expressions -------------------------------------------------------------------------
    def expr(self, node: ast.expr) -> Operand:  # noqa: C901 - one dispatch over expression kinds
        if isinstance(node, ast.Constant):
            return Operand(node=node, constant=node.value)
        if isinstance(node, ast.Name):
            frame = self.frame
            if node.id in frame.modules:
                return Operand(node=node, module=frame.modules[node.id])
            return Operand(node=node, flows=frame.env.get(node.id, ()))
        if isinstance(node, ast.Attribute):
            ref = self.module_ref(node)
            if ref is not None:
                return Operand(node=node, module=ref)
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "config"):
                return Operand(node=node)
            base = self.expr(node.value)
            if not base.flows:
                return Operand(node=node)
            return self.attribute_read(node, base)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.BinOp):
            left, right = self.expr(node.left), self.expr(node.right)
            return self.emit(BINARY_OPERATORS.get(type(node.op), "binop"), node, [left, right], {})
        if isinstance(node, ast.UnaryOp):
            constant = constant_value(node)
            if constant is not NOT_CONSTANT:
                return Operand(node=node, constant=constant)
            operand = self.expr(node.operand)
            return self.emit(UNARY_OPERATORS.get(type(node.op), "unary"), node, [operand], {})
        if isinstance(node, ast.Subscript):
            ref = self.module_ref(node)
            if ref is not None:
                return Operand(node=node, module=ref)
            base = self.expr(node.value)
            index = _last_dimension_slice(node.slice) or self.expr(node.slice)
            if (
                index.is_constant
                and isinstance(index.constant, int)
                and len(base.flows) == 1
                and base.flows[0].value in self.tuples
            ):
                elements = self.tuples[base.flows[0].value]
                if -len(elements) <= index.constant < len(elements):
                    return elements[index.constant]
            return self.emit("getitem", node, [base], {"index": index})
        if isinstance(node, (ast.Tuple, ast.List)):
            elements = [self.expr(e.value if isinstance(e, ast.Starred) else e) for e in node.elts]
            constant = constant_value(node) if isinstance(node, ast.Tuple) else NOT_CONSTANT
            if constant is not NOT_CONSTANT:
                return Operand(node=node, constant=constant)
            result = self.emit(
                "tuple" if isinstance(node, ast.Tuple) else "list", node, elements, {}
            )
            if not any(isinstance(e, ast.Starred) for e in node.elts):
                self.tuples[result.flows[0].value] = elements
            return result
        if isinstance(node, ast.IfExp):
            self.escape(self.expr(node.test), "condition")
            point = self.analysis.next_branch()
            self.flow.branch_labels[point] = BranchPoint("if", node.test)
            outer = self.context
            flows: list[Flow] = []
            for arm, sub in enumerate((node.body, node.orelse)):
                self.context = outer | {(point, arm)}
                value = self.expr(sub)
                flows += [Flow(f.value, f.context | {(point, arm)}) for f in value.flows]
            self.context = outer
            return Operand(node=node, flows=tuple(flows))
        if isinstance(node, ast.NamedExpr):
            value = self.expr(node.value)
            self.assign(node.target, value, node.value)
            return value
        if isinstance(node, ast.Compare):
            operands = [self.expr(child) for child in (node.left, *node.comparators)]
            # the operator of a single comparison (``dtype in [...]``), so a rule can tell a test
            # from its negation
            keywords = {}
            if len(node.ops) == 1:
                op = _COMPARE_OPS.get(type(node.ops[0]))
                keywords = {"op": Operand(constant=op, label=repr(op))} if op else {}
            return self.emit("compare", node, operands, keywords)
        if isinstance(node, ast.BoolOp):
            return self.emit("boolop", node, [self.expr(child) for child in node.values], {})
        if isinstance(node, ast.Slice):
            parts = [self.expr(p) for p in (node.lower, node.upper, node.step) if p is not None]
            if not any(part.flows for part in parts):
                return Operand(node=node)
            return self.emit("slice", node, parts, {})
        # Anything else (comprehensions, f-strings, lambdas...): one opaque step
        # that uses every variable the expression reads, so no use goes unnoticed.
        operands = [self.expr(child) for child in _read_names(node)]
        return self.emit(type(node).__name__.lower(), node, operands, {})

    def module_ref(self, node: ast.expr) -> ModuleRef | None:
        """The submodule an expression names: ``self.dense``, ``self.layers[0]``, ``layer``."""
        frame = self.frame
        if isinstance(node, ast.Name):
            return frame.modules.get(node.id)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" and frame.cls:
                constructions = frame.cls.bindings.get(node.attr)
                if constructions:
                    return ModuleRef(f"{frame.self_path}.{node.attr}", constructions)
                return None
            base = self.module_ref(node.value)
            if base is not None:
                owners = [self.analysis.module_class(c.kind) for c in base.constructions]
                if len(owners) == 1 and owners[0] is not None:
                    constructions = owners[0].bindings.get(node.attr)
                    if constructions:
                        return ModuleRef(f"{base.path}.{node.attr}", constructions)
            return None
        if isinstance(node, ast.Subscript):
            base = self.module_ref(node.value)
            if base is None:
                return None
            containers = [c for c in base.constructions if c.container]
            if not containers:
                return None
            index = constant_value(node.slice)
            elements: list[Construction] = []
            for container in containers:
                if (
                    container.container == "sequential"
                    and isinstance(index, int)
                    and -len(container.elements) <= index < len(container.elements)
                ):
                    elements.append(container.elements[index])
                else:
                    elements.extend(container.elements)
            label = index if index is not NOT_CONSTANT else "*"
            return ModuleRef(f"{base.path}[{label}]", elements)
        return None

    # -- calls -------------------------------------------------------------------------------
    def arguments(self, node: ast.Call) -> tuple[list[Operand], dict[str, Operand]]:
        positional = [self.expr(a.value if isinstance(a, ast.Starred) else a) for a in node.args]
        keywords: dict[str, Operand] = {}
        for keyword in node.keywords:
            keywords[keyword.arg or f"**{len(keywords)}"] = self.expr(keyword.value)
        return positional, keywords

    def call(self, node: ast.Call) -> Operand:  # noqa: C901 - the callee kinds
        func = node.func
        frame = self.frame
        # super().forward(...) and friends: the parent's method, when the parent is ours.
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name)
            and func.value.func.id == "super"
            and frame.cls is not None
        ):
            parent = self.analysis.parent_method(frame.cls, func.attr)
            positional, keywords = self.arguments(node)
            if parent is not None:
                return self.inline(parent, frame.cls, frame.self_path, positional, keywords, node)
            return self.emit(f"super.{func.attr}", node, positional, keywords)
        ref = self.module_ref(func)
        if ref is not None:
            positional, keywords = self.arguments(node)
            return self.call_module(ref, node, positional, keywords)
        if isinstance(func, ast.Attribute) and not isinstance(func.value, ast.Call):
            owner_ref = self.module_ref(func.value)
            if owner_ref is not None and len(owner_ref.constructions) == 1:
                # ``attn.get_attention_scores(q, k)``: a method of a submodule of ours
                owner = self.analysis.module_class(owner_ref.constructions[0].kind)
                method = self.analysis.method(owner, func.attr) if owner else None
                foreign = owner is not None and owner.path != self.analysis.path
                if method is not None and f"method.{func.attr}" in self.analysis.opaque_methods:
                    # a rule names this method (``method.get_attention_scores($attn, ...)``): one
                    # step, the receiver first, so the kernel is handed the module itself
                    positional, keywords = self.arguments(node)
                    receiver = Operand(node=func.value, module=owner_ref)
                    return self.emit(f"method.{func.attr}", node, [receiver, *positional], keywords)
                if method is not None and not foreign and frame.class_depth < MAX_CLASS_DEPTH:
                    positional, keywords = self.arguments(node)
                    return self.inline(
                        method, owner, owner_ref.path, positional, keywords, node, class_call=True
                    )
        method_name = self_attribute(func)
        if method_name is not None and frame.cls is not None:
            positional, keywords = self.arguments(node)
            if method_name in self.analysis.opaque_methods:
                return self.emit(f"self.{method_name}", node, positional, keywords)
            method = self.analysis.method(frame.cls, method_name)
            if method is not None:
                return self.inline(method, frame.cls, frame.self_path, positional, keywords, node)
            return self.emit(f"self.{method_name}", node, positional, keywords)
        if isinstance(func, ast.Call):
            inline = self.inline_construction(func)
            if inline is not None:
                positional, keywords = self.arguments(node)
                return self.call_module(inline, node, positional, keywords)
        if isinstance(func, ast.Attribute):
            receiver = self.expr(func.value)
            if receiver.flows:
                positional, keywords = self.arguments(node)
                kind = canonical_function(f"Tensor.{func.attr}")
                arguments = normalise_arguments(
                    f"Tensor.{func.attr}", [receiver, *positional], keywords
                )
                return self.emit(kind, node, [receiver, *positional], arguments)
        kind = call_kind(func, self.analysis.imports)
        positional, keywords = self.arguments(node)
        if kind is None:
            callee = self.expr(func)
            return self.emit("call", node, [callee, *positional], keywords)
        if _LOSS_MODULE.fullmatch(kind):
            # ``loss_fct = CrossEntropyLoss()`` in forward, then ``loss_fct(logits, labels)``: a
            # module without parameters built where it is used, as ``CrossEntropyLoss()(...)``.
            construction = self.pseudo_construction(kind, node, positional, keywords)
            return Operand(node=node, module=ModuleRef(ast.unparse(node), [construction]))
        if isinstance(func, ast.Name) and func.id in self.frame.functions:
            function = self.frame.functions[func.id]
            return self.inline(function, None, None, positional, keywords, node)
        if isinstance(func, ast.Name) and func.id in self.analysis.functions:
            function = self.analysis.functions[func.id]
            helper = self.analysis.canonical_helper(function)
            bound = _helper_arguments(function, positional, keywords) if helper else None
            if helper is not None and bound is not None:
                # ``rotate_half(q)``: one step, whatever the helper's name
                return self.emit(helper, node, bound, {})
            return self.inline(function, None, None, positional, keywords, node)
        if isinstance(func, ast.Name) and func.id in self.analysis.imports.origins:
            imported = self.analysis.imported_helper(func.id)
            if imported is not None:
                bound = _helper_arguments(imported[1], positional, keywords)
                if bound is not None:
                    return self.emit(imported[0], node, bound, {})
        canonical = canonical_function(kind)
        arguments = normalise_arguments(kind, positional, keywords)
        activation = self.activation_function(canonical, node)
        if activation is not None:
            # called like a module on its input; its other arguments stay (by name) as uses
            return self.emit(canonical, node, positional[:1], arguments, module=activation)
        return self.emit(canonical, node, positional, arguments)

    def activation_function(self, kind: str, node: ast.Call) -> ModuleRef | None:
        """An activation applied as a function to a tensor (``F.gelu(h)``,
        ``ACT2FN["gelu"](h)``, ``F.gelu(h, approximate="tanh")``) is recorded like a call of an
        activation module: the callee itself is what a kernel is handed (a rewrite that would
        drop further arguments is refused)."""
        dropout = kind == DROPOUT_FUNCTION
        if not dropout and kind not in ACTIVATION_FUNCTIONS and activation_family(kind) is None:
            return None
        if not node.args or isinstance(node.args[0], ast.Starred):
            return None
        if dropout:
            # ``F.dropout(x, p, training)``: its settings are what a kernel is handed
            positional = [Operand(node=a, constant=constant_value(a)) for a in node.args]
            keywords = {
                k.arg: Operand(node=k.value, constant=constant_value(k.value))
                for k in node.keywords
                if k.arg is not None
            }
            construction = self.pseudo_construction(kind, node.func, positional, keywords)
            return ModuleRef(ast.unparse(node.func), [construction])
        construction = self.pseudo_construction(kind, node.func, [], {})
        construction.family = ACTIVATION
        return ModuleRef(ast.unparse(node.func), [construction])

    def inline_construction(self, func: ast.Call) -> ModuleRef | None:
        """``nn.Softmax(dim=-1)(x)``, ``nn.GELU()(x)``: a torch module built where it is called."""
        kind = call_kind(func.func, self.analysis.imports)
        if kind is None:
            return None
        last = kind.rsplit(".", 1)[-1]
        torch_module = kind.startswith("torch.nn.") and last[:1].isupper()
        if not torch_module and activation_family(kind) is None:
            return None
        positional, keywords = self.arguments(func)
        construction = self.pseudo_construction(kind, func, positional, keywords)
        return ModuleRef(ast.unparse(func), [construction])

    def pseudo_construction(
        self, kind: str, node: ast.expr, positional: list[Operand], keywords: dict[str, Operand]
    ) -> Construction:
        """A module (or function) that is built, or named, where ``forward`` calls it."""
        return Construction(
            kind=kind,
            arguments=normalise_arguments(kind, positional, keywords),
            positional=positional,
            path=self.flow.path,
            line=node.lineno,
            column=node.col_offset + 1,
            context=self.context,
            node=node,
            method=self.frame.method,
            function=self.frame.function,
            family=construction_family(kind),
        )

    def call_module(
        self,
        ref: ModuleRef,
        node: ast.Call,
        positional: list[Operand],
        keywords: dict[str, Operand],
    ) -> Operand:
        frame = self.frame
        if len(ref.constructions) == 1:
            construction = ref.constructions[0]
            function = MODULE_FUNCTIONS.get(construction.kind)
            if function is not None and len(positional) == 1 and not keywords:
                names = set(parameter_names(function)[0])
                # copies: the rank of this call's input may settle ``dim`` for this call only
                settings = {
                    k: copy.copy(v) for k, v in construction.arguments.items() if k in names
                }
                arguments = normalise_arguments(function, positional, settings)
                return self.emit(function, node, positional, arguments)
            if construction.container == "sequential" and construction.elements:
                value = positional[0] if positional else Operand(node=node)
                for index, element in enumerate(construction.elements):
                    element_ref = ModuleRef(f"{ref.path}.{index}", [element])
                    value = self.emit(
                        element.kind, node, [value], {}, module=element_ref, synthetic_at=element
                    )
                return value
            local = self.analysis.local_class(construction.kind)
            if local is not None and frame.class_depth < MAX_CLASS_DEPTH:
                forward = self.analysis.method(local, "forward")
                if forward is not None:
                    summary = self.emit(
                        construction.kind, node, positional, keywords, module=ref, transparent=True
                    )
                    result = self.inline(
                        forward, local, ref.path, positional, keywords, node, class_call=True
                    )
                    if self.replay is None and summary.flows:
                        self.flow.call_results[summary.flows[0].value] = tuple(
                            f.value for f in result.flows
                        )
                    return result
        kind = ref.constructions[0].kind if ref.constructions else "?"
        return self.emit(kind, node, positional, keywords, module=ref)

    def inline(
        self,
        function: ast.FunctionDef,
        cls: ClassInfo | None,
        self_path: str | None,
        positional: list[Operand],
        keywords: dict[str, Operand],
        node: ast.Call,
        class_call: bool = False,
    ) -> Operand:
        """Analyse a callee's body in place, its parameters bound to the call's arguments."""
        depth = len(self.frames) - 1
        qualified = f"{cls.name}.{function.name}" if cls else function.name
        if depth >= MAX_CALL_DEPTH or function in self.active:
            kind = f"self.{function.name}" if cls is not None and not class_call else qualified
            return self.emit(kind, node, positional, keywords)
        frame = Frame(
            cls=cls,
            self_path=self_path,
            method=self.nested_names.get(id(function), function.name),
            # a forward that only hands its input to one submodule (BERT's ``OnlyMLMHead``:
            # ``return self.predictions(x)``) adds no depth: the work is one class further
            class_depth=self.frame.class_depth
            + (1 if class_call and not delegates(function) else 0),
            inlined=True,
            scripted=self.frame.scripted or is_scripted(function, self.analysis),
            chain=(*self.frame.chain, function.name),
            function=function,
        )
        self.bind_parameters(frame, function, positional, keywords, has_self=cls is not None)
        saved_context, saved_statement = self.context, self.statement
        self.frames.append(frame)
        self.active.append(function)
        try:
            self.block(function.body)
        except _Terminated:
            pass
        finally:
            self.frames.pop()
            self.active.pop()
            self.context, self.statement = saved_context, saved_statement
        result = Operand(node=node, flows=tuple(dict.fromkeys(frame.returns)))
        if len(frame.returned_tuples) == 1 and len(frame.returns) == 1:
            if frame.returned_tuples[0]:
                self.tuples[frame.returns[0].value] = frame.returned_tuples[0]
        elif len(frame.returned_tuples) > 1 and self.replay is None:
            # several ``return a, b`` of the same length: element i may be any of theirs
            sizes = {len(elements) for elements in frame.returned_tuples}
            if len(sizes) == 1 and 0 not in sizes:
                merged = [
                    Operand(
                        node=node,
                        flows=tuple(
                            dict.fromkeys(
                                f for elements in frame.returned_tuples for f in elements[i].flows
                            )
                        ),
                    )
                    for i in range(sizes.pop())
                ]
                result = self.emit("tuple", node, merged, {}, transparent=True)
                self.tuples[result.flows[0].value] = merged
        return result

    def bind_parameters(
        self,
        frame: Frame,
        function: ast.FunctionDef,
        positional: list[Operand],
        keywords: dict[str, Operand],
        has_self: bool,
    ) -> None:
        arguments = function.args
        params = [*arguments.posonlyargs, *arguments.args]
        if has_self and params:
            params = params[1:]
        defaults = dict(
            zip(
                [p.arg for p in params][len(params) - len(arguments.defaults) :], arguments.defaults
            )
        )
        for kw_param, kw_default in zip(arguments.kwonlyargs, arguments.kw_defaults):
            if kw_default is not None:
                defaults[kw_param.arg] = kw_default
        for index, param in enumerate([*params, *arguments.kwonlyargs]):
            if index < len(params) and index < len(positional):
                operand = positional[index]
            elif param.arg in keywords:
                operand = keywords[param.arg]
            elif param.arg in defaults:
                default = defaults[param.arg]
                operand = Operand(node=default, constant=constant_value(default))
            else:
                operand = Operand(flows=(Flow(self.new_value(param.arg)),))
            if operand.module is not None:
                frame.modules[param.arg] = operand.module
            else:
                frame.env[param.arg] = operand.flows
        extra = positional[len(params) :]
        if arguments.vararg is not None:
            frame.env[arguments.vararg.arg] = tuple(f for op in extra for f in op.flows)
        if arguments.kwarg is not None:
            names = {p.arg for p in [*params, *arguments.kwonlyargs]}
            frame.env[arguments.kwarg.arg] = tuple(
                f for key, op in keywords.items() if key not in names for f in op.flows
            )


def is_scripted(function: ast.FunctionDef, analysis: FileAnalysis) -> bool:
    """Decorated with ``torch.jit.script``: compiled by TorchScript, which cannot call into
    arbitrary Python kernels."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if analysis.imports.resolve(target) in ("torch.jit.script", "torch.jit.script_method"):
            return True
    return False


class _ReplayDiverged(Exception):
    """A loop replay took a different route than the first pass; its extra uses are dropped."""


class _Budget(Exception):
    """The step budget of one root was spent."""


def _read_names(node: ast.AST) -> list[ast.expr]:
    """The variables an expression reads (names bound inside comprehensions excluded)."""
    bound: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.comprehension):
            bound |= {n.id for n in ast.walk(child.target) if isinstance(n, ast.Name)}
        elif isinstance(child, ast.Lambda):
            bound |= {a.arg for a in child.args.args}
    names: dict[str, ast.Name] = {}
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load):
            if child.id not in bound and child.id != "self":
                names.setdefault(child.id, child)
    return list(names.values())


def _helper_arguments(
    function: ast.FunctionDef, positional: list[Operand], keywords: dict[str, Operand]
) -> list[Operand] | None:
    """A canonical helper's arguments in the order of its parameters: keywords moved to their
    place, omitted ones given their default; ``None`` when the call does not bind (too many
    arguments, an unknown or repeated name, a missing one without a default)."""
    names = [arg.arg for arg in [*function.args.posonlyargs, *function.args.args]]
    if len(positional) > len(names) or any(name not in names for name in keywords):
        return None
    defaults = dict(zip(names[len(names) - len(function.args.defaults) :], function.args.defaults))
    bound: list[Operand] = list(positional)
    for name in names[len(positional) :]:
        if name in keywords:
            bound.append(keywords[name])
        elif name in defaults:
            default = defaults[name]
            bound.append(Operand(node=default, constant=constant_value(default)))
        else:
            return None
    if any(names.index(name) < len(positional) for name in keywords):
        return None  # given twice: the call raises
    return bound
