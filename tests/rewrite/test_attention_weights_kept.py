"""A model that keeps its layers' attention probabilities whether or not they are asked for
(BridgeTower, transformers 5.24) must not get modern.4's kernel, which returns them only when
asked: its output's ``attentions`` would become ``None``. Verify refuted that edit; the rewrite
now refuses it, naming the line."""

from __future__ import annotations

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rewrite.apply import FileRewrite, SiteStatus
from adopter.rules import load_rule_set, rule_files
from tests.rules.fixture_cases import fixture_path, read_fixture

_COLLECTING_MODEL = """

class Model(nn.Module):
    def forward(self, hidden, output_attentions=False):
        all_self_attentions = []
        for layer in self.layers:
            hidden, weights = layer(hidden)
            {collect}
        return hidden, all_self_attentions
"""


def _attention_function_file(collect: str) -> str:
    """The fixture's first case (transformers 5's ``eager_attention_forward``) in a file with a
    model that collects the probabilities as ``collect`` says."""
    rule_file = next(path for path in rule_files() if path.stem.startswith("modern_4"))
    first = read_fixture(fixture_path(rule_file))[0]
    return first.source + _COLLECTING_MODEL.format(collect=collect)


def _rewrite(text: str) -> FileRewrite:
    matcher = Matcher([rule for rule in load_rule_set("all") if rule.id == "modern.4"])
    return rewrite_text(text, "modeling_x.py", matcher)


def test_a_file_that_keeps_the_probabilities_unasked_is_left_alone() -> None:
    result = _rewrite(_attention_function_file("all_self_attentions.append(weights)"))
    assert not result.changed
    (skipped,) = result.with_status(SiteStatus.SKIPPED)
    assert "attention probabilities whether or not they are asked for" in skipped.reason


def test_a_file_that_keeps_them_when_asked_is_patched() -> None:
    asked = "if output_attentions:\n                all_self_attentions.append(weights)"
    result = _rewrite(_attention_function_file(asked))
    assert result.changed and "attention_function(" in result.patched
