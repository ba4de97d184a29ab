"""Built-in rule sets. Each rule is one ``.adopt`` file: DSL text plus a header that says what
the rule does, why, and shows the code before and after.

The set ``paper`` holds the nine rules of the original evaluation (ids ``paper.1`` to ``paper.9``);
``extended`` holds our rules beyond it (ids ``ext.N``: fused attention for model families the
paper's rules do not name); ``all`` is both.
"""

from __future__ import annotations

from pathlib import Path

from ..dsl import Rule, load_rule_file

RULES_DIR = Path(__file__).parent
RULE_SETS: dict[str, tuple[str, ...]] = {
    "paper": ("paper_*.adopt",),
    "extended": ("ext_*.adopt",),
    "all": ("paper_*.adopt", "ext_*.adopt"),
}


def rule_files(rule_set: str = "paper") -> list[Path]:
    if rule_set not in RULE_SETS:
        raise KeyError(f"unknown rule set {rule_set!r}; known: {', '.join(sorted(RULE_SETS))}")
    return [
        path
        for pattern in RULE_SETS[rule_set]
        for path in sorted(RULES_DIR.glob(pattern), key=lambda p: int(p.name.split("_")[1]))
    ]


def load_rule_set(rule_set: str = "paper") -> list[Rule]:
    """The rules of a built-in set, in id order."""
    return [rule for path in rule_files(rule_set) for rule in load_rule_file(path)]
