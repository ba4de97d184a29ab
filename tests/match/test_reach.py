"""Reach: everything that runs, not only ``forward`` - module-level functions (also through an
``attention_interface`` variable), ``forward_*`` entry points, attention processors whose
``attn`` parameter is a module class of the file, and methods called on a submodule."""

from __future__ import annotations

from tests.helpers import scan_snippet

SOURCE = """
from typing import Callable
import torch
from torch import nn
from ...modeling_utils import ALL_ATTENTION_FUNCTIONS


def eager_attention_forward(module, query, key, value, mask, scaling, dropout=0.0, **kwargs):
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if mask is not None:
        weights = weights + mask
    weights = nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value), weights


def never_called(x):
    return x.softmax(-1)


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.q_proj = nn.Linear(8, 8)
        self.to_q = nn.Linear(8, 8)

    def get_attention_scores(self, query, key):
        return (query @ key.transpose(-1, -2)).softmax(dim=-1)

    def forward(self, hidden_states, mask=None):
        q = self.q_proj(hidden_states)
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        out, weights = attention_interface(self, q, q, q, mask, scaling=0.1)
        return out


class AttnProcessor:
    def __call__(self, attn: "Attention", hidden_states, encoder_hidden_states=None):
        query = attn.to_q(hidden_states)
        probs = attn.get_attention_scores(query, query)
        return torch.bmm(probs, query)


class Net(nn.Module):
    def __init__(self, act_layer=nn.GELU):
        super().__init__()
        self.head = nn.Linear(8, 8)
        self.act = act_layer()

    def forward_features(self, x):
        return torch.softmax(x, -1)

    def forward_head(self, x):
        return self.act(self.head(x))

    def forward(self, x):
        return x
"""


def test_sites_are_reported_where_the_computation_is():
    found = {(s.rule.id, s.line, s.cls, s.method) for s in scan_snippet(SOURCE) if s.applicable}
    assert found == {
        ("paper.4", 12, None, "eager_attention_forward"),
        ("paper.4", 17, None, "never_called"),
        ("paper.4", 28, "Attention", "get_attention_scores"),
        ("paper.4", 53, "Net", "forward_features"),
        ("paper.6", 56, "Net", "forward_head"),
    }


def test_attention_interface_runs_the_module_level_function():
    from tests.helpers import extract

    flow = extract(SOURCE).classes["Attention"].flows["forward"]
    inlined = {step.inline_chain for step in flow.steps if step.kind.endswith("softmax")}
    assert ("eager_attention_forward",) in inlined


def test_processor_reaches_the_attention_module_it_is_given():
    from tests.helpers import extract

    flow = extract(SOURCE).classes["AttnProcessor"].flows["__call__"]
    kinds = [(step.kind, step.module) for step in flow.steps if step.module]
    assert ("torch.nn.Linear", "attn.to_q") in kinds
    assert any(step.method == "get_attention_scores" for step in flow.steps)


def test_one_tensor_under_several_names_is_a_site_fused_behind_an_identity_test():
    # one input only where the caller passes the same tensor three times
    source = """
import torch
from torch import nn
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8)
        self.v = nn.Linear(8, 8)
    def forward(self, q, k, v):
        return self.q(q).view(2, 4, 2), self.k(k).view(2, 4, 2), self.v(v).view(2, 4, 2)
class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = Attention()
    def forward(self, x):
        return self.attention(x, x, x)
"""
    (site,) = [s for s in scan_snippet(source) if s.rule.id == "paper.9"]
    assert site.applicable and site.line == 11
    from adopter.match import Matcher
    from adopter.rewrite import rewrite_text
    from adopter.rules import load_rule_set

    result = rewrite_text(source, "model.py", Matcher(load_rule_set("paper")))
    (patched,) = [r for r in result.results if r.site.rule.id == "paper.9"]
    assert patched.status == "patched"
    # the kernel only where the caller passed one tensor; the original projections elsewhere
    assert "qkv_projection(q, self.q, self.k, self.v)\n            if k is q and v is q\n" in (
        result.patched
    )
    assert "else (self.q(q), self.k(k), self.v(v))" in result.patched


def test_self_attention_path_of_shared_attention_code_is_a_site():
    source = """
import torch
from torch import nn
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(8, 8)
        self.k_proj = nn.Linear(8, 8)
        self.v_proj = nn.Linear(8, 8)
        self.scaling = 0.5
    def forward(self, hidden_states, key_value_states=None):
        query_states = self.q_proj(hidden_states) * self.scaling
        current_states = key_value_states if key_value_states is not None else hidden_states
        key_states = self.k_proj(current_states).view(2, 4, 2, 4)
        value_states = self.v_proj(current_states).view(2, 4, 2, 4)
        return query_states.view(2, 4, 2, 4), key_states, value_states
"""
    (site,) = [s for s in scan_snippet(source) if s.rule.id == "paper.9"]
    assert site.applicable and site.line == 12


PROCESSORS = """
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.to_q = nn.Linear(8, 8)
        self.to_k = nn.Linear(8, 8)
        self.to_v = nn.Linear(8, 8)
        self.to_qkv = nn.Linear(8, 24)
        self.norm_q = nn.RMSNorm(8)
        self.fused = False


def get_projections(attn: "Attention", hidden_states):
    if attn.fused:
        query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        return query, key, value
    query = attn.to_q(hidden_states)
    key = attn.to_k(hidden_states)
    value = attn.to_v(hidden_states)
    return query, key, value


class Processor(nn.Module):
    def __call__(self, attn: Attention, hidden_states, context):
        query, key, value = get_projections(attn, hidden_states)
        query = attn.norm_q(query).unflatten(-1, (2, 4))
        key = torch.cat([key, context], dim=1).unflatten(-1, (2, 4))
        return query, key, value.unflatten(-1, (2, 4))
"""


def test_projection_helpers_with_several_returns_reach_the_processor_that_splits_heads():
    # two returns (fused or not) merge elementwise; an nn.Module processor's __call__ binds
    # `attn`; the split is reached through QK-norm and a concatenation
    found = [(s.rule.id, s.line, s.method) for s in scan_snippet(PROCESSORS) if s.applicable]
    assert found == [("paper.9", 21, "get_projections")]
