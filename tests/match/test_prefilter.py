"""The matcher skips a rule on a flow that never calls an operation (or constructs a submodule
class) the rule names. The skip never changes what is found: every case of every rule's
fixture is matched with and without it."""

from __future__ import annotations

import pytest

from adopter.dsl import load_rule_file
from adopter.match import Matcher
from adopter.match.matcher import CompiledRule
from adopter.rules import load_rule_set, rule_files
from tests.helpers import scan_snippet
from tests.rules.fixture_cases import fixture_path, read_fixture

RULE_FILES = rule_files("all")


def _found(source: str, rules) -> list[tuple]:
    return [
        (s.rule.id, s.line, s.column, s.applicable, s.reason, len(s.instances))
        for s in scan_snippet(source, rules)
    ]


@pytest.mark.parametrize("rule_file", RULE_FILES, ids=[path.stem for path in RULE_FILES])
def test_skipping_rules_a_flow_cannot_match_finds_the_same_sites(rule_file, monkeypatch):
    rules = load_rule_file(rule_file)
    cases = read_fixture(fixture_path(rule_file))
    with_skip = [_found(case.source, rules) for case in cases]
    monkeypatch.setattr(Matcher, "_could_match", lambda self, compiled, index, called: True)
    without_skip = [_found(case.source, rules) for case in cases]
    assert with_skip == without_skip
    assert any(with_skip), "the fixture has sites"


def test_a_rule_requires_the_operations_and_classes_it_names():
    rules = {rule.id: rule for rule in load_rule_set("all")}
    assert CompiledRule(rules["paper.4"].spellings[0]).required_names == (
        "torch.nn.functional.softmax",
    )
    # A submodule call requires the class its init pattern constructs.
    assert "torch.nn.Linear" in CompiledRule(rules["paper.9"].spellings[0]).required_names
    matcher = Matcher([rules["paper.4"]])
    assert not matcher._could_match(matcher.rules[0], {"matmul": []}, {})
    assert matcher._could_match(matcher.rules[0], {"torch.nn.functional.softmax": []}, {})


def test_explain_still_searches_every_rule_for_its_misses():
    matcher = Matcher(load_rule_set("all"), explain=True)
    assert all(matcher._could_match(compiled, {}, {}) for compiled in matcher.rules)
