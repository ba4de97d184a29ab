"""A masked-LM head nested in a submodule that does more before its vocabulary projection
(dense, activation, norm): the kernel arm of modern.7 copies that work into the caller, in the
caller's terms, and the patched model computes the same loss in training and the same logits
everywhere else. Where copying could change what runs, the site is skipped with the reason,
and scan says so too."""

from __future__ import annotations

import pytest

from adopter.match import Matcher
from adopter.match.scan import scan_source
from adopter.rewrite import rewrite_text
from adopter.rewrite.judge import mark_unwritable
from adopter.rules import load_rule_set

torch = pytest.importorskip("torch")

HEAD = """\
import torch
from torch import nn
from torch.nn import CrossEntropyLoss
from torch.nn.functional import gelu


class Config:
    hidden_size = 8
    vocab_size = 11
"""

# RoBERTa's shape: a parameter of its own name, the activation a global of the file
LM_HEAD = """
class LMHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, features, **kwargs):
        \"\"\"Back to the vocabulary.\"\"\"
        x = self.dense(features)
        x = gelu(x)
        x = self.layer_norm(x)
        x = self.decoder(x)
        return x
"""

# ALBERT's shape: the parameter rebound, the result named again before it is returned, and a
# logit bias added after the projection (ESM, BridgeTower)
BIASED_HEAD = """
class LMHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.randn(config.vocab_size))

    def forward(self, hidden_states):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.layer_norm(gelu(hidden_states))
        hidden_states = self.decoder(hidden_states) + self.bias
        prediction_scores = hidden_states
        return prediction_scores
"""

CALLER = """
class ForMaskedLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.encoder = nn.Linear(config.hidden_size, config.hidden_size)
        self.lm_head = LMHead(config)

    def forward(self, hidden_states, labels=None):
        x = self.encoder(hidden_states)
        sequence_output = torch.tanh(x)
        prediction_scores = self.lm_head(sequence_output)

        masked_lm_loss = None
        if labels is not None:
            labels = labels.to(prediction_scores.device)
            loss_fct = CrossEntropyLoss()
            masked_lm_loss = loss_fct(prediction_scores.view(-1, self.config.vocab_size), labels.view(-1))
        return masked_lm_loss, prediction_scores
"""


def _rules():
    return [rule for rule in load_rule_set("all") if rule.id == "modern.7"]


def _rewrite(text: str):
    matcher = Matcher(_rules())
    return rewrite_text(text, "model.py", matcher), matcher


def _model(text: str) -> object:
    namespace: dict[str, object] = {}
    exec(compile(text, "model.py", "exec"), namespace)  # noqa: S102 - our own fixture
    torch.manual_seed(0)
    return namespace["ForMaskedLM"](namespace["Config"]())  # type: ignore[operator]


def _same_model(original_text: str, patched_text: str) -> None:
    original, patched = _model(original_text), _model(patched_text)
    assert list(original.state_dict()) == list(patched.state_dict())  # type: ignore[attr-defined]
    patched.load_state_dict(original.state_dict(), strict=True)  # type: ignore[attr-defined]
    hidden = torch.randn(2, 5, 8)
    labels = torch.randint(0, 11, (2, 5))
    labels[0, 1] = -100  # a token the loss ignores
    original.train()  # type: ignore[attr-defined]
    patched.train()  # type: ignore[attr-defined]
    want, _ = original(hidden, labels)  # type: ignore[operator]
    have, logits = patched(hidden, labels)  # type: ignore[operator]
    assert logits is None  # the kernel ran: no logits in a training step with labels
    torch.testing.assert_close(have, want)
    want.backward()
    have.backward()
    for (name, a), (_, b) in zip(
        original.named_parameters(),  # type: ignore[attr-defined]
        patched.named_parameters(),  # type: ignore[attr-defined]
        strict=True,
    ):
        torch.testing.assert_close(b.grad, a.grad, msg=name)
    original.eval()  # type: ignore[attr-defined]
    patched.eval()  # type: ignore[attr-defined]
    for got, expected in zip(patched(hidden, labels), original(hidden, labels), strict=True):  # type: ignore[operator]
        torch.testing.assert_close(got, expected)


def test_the_head_submodules_work_is_copied_into_the_kernel_arm():
    text = HEAD + LM_HEAD + CALLER
    rewrite, matcher = _rewrite(text)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    # `x` is the caller's: the copy's local gets a name of its own; `self` is the submodule
    assert "            lm_head_x = self.lm_head.dense(sequence_output)\n" in patched
    assert "            lm_head_x = gelu(lm_head_x)\n" in patched
    assert (
        "causal_lm_loss(lm_head_x, self.lm_head.decoder, labels, self.config.vocab_size, "
        "shift=False, upcast=False)" in patched
    )
    assert "fused_loss_applies(self.lm_head.decoder, labels)" in patched
    assert (
        "        else:\n            prediction_scores = self.lm_head(sequence_output)\n" in patched
    )
    assert patched.count("x = self.decoder(x)") == 1  # the submodule itself is not edited
    assert not rewrite_text(patched, "model.py", matcher).changed  # second apply: nothing
    _same_model(text, patched)


def test_a_rebound_parameter_an_alias_and_a_logit_bias():
    text = (
        HEAD
        + BIASED_HEAD
        + CALLER.replace("hidden_states, labels", "inputs, labels").replace(
            "self.encoder(hidden_states)", "self.encoder(inputs)"
        )
    )
    rewrite, matcher = _rewrite(text)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert "            hidden_states = self.lm_head.dense(sequence_output)\n" in patched
    assert "hidden_states = self.lm_head.layer_norm(gelu(hidden_states))" in patched
    assert "logit_bias=self.lm_head.bias" in patched
    assert not rewrite_text(patched, "model.py", matcher).changed
    _same_model(text, patched)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        # the submodule called twice: the kernel arm would replace only one of the calls
        (
            (
                "        prediction_scores = self.lm_head(sequence_output)\n",
                "        prediction_scores = self.lm_head(sequence_output)\n"
                "        again = self.lm_head(sequence_output)\n",
            ),
            "self.lm_head() is called more than once",
        ),
        # a local of the caller shadows the global the copied statements read
        (
            ("        x = self.encoder(hidden_states)\n", "        gelu = torch.tanh\n"),
            "which forward() reads as a global",
        ),
        # the argument calls something: the copy would run it again, or not at all
        (
            ("self.lm_head(sequence_output)", "self.lm_head(torch.tanh(x))"),
            "the argument for `features` of forward() calls something",
        ),
        # control flow before the head: not copied
        (
            ("        x = gelu(x)\n", "        if self.training:\n            x = gelu(x)\n"),
            "does work before the match that is not copied",
        ),
    ],
)
def test_where_copying_could_change_what_runs_the_site_is_skipped_and_scan_agrees(edit, reason):
    old, new = edit
    text = HEAD + LM_HEAD + CALLER
    text = text.replace(old, new) if old != "        x = gelu(x)\n" else text.replace(old, new, 1)
    if old == "        x = self.encoder(hidden_states)\n":
        text = text.replace("torch.tanh(x)", "gelu(hidden_states)")
    assert text != HEAD + LM_HEAD + CALLER
    rewrite, _ = _rewrite(text)
    (result,) = rewrite.results
    assert result.status.value == "skipped"
    assert reason in result.reason
    assert not rewrite.changed
    sites = scan_source(text, "model.py", Matcher(_rules()))
    mark_unwritable(text, "model.py", sites)
    (site,) = [s for s in sites if s.applicable]
    assert not site.rewritable and site.rewrite_reason == result.reason


def test_an_argument_that_is_an_expression_is_evaluated_once_into_a_name():
    text = (HEAD + LM_HEAD + CALLER).replace(
        "self.lm_head(sequence_output)", "self.lm_head(sequence_output if labels is None else x)"
    )
    rewrite, matcher = _rewrite(text)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert "            features = sequence_output if labels is None else x\n" in patched
    assert "            lm_head_x = self.lm_head.dense(features)\n" in patched
    assert not rewrite_text(patched, "model.py", matcher).changed
    _same_model(text, patched)


PRETRAINING = """
class ForPreTraining(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.lm_head = LMHead(config)
        self.order = nn.Linear(config.hidden_size, 2)

    def forward(self, sequence_output, pooled_output=None, labels=None):
        prediction_scores = self.lm_head(sequence_output)
        order_scores = self.order(pooled_output) + prediction_scores.mean()
        loss = None
        if labels is not None:
            loss_fct = CrossEntropyLoss()
            loss = loss_fct(prediction_scores.view(-1, self.config.vocab_size), labels.view(-1))
        return loss, prediction_scores, order_scores
"""


def test_a_head_two_models_call_is_patched_through_the_call_that_allows_it():
    # ALBERT's shape: the masked-LM model and the pre-training one (which scores the sentence
    # order among the head's statements, here from the logits too, so the kernel arm could not
    # run it) share the head: a site at each caller's call of it, each patched or skipped on
    # its own
    text = HEAD + LM_HEAD + CALLER + PRETRAINING
    rewrite, matcher = _rewrite(text)
    patched_result, skipped_result = rewrite.results
    assert patched_result.status.value == "patched"
    assert skipped_result.status.value == "skipped"
    assert "order_scores = self.order(pooled_output) + prediction_scores.mean()` computes" in (
        skipped_result.reason
    )
    patched = rewrite.patched
    assert patched.count("fused_loss_applies(") == 1  # the masked-LM model's call only
    assert (
        "        prediction_scores = self.lm_head(sequence_output)\n        order_scores" in patched
    )
    again = rewrite_text(patched, "model.py", matcher)
    assert not again.changed  # the pre-training model's site is still there, still skipped
    assert [r.status.value for r in again.results] == ["skipped"]
    sites = scan_source(text, "model.py", Matcher(_rules()))
    mark_unwritable(text, "model.py", sites)
    assert [s.rewritable for s in sites if s.applicable] == [True, False]
    _same_model(HEAD + LM_HEAD + CALLER, patched.split("\nclass ForPreTraining")[0] + "\n")


def test_with_every_rule_the_copied_statements_are_fused_in_the_same_apply():
    # ALBERT's head applies its activation to the dense layer's output: once copied into the
    # kernel arm, the two are a bias + activation site of their own
    text = (HEAD + LM_HEAD + CALLER).replace("x = gelu(x)", "x = torch.nn.functional.gelu(x)")
    matcher = Matcher(load_rule_set("all"))
    rewrite = rewrite_text(text, "model.py", matcher)
    assert "causal_lm_loss(" in rewrite.patched
    assert not rewrite_text(rewrite.patched, "model.py", matcher).changed
