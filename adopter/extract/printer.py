"""Print extracted structure in the DSL so a user can see what Adopter understood.

``__init__`` bindings print as construction steps (``@torch.nn.Linear(...) -> $dense``);
``forward`` prints one call sequence per execution path (paper Fig. 3), up to a bound.
"""

from __future__ import annotations

import itertools

from .model import BranchPoint, ClassInfo, Construction, FunctionFlow, Step, consistent


def _construction_text(
    construction: Construction, target: str, labels: dict[int, BranchPoint]
) -> str:
    condition = _context_text(construction.context, labels)
    text = f"{construction.describe()} -> ${target}"
    if construction.elements:
        inner = "; ".join(e.describe() for e in construction.elements)
        text += f"  # {construction.container} of [{inner}]"
    return text + (f"  # when {condition}" if condition else "")


def _context_text(context: frozenset, labels: dict[int, BranchPoint]) -> str:
    parts = []
    for point, arm in sorted(context):
        branch = labels.get(point)
        parts.append(branch.label(arm) if branch else f"branch {point}.{arm}")
    return ", ".join(parts)


class _ValueNames:
    """Readable SSA names: the variable a value was stored in, numbered when reassigned."""

    def __init__(self, flow: FunctionFlow) -> None:
        self.flow = flow
        self.names: dict[int, str] = {}
        self.counts: dict[str, int] = {}

    def __call__(self, value: int) -> str:
        if value not in self.names:
            base = self.flow.value_names.get(value, "t")
            count = self.counts.get(base, 0)
            self.counts[base] = count + 1
            self.names[value] = f"${base}" if count == 0 else f"${base}_{count}"
        return self.names[value]


def _step_text(step: Step, name: _ValueNames) -> str:
    def operand(op) -> str:
        if op.module is not None:
            return op.module.path
        if op.flows:
            values = sorted({f.value for f in op.flows})
            return name(values[0]) if len(values) == 1 else "{" + "|".join(map(name, values)) + "}"
        return op.text

    args = [operand(op) for op in step.positional]
    positional_ids = {id(op) for op in step.positional}
    args += [
        f"{key}={operand(op)}"
        for key, op in step.arguments.items()
        if id(op) not in positional_ids and op.node is not None
    ]
    text = f"{step.kind}({', '.join(args)}) -> {name(step.output)}"
    notes = [f"line {step.line}"]
    if step.module:
        notes.insert(0, step.module)
    if step.inline_chain:
        notes.append("via " + " > ".join(step.inline_chain))
    return f"{text}  # {', '.join(notes)}"


def paths_of(flow: FunctionFlow, limit: int) -> tuple[list[list[Step]], bool]:
    """Distinct step sequences, one per feasible path; True when ``limit`` cut the list."""
    points = sorted({point for step in flow.steps for point, _ in step.context})
    arms = [range(flow.branch_labels[p].arms if p in flow.branch_labels else 2) for p in points]
    sequences: list[list[Step]] = []
    seen: set[tuple[int, ...]] = set()
    truncated = False
    for tried, choice in enumerate(itertools.product(*arms)):
        if tried >= limit * 64:
            truncated = True
            break
        path = frozenset(zip(points, choice))
        steps = [s for s in flow.steps if not s.transparent and consistent(s.context, path)]
        key = tuple(s.id for s in steps)
        if key in seen:
            continue
        if len(sequences) == limit:
            truncated = True
            break
        seen.add(key)
        sequences.append(steps)
    return sequences, truncated


def format_class(
    info: ClassInfo, max_paths: int = 4, labels: dict[int, BranchPoint] | None = None
) -> str:
    labels = labels or {}
    bases = ", ".join(info.bases)
    lines = [f"class {info.name}({bases})  # {info.path}:{info.line}"]
    if info.bindings:
        lines.append("  init:")
        for attribute, constructions in info.bindings.items():
            for construction in constructions:
                text = _construction_text(construction, attribute, labels)
                lines.append(f"    {text};")
    for method, flow in info.flows.items():
        sequences, truncated = paths_of(flow, max_paths)
        more = ", more not shown" if truncated else ""
        lines.append(f"  {method} ({len(sequences)} path{'s' * (len(sequences) != 1)}{more}):")
        for number, steps in enumerate(sequences, 1):
            if len(sequences) > 1:
                lines.append(f"    path {number}:")
            name = _ValueNames(flow)
            indent = "      " if len(sequences) > 1 else "    "
            lines.extend(f"{indent}{_step_text(step, name)};" for step in steps)
        if flow.truncated:
            lines.append("    # step budget reached; the rest of this method was not analysed")
    return "\n".join(lines)
