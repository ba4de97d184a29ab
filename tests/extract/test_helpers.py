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
        ("rotate_half", "helper.rotate_half"),
        ("swap", "helper.rotate_half"),  # another name, annotations, a slice start of 0
        ("interleaved", "helper.rotate_pairs"),  # GPT-J's rotate_every_two, whatever it is called
        ("not_quite", None),  # no negation: inlined, not a rotation
    ],
)
def test_helpers_are_known_by_their_body(call, kind):
    structure = extract(HELPERS.replace("{call}", call))
    (flow,) = structure.classes["Rotate"].flows.values()
    kinds = [step.kind for step in flow.steps if not step.transparent]
    if kind is None:
        assert "helper.rotate_half" not in kinds and "torch.cat" in kinds
    else:
        assert kinds == [kind]


def test_imported_helpers_are_read_from_their_file(tmp_path):
    """A ``rotate_half`` imported from another file is known by that file's body: the halves
    swap of one file is the canonical step, the pair rotation of another file of the same name
    is not (and no rule matches it by its name)."""
    from adopter.extract import analyse_file

    files = {
        "pkg/__init__.py": "",
        "pkg/llama.py": HELPERS.split("class Rotate")[0],
        "pkg/gptj.py": "import torch\n\ndef rotate_half(x):\n"
        "    x1 = x[..., ::2]\n    x2 = x[..., 1::2]\n"
        "    return torch.stack((-x2, x1), dim=-1).flatten(-2)\n",
        "pkg/model.py": "from torch import nn\nfrom .llama import rotate_half\n"
        "from .gptj import rotate_half as rotate_pairs_named_half\n\n"
        "class Rotate(nn.Module):\n    def forward(self, q, k):\n"
        "        return rotate_half(q), rotate_pairs_named_half(k)\n",
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    structure = analyse_file(str(tmp_path / "pkg/model.py"))
    (flow,) = structure.classes["Rotate"].flows.values()
    kinds = [step.kind for step in flow.steps if not step.transparent]
    assert kinds[:2] == ["helper.rotate_half", "helper.rotate_pairs"]


MASK_HELPERS = """
import torch
from torch import nn

@torch.fx.wrap
def bias_of(seq_len, attn, attn_mask=None, is_causal=False):
    if is_causal:
        attn_bias = attn.new_full((seq_len, seq_len), float('-inf')).triu_(1)
    elif attn_mask is None:
        attn_bias = None
    elif attn_mask.dtype == torch.bool:
        attn_bias = torch.zeros_like(attn_mask, dtype=attn.dtype)
        attn_bias.masked_fill_(~attn_mask, float('-inf'))
    else:
        attn_bias = attn_mask
    return attn_bias

def other_default(seq_len, attn, attn_mask=None, is_causal=True):
    if is_causal:
        attn_bias = attn.new_full((seq_len, seq_len), float('-inf')).triu_(1)
    elif attn_mask is None:
        attn_bias = None
    elif attn_mask.dtype == torch.bool:
        attn_bias = torch.zeros_like(attn_mask, dtype=attn.dtype)
        attn_bias.masked_fill_(~attn_mask, float('-inf'))
    else:
        attn_bias = attn_mask
    return attn_bias

class Masked(nn.Module):
    def forward(self, scores, mask, causal):
        return {call}
"""


@pytest.mark.parametrize(
    ("call", "kind", "arguments"),
    [
        (
            "bias_of(4, scores, mask, causal)",
            "helper.self_attn_bias",
            ["4", "scores", "mask", "causal"],
        ),
        (
            "bias_of(4, scores, mask, is_causal=causal)",
            "helper.self_attn_bias",
            ["4", "scores", "mask", "causal"],
        ),
        ("bias_of(4, attn=scores)", "helper.self_attn_bias", ["4", "scores", "None", "False"]),
        ("other_default(4, scores, mask)", None, None),  # another default: another function
    ],
)
def test_helper_arguments_follow_its_parameters(call, kind, arguments):
    """Keywords move to their parameter's place and omitted ones get their default, so a rule
    sees one spelling; a tracer-registration decorator does not hide the body."""
    structure = extract(MASK_HELPERS.replace("{call}", call))
    (flow,) = structure.classes["Masked"].flows.values()
    steps = [step for step in flow.steps if step.kind.startswith("helper.")]
    if kind is None:
        assert not steps
        return
    (step,) = steps
    assert step.kind == kind and not step.arguments
    assert [operand.text for operand in step.positional] == arguments
