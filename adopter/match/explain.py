"""Why a rule did not fire: the match trace of ``adopter scan --explain`` (``ADOPTER_EXPLAIN=1``).

For every place where a rule's first step could start (a *candidate*), the matcher remembers the
furthest pattern step it reached and why the code there did not match it: a call of the wrong
kind, a value that does not flow from the step before, a submodule built in ``__init__`` by
something the rule's ``init`` does not accept, a step on another branch. Like torch.fx's subgraph
matcher log, it names the pattern step and the line; it never changes what is matched.

The explanations are computed only after a failure and only when explaining, so the matcher's
hot path is the same with the trace off.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dsl.syntax import Expr, Literal, Step, Var
from ..extract.model import Construction, Operand
from ..extract.model import Step as FlowStep

NO_START = "no call in this file can start the match"


@dataclass(frozen=True)
class Miss:
    """A candidate place where a rule did not fire, and why."""

    rule: str
    path: str
    line: int
    column: int
    where: str  # Class.method (or the function) of the candidate
    step: str  # the pattern step that failed, numbered (``step 2 `add($a, $b) -> $s```)
    reason: str
    # A rule whose first step matched no call of the file: the call of the file whose callee
    # reads closest to the step's (``path:line:col `callee(...)```) and how far it is.
    nearest: str = ""
    distance: tuple[int, ...] = ()

    @property
    def started(self) -> bool:
        """Whether the rule's first step matched some call of the file."""
        return bool(self.line) or self.reason != NO_START

    @property
    def key(self) -> tuple[str, int, int, str]:
        return (self.path, self.line, self.column, self.rule)

    def __str__(self) -> str:
        at = f" at {self.step}" if self.step else ""
        if not self.line:  # the rule had no candidate place in the file
            return f"{self.path}: {self.rule} did not fire{at}: {self.reason}"
        return (
            f"{self.path}:{self.line}:{self.column}: {self.rule} did not fire in {self.where}"
            f"{at}: {self.reason}"
        )


def numbered(pattern_step: Step, position: int, where: bool) -> str:
    """``step 2 `add($dropped, $residual) -> $sum``` (``where step 1`` for ``where`` steps)."""
    section = "where step" if where else "step"
    return f"{section} {position + 1} `{pattern_step}`"


def owner(step: FlowStep) -> str:
    """``Class.method`` of a flow step, or the function's name at module level."""
    return f"{step.cls}.{step.method}" if step.cls else step.method


def callee_text(step: FlowStep) -> str:
    """How a flow step's call reads in a reason: ``self.dropout (torch.nn.Dropout)`` or ``mul``."""
    if step.module is not None:
        return f"{step.module} ({step.kind})"
    return step.kind


def describe_value(pattern: Expr, operand: Operand, bindings: dict[str, object]) -> str:
    """Why ``operand`` does not unify with ``pattern`` (the matcher's ``_unify_value`` failed)."""
    text = f"`{operand.text}`"
    if isinstance(pattern, Literal):
        return f"{text} is not the literal {pattern}"
    if not isinstance(pattern, Var):  # a name, call, subscript or attribute of the pattern
        return f"{text} is not `{pattern}`"
    bound = bindings.get(pattern.name)
    # the matcher's BoundOutput (a value a matched call produced) and BoundModule (a submodule),
    # known by their fields: the matcher imports this module, not the other way round
    step = getattr(bound, "step", None)
    if isinstance(step, FlowStep):
        return f"data flow broken: {text} does not come from {pattern} (line {step.line})"
    path = getattr(bound, "path", None)
    if isinstance(path, str):
        return f"{text} is not {pattern} ({path})"
    if isinstance(bound, Operand):
        return f"{text} is not the value {pattern} stands for (`{bound.text}`)"
    return f"{text} is not {pattern} (`{bound}`)"


def describe_construction(pattern: Step, construction: Construction, reason: str) -> str:
    """Why a submodule's ``__init__`` construction does not match the rule's ``init`` step."""
    return (
        f"init construction `{construction.kind}` (line {construction.line}) does not match "
        f"`{pattern}`: {reason}"
    )


@dataclass(frozen=True)
class NeverStarted:
    """A rule whose first step matched no call in any scanned file: one line for the whole
    scan (a per-file line would repeat it for every file), naming the nearest call seen."""

    rule: str
    step: str  # the first pattern step, as the rule writes it
    files: int
    nearest: str  # ``path:line:col `callee(...)``` or "" when the files have no call at all

    def __str__(self) -> str:
        seen = f"nearest: {self.nearest}" if self.nearest else "the files have no call to compare"
        return (
            f"{self.rule} did not fire: its first step `{self.step}` matched no call in "
            f"{self.files} file(s); {seen}"
        )


def never_started(misses: list[Miss], files: int) -> tuple[list[Miss], list[NeverStarted]]:
    """Split the misses of ``files`` scanned files: the rules whose first step started nowhere
    become one ``NeverStarted`` each (with the nearest call over all files); their per-file
    lines are dropped, the other misses are kept in order."""
    unstarted: dict[str, list[Miss]] = {}
    for miss in misses:
        if not miss.started:
            unstarted.setdefault(miss.rule, []).append(miss)
    nowhere = {rule for rule, found in unstarted.items() if files and len(found) == files}
    summaries = []
    for rule in sorted(nowhere):
        found = unstarted[rule]
        ranked = [miss for miss in found if miss.nearest]
        best = min(ranked, key=lambda miss: miss.distance) if ranked else None
        step = found[0].step.split("`", 2)[1] if "`" in found[0].step else found[0].step
        summaries.append(NeverStarted(rule, step, files, best.nearest if best else ""))
    return [miss for miss in misses if miss.rule not in nowhere or miss.started], summaries


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: insertions, deletions and substitutions."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, left in enumerate(a, 1):
        current = [i]
        for j, right in enumerate(b, 1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (left != right))
            )
        previous = current
    return previous[-1]


def callee_distance(wanted: str, kind: str) -> tuple[int, int]:
    """How far a call's callee ``kind`` reads from the callee a pattern step names: the edit
    distance of the last dotted names (``sofmax`` vs ``softmax``), then of the whole names, so
    ``F.log_softmax`` ranks before ``torch.matmul`` for ``softmax``."""
    return (
        edit_distance(wanted.rsplit(".", 1)[-1], kind.rsplit(".", 1)[-1]),
        edit_distance(wanted, kind),
    )


def call_text(step: FlowStep) -> str:
    """``torch.nn.functional.log_softmax(...)`` or ``self.proj(...) (torch.nn.Linear)``."""
    if step.module is not None:
        return f"`{step.module}(...)` ({step.kind})"
    return f"`{step.kind}(...)`"
