"""adopter.patch names kernels as apply does: a parameter with the kernel's name does not
capture the call swapped into the running function."""

from __future__ import annotations

import dis
import importlib

import torch

import adopter

SHADOWED = """
import torch
from torch import nn
import torch.nn.functional as F


class Scores(nn.Module):
    def forward(self, x, softmax=None):
        probs = F.softmax(x @ x.transpose(-1, -2), dim=-1)
        return probs @ x
"""


def _globals_read(function) -> set[str]:
    return {
        instruction.argval
        for instruction in dis.get_instructions(function)
        if instruction.opname == "LOAD_GLOBAL"
    }


def test_patch_imports_a_shadowed_kernel_under_a_fresh_alias(make_package):
    make_package("rt_shadowed", {"scores.py": SHADOWED})
    scores = importlib.import_module("rt_shadowed.scores")
    model = scores.Scores().eval()
    x = torch.randn(2, 3, 4)
    expected = model(x)

    report = adopter.patch(scores, rules="paper")

    assert report.patched == {"rt_shadowed.scores": ["paper.4 Scores.forward line 8"]}
    assert "adopter_softmax" in _globals_read(scores.Scores.forward)
    assert scores.adopter_softmax.__module__.startswith("adopter.kernels")
    torch.testing.assert_close(model(x), expected)
    assert adopter.unpatch(scores) == ["rt_shadowed.scores"]
    assert not hasattr(scores, "adopter_softmax")
