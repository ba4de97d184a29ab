"""The ``extended`` rule set: fused attention for model families the paper's rules do not name.

Each rule gets cases that must match and cases that must not (small models of our own, ``line``
is the expected site line after dedent), and one rewrite of the real shape it targets.
"""

from __future__ import annotations

import textwrap

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set, rule_files
from tests.helpers import scan_snippet

HEAD = """
import torch
from torch import nn
"""


def _holder(attention: str, construction: str) -> str:
    return (
        HEAD
        + f"""
class {attention}(nn.Module):
    def forward(self, x):
        return x
class Layer(nn.Module):
    def __init__(self, config, attention_type="global"):
        super().__init__()
        self.attention = {construction}
    def forward(self, x):
        return self.attention(x)
"""
    )


CASES: dict[str, list[tuple[str, list[int]]]] = {
    "ext.1": [
        (
            _holder(
                "RobertaSelfAttention",
                "RobertaSelfAttention(config, position_embedding_type=attention_type)",
            ),
            [11],
        ),
        # BertSelfAttention is paper.1's, not ext.1's
        (
            _holder(
                "BertSelfAttention",
                "BertSelfAttention(config, position_embedding_type=attention_type)",
            ),
            [],
        ),
    ],
    "ext.2": [
        (_holder("MultiHeadSelfAttention", "MultiHeadSelfAttention(config)"), [11]),
        # built but never called: nothing to speed up
        (
            HEAD
            + """
class Holder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = MultiHeadSelfAttention(config)
    def forward(self, x):
        return x
""",
            [],
        ),
    ],
    "ext.3": [
        (_holder("AlbertAttention", "AlbertAttention(config)"), [11]),
        (_holder("AlbertSdpaAttention", "AlbertSdpaAttention(config)"), []),
    ],
    "ext.4": [
        (_holder("GPTNeoSelfAttention", "GPTNeoSelfAttention(config, attention_type)"), [11]),
        (_holder("GPTNeoFlashAttention2", "GPTNeoFlashAttention2(config, attention_type)"), []),
    ],
}


def test_every_extended_rule_has_cases_and_a_documented_file():
    rules = load_rule_set("extended")
    assert [rule.id for rule in rules] == [f"ext.{n}" for n in range(1, 5)]
    assert set(CASES) == {rule.id for rule in rules}
    assert len(rule_files("extended")) == 4
    for rule in rules:
        assert "What it does" in rule.doc and "Before:" in rule.doc and "After" in rule.doc
        assert rule.kernel.startswith("adopter.kernels.")
        assert rule.site == "init"


def test_the_all_set_is_paper_then_extended():
    ids = [rule.id for rule in load_rule_set("all")]
    assert ids == [f"paper.{n}" for n in range(1, 10)] + [f"ext.{n}" for n in range(1, 5)]


def test_an_unknown_rule_set_is_named_in_the_error():
    with pytest.raises(KeyError, match="known: all, extended, paper"):
        rule_files("newest")


@pytest.mark.parametrize(
    ("rule_id", "source", "lines"),
    [(rule_id, source, lines) for rule_id, cases in CASES.items() for source, lines in cases],
)
def test_rule_cases(rule_id, source, lines):
    rules = [rule for rule in load_rule_set("extended") if rule.id == rule_id]
    found = [site.line for site in scan_snippet(source, rules) if site.applicable]
    assert sorted(found) == lines


ALBERT_LIKE = (
    HEAD
    + """
class AlbertAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.output_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.LayerNorm = nn.LayerNorm(config.hidden_size)

    def forward(self, hidden_states):
        projected = self.dense(hidden_states)
        dropped = self.output_dropout(projected)
        return (self.LayerNorm(hidden_states + dropped),)


class AlbertLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = AlbertAttention(config)  # the whole block

    def forward(self, hidden_states):
        return self.attention(hidden_states)[0]
"""
)


def test_albert_attention_is_replaced_whole_and_its_norm_site_is_covered():
    matcher = Matcher(load_rule_set("all"))
    result = rewrite_text(textwrap.dedent(ALBERT_LIKE), "model.py", matcher)
    statuses = {r.site.rule.id: (r.status, r.reason) for r in result.results}
    assert statuses["ext.3"][0] == "patched"
    assert statuses["paper.5"] == (
        "covered",
        "inside AlbertAttention, which a fused-attention rule replaces as a whole",
    )
    assert (
        "self.attention = fused_albert_attention(AlbertAttention)(config)  # the whole block"
        in result.patched
    )
    assert "from adopter.kernels import fused_albert_attention" in result.patched
    assert "self.LayerNorm(hidden_states + dropped)" in result.patched
    assert not rewrite_text(result.patched, "model.py", matcher).changed
