"""RT-DETR's encoder layer: the MLP's forward ends with dropout, the caller adds the residual
and normalises only when it does not normalise before. The helper returns the fused kernel when
handed the residual and the norm; the caller's call and add move into both arms of the ``if``,
fused in the arm that normalises. Patched and original agree for both settings."""

from __future__ import annotations

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set

torch = pytest.importorskip("torch")

LAYER = """\
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)
        self.dropout = 0.0

    def forward(self, hidden_states):
        hidden_states = torch.relu(self.fc1(hidden_states))
        hidden_states = self.fc2(hidden_states)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        return hidden_states


class Layer(nn.Module):
    def __init__(self, normalize_before=False):
        super().__init__()
        self.normalize_before = normalize_before
        self.final_layer_norm = nn.LayerNorm(8)
        self.mlp = MLP()

    def forward(self, hidden_states):
        if self.normalize_before:
            hidden_states = self.final_layer_norm(hidden_states)
        residual = hidden_states
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        if not self.normalize_before:
            hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states
"""


def _layer(text: str, normalize_before: bool):
    namespace: dict[str, object] = {}
    exec(compile(text, "layer.py", "exec"), namespace)  # noqa: S102 - our own fixture
    torch.manual_seed(0)
    return namespace["Layer"](normalize_before)  # type: ignore[operator]


def test_the_helpers_call_and_the_add_move_into_the_arms_of_the_norms_if():
    matcher = Matcher([rule for rule in load_rule_set("paper") if rule.id == "paper.5"])
    rewrite = rewrite_text(LAYER, "layer.py", matcher)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert (
        "        if not self.normalize_before:\n"
        "            hidden_states = self.mlp(hidden_states, residual=residual, "
        "norm=self.final_layer_norm)\n"
        "        else:\n"
        "            hidden_states = self.mlp(hidden_states)\n"
        "            hidden_states = residual + hidden_states\n"
    ) in patched
    assert not rewrite_text(patched, "layer.py", matcher).changed
    x = torch.randn(2, 3, 8)
    for normalize_before in (False, True):
        original, new = _layer(LAYER, normalize_before), _layer(patched, normalize_before)
        new.load_state_dict(original.state_dict(), strict=True)
        for train in (False, True):
            original.train(train)
            new.train(train)
            torch.testing.assert_close(new(x), original(x))
