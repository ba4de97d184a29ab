"""Two layouts of a match around a branch: the final statement after an ``if``/``elif`` chain
whose first arm ends the match (xLSTM's feed-forward: the gated product in one arm, the down
projection after the chain), and an ``if`` whose test calls only an effect-free builtin
(SAM 3's ``if i < len(self.layers) - 1`` before the activation). Both are rewritten, patched
and original agree on every arm, a second apply changes nothing; a test that calls anything
else is still refused, with the reason, and scan says the same."""

from __future__ import annotations

import ast

import pytest

from adopter.match import Matcher
from adopter.match.scan import scan_source
from adopter.rewrite import rewrite_text
from adopter.rewrite.judge import mark_unwritable
from adopter.rewrite.source import calls_effectful
from adopter.rules import load_rule_set

torch = pytest.importorskip("torch")

FEED_FORWARD = """\
import torch
from torch import nn


class FeedForward(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.gate = nn.Linear(4, 8, bias=False)
        self.up = nn.Linear(4, 8, bias=False)
        self.fused = nn.Linear(4, 16, bias=False)
        self.down = nn.Linear(8, 4, bias=False)
        self.act = nn.SiLU()

    def forward(self, x):
        if self.mode == "single":
            x = self.act(self.gate(x)) * self.up(x)
        elif self.mode == "fused":
            gate, up = self.fused(x).chunk(2, dim=-1)
            x = self.act(gate) * up
        elif self.mode == "skip":
            return x
        y = self.down(x)  # back to the model width
        return y
"""

MLP_STACK = """\
import torch
from torch import nn


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.activation = nn.ReLU()

    def forward(self, hidden):
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden)
            if i < len(self.layers) - 1:
                hidden = self.activation(hidden)
        return hidden
"""


def _matcher(rule_id: str) -> Matcher:
    return Matcher([rule for rule in load_rule_set("all") if rule.id == rule_id])


def _build(text: str, name: str, *args: object):
    namespace: dict[str, object] = {}
    exec(compile(text, "model.py", "exec"), namespace)  # noqa: S102 - our own fixture
    torch.manual_seed(0)
    return namespace[name](*args)  # type: ignore[operator]


def _agree(original_text: str, patched_text: str, name: str, *args: object) -> None:
    original, patched = _build(original_text, name, *args), _build(patched_text, name, *args)
    patched.load_state_dict(original.state_dict(), strict=True)
    x = torch.randn(3, 4)
    torch.testing.assert_close(patched(x), original(x))


def test_the_statement_after_an_elif_chain_closes_every_arm_that_falls_through():
    matcher = _matcher("modern.2")
    rewrite = rewrite_text(FEED_FORWARD, "model.py", matcher)
    # the copy closing the fused-projection arm completes that arm's match: fused too
    assert [r.status.value for r in rewrite.results] == ["patched", "patched"]
    patched = rewrite.patched
    assert (
        '        if self.mode == "single":\n'
        "            y = gated_mlp(x, self.gate, self.up, self.down, self.act)\n"
        '        elif self.mode == "fused":\n'
        "            y = gated_mlp(self.fused(x), None, None, self.down, self.act, "
        "halves='first', dim=-1)  # back to the model width\n"
        '        elif self.mode == "skip":\n'
        "            return x\n"
        "        else:\n"
        "            y = self.down(x)  # back to the model width\n"
        "        return y\n"
    ) in patched
    assert not rewrite_text(patched, "model.py", matcher).changed
    for mode in ("single", "fused", "skip"):
        _agree(FEED_FORWARD, patched, "FeedForward", mode)
    # the added ``else`` runs the down projection on the input, as the original did after the
    # chain: both fail alike on a width it does not take
    for text in (FEED_FORWARD, patched):
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            _build(text, "FeedForward", "other")(torch.randn(3, 4))


def test_a_test_calling_only_len_lets_the_projection_move_into_its_arms():
    matcher = _matcher("paper.6")
    rewrite = rewrite_text(MLP_STACK, "model.py", matcher)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert (
        "            if i < len(self.layers) - 1:\n"
        "                hidden = linear_bias_activation(hidden, layer, self.activation)\n"
        "            else:\n"
        "                hidden = layer(hidden)\n"
    ) in patched
    assert not rewrite_text(patched, "model.py", matcher).changed
    _agree(MLP_STACK, patched, "Stack")


@pytest.mark.parametrize(
    "test",
    ["i < self.depth() - 1", "i < len(self.active_layers()) - 1", "i < max(len(self.layers), 2)"],
)
def test_a_test_that_calls_anything_else_is_still_refused_and_scan_agrees(test):
    text = MLP_STACK.replace("i < len(self.layers) - 1", test)
    matcher = _matcher("paper.6")
    rewrite = rewrite_text(text, "model.py", matcher)
    (result,) = rewrite.results
    assert result.status.value == "skipped"
    assert "the condition calls something" in result.reason
    sites = scan_source(text, "model.py", matcher)
    mark_unwritable(text, "model.py", sites)
    (site,) = [s for s in sites if s.applicable]
    assert not site.rewritable and site.rewrite_reason == result.reason


@pytest.mark.parametrize(
    ("expression", "effectful"),
    [
        ("len(x) > 1", False),
        ("isinstance(x, int) and callable(f)", False),
        ("len(x.items())", True),  # the argument calls a method
        ("x.size(0) > 1", True),
        ("print(x)", True),
        ("(yield x)", True),
    ],
)
def test_effect_free_builtins_are_told_from_other_calls(expression, effectful):
    tree = ast.parse(f"def f():\n    return {expression}\n")
    assert calls_effectful(tree.body[0].body[0].value) is effectful  # type: ignore[attr-defined]
