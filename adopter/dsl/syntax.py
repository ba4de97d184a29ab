"""The DSL's syntax tree: plain, immutable data shared by the parser, the matcher and printers."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Var:
    """A pattern variable, ``$name``."""

    name: str

    def __str__(self) -> str:
        return f"${self.name}"


@dataclass(frozen=True)
class Name:
    """A dotted name such as ``torch.nn.Linear`` or ``config.hidden_act``."""

    dotted: str

    def __str__(self) -> str:
        return self.dotted


@dataclass(frozen=True)
class Literal:
    """A number, string, ``True``/``False``/``None`` (parsed as names, see ``literal_value``)."""

    value: object

    def __str__(self) -> str:
        return repr(self.value) if isinstance(self.value, str) else str(self.value)


@dataclass(frozen=True)
class Wildcard:
    """``_``: anything, bound to nothing."""

    def __str__(self) -> str:
        return "_"


@dataclass(frozen=True)
class Index:
    """``base[item]``, e.g. ``ACT2FN[config.hidden_act]``."""

    base: Expr
    item: Expr

    def __str__(self) -> str:
        return f"{self.base}[{self.item}]"


@dataclass(frozen=True)
class Call:
    """``base(args)`` used as a callee, e.g. ``factory(BertSelfAttention)(config)``."""

    base: Expr
    args: tuple[Arg, ...]

    def __str__(self) -> str:
        return f"{self.base}({', '.join(map(str, self.args))})"


@dataclass(frozen=True)
class Attribute:
    """``$var.name``: an attribute of an object the pattern binds to ``$var`` (``repeat_kv(k,
    $module.num_key_value_groups)`` binds ``$module`` to the text before ``.num_...``)."""

    base: Var
    name: str

    def __str__(self) -> str:
        return f"{self.base}.{self.name}"


Expr = Var | Name | Literal | Wildcard | Index | Call | Attribute


@dataclass(frozen=True)
class Positional:
    value: Expr

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Keyword:
    key: str
    value: Expr

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


@dataclass(frozen=True)
class Rest:
    """``...``: any further arguments."""

    def __str__(self) -> str:
        return "..."


Arg = Positional | Keyword | Rest


@dataclass(frozen=True)
class Step:
    """One call in a sequence: ``[@]callee(args) -> targets``.

    ``construct`` marks an ``__init__`` construction (``@``). ``targets`` is empty for ``-> _``
    or a step without a target.
    """

    callee: Expr
    args: tuple[Arg, ...]
    targets: tuple[Var, ...] = ()
    construct: bool = False
    lookup: bool = False  # `@ACT2FN[$name]`: looked up by subscript, not called
    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        if isinstance(self.callee, Literal):  # ``None -> $logits`` in a replacement
            return f"{self.callee} -> {self.targets[0]}" if self.targets else str(self.callee)
        call = "" if self.lookup else f"({', '.join(map(str, self.args))})"
        text = f"{'@' if self.construct else ''}{self.callee}{call}"
        if len(self.targets) == 1:
            text += f" -> {self.targets[0]}"
        elif self.targets:
            text += f" -> ({', '.join(map(str, self.targets))})"
        return text


DETECT_ONLY = "detect-only"
# What a forward replacement stands for: the matched calls (the default), or - ``scope:
# "block"`` - every statement from the one holding the first matched call to the one holding
# the last, on every path through them (the kernel handles the paths the pattern did not take,
# e.g. an attention mask of ``None``), as a guarded replacement does.
SCOPES = ("calls", "block")


@dataclass(frozen=True)
class Section:
    """``init { ... }`` or ``forward { ... }``, with optional ``where`` context and replacement.

    ``replacement`` is ``None`` when the section is left as it is, ``DETECT_ONLY`` for ``=> _``,
    or the replacement steps. ``guard`` (``=> if kernel(...) { ... }``): the replacement runs
    only where this call returns true at run time; elsewhere the original statements do.
    """

    kind: str
    steps: tuple[Step, ...]
    where: tuple[Step, ...] = ()
    replacement: tuple[Step, ...] | str | None = None
    guard: Step | None = None


@dataclass(frozen=True)
class CallPattern:
    """A call-site rule's pattern: one call of a named callee, anywhere in a file (module level,
    any function or method), not a step of a module's ``forward``.

    Training code is not model structure: an optimizer is built once, in a script or a trainer,
    from a class named through the file's imports. Such a rule has no data flow to follow, only
    conditions on the call's keywords, so it is written as data (``adopter/rules/train.py``)
    rather than in the DSL, and shares the rest - ids, sets, reports, ``apply`` - with DSL rules.

    ``wrap_keyword`` is ``None`` when the kernel wraps the whole call, ``kernel(callee, *args,
    **kwargs)`` (the kernel builds what the call built); otherwise the kernel wraps that
    keyword's value, ``keyword=kernel(value)``, and the call is a site only when the value is one
    of ``values`` (string literals). ``refused`` lists the keywords whose presence leaves the call
    as written, each with the reason a report gives.
    """

    callees: tuple[str, ...]
    refused: tuple[tuple[str, str], ...] = ()
    wrap_keyword: str | None = None
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rule:
    """A transformation rule: metadata plus its ``init`` and ``forward`` sections."""

    id: str
    name: str
    description: str = ""
    kernel: str = ""
    message: str = ""
    site: str = "forward"
    init: Section | None = None
    forward: Section | None = None
    scope: str = "calls"
    # Variables a ``mul`` step may also read from a division (``reciprocal: "$scaling"``):
    # ``x / s`` is matched as ``mul(x, $scaling)`` with ``$scaling`` bound to ``1 / s``.
    reciprocal: tuple[str, ...] = ()
    # Inputs the kernel reads ``None`` for as absent (``optional: "$weight, self.weight"``: a
    # variable, or a name the replacement spells out): in a block-scope
    # rewrite a matched step that reads one may run under a condition ``c`` (``if c: h = h * w``);
    # the kernel is then handed ``w if c else None``.
    optional: tuple[str, ...] = ()
    # Variables the guard holds only when they are given (``given: "$labels"``: the guard is
    # false for ``None``): in a guarded rewrite a matched statement may sit under
    # ``if labels is not None:`` (the kernel arm runs it on every path the guard takes), under
    # no other test.
    given: tuple[str, ...] = ()
    source: str = "<string>"
    line: int = 0
    doc: str = field(default="", compare=False)
    # Where the ``kernel:`` value is (line, column), so that a load error can point at it.
    kernel_at: tuple[int, int] = field(default=(0, 0), compare=False)
    # Other spellings of the same computation: rules with this rule's metadata, each with its
    # own ``init``/``forward`` pair (written as further pairs in the rule's block).
    variants: tuple[Rule, ...] = ()
    # A call-site rule (``adopter/rules/train.py``): no init/forward sections, its pattern here.
    call: CallPattern | None = None

    @property
    def spellings(self) -> tuple[Rule, ...]:
        """This rule and its variants: what a matcher compiles."""
        return (self, *self.variants)

    @property
    def third_party_kernel(self) -> bool:
        """The declared kernel is not one of ``adopter.kernels``' (scan and apply say so)."""
        return bool(self.kernel) and not self.kernel.startswith("adopter.kernels.")

    @property
    def detect_only(self) -> bool:
        if self.call is not None:
            return not self.kernel
        sections = [s for s in (self.init, self.forward) if s is not None]
        replaced = [s.replacement for s in sections if s.replacement is not None]
        return not replaced or all(r == DETECT_ONLY for r in replaced)


def format_sequence(steps: list[Step] | tuple[Step, ...]) -> str:
    """Render steps the way the DSL writes them: ``a($x) -> $h; b($h) -> $y``."""
    return ";\n".join(str(step) for step in steps)
