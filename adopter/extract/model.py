"""What structure extraction produces: constructions bound in ``__init__`` and call steps of
``forward`` (and the other methods), connected by data flow.

Control flow is kept as *contexts*: a context is a set of ``(branch_point, arm)`` pairs naming the
arms of ``if``/loop/``try`` statements a step sits in. Two things can happen on one execution path
exactly when their contexts agree on every shared branch point, so a single linear pass gives the
same answers as enumerating every path (paper Fig. 3) without the exponential blow-up; paths are
enumerated only to print them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

Context = frozenset  # frozenset[tuple[int, int]]: (branch point id, arm index)
EMPTY_CONTEXT: Context = frozenset()


def consistent(*contexts: Context) -> bool:
    """True when all contexts can hold on one execution path."""
    arms: dict[int, int] = {}
    for context in contexts:
        for point, arm in context:
            if arms.setdefault(point, arm) != arm:
                return False
    return True


class _Missing:
    def __repr__(self) -> str:
        return "<not a constant>"


NOT_CONSTANT = _Missing()


@dataclass(frozen=True)
class BranchPoint:
    """An ``if``/loop/``try``/``match`` whose arms split execution paths."""

    kind: str
    node: ast.AST | None = None
    arms: int = 2

    def label(self, arm: int) -> str:
        """Human-readable condition of one arm (unparsed only when printed)."""
        test = ast.unparse(self.node) if self.node is not None else ""
        if self.kind == "if":
            return test if arm == 0 else f"not ({test})"
        if self.kind == "loop":
            return f"loop over {test}" if arm == 0 else f"no iteration of {test}"
        if self.kind == "while":
            return f"while {test}" if arm == 0 else f"no iteration of while {test}"
        if self.kind == "try":
            return "try body" if arm == 0 else f"except handler {arm}"
        return f"{self.kind} arm {arm}"


@dataclass(frozen=True)
class Flow:
    """A value that may reach a use, and the branch arms it must have come through."""

    value: int
    context: Context = EMPTY_CONTEXT


@dataclass(eq=False)
class Operand:
    """An argument as the analysis sees it: its expression, constant value, data-flow sources,
    and the submodule it names when it names one (``self.dense``)."""

    node: ast.AST | None = None
    flows: tuple[Flow, ...] = ()
    constant: object = NOT_CONSTANT
    module: ModuleRef | None = None
    label: str | None = None

    @property
    def is_constant(self) -> bool:
        return self.constant is not NOT_CONSTANT

    @property
    def text(self) -> str:
        if self.label is None:
            self.label = ast.unparse(self.node) if self.node is not None else "?"
        return self.label


@dataclass(eq=False)
class Reciprocal(Operand):
    """``1 / s`` for the divisor ``s`` (``of``) of ``x / s``, read as ``x * (1 / s)`` by a rule
    that asks for it (``reciprocal:``). Its ``node`` is built, not parsed: it has no place in
    the source, so it is rendered from ``of``."""

    of: Operand | None = None

    @classmethod
    def of_divisor(cls, divisor: Operand) -> Reciprocal:
        assert divisor.node is not None
        node = ast.BinOp(left=ast.Constant(1), op=ast.Div(), right=divisor.node)
        constant: object = NOT_CONSTANT
        if isinstance(divisor.constant, (int, float)) and not isinstance(divisor.constant, bool):
            if divisor.constant != 0:
                constant = 1 / divisor.constant
        return cls(node=node, constant=constant, of=divisor)


@dataclass
class ModuleRef:
    """A submodule reached from ``self``: its attribute path and how it may have been built."""

    path: str
    constructions: list[Construction]


@dataclass
class Construction:
    """One way an attribute is built in ``__init__``: ``self.dense = nn.Linear(a, b)``."""

    kind: str
    arguments: dict[str, Operand]
    positional: list[Operand]
    path: str
    line: int
    column: int
    context: Context = EMPTY_CONTEXT
    node: ast.AST | None = None
    elements: list[Construction] = field(default_factory=list)
    container: str | None = None  # "list" (ModuleList/ModuleDict) or "sequential"
    method: str = "__init__"
    condition: str = ""
    function: ast.FunctionDef | None = None  # the def whose body holds ``node``
    # An element of an ``nn.Sequential``: its index there when that is the same on every path
    # (``None`` when it is not), and the container. A rewrite that calls elements one by one
    # indexes them by ``position``, never by counting steps.
    position: int | None = None
    owner: Construction | None = field(default=None, compare=False, repr=False)
    # A ``sequential`` container whose element indexes are not statically known: why not.
    elements_unknown: str = ""
    # a canonical family rules can name instead of the kind (``activation``: any activation)
    family: str | None = None
    via: str | None = None  # built by this factory of another file (the call is in this one)

    def describe(self) -> str:
        """The construction as a DSL step callee, with the arguments the source spelled out."""
        if "[" in self.kind and not self.positional and not self.arguments:
            return f"@{self.kind}"
        positional_ids = {id(op) for op in self.positional}
        args = [op.text for op in self.positional]
        args += [
            f"{key}={op.text}"
            for key, op in self.arguments.items()
            if id(op) not in positional_ids and op.node is not None
        ]
        return f"@{self.kind}({', '.join(args)})"


@dataclass
class Step:
    """One call (or operator) executed by a method, in three-address form.

    ``kind`` is the canonical callee: the constructor of the submodule called
    (``torch.nn.Linear``), a canonical function (``torch.nn.functional.softmax``), an operator
    (``add``), a tensor method (``Tensor.view``) or an opaque method (``self._split_heads``).
    """

    id: int
    kind: str
    positional: list[Operand]
    arguments: dict[str, Operand]
    output: int
    line: int
    column: int
    context: Context
    cls: str | None
    method: str
    path: str
    node: ast.AST | None = None
    statement: ast.stmt | None = None
    module: str | None = None
    construction: Construction | None = None
    alternatives: list[Construction] = field(default_factory=list)
    transparent: bool = False  # a summary of an inlined call: its uses are not counted
    synthetic: bool = False  # no call text of its own (an element of an nn.Sequential)
    scripted: bool = False  # inside a @torch.jit.script function
    function: ast.FunctionDef | None = None  # the def whose body holds ``node``
    inline_chain: tuple[str, ...] = ()

    def operands(self) -> list[Operand]:
        seen: list[Operand] = []
        for operand in [*self.positional, *self.arguments.values()]:
            if not any(operand is other for other in seen):
                seen.append(operand)
        return seen


@dataclass(frozen=True)
class Use:
    """A use of a value: by a step, or by something that is not a step (``step`` is None), such
    as a ``return``, a condition or an attribute store."""

    step: int | None
    context: Context
    where: str = ""


@dataclass
class FunctionFlow:
    """The analysed body of one method (or module-level function), callees inlined."""

    cls: str | None
    method: str
    path: str
    line: int
    steps: list[Step] = field(default_factory=list)
    uses: dict[int, list[Use]] = field(default_factory=dict)
    producers: dict[int, int] = field(default_factory=dict)
    branch_labels: dict[int, BranchPoint] = field(default_factory=dict)
    value_names: dict[int, str] = field(default_factory=dict)
    # the output of a call's transparent summary step (a submodule of a class of this file,
    # inlined) -> the values the inlined body returns: what the call's result is
    call_results: dict[int, tuple[int, ...]] = field(default_factory=dict)
    truncated: bool = False
    # Why the sites of this flow are reported but not rewritten ("" when they may be): the
    # flow of an nn.Sequential container that no call of the file runs alone.
    report_only: str = ""

    def consumers(self, value: int) -> list[Use]:
        return self.uses.get(value, [])


@dataclass
class ClassInfo:
    """A class of the analysed file, with its ``__init__`` bindings when it is a module."""

    name: str
    path: str
    line: int
    bases: list[str]
    is_module: bool
    node: ast.ClassDef
    bindings: dict[str, list[Construction]] = field(default_factory=dict)
    methods: dict[str, ast.FunctionDef] = field(default_factory=dict)
    flows: dict[str, FunctionFlow] = field(default_factory=dict)


@dataclass
class FileStructure:
    """Everything extraction learned about one source file."""

    path: str
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    functions: dict[str, FunctionFlow] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)
    branch_labels: dict[int, BranchPoint] = field(default_factory=dict)
    # Lines holding non-ASCII text, by number: ``ast`` columns count UTF-8 bytes, reports count
    # characters, and only these lines tell the two apart.
    wide_lines: dict[int, str] = field(default_factory=dict)
    # The parsed file, for call-site rules that look at every call, not only at modules.
    tree: ast.Module | None = field(default=None, compare=False, repr=False)

    def character_column(self, line: int, column: int) -> int:
        """The 1-based character column of ``ast``'s 1-based UTF-8 byte column on ``line``."""
        text = self.wide_lines.get(line)
        if text is None:
            return column
        return len(text.encode("utf-8")[: column - 1].decode("utf-8", errors="ignore")) + 1

    def all_flows(self) -> list[FunctionFlow]:
        flows = [flow for info in self.classes.values() for flow in info.flows.values()]
        return flows + list(self.functions.values())
