"""Each built-in rule with cases that must match and cases that must not (ast-grep style).

Every case is a small model of our own; ``line`` is the expected site line (1-based, after
dedent) so a right count at a wrong place fails too.
"""

from __future__ import annotations

import pytest

from adopter.rules import load_rule_set, rule_files
from tests.helpers import scan_snippet

HEAD = """
import torch
from torch import nn
import torch.nn.functional as F
from ...activations import ACT2FN
"""

CASES: dict[str, list[tuple[str, list[int]]]] = {
    "paper.1": [
        (
            HEAD
            + """
class BertSelfAttention(nn.Module):
    def forward(self, x):
        return x
class BertAttention(nn.Module):
    def __init__(self, config, position_embedding_type=None):
        super().__init__()
        self.self = BertSelfAttention(config, position_embedding_type=position_embedding_type)
    def forward(self, x):
        return self.self(x)
""",
            [13],
        ),
        # constructed but never called in forward: nothing to speed up
        (
            HEAD
            + """
class BertSelfAttention(nn.Module):
    pass
class Holder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = BertSelfAttention(config, position_embedding_type="absolute")
    def forward(self, x):
        return x
""",
            [],
        ),
    ],
    "paper.2": [
        (
            HEAD
            + """
class T5Attention(nn.Module):
    def forward(self, x):
        return x
class T5Layer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.SelfAttention = T5Attention(config, has_relative_attention_bias=True)
        self.Cross = T5Attention(config, has_relative_attention_bias=False)
    def forward(self, x):
        return self.Cross(self.SelfAttention(x))
""",
            [13, 14],
        ),
        (
            HEAD
            + """
class T5Layer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.SelfAttention = T5Attention(config)
    def forward(self, x):
        return self.SelfAttention(x)
""",
            [],
        ),  # the pattern requires has_relative_attention_bias
    ],
    "paper.3": [
        (
            HEAD
            + """
class GPT2Attention(nn.Module):
    def forward(self, x):
        return x
class GPT2Block(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        self.attn = GPT2Attention(config, layer_idx=layer_idx)
        if config.add_cross_attention:
            self.crossattention = GPT2Attention(config, is_cross_attention=True, layer_idx=layer_idx)
    def forward(self, x, encoder_hidden_states=None):
        x = self.attn(x)
        if encoder_hidden_states is not None:
            x = self.crossattention(x)
        return x
""",
            [13, 15],
        ),
    ],
    "paper.4": [
        (
            HEAD
            + """
class Attn(nn.Module):
    def forward(self, scores, other):
        probs = nn.functional.softmax(scores, dim=-1)
        more = F.softmax(other, -1)
        return probs, more
""",
            [9, 10],
        ),
        (
            HEAD
            + """
class Attn(nn.Module):
    def forward(self, scores):
        a = F.softmax(scores, dim=1)
        b = torch.softmax(scores, -1)
        c = scores.softmax(dim=-1)
        return a, b, c
""",
            [10, 11],
        ),  # dim=1 of a tensor of unknown rank is not the last dimension; every spelling counts
        (
            HEAD
            + """
class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.softmax = nn.Softmax(dim=-1)
        self.other = nn.Softmax(dim=1)
    def forward(self, q, k, v):
        a = self.softmax(q @ k)
        b = nn.Softmax(dim=-1)(a)
        c = torch.special.softmax(b, dim=-1)
        d = self.other(c)
        e = torch.bmm(d, v)
        f = F.softmax(e, dim=2)
        g = F.softmax(torch.einsum("bhqd,bhkd->bhqk", f, f), 3)
        return self.other(g)
""",
            [13, 14, 15, 18, 19],
        ),  # nn.Softmax module (attribute or inline), torch.special, dim last by rank
        (
            HEAD
            + """
def scaled_attention(q, k):
    return F.softmax(q @ k, dim=-1)
class Attn(nn.Module):
    def forward(self, q, k):
        return scaled_attention(q, k)
""",
            [8],
        ),  # module-level helpers are followed (the original tool never looked there)
        (
            HEAD
            + """
@torch.jit.script
def scripted(x):
    return F.softmax(x, dim=-1)
class Attn(nn.Module):
    def forward(self, x):
        return scripted(x)
""",
            [],
        ),  # TorchScript cannot call the kernel: reported as not applicable
    ],
    "paper.5": [
        (
            HEAD
            + """
class SelfOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.LayerNorm = nn.LayerNorm(4, eps=1e-12)
        self.dropout = nn.Dropout(0.1)
    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
        return hidden_states
""",
            [15],
        ),
        (
            HEAD
            + """
class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(4)
    def forward(self, x, residual):
        y = self.drop(x)
        z = residual + y
        return self.norm(z)
""",
            [13],
        ),  # residual first, separate statements
        (
            HEAD
            + """
class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(4)
    def forward(self, x, residual):
        y = self.drop(x)
        z = residual + y
        return self.norm(z), z
""",
            [],
        ),  # the sum is returned too: fusing would lose it
        (
            HEAD
            + """
class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(4)
    def forward(self, x, residual):
        y = self.drop(x)
        z = residual * y
        return self.norm(z)
""",
            [],
        ),  # a product is not a residual add
    ],
    "paper.6": [
        (
            HEAD
            + """
from functools import partial
class Mlp(nn.Module):
    def __init__(self, config, act_layer=nn.GELU, use_conv=False, bias=True):
        super().__init__()
        layer = partial(nn.Conv2d, kernel_size=1) if use_conv else nn.Linear
        self.fc1 = layer(4, 16, bias=bias)
        self.act = act_layer()
        self.drop = nn.Dropout(0.1)
        self.fc2 = layer(16, 4)
        self.gate = nn.Linear(4, 16, bias=config.mlp_bias)
        self.act2 = ACT2FN[config.activation_function]
        self.pool = nn.Linear(4, 4)
        self.tanh = nn.Tanh()
    def forward(self, x):
        h = self.fc2(self.drop(self.act(self.fc1(x))))
        g = self.act2(self.gate(x)) * h
        return self.tanh(self.pool(g))
""",
            [21, 22, 23],
        ),  # act_layer default, partial/if-else layer class, config bias, any ACT2FN, nn.Tanh
        (
            HEAD
            + """
from functools import partial
from .activations import get_activation
class Head(nn.Module):
    def __init__(self, config, act_layer=None):
        super().__init__()
        act_layer = act_layer or partial(nn.LeakyReLU, negative_slope=0.1)
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)
        self.d = nn.Linear(4, 4)
        self.e = nn.Linear(4, 4)
        self.act = act_layer(inplace=True)
        self.named = get_activation(config.act)
    def forward(self, x):
        x = F.gelu(self.a(x))
        x = torch.tanh(self.b(x))
        x = nn.SiLU()(self.c(x))
        x = self.act(self.d(x))
        x = F.gelu(self.e(x), approximate="tanh")
        return self.named(self.e(x))
""",
            [21, 22, 23, 24, 26],
        ),  # functional forms, inline modules, `x or default`, get_activation; not F.gelu(.., k=v)
        (
            HEAD
            + """
class Intermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(4, 16)
        if isinstance(config.hidden_act, str):
            self.intermediate_act_fn = ACT2FN[config.hidden_act]
        else:
            self.intermediate_act_fn = config.hidden_act
    def forward(self, hidden_states):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.intermediate_act_fn(hidden_states)
        return hidden_states
""",
            [16],
        ),
        (
            HEAD
            + """
class Intermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(4, 16, bias=False)
        self.act = ACT2FN[config.hidden_act]
    def forward(self, x):
        return self.act(self.dense(x))
""",
            [],
        ),  # no bias to fuse
        (
            HEAD
            + """
class Intermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(4, 16)
        self.act = ACT2FN[config.hidden_act]
        self.dropout = nn.Dropout(0.1)
    def forward(self, x):
        return self.act(self.dropout(self.dense(x)))
""",
            [],
        ),  # dropout in between: not "straight into"
        (
            HEAD
            + """
class Intermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(4, 16)
        self.act = ACT2FN[config.hidden_act]
    def forward(self, x):
        h = self.fc(x)
        first = self.act(h)
        second = self.fc(first)
        return self.act(second)
""",
            [13, 15],
        ),  # every instance in a method, not just the first
    ],
    "paper.7": [
        (
            HEAD
            + """
class ConvLayer(nn.Module):
    def __init__(self, use_bn):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.use_bn = use_bn
    def forward(self, x):
        x = self.conv(x)
        if self.use_bn:
            x = self.bn(x)
        return x
""",
            [14],
        ),  # paper Fig. 4: the norm sits in a branch
        (
            HEAD
            + """
class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    def forward(self, x):
        return self.block(x)
""",
            [10],
        ),
        (
            HEAD
            + """
class ConvLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
    def forward(self, x):
        y = self.conv(x)
        return self.bn(y), y
""",
            [],
        ),
    ],
    "paper.8": [
        (
            HEAD
            + """
class Projection(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Sequential(
            nn.Linear(4, 8, bias=True),
            nn.BatchNorm1d(8),
            nn.ReLU(inplace=True),
        )
    def forward(self, x):
        return self.proj(x)
""",
            [11],
        ),
    ],
    "paper.9": [
        (
            HEAD
            + """
class SelfAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.q_proj = nn.Linear(d, d, bias=False)
    def _split_heads(self, tensor, heads, size):
        return tensor.view(tensor.shape[:-1] + (heads, size))
    def forward(self, hidden_states):
        query = self.q_proj(hidden_states)
        key = self.k_proj(hidden_states)
        value = self.v_proj(hidden_states)
        query = self._split_heads(query, 2, 2)
        key = self._split_heads(key, 2, 2)
        value = self._split_heads(value, 2, 2)
        return query, key, value
""",
            [16],
        ),
        (
            HEAD
            + """
class SelfAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.q_proj = nn.Linear(d, d, bias=False)
    def _split_heads(self, tensor, heads, size):
        return tensor
    def forward(self, hidden_states, other):
        query = self.q_proj(hidden_states)
        key = self.k_proj(other)
        value = self.v_proj(other)
        return self._split_heads(query, 2, 2), self._split_heads(key, 2, 2), self._split_heads(value, 2, 2)
""",
            [],
        ),  # projections of different tensors cannot share one matmul
        (
            HEAD
            + """
class LlamaAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.q_proj = nn.Linear(8, 8, bias=config.attention_bias)
        self.k_proj = nn.Linear(8, 4, bias=config.attention_bias)
        self.v_proj = nn.Linear(8, 4, bias=config.attention_bias)
    def forward(self, hidden_states):
        hidden_shape = (*hidden_states.shape[:-1], -1, 2)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        return query_states, key_states, value_states
""",
            [15],
        ),  # transformers 5.x: bias from the configuration, narrower key/value, view inline
        (
            HEAD
            + """
class BertSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.query = nn.Linear(8, 8)
        self.key = nn.Linear(8, 8)
        self.value = nn.Linear(8, 8)
    def transpose_for_scores(self, x):
        return x.view(x.size()[:-1] + (2, 4)).permute(0, 2, 1, 3)
    def forward(self, hidden_states):
        q = self.transpose_for_scores(self.query(hidden_states))
        k = self.key(hidden_states).unflatten(-1, (2, 4))
        v = self.value(hidden_states).reshape(2, 3, 2, 4)
        return q, k, v
""",
            [16],
        ),  # a helper that views, unflatten, reshape
        (
            HEAD
            + """
class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 8)
    def forward(self, x):
        return self.a(x) * self.b(x) + self.c(x)
""",
            [],
        ),  # three projections of one input, but not split into heads: not attention
    ],
}


def test_every_rule_has_cases_and_a_documented_file():
    rules = load_rule_set("paper")
    assert [rule.id for rule in rules] == [f"paper.{n}" for n in range(1, 10)]
    assert set(CASES) == {rule.id for rule in rules}
    assert len(rule_files("paper")) == 9
    for rule in rules:
        assert "What it does" in rule.doc and "Before:" in rule.doc and "After" in rule.doc
        assert rule.kernel.startswith("adopter.kernels.")


@pytest.mark.parametrize(
    ("rule_id", "source", "lines"),
    [(rule_id, source, lines) for rule_id, cases in CASES.items() for source, lines in cases],
)
def test_rule_cases(rule_id, source, lines):
    rules = [rule for rule in load_rule_set("paper") if rule.id == rule_id]
    found = [site.line for site in scan_snippet(source, rules) if site.applicable]
    assert sorted(found) == lines
