"""Typed apply results: a site is patched, covered or skipped (with the kind of reason), and
the JSON and text output print the same words as before."""

from __future__ import annotations

import json

import pytest

from adopter.dsl import load_rule_file
from adopter.match import Matcher
from adopter.rewrite import SiteStatus, SkipReason, WriteStatus, rewrite_text
from adopter.rules import load_rule_set, rule_files
from tests.rules.fixture_cases import fixture_path, read_fixture

BERT_OUTPUT = """
from torch import nn
class SelfOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.LayerNorm = nn.LayerNorm(4)
        self.dropout = nn.Dropout(0.1)
    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return self.LayerNorm(hidden_states + input_tensor)
"""


@pytest.mark.parametrize("member", [*SiteStatus, *SkipReason, *WriteStatus])
def test_members_read_as_their_text(member):
    assert str(member) == f"{member}" == member.value
    assert json.dumps({"status": member}) == json.dumps({"status": member.value})
    assert member == member.value  # records read back from JSON compare equal


@pytest.mark.parametrize("rule_file", rule_files("all"), ids=lambda path: path.stem)
def test_every_fixture_result_is_typed(rule_file):
    matcher = Matcher(load_rule_file(rule_file))
    for case in read_fixture(fixture_path(rule_file)):
        for result in rewrite_text(case.source, "fixture.py", matcher).results:
            assert isinstance(result.status, SiteStatus)
            if result.status is SiteStatus.SKIPPED:
                assert isinstance(result.skip, SkipReason) and result.reason, case.title
            else:
                assert result.skip is None, case.title


def test_a_refused_site_is_skipped_as_unsafe():
    rule_file = next(path for path in rule_files("all") if path.stem.startswith("paper_6_"))
    case = next(
        case for case in read_fixture(fixture_path(rule_file)) if "functional forms" in case.title
    )
    results = rewrite_text(case.source, "fixture.py", Matcher(load_rule_file(rule_file))).results
    (skipped,) = [r for r in results if r.status is SiteStatus.SKIPPED]
    assert skipped.skip is SkipReason.UNSAFE
    assert skipped.as_record()["status"] == "skipped"
    assert "passes arguments the replacement would drop" in skipped.reason


def test_a_modular_source_is_skipped_by_policy_and_patched_with_modular():
    matcher = Matcher(load_rule_set("paper"))
    kept = rewrite_text(BERT_OUTPUT, "modular_bert.py", matcher)
    assert [(r.status, r.skip) for r in kept.results] == [
        (SiteStatus.SKIPPED, SkipReason.MODULAR_POLICY)
    ]
    assert not kept.changed and kept.rules_patched == []
    patched = rewrite_text(BERT_OUTPUT, "modular_bert.py", matcher, modular=True)
    assert [(r.status, r.skip) for r in patched.results] == [(SiteStatus.PATCHED, None)]
    assert patched.rules_patched == ["paper.5"]
    assert patched.with_status(SiteStatus.PATCHED)[0].as_record()["status"] == "patched"


def test_a_status_given_as_text_becomes_the_member():
    from adopter.rewrite.apply import SiteResult

    result = rewrite_text(BERT_OUTPUT, "model.py", Matcher(load_rule_set("paper"))).results[0]
    again = SiteResult(result.site, "skipped", "why")  # code that predates SiteStatus
    assert again.status is SiteStatus.SKIPPED
