"""Built-in rule sets. Each rule is one ``.adopt`` file: DSL text plus a header that says what
the rule does, why, and shows the code before and after.

The set ``paper`` holds the nine rules of the original evaluation (ids ``paper.1`` to ``paper.9``);
``extended`` holds our rules beyond it (ids ``ext.N``: fused attention for model families the
paper's rules do not name); ``modern`` the fusions of the models of today (ids ``modern.N``:
RMSNorm, gated MLP, rotary embeddings, attention functions, GroupNorm + SiLU, conv + BatchNorm +
activation, LM head + cross-entropy); ``all`` is every set of model rules. ``train`` holds the
call-site rules for training code (ids ``train.N``, in :mod:`adopter.rules.train`: fused
optimizers); it is not part of ``all``, which is what ``adopter run`` and ``patch`` apply to
library modules.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..dsl import DslError, Rule, load_rule_file
from . import train

RULES_DIR = Path(__file__).parent
RULE_SETS: dict[str, tuple[str, ...]] = {
    "paper": ("paper_*.adopt",),
    "extended": ("ext_*.adopt",),
    "modern": ("modern_*.adopt",),
    "all": ("paper_*.adopt", "ext_*.adopt", "modern_*.adopt"),
    "train": (),  # call-site rules, written as data: CALL_RULES
}
# Sets of call-site rules (``Rule.call``), by set name: rules with no ``.adopt`` file.
CALL_RULES: dict[str, tuple[Rule, ...]] = {"train": train.RULES}
# The set every command runs when none is named (scan, apply, verify, bench, run and patch alike:
# a plain scan must report what `adopter run` patches). Benchmarks of the paper name "paper".
DEFAULT_RULE_SET = "all"


# `paper_4_softmax.adopt` holds rule `paper.4`: the file name orders the set and names the rule.
_FILE_NAME = re.compile(r"(?P<prefix>[a-z]+)_(?P<number>[0-9]+)_\w+\.adopt")


def _numbered(path: Path) -> tuple[str, int]:
    """``(prefix, number)`` of a built-in rule file; :class:`DslError` when misnamed."""
    found = _FILE_NAME.fullmatch(path.name)
    if found is None:
        prefix = path.name.split("_", 1)[0]
        raise DslError(
            str(path),
            1,
            1,
            f"a built-in rule file is named {prefix}_<number>_<what>.adopt "
            f"(e.g. paper_4_softmax.adopt for rule paper.4), not {path.name!r}",
        )
    return found["prefix"], int(found["number"])


def rule_files(rule_set: str = DEFAULT_RULE_SET) -> list[Path]:
    """The files of a built-in set, in rule-number order. Raises ``KeyError`` for an unknown
    set and :class:`DslError` (at the file) for a file not named ``<set>_<N>_<what>.adopt``."""
    if rule_set not in RULE_SETS:
        raise KeyError(f"unknown rule set {rule_set!r}; known: {', '.join(sorted(RULE_SETS))}")
    return [
        path
        for pattern in RULE_SETS[rule_set]
        for path in sorted(RULES_DIR.glob(pattern), key=lambda p: _numbered(p)[1])
    ]


def load_rule_set(rule_set: str = DEFAULT_RULE_SET) -> list[Rule]:
    """The rules of a built-in set, in id order. Each file must hold exactly the rule its name
    gives (``paper_4_...`` holds ``paper.4``); otherwise :class:`DslError` at the file."""
    rules: list[Rule] = []
    for path in rule_files(rule_set):
        prefix, number = _numbered(path)
        expected = f"{prefix}.{number}"
        loaded = load_rule_file(path)
        ids = [rule.id for rule in loaded]
        if ids != [expected]:
            line = loaded[0].line if loaded else 1
            raise DslError(
                str(path),
                line,
                1,
                f"by its name this file holds rule {expected!r} alone, but it holds "
                + (", ".join(repr(rule_id) for rule_id in ids) if ids else "no rule"),
            )
        rules.extend(loaded)
    rules.extend(CALL_RULES.get(rule_set, ()))
    return rules
