"""Conv, norm and activation where the norm and the activation each sit under an ``if`` of
their own (MobileNet's, MobileViT's conv layer): the kernel runs where every test holds, the
original statements everywhere else; patched and original agree with each module present or
absent, and a second apply changes nothing. A test that could mean something else before the
convolution, or other work among the statements, is refused with the reason, and scan says so."""

from __future__ import annotations

import pytest

from adopter.match import Matcher
from adopter.match.scan import scan_source
from adopter.rewrite import rewrite_text
from adopter.rewrite.judge import mark_unwritable
from adopter.rules import load_rule_set

torch = pytest.importorskip("torch")

LAYER = """\
import torch
from torch import nn


class ConvLayer(nn.Module):
    def __init__(self, use_norm=True, use_act=True):
        super().__init__()
        self.convolution = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.normalization = nn.BatchNorm2d(4) if use_norm else None
        self.activation = nn.ReLU() if use_act else None

    def forward(self, features):
        features = self.convolution(features)
        if self.normalization is not None:
            features = self.normalization(features)
        if self.activation is not None:
            features = self.activation(features)
        return features
"""


def _rewrite(text: str):
    matcher = Matcher([rule for rule in load_rule_set("all") if rule.id == "modern.6"])
    return rewrite_text(text, "layer.py", matcher), matcher


def _layer(text: str, **options: bool):
    namespace: dict[str, object] = {}
    exec(compile(text, "layer.py", "exec"), namespace)  # noqa: S102 - our own fixture
    torch.manual_seed(0)
    return namespace["ConvLayer"](**options)  # type: ignore[operator]


def test_the_kernel_runs_where_every_test_holds():
    rewrite, matcher = _rewrite(LAYER)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert (
        "        if self.normalization is not None and self.activation is not None:\n"
        "            features = conv_bn_act(features, self.convolution, self.normalization, "
        "self.activation)\n        else:\n            features = self.convolution(features)\n"
    ) in patched
    assert not rewrite_text(patched, "layer.py", matcher).changed  # second apply: nothing
    x = torch.randn(2, 3, 5, 5)
    for options in ({}, {"use_norm": False}, {"use_act": False}):
        original, new = _layer(LAYER, **options), _layer(patched, **options)
        new.load_state_dict(original.state_dict(), strict=True)
        for train in (True, False):
            original.train(train)
            new.train(train)
            torch.testing.assert_close(new(x), original(x))


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (
            "        if self.activation is not None:\n",
            "        if self.activation is not None and self.activation_wanted():\n",
            "the condition calls something",
        ),
    ],
)
def test_a_test_that_could_mean_something_else_first_is_refused_and_scan_agrees(old, new, reason):
    # (a test reading the convolution's output is a use of it: no match at all)
    text = LAYER.replace(old, new)
    rewrite, matcher = _rewrite(text)
    (result,) = rewrite.results
    assert result.status.value == "skipped"
    assert reason in result.reason
    assert not rewrite.changed
    sites = scan_source(
        text, "layer.py", Matcher([r for r in load_rule_set("all") if r.id == "modern.6"])
    )
    mark_unwritable(text, "layer.py", sites)
    (site,) = [s for s in sites if s.applicable]
    assert not site.rewritable and site.rewrite_reason == result.reason


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # other work among the statements: not this shape, the usual refusal stands
        (
            "        if self.activation is not None:\n",
            "        features = features * 2\n        if self.activation is not None:\n",
        ),
        # an `else` arm: the original does something on the other path
        (
            "        if self.activation is not None:\n            features = self.activation(features)\n",
            "        if self.activation is not None:\n            features = self.activation(features)\n"
            "        else:\n            features = -features\n",
        ),
    ],
)
def test_other_layouts_keep_their_refusal(old, new):
    text = LAYER.replace(old, new)
    assert text != LAYER
    rewrite, _ = _rewrite(text)
    assert all(r.status.value != "patched" for r in rewrite.results)
    assert not rewrite.changed


# Gemma 3n's gated MLP: the gate goes through a top-k only when sparsity is configured; the
# match's path skips that `if`, so the kernel runs where its test is false
SPARSE_GATE = """\
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, sparsity=0.0):
        super().__init__()
        self.gate_proj = nn.Linear(8, 16, bias=False)
        self.up_proj = nn.Linear(8, 16, bias=False)
        self.down_proj = nn.Linear(16, 8, bias=False)
        self.act_fn = nn.GELU()
        self.activation_sparsity = sparsity

    def _topk(self, inputs):
        return inputs * (inputs > inputs.mean(dim=-1, keepdim=True))

    def forward(self, hidden_states):
        gate_proj = self.gate_proj(hidden_states)
        if self.activation_sparsity > 0.0:
            gate_proj = self._topk(gate_proj)
        activations = self.act_fn(gate_proj)
        up_proj = self.up_proj(hidden_states)
        down_proj = self.down_proj(activations * up_proj)
        return down_proj
"""


def test_an_if_the_match_skips_guards_the_kernel_by_its_negation():
    matcher = Matcher([rule for rule in load_rule_set("all") if rule.id == "modern.2"])
    rewrite = rewrite_text(SPARSE_GATE, "mlp.py", matcher)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert (
        "        if not (self.activation_sparsity > 0.0):\n            down_proj = gated_mlp("
        in (patched)
    )
    assert not rewrite_text(patched, "mlp.py", matcher).changed
    x = torch.randn(2, 3, 8)
    for sparsity in (0.0, 0.5):
        namespaces: list[dict[str, object]] = [{}, {}]
        for namespace, text in zip(namespaces, (SPARSE_GATE, patched), strict=True):
            exec(compile(text, "mlp.py", "exec"), namespace)  # noqa: S102 - our own fixture
        torch.manual_seed(0)
        original = namespaces[0]["MLP"](sparsity)  # type: ignore[operator]
        new = namespaces[1]["MLP"](sparsity)  # type: ignore[operator]
        new.load_state_dict(original.state_dict(), strict=True)
        torch.testing.assert_close(new(x), original(x))


def test_with_every_rule_one_apply_reaches_the_fixpoint():
    # the else arm keeps the original, where conv + norm alone (paper.7) fuse on the path
    # without the activation: apply looks once more, so a second apply has nothing left
    matcher = Matcher(load_rule_set("all"))
    rewrite = rewrite_text(LAYER, "layer.py", matcher)
    assert "conv_bn_act(" in rewrite.patched and "conv_batch_norm(" in rewrite.patched
    assert not rewrite_text(rewrite.patched, "layer.py", matcher).changed
    x = torch.randn(2, 3, 5, 5)
    for options in ({}, {"use_act": False}):
        original, new = _layer(LAYER, **options), _layer(rewrite.patched, **options)
        new.load_state_dict(original.state_dict(), strict=True)
        original.eval()
        new.eval()
        torch.testing.assert_close(new(x), original(x))


# TextNet's conv layer: optional vertical and horizontal branches added before the activation,
# which the final statement returns
BRANCHES = """\
import torch
from torch import nn


class ConvLayer(nn.Module):
    def __init__(self, vertical=False):
        super().__init__()
        self.main_conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.main_batch_norm = nn.BatchNorm2d(4)
        self.vertical_conv = nn.Conv2d(3, 4, (3, 1), padding=(1, 0), bias=False) if vertical else None
        self.activation_function = nn.ReLU()

    def forward(self, hidden_states):
        main_outputs = self.main_conv(hidden_states)
        main_outputs = self.main_batch_norm(main_outputs)
        if self.vertical_conv is not None:
            main_outputs = main_outputs + self.vertical_conv(hidden_states)
        return self.activation_function(main_outputs)
"""


def test_a_returned_activation_after_a_skipped_branch():
    rewrite, matcher = _rewrite(BRANCHES)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert (
        "        if self.vertical_conv is None:\n"
        "            return conv_bn_act(hidden_states, self.main_conv, self.main_batch_norm, "
        "self.activation_function)\n"
    ) in patched
    assert not rewrite_text(patched, "layer.py", matcher).changed
    x = torch.randn(2, 3, 5, 5)
    for vertical in (False, True):
        namespaces: list[dict[str, object]] = [{}, {}]
        for namespace, text in zip(namespaces, (BRANCHES, patched), strict=True):
            exec(compile(text, "layer.py", "exec"), namespace)  # noqa: S102 - our own fixture
        torch.manual_seed(0)
        original = namespaces[0]["ConvLayer"](vertical)  # type: ignore[operator]
        new = namespaces[1]["ConvLayer"](vertical)  # type: ignore[operator]
        new.load_state_dict(original.state_dict(), strict=True)
        for train in (True, False):
            original.train(train)
            new.train(train)
            torch.testing.assert_close(new(x), original(x))
