"""Write a learned rule as a rule file in the house style, and its example as a fixture."""

from __future__ import annotations

import json
import textwrap

from ..dsl import DETECT_ONLY, Keyword, Literal, Name, Positional, Rest, Rule, Section, Step, Var
from ..dsl.syntax import Attribute, Call, Expr, Index, Wildcard


def expression(expr: Expr) -> str:
    if isinstance(expr, Var):
        return f"${expr.name}"
    if isinstance(expr, Name):
        return expr.dotted
    if isinstance(expr, Literal):
        value = expr.value
        if isinstance(value, str):
            return json.dumps(value)
        return repr(value)
    if isinstance(expr, Wildcard):
        return "_"
    if isinstance(expr, Index):
        return f"{expression(expr.base)}[{expression(expr.item)}]"
    if isinstance(expr, Call):
        return f"{expression(expr.base)}({', '.join(argument(a) for a in expr.args)})"
    if isinstance(expr, Attribute):
        return f"${expr.base.name}.{expr.name}"
    raise TypeError(f"not an expression: {expr!r}")


def argument(arg: Positional | Keyword | Rest) -> str:
    if isinstance(arg, Rest):
        return "..."
    if isinstance(arg, Keyword):
        return f"{arg.key}={expression(arg.value)}"
    return expression(arg.value)


def step_text(step: Step) -> str:
    if isinstance(step.callee, Literal):
        return f"{expression(step.callee)} -> ${step.targets[0].name}"
    text = f"{'@' if step.construct else ''}{expression(step.callee)}"
    if not step.lookup:
        text += f"({', '.join(argument(a) for a in step.args)})"
    if len(step.targets) == 1:
        text += f" -> ${step.targets[0].name}"
    elif step.targets:
        text += " -> (" + ", ".join(f"${t.name}" for t in step.targets) + ")"
    return text


def _steps(steps: tuple[Step, ...], indent: str) -> str:
    return ";\n".join(indent + step_text(step) for step in steps)


def _section(section: Section) -> str:
    lines = [f"    {section.kind} {{", _steps(section.steps, " " * 8), "    }"]
    text = "\n".join(lines)
    if section.where:
        text += " where {\n" + _steps(section.where, " " * 8) + "\n    }"
    if section.replacement == DETECT_ONLY:
        text += " => _"
    elif isinstance(section.replacement, tuple) and section.guard is not None:
        text += f" => if {step_text(section.guard)} {{\n"
        text += _steps(section.replacement, " " * 8) + "\n    }"
    elif isinstance(section.replacement, tuple):
        text += " => {\n" + _steps(section.replacement, " " * 8) + "\n    }"
    return text


def rule_text(rule: Rule) -> str:
    """The DSL text of a rule and its variants (without the header comment)."""
    lines = [f"rule {rule.id} {{", f"    name: {json.dumps(rule.name)}"]
    if rule.description:
        lines.append(f"    description: {json.dumps(rule.description)}")
    lines.append(f"    kernel: {json.dumps(rule.kernel)}")
    if rule.site != "forward":
        lines.append(f"    site: {json.dumps(rule.site)}")
    if rule.scope != "calls":
        lines.append(f"    scope: {json.dumps(rule.scope)}")
    for spelling in rule.spellings:
        for section in (spelling.init, spelling.forward):
            if section is not None:
                lines.append(_section(section))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _commented(code: str, indent: str = "#     ") -> list[str]:
    return [(indent + line).rstrip() for line in textwrap.dedent(code).strip("\n").split("\n")]


def header(rule: Rule, before_code: str, after_code: str, source: str, site: str) -> str:
    """The house-style header: What it does / Why / Before / After / Site."""
    kernel = rule.kernel.rsplit(".", 1)[-1]
    lines = [
        f"# {rule.id} — {rule.name} (learned by `adopter learn` from {source})",
        "#",
        f"# What it does: finds the computation of the example's Before and calls `{kernel}`",
        f"# ({rule.kernel}) instead, with the same modules and values, as in After.",
        *_context_lines(rule),
        "#",
        f"# Why: the example's author replaced this code with `{kernel}`; every other site that",
        "# computes the same thing can call it too.",
        "#",
        "# Before:",
        *_commented(before_code),
        "# After:",
        *_commented(after_code),
        "#",
        f"# Site: {site}.",
        "",
    ]
    return "\n".join(lines)


def _context_lines(rule: Rule) -> list[str]:
    """What the ``where`` block asks, in words: the consumers the example's kept code shows."""
    where = rule.forward.where if rule.forward is not None else ()
    families = sorted({expression(step.callee) for step in where})
    if not families:
        return []
    calls = " / ".join(f"`{family}`" for family in families)
    return [f"# A site must also hand each result to {calls}, as the example's kept code does."]


def fixture_text(rule: Rule, before: str, site_lines: list[int], stem: str) -> str:
    """BEFORE as the rule's fixture (tests/rules/README.md): one case, its sites marked."""
    lines = before.split("\n")
    for number in site_lines:
        if 1 <= number <= len(lines) and not lines[number - 1].rstrip().endswith("# site"):
            lines[number - 1] = lines[number - 1].rstrip() + "  # site"
    body = "\n".join(lines).strip("\n")
    preamble = f"# Cases for {rule.id} ({stem}.adopt). See tests/rules/README.md for the format.\n"
    imports, rest = _split_imports(body)
    return f"{preamble}{imports}\n\n# %% the example it was learned from\n{rest}\n"


def _split_imports(body: str) -> tuple[str, str]:
    lines = body.split("\n")
    cut = 0
    for index, line in enumerate(lines):
        if line.startswith(("import ", "from ")) or not line.strip() or line.startswith("#"):
            cut = index + 1
            continue
        break
    return "\n".join(lines[:cut]).strip("\n"), "\n".join(lines[cut:]).strip("\n")
