"""Canonical helpers: a module-level function is one step when its body is a known operation,
whatever its name, and is inlined as usual when its body is anything else."""

import pytest

from tests.helpers import extract

HELPERS = """
import torch
from torch import nn

def rotate_half(x):
    '''Rotates half the hidden dims of the input.'''
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)

def swap(t: torch.Tensor) -> torch.Tensor:
    a = t[..., 0 : t.shape[-1] // 2]
    b = t[..., t.shape[-1] // 2 :]
    return torch.cat((-b, a), dim=-1)

def interleaved(x):
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)

def not_quite(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((x2, x1), dim=-1)

class Rotate(nn.Module):
    def forward(self, q):
        return {call}(q)
"""


@pytest.mark.parametrize(
    ("call", "kind"),
    [
        ("rotate_half", "rotate_half"),
        ("swap", "rotate_half"),  # another name, annotations, a slice start of 0
        ("interleaved", "rotate_pairs"),  # GPT-J's rotate_every_two, whatever it is called
        ("not_quite", None),  # no negation: inlined, not a rotation
    ],
)
def test_helpers_are_known_by_their_body(call, kind):
    structure = extract(HELPERS.replace("{call}", call))
    (flow,) = structure.classes["Rotate"].flows.values()
    kinds = [step.kind for step in flow.steps if not step.transparent]
    if kind is None:
        assert "rotate_half" not in kinds and "torch.cat" in kinds
    else:
        assert kinds == [kind]
