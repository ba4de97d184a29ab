"""A soft cap the model reads from its configuration between the head and the loss (Gemma 3n
and 4 bind it with ``:=`` in the capping test, T5Gemma 2 reads the decoder's configuration into
a local): modern.7's kernel arm computes that value first, the same way, and hands it to the
chunked loss. Patched and original compute the same loss in a training step, with the cap set
and unset, and the same logits in evaluation."""

from __future__ import annotations

import types

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set
from tests.rules.fixture_cases import FIXTURES, read_fixture

torch = pytest.importorskip("torch")

HEAD = """\
import torch
from torch import nn
"""

WALRUS = """
class ForCausalLM(nn.Module):
    def __init__(self, config, loss_function):
        super().__init__()
        self.config = config
        self.loss_function = loss_function
        self.lm_head = nn.Linear(8, 11, bias=False)

    def forward(self, hidden_states, labels=None, **kwargs):
        logits = self.lm_head(hidden_states)
        if (final_logit_softcapping := self.config.get_text_config().final_logit_softcapping) is not None:
            logits = logits / final_logit_softcapping
            logits = torch.tanh(logits)
            logits = logits * final_logit_softcapping
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config.get_text_config().vocab_size, **kwargs)
        return loss, logits
"""

LOCAL = """
class ForCausalLM(nn.Module):
    def __init__(self, config, loss_function):
        super().__init__()
        self.config = config
        self.vocab_size = 11
        self.loss_function = loss_function
        self.lm_head = nn.Linear(8, 11, bias=False)

    def forward(self, hidden_states, labels=None, **kwargs):
        logits = self.lm_head(hidden_states)
        decoder_config = self.config.decoder
        if decoder_config.final_logit_softcapping is not None:
            logits = logits / decoder_config.final_logit_softcapping
            logits = torch.tanh(logits)
            logits = logits * decoder_config.final_logit_softcapping
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)
        return loss, logits
"""


def ForCausalLMLoss(logits, labels, vocab_size, ignore_index=-100, **kwargs):  # noqa: N802
    """transformers 5's shifted causal-LM loss, as the guard recognises it by name."""
    logits = logits.float()
    labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
    shift_labels = labels[..., 1:].contiguous()
    return torch.nn.functional.cross_entropy(
        logits.view(-1, vocab_size), shift_labels.view(-1), ignore_index=ignore_index
    )


ForCausalLMLoss.__module__ = "transformers.loss.loss_utils"


def _config(cap):
    text = types.SimpleNamespace(final_logit_softcapping=cap, vocab_size=11)
    return types.SimpleNamespace(
        get_text_config=lambda: text, decoder=types.SimpleNamespace(final_logit_softcapping=cap)
    )


def _model(text: str, cap):
    namespace: dict[str, object] = {}
    exec(compile(text, "model.py", "exec"), namespace)  # noqa: S102 - our own fixture
    torch.manual_seed(0)
    return namespace["ForCausalLM"](_config(cap), ForCausalLMLoss)  # type: ignore[operator]


@pytest.mark.parametrize("body", [WALRUS, LOCAL], ids=["walrus", "local"])
def test_the_kernel_arm_reads_the_cap_the_way_the_model_does(body):
    text = HEAD + body
    matcher = Matcher([rule for rule in load_rule_set("all") if rule.id == "modern.7"])
    rewrite = rewrite_text(text, "model.py", matcher)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert "final_logit_softcapping=" in patched
    assert not rewrite_text(patched, "model.py", matcher).changed
    hidden = torch.randn(2, 5, 8)
    labels = torch.randint(0, 11, (2, 5))
    for cap in (None, 3.0):
        original, new = _model(text, cap), _model(patched, cap)
        new.load_state_dict(original.state_dict(), strict=True)
        want, _ = original.train()(hidden, labels)
        have, logits = new.train()(hidden, labels)
        assert logits is None
        torch.testing.assert_close(have, want)
        for a, b in zip(original.eval()(hidden, labels), new.eval()(hidden, labels), strict=True):
            torch.testing.assert_close(b, a)


# Canary and Cohere ASR read the targets from the keyword arguments just before the loss, in
# the block that computes it: the kernel arm pops them first too, and the guard (which runs
# before that statement) is not handed the name it binds.
POPPED = """
class ForCausalLM(nn.Module):
    def __init__(self, config, loss_function):
        super().__init__()
        self.config = config
        self.loss_function = loss_function
        self.lm_head = nn.Linear(8, 11, bias=False)

    def forward(self, hidden_states, labels=None, **kwargs):
        logits = self.lm_head(hidden_states)

        loss = None
        if labels is not None:
            shift_labels = kwargs.pop("shift_labels", labels)
            loss = self.loss_function(
                logits=logits,
                labels=labels,
                vocab_size=11,
                shift_labels=shift_labels,
                **kwargs,
            )
        return loss, logits
"""

# The same value bound one block deeper, so it is not bound on every run of the loss.
POPPED_DEEPER = POPPED.replace(
    """            shift_labels = kwargs.pop("shift_labels", labels)
""",
    """            shift_labels = labels
            if kwargs.get("pop"):
                shift_labels = kwargs.pop("shift_labels", labels)
""",
)


def ForCausalLMLossShifted(  # noqa: N802
    logits, labels, vocab_size, ignore_index=-100, shift_labels=None, **kwargs
):
    """``ForCausalLMLoss`` with its ``shift_labels``: targets given as they are."""
    if shift_labels is None:
        labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    return torch.nn.functional.cross_entropy(
        logits.float().view(-1, vocab_size), shift_labels.view(-1), ignore_index=ignore_index
    )


ForCausalLMLossShifted.__name__ = "ForCausalLMLoss"
ForCausalLMLossShifted.__module__ = "transformers.loss.loss_utils"


def test_the_kernel_arm_binds_a_value_read_just_before_the_loss():
    text = HEAD + POPPED
    matcher = Matcher([rule for rule in load_rule_set("all") if rule.id == "modern.7"])
    rewrite = rewrite_text(text, "model.py", matcher)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    guard = next(line for line in patched.splitlines() if "fused_loss_applies(" in line)
    assert "shift_labels" not in guard
    assert not rewrite_text(patched, "model.py", matcher).changed
    hidden = torch.randn(2, 5, 8)
    labels = torch.randint(0, 11, (2, 5))
    given = torch.randint(0, 11, (2, 5))
    namespace: dict[str, object] = {}
    for extra in ({}, {"shift_labels": given}):
        models = []
        for source in (text, patched):
            exec(compile(source, "model.py", "exec"), namespace)  # noqa: S102 - our fixture
            torch.manual_seed(0)
            models.append(namespace["ForCausalLM"](None, ForCausalLMLossShifted))  # type: ignore[operator]
        original, new = models
        want, _ = original.train()(hidden, labels, **extra)
        have, logits = new.train()(hidden, labels, **extra)
        assert logits is None
        torch.testing.assert_close(have, want)
        for a, b in zip(
            original.eval()(hidden, labels, **extra),
            new.eval()(hidden, labels, **extra),
            strict=True,
        ):
            torch.testing.assert_close(b, a)


def test_a_value_bound_in_a_deeper_block_is_not_moved_into_the_kernel_arm():
    matcher = Matcher([rule for rule in load_rule_set("all") if rule.id == "modern.7"])
    rewrite = rewrite_text(HEAD + POPPED_DEEPER, "model.py", matcher)
    assert [r.status.value for r in rewrite.results] == ["skipped"]
    assert "computes among the matched statements" in rewrite.results[0].reason


UPCAST = LOCAL.replace(
    """        logits = self.lm_head(hidden_states)
        decoder_config = self.config.decoder
        if decoder_config.final_logit_softcapping is not None:
            logits = logits / decoder_config.final_logit_softcapping
            logits = torch.tanh(logits)
            logits = logits * decoder_config.final_logit_softcapping
""",
    """        logits = self.lm_head(hidden_states.to(self.lm_head.weight.dtype)).float()
""",
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_upcast_on_the_way_to_the_loss(dtype):
    """Mamba's and Mllama's ``lm_head(...).float()``: the loss upcasts the logits anyway."""
    text = HEAD + UPCAST
    assert ".float()" in text
    matcher = Matcher([rule for rule in load_rule_set("all") if rule.id == "modern.7"])
    rewrite = rewrite_text(text, "model.py", matcher)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert not rewrite_text(patched, "model.py", matcher).changed
    hidden = torch.randn(2, 5, 8)
    labels = torch.randint(0, 11, (2, 5))
    original, new = _model(text, None).to(dtype), _model(patched, None).to(dtype)
    new.load_state_dict(original.state_dict(), strict=True)
    want, _ = original.train()(hidden, labels)
    have, logits = new.train()(hidden, labels)
    assert logits is None
    torch.testing.assert_close(have, want)
    for a, b in zip(original.eval()(hidden, labels), new.eval()(hidden, labels), strict=True):
        torch.testing.assert_close(b, a)


# DistilBERT's masked-LM head reads its input from the name its logits get
# (``x = self.vocab_projector(x)``): the kernel arm hands the loss that input first and sets the
# name to None after, never the other way round (which handed the kernel None). The model is the
# modern.7 fixture's case of that title, run here.
REUSED_TITLE = "a masked-LM head whose input has the name its logits get"


def test_a_head_whose_input_has_its_logits_name_hands_the_loss_that_input() -> None:
    fixture = FIXTURES / "modern_7_linear_cross_entropy.py"
    (case,) = [c for c in read_fixture(fixture) if c.title.startswith(REUSED_TITLE)]
    matcher = Matcher([rule for rule in load_rule_set("all") if rule.id == "modern.7"])
    rewrite = rewrite_text(case.source, "model.py", matcher)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    built = []
    for source in (case.source, rewrite.patched):
        namespace: dict[str, object] = {}
        exec(compile(source, "model.py", "exec"), namespace)  # noqa: S102 - our own fixture
        torch.manual_seed(0)
        config = types.SimpleNamespace(dim=8, vocab_size=11)
        built.append(namespace["ReusedNameForMaskedLM"](config))  # type: ignore[operator]
    original, patched = built
    patched.load_state_dict(original.state_dict(), strict=True)
    hidden, labels = torch.randn(2, 5, 8), torch.randint(0, 11, (2, 5))
    want, _ = original.train()(hidden, labels)
    have, logits = patched.train()(hidden, labels)
    assert logits is None
    torch.testing.assert_close(have, want)
