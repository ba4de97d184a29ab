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
