"""Built-in rule sets. Each rule is one ``.adopt`` file: DSL text plus a header that says what
the rule does, why, and shows the code before and after.

The set ``paper`` holds the nine rules of the original evaluation (ids ``paper.1`` to ``paper.9``).
"""

from __future__ import annotations

from pathlib import Path

from ..dsl import Rule, load_rule_file

RULES_DIR = Path(__file__).parent
RULE_SETS = {"paper": "paper_*.adopt"}


def rule_files(rule_set: str = "paper") -> list[Path]:
    if rule_set not in RULE_SETS:
        raise KeyError(f"unknown rule set {rule_set!r}; known: {', '.join(sorted(RULE_SETS))}")
    return sorted(RULES_DIR.glob(RULE_SETS[rule_set]), key=lambda p: int(p.name.split("_")[1]))


def load_rule_set(rule_set: str = "paper") -> list[Rule]:
    """The rules of a built-in set, in id order."""
    return [rule for path in rule_files(rule_set) for rule in load_rule_file(path)]
