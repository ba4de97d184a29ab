"""The ``extended`` rule set: fused attention for model families the paper's rules do not name.

Each rule's cases live in its fixture (tests/rules/fixtures/); here, how the set interacts with
the paper rules on the real shape it targets.
"""

from __future__ import annotations

import textwrap

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set

HEAD = """
import torch
from torch import nn
"""


def test_extended_rules_replace_attention_classes_at_their_constructor():
    for rule in load_rule_set("extended"):
        assert rule.site == "init", rule.id


def test_the_all_set_is_paper_then_extended_then_modern():
    ids = [rule.id for rule in load_rule_set("all")]
    assert ids == [
        rule.id for name in ("paper", "extended", "modern") for rule in load_rule_set(name)
    ]


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
