"""Statements that take no part in the match, between the LM head and its loss (GPT-2's and
OpenAI GPT's double-heads models compute the multiple-choice head and its loss there): modern.7's
kernel arm runs them first, as written. Patched and original give the same losses, logits of the
second head and gradients in a training step (the second head's dropout included), and the same
outputs in evaluation; a statement in between that reads the logits, or rebinds what the kernel
reads, keeps the site unwritten."""

from __future__ import annotations

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set

torch = pytest.importorskip("torch")

DOUBLE_HEADS = """\
import torch
from torch import nn
from torch.nn import CrossEntropyLoss


class DoubleHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.lm_head = nn.Linear(8, 11, bias=False)
        self.multiple_choice_head = nn.Sequential(nn.Dropout(0.5), nn.Linear(8, 4))

    def forward(self, hidden_states, labels=None, mc_labels=None):
        lm_logits = self.lm_head(hidden_states)
        mc_logits = self.multiple_choice_head(hidden_states[:, -1])

        mc_loss = None
        if mc_labels is not None:
            loss_fct = CrossEntropyLoss()
            mc_loss = loss_fct(mc_logits.view(-1, mc_logits.size(-1)), mc_labels.view(-1))
        lm_loss = None
        if labels is not None:
            labels = labels.to(lm_logits.device)
            shift_logits = lm_logits[..., :-1, :].contiguous()
            shift_labels = labels[..., 1:].contiguous()
            loss_fct = CrossEntropyLoss()
            lm_loss = loss_fct(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))
        return lm_loss, mc_loss, lm_logits, mc_logits
"""


def _matcher() -> Matcher:
    return Matcher([rule for rule in load_rule_set("all") if rule.id == "modern.7"])


def _build(source: str):
    namespace: dict[str, object] = {}
    exec(compile(source, "model.py", "exec"), namespace)  # noqa: S102 - our own fixture
    torch.manual_seed(0)
    return namespace["DoubleHeads"]()  # type: ignore[operator]


def test_the_kernel_arm_runs_the_second_head_first_and_computes_the_same():
    rewrite = rewrite_text(DOUBLE_HEADS, "model.py", _matcher())
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    arm = patched.split("else:")[0]
    assert "self.multiple_choice_head(" in arm and "causal_lm_loss(" in arm
    assert arm.index("mc_loss = None") < arm.index("causal_lm_loss(")
    assert not rewrite_text(patched, "model.py", _matcher()).changed
    hidden = torch.randn(3, 5, 8)
    labels = torch.randint(0, 11, (3, 5))
    labels[0, 2] = -100
    mc_labels = torch.randint(0, 4, (3,))
    original, new = _build(DOUBLE_HEADS), _build(patched)
    new.load_state_dict(original.state_dict(), strict=True)
    for given_mc in (mc_labels, None):
        torch.manual_seed(1)
        want = original.train()(hidden, labels, given_mc)
        torch.manual_seed(1)
        have = new.train()(hidden, labels, given_mc)
        assert have[2] is None  # the kernel arm ran: no logits
        torch.testing.assert_close(have[0], want[0])
        torch.testing.assert_close(have[3], want[3])
        if given_mc is None:
            assert have[1] is None and want[1] is None
            continue
        torch.testing.assert_close(have[1], want[1])
        want_grads = torch.autograd.grad(want[0] + want[1], list(original.parameters()))
        have_grads = torch.autograd.grad(have[0] + have[1], list(new.parameters()))
        for a, b in zip(want_grads, have_grads, strict=True):
            torch.testing.assert_close(b, a)
    with torch.no_grad():
        for a, b in zip(
            original.eval()(hidden, labels, mc_labels),
            new.eval()(hidden, labels, mc_labels),
            strict=True,
        ):
            torch.testing.assert_close(b, a)


@pytest.mark.parametrize(
    ("between", "reason"),
    [
        # reads the logits the kernel arm never computes
        ("        mc_logits = self.multiple_choice_head(lm_logits[:, -1, :8])\n", "lm_logits"),
        # rebinds the hidden states the kernel reads
        ("        hidden_states = hidden_states * 2\n", "hidden_states"),
    ],
    ids=["reads-logits", "rebinds-kernel-input"],
)
def test_a_statement_in_between_that_the_match_depends_on_is_not_moved(between, reason):
    source = DOUBLE_HEADS.replace(
        "        mc_logits = self.multiple_choice_head(hidden_states[:, -1])\n",
        between + "        mc_logits = self.multiple_choice_head(hidden_states[:, -1])\n",
    )
    rewrite = rewrite_text(source, "model.py", _matcher())
    assert [r.status.value for r in rewrite.results] == ["skipped"]
    assert reason in rewrite.results[0].reason
    assert not rewrite.changed
