"""Round trip over the built-in rules: from the first positive case of each rule's fixture
(BEFORE: the case; AFTER: what its reviewed snapshot records apply writes), ``learn`` gives a
rule that rewrites BEFORE to AFTER and reports the sites the fixture marks in that case."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from adopter.learn import Example, LearnError, learn
from adopter.rules import rule_files
from tests.helpers import scan_snippet

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from learn_examples import positive_examples  # noqa: E402

RULE_FILES = rule_files("all")
# What the learner cannot express yet (docs/learn.md): a replacement guarded by a run-time check.
NOT_LEARNABLE = {"modern_7_linear_cross_entropy": "helper of adopter.kernels, not a kernel"}


@pytest.mark.parametrize("rule_file", RULE_FILES, ids=[p.stem for p in RULE_FILES])
def test_rule_learned_from_its_first_fixture_case_reproduces_it(rule_file):
    case = positive_examples(rule_file)[0]
    example = Example(f"{rule_file.stem}.py", f"{rule_file.stem}.after.py", case.before, case.after)
    if rule_file.stem in NOT_LEARNABLE:
        with pytest.raises(LearnError, match=NOT_LEARNABLE[rule_file.stem]):
            learn([example])
        return
    learned = learn([example], rule_id="learned.1")  # checks BEFORE -> AFTER itself
    sites = sorted(s.line for s in scan_snippet(case.before, [learned.rule]) if s.applicable)
    assert sites == sorted(case.sites)
