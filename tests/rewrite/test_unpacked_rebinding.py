"""Moonshine's gated MLP: the chunk's first half bound to the name the product then rebinds,
and the down projection reads that name again. The later read sees the product, not the half,
so the unpacking may go with the match; the patched MLP computes what the original did. (A read
of the half itself outside the match stays refused: the modern.2 fixture's timm GluMlp case.)"""

from __future__ import annotations

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set

torch = pytest.importorskip("torch")

MLP = """\
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.activation_fn = nn.SiLU()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, hidden_states):
        hidden_states = self.fc1(hidden_states)
        hidden_states, gate = hidden_states.chunk(2, dim=-1)
        hidden_states = self.activation_fn(gate) * hidden_states
        hidden_states = self.fc2(hidden_states)
        return hidden_states
"""


def _rewrite(text: str):
    matcher = Matcher([rule for rule in load_rule_set("all") if rule.id == "modern.2"])
    return rewrite_text(text, "mlp.py", matcher), matcher


def _mlp(text: str):
    namespace: dict[str, object] = {}
    exec(compile(text, "mlp.py", "exec"), namespace)  # noqa: S102 - our own fixture
    torch.manual_seed(0)
    return namespace["MLP"]()  # type: ignore[operator]


def test_a_name_the_product_rebinds_is_not_a_read_of_the_half():
    rewrite, matcher = _rewrite(MLP)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    assert "hidden_states, gate = hidden_states.chunk" not in rewrite.patched
    assert not rewrite_text(rewrite.patched, "mlp.py", matcher).changed
    original, patched = _mlp(MLP), _mlp(rewrite.patched)
    patched.load_state_dict(original.state_dict(), strict=True)
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(patched(x), original(x))
