"""Patched fixtures run: same weights (strict state_dict load), same inputs, same outputs and
gradients as the original, in eval and train mode."""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

from adopter.match import Matcher  # noqa: E402
from adopter.rewrite import rewrite_text  # noqa: E402
from adopter.rules import load_rule_set  # noqa: E402

HEAD = """\
import torch
from torch import nn
import torch.nn.functional as F

ACT2FN = {"gelu": nn.GELU(), "relu": nn.ReLU()}
"""

MODELS = {
    "bert_block": (
        """
class Intermediate(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(8, 16)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.intermediate_act_fn(hidden_states)
        return hidden_states


class Output(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(16, 8)
        self.LayerNorm = nn.LayerNorm(8, eps=1e-12)
        self.dropout = nn.Dropout(0.0)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
        return hidden_states


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.intermediate = Intermediate()
        self.output = Output()

    def forward(self, x):
        scores = x @ x.transpose(-1, -2)
        mixed = F.softmax(scores, dim=-1) @ x
        return self.output(self.intermediate(mixed), x)
""",
        lambda: (torch.randn(2, 5, 8),),
        {"paper.4", "paper.5", "paper.6"},
    ),
    "conv_branch": (
        """
class Model(nn.Module):
    def __init__(self, use_bn=True):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.use_bn = use_bn

    def forward(self, x):
        x = self.conv(x)
        if self.use_bn:
            x = self.bn(x)
        return torch.relu(x)
""",
        lambda: (torch.randn(2, 3, 6, 6),),
        {"paper.7"},
    ),
    "norm_after_branch": (
        """
class Model(nn.Module):
    def __init__(self, residual=True):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.dropout = nn.Dropout(0.0)
        self.layer_norm = nn.LayerNorm(4)
        self.residual = residual

    def forward(self, h):
        attn_out = self.proj(h)
        attn_out = self.dropout(attn_out)
        if self.residual:
            attn_out = attn_out + h
        output = self.layer_norm(attn_out)
        return output
""",
        lambda: (torch.randn(2, 3, 4),),
        {"paper.5"},
    ),
    "helper_ends_with_dropout": (
        """
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.proj = nn.Linear(8, 4)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return self.dropout(self.proj(h))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = MLP()
        self.ln = nn.LayerNorm(4)
        self.unfused = MLP()  # also an MLP, called without the add and norm

    def forward(self, x):
        m = self.mlp(x)
        h = self.ln(x + m)
        return h + self.unfused(h)
""",
        lambda: (torch.randn(2, 3, 4),),
        {"paper.5", "paper.6"},
    ),
    "sequential_ends_with_dropout": (
        """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.core = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4), nn.Dropout(0.0))
        self.layer_norm = nn.LayerNorm(4)

    def forward(self, inp):
        core_out = self.core(inp)
        output = self.layer_norm(inp + core_out)
        return output
""",
        lambda: (torch.randn(2, 3, 4),),
        {"paper.5", "paper.6"},  # Linear + ReLU merge into the input of the dropout fusion
    ),
    "helper_adds_caller_norms_in_branch": (
        """
class SelfOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.LayerNorm = nn.LayerNorm(4)
        self.dropout = nn.Dropout(0.0)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = hidden_states + input_tensor
        return hidden_states


class Model(nn.Module):
    def __init__(self, pre_norm=False):
        super().__init__()
        self.output = SelfOutput()
        self.pre_norm = pre_norm

    def forward(self, x):
        residual = x
        if self.pre_norm:
            x = self.output.LayerNorm(x)
        attention_output = self.output(x * 2, residual)
        if not self.pre_norm:
            attention_output = self.output.LayerNorm(attention_output)
        return attention_output
""",
        lambda: (torch.randn(2, 3, 4),),
        {"paper.5"},
    ),
    "qkv": (
        """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.k_proj = nn.Linear(8, 8, bias=False)
        self.v_proj = nn.Linear(8, 8, bias=False)
        self.q_proj = nn.Linear(8, 8, bias=False)

    def _split_heads(self, tensor, heads, size):
        return tensor.view(tensor.shape[0], tensor.shape[1], heads, size).transpose(1, 2)

    def forward(self, hidden_states):
        query = self.q_proj(hidden_states)
        key = self.k_proj(hidden_states)
        value = self.v_proj(hidden_states)
        query = self._split_heads(query, 2, 4)
        key = self._split_heads(key, 2, 4)
        value = self._split_heads(value, 2, 4)
        weights = F.softmax(query @ key.transpose(-1, -2), dim=-1, dtype=torch.float32)
        return weights @ value
""",
        lambda: (torch.randn(2, 5, 8),),
        {"paper.4", "paper.9"},
    ),
    "softmax_spellings": (
        """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4, bias=False)
        self.softmax = nn.Softmax(dim=-1)
        self.across = nn.Softmax(dim=1)

    def forward(self, q, k):
        q = self.proj(q)
        a = self.softmax(q @ k.transpose(-1, -2))
        b = nn.Softmax(dim=-1)(a * 2)
        c = torch.softmax(b - 1, -1, torch.float64)
        d = torch.bmm(c.float(), q)
        e = F.softmax(d, dim=2)
        f = e.softmax(-1)
        return self.across(f), torch.special.softmax(f, dim=-1)
""",
        lambda: (torch.randn(2, 5, 4), torch.randn(2, 5, 4)),
        {"paper.4"},
    ),
    "activation_spellings": (
        """
from functools import partial


class Model(nn.Module):
    def __init__(self, act_layer=nn.GELU, bias=False, use_conv=False):
        super().__init__()
        layer = partial(nn.Conv2d, kernel_size=1) if use_conv else nn.Linear
        self.fc1 = layer(4, 8, bias=bias)  # the bias follows the configuration
        self.act = act_layer()
        self.drop = nn.Dropout(0.0)
        self.fc2 = layer(8, 4)
        self.gate = nn.Linear(4, 4)
        self.pool = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc2(self.drop(self.act(self.fc1(x))))
        g = F.silu(self.gate(h)) * h
        return nn.Tanh()(self.pool(g))
""",
        lambda: (torch.randn(2, 3, 4),),
        {"paper.6"},
    ),
    "qkv_heads_split_inline": (
        """
class Model(nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.q_proj = nn.Linear(8, 8, bias=bias)
        self.k_proj = nn.Linear(8, 4, bias=bias)  # grouped-query: narrower key and value
        self.v_proj = nn.Linear(8, 4, bias=bias)

    def forward(self, hidden_states):
        hidden_shape = (*hidden_states.shape[:-1], -1, 2)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).unflatten(-1, (2, 2)).transpose(1, 2)
        key = key.repeat_interleave(2, dim=1)
        value = value.repeat_interleave(2, dim=1)
        weights = (query @ key.transpose(-1, -2)).softmax(-1)
        return (weights @ value).transpose(1, 2).reshape(*hidden_states.shape[:-1], -1)
""",
        lambda: (torch.randn(2, 5, 8),),
        {"paper.4", "paper.9"},
    ),
    "functional_dropout": (
        """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout = 0.0
        self.fc2 = nn.Linear(4, 4)
        self.final_layer_norm = nn.LayerNorm(4)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.fc2(hidden_states)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = residual + hidden_states
        hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states
""",
        lambda: (torch.randn(2, 3, 4),),
        {"paper.5"},
    ),
    "helpers_finished_by_the_caller": (
        """
class Proj(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(4, 4)

    def forward(self, x):
        return self.dense(x)


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        return self.conv(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = Proj()
        self.act = nn.GELU()
        self.c = Conv()
        self.bn = nn.BatchNorm2d(3)
        self.plain = Proj()  # also a Proj, used without the activation

    def forward(self, x, image):
        return self.act(self.proj(x)) + self.plain(x), self.bn(self.c(image))
""",
        lambda: (torch.randn(2, 3, 4), torch.randn(2, 3, 4, 4)),
        {"paper.6", "paper.7"},
    ),
    "sequential": (
        """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
        self.convs = nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3), nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3))

    def forward(self, x, image):
        return self.proj(x), self.convs(image)
""",
        lambda: (torch.randn(6, 4), torch.randn(2, 3, 4, 4)),
        {"paper.7", "paper.8"},
    ),
}


class _Config:
    hidden_act = "gelu"


def _load(code: str):
    namespace: dict = {"config": _Config()}
    exec(compile(code, "<fixture>", "exec"), namespace)  # noqa: S102 - our own fixture code
    return namespace["Model"]


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("training", [False, True])
def test_patched_model_matches_original(name, training):
    body, make_inputs, expected_rules = MODELS[name]
    original_code = HEAD + textwrap.dedent(body)
    rewritten = rewrite_text(original_code, "model.py", Matcher(load_rule_set("paper")))
    patched_rules = {r.site.rule.id for r in rewritten.results if r.status == "patched"}
    assert patched_rules == expected_rules, [(r.site.rule.id, r.reason) for r in rewritten.results]
    torch.manual_seed(0)
    original = _load(original_code)()
    patched = _load(rewritten.patched)()
    patched.load_state_dict(original.state_dict(), strict=True)
    original.train(training)
    patched.train(training)
    inputs = make_inputs()
    copies = [tensor.clone().requires_grad_(True) for tensor in inputs]
    expected = _outputs(original(*inputs))
    got = _outputs(patched(*copies))
    for want, have in zip(expected, got, strict=True):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)
    sum(o.square().sum() for o in expected).backward()
    sum(o.square().sum() for o in got).backward()
    for (label, p1), (_, p2) in zip(
        original.named_parameters(), patched.named_parameters(), strict=True
    ):
        torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-4, atol=1e-5, msg=label)
    if training:
        for (label, b1), (_, b2) in zip(
            original.named_buffers(), patched.named_buffers(), strict=True
        ):
            torch.testing.assert_close(b2, b1, msg=label)


@pytest.mark.parametrize(
    ("name", "other_path"),
    [
        ("conv_branch", {"use_bn": False}),  # the arm without the batch norm (Fig. 4)
        ("norm_after_branch", {"residual": False}),  # dropout then norm, no add
        ("helper_adds_caller_norms_in_branch", {"pre_norm": True}),  # the helper's own code
    ],
)
@pytest.mark.parametrize("training", [False, True])
def test_the_path_the_rewrite_does_not_fuse_still_matches(name, other_path, training):
    body, make_inputs, _ = MODELS[name]
    original_code = HEAD + textwrap.dedent(body)
    rewritten = rewrite_text(original_code, "model.py", Matcher(load_rule_set("paper")))
    torch.manual_seed(0)
    original = _load(original_code)(**other_path).train(training)
    patched = _load(rewritten.patched)(**other_path).train(training)
    patched.load_state_dict(original.state_dict())
    inputs = make_inputs()
    torch.testing.assert_close(patched(*inputs), original(*inputs))
