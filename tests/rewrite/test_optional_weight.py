"""A weight the norm applies only under a test of its settings (Gemma 3n/4's ``if
self.with_scale:``): modern.1 hands the kernel ``self.weight if self.with_scale else None``,
and the patched module computes what the original does with the weight and without it."""

from __future__ import annotations

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set

torch = pytest.importorskip("torch")

MODEL = """\
import torch
from torch import nn


class ScaledRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6, with_scale=True):
        super().__init__()
        self.eps = eps
        self.with_scale = with_scale
        if self.with_scale:
            self.weight = nn.Parameter(torch.randn(dim))

    def _norm(self, hidden_states):
        mean_squared = hidden_states.pow(2).mean(-1, keepdim=True) + self.eps
        return hidden_states * torch.pow(mean_squared, -0.5)

    def forward(self, hidden_states):
        normed_output = self._norm(hidden_states.float())
        if self.with_scale:
            normed_output = normed_output * self.weight.float()
        return normed_output.type_as(hidden_states)
"""


def _build(text: str, with_scale: bool):
    namespace: dict[str, object] = {}
    exec(compile(text, "model.py", "exec"), namespace)  # noqa: S102 - our own fixture
    torch.manual_seed(0)
    return namespace["ScaledRMSNorm"](8, with_scale=with_scale)  # type: ignore[operator]


def test_the_weight_is_handed_over_only_where_the_original_applies_it():
    matcher = Matcher([rule for rule in load_rule_set("all") if rule.id == "modern.1"])
    rewrite = rewrite_text(MODEL, "model.py", matcher)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert "self.weight if self.with_scale else None" in patched
    assert not rewrite_text(patched, "model.py", matcher).changed
    for with_scale in (True, False):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(3, 5, 8, dtype=dtype, requires_grad=True)
            original, new = _build(MODEL, with_scale), _build(patched, with_scale)
            want, have = original(x), new(x)
            assert have.dtype == want.dtype
            torch.testing.assert_close(have, want)
            (grad_want,) = torch.autograd.grad(want.float().sum(), x)
            (grad_have,) = torch.autograd.grad(have.float().sum(), x)
            torch.testing.assert_close(grad_have, grad_want)
