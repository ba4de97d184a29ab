"""Synthesis: the patched source, refusals, imports, idempotence, and behaviour kept."""

from __future__ import annotations

import textwrap

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set

HEAD = """\
import torch
from torch import nn
import torch.nn.functional as F
ACT2FN = {"gelu": nn.GELU()}
"""


def rewrite(source: str, rules=None):
    matcher = Matcher(rules if rules is not None else load_rule_set("paper"))
    return rewrite_text(HEAD + textwrap.dedent(source), "model.py", matcher)


def body_of(text: str) -> str:
    return text[len(HEAD) :]


BERT_OUTPUT = """
class SelfOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(8, 8)
        self.LayerNorm = nn.LayerNorm(8, eps=1e-12)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        # regularise before the residual
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)  # post-norm
        return hidden_states
"""


def test_dropout_add_layernorm_rewrite_keeps_comments_and_modules():
    result = rewrite(BERT_OUTPUT)
    assert [r.status for r in result.results] == ["patched"]
    assert result.patched.startswith(
        HEAD.replace(
            "ACT2FN = ", "from adopter.kernels import dropout_add_layer_norm\nACT2FN = "
        ).split("ACT2FN")[0]
    )
    assert body_of(
        result.patched.replace("from adopter.kernels import dropout_add_layer_norm\n", "")
    ) == textwrap.dedent("""
        class SelfOutput(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.dense = nn.Linear(8, 8)
                self.LayerNorm = nn.LayerNorm(8, eps=1e-12)
                self.dropout = nn.Dropout(0.1)

            def forward(self, hidden_states, input_tensor):
                hidden_states = self.dense(hidden_states)
                # regularise before the residual
                hidden_states = dropout_add_layer_norm(hidden_states, input_tensor, self.dropout, self.LayerNorm)  # post-norm
                return hidden_states
        """)


def test_the_comment_at_the_end_of_a_removed_statement_is_kept():
    result = rewrite(
        BERT_OUTPUT.replace(
            "hidden_states = self.dropout(hidden_states)",
            "hidden_states = self.dropout(hidden_states)  # p=0.1",
        )
    )
    assert [r.status for r in result.results] == ["patched"]
    patched = result.patched
    assert (
        "        # regularise before the residual\n        # p=0.1\n        hidden_states = "
        in patched
    )
    assert "self.dropout(hidden_states)" not in patched


def test_second_apply_changes_nothing():
    first = rewrite(BERT_OUTPUT)
    again = rewrite_text(first.patched, "model.py", Matcher(load_rule_set("paper")))
    assert not again.changed
    assert again.results == []


def test_imports_merge_into_existing_kernel_import():
    source = "from adopter.kernels import softmax\n" + BERT_OUTPUT
    result = rewrite(source)
    assert "from adopter.kernels import dropout_add_layer_norm, softmax\n" in result.patched
    assert result.patched.count("adopter.kernels") == 1


def test_name_clash_gets_an_alias():
    source = (
        "def softmax(x):\n    return x\n"
        + """
class A(nn.Module):
    def forward(self, scores):
        return F.softmax(scores, dim=-1, dtype=torch.float32)
"""
    )
    result = rewrite(source)
    assert "from adopter.kernels import softmax as adopter_softmax" in result.patched
    assert "return adopter_softmax(scores, dim=-1, dtype=torch.float32)" in result.patched


def test_fig4_statement_moves_into_both_arms():
    result = rewrite("""
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
""")
    assert [r.status for r in result.results] == ["patched"]
    assert textwrap.dedent("""
        def forward(self, x):
            if self.use_bn:
                x = conv_batch_norm(x, self.conv, self.bn)
            else:
                x = self.conv(x)
            return x
    """).strip() in textwrap.dedent(
        result.patched.split("def forward", 1)[1].join(["def forward", ""])
    ).strip() or (
        "        if self.use_bn:\n            x = conv_batch_norm(x, self.conv, self.bn)\n"
        "        else:\n            x = self.conv(x)\n        return x\n" in result.patched
    )


def test_statement_after_a_branch_moves_into_the_other_arm():
    result = rewrite("""
class PostAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout = nn.Dropout(0.1)
        self.layer_norm = nn.LayerNorm(4)

    def forward(self, h, attn_out, residual=True):
        attn_out = self.dropout(attn_out)
        if residual:
            attn_out = attn_out + h
        output = self.layer_norm(attn_out)  # post-norm
        return output
""")
    assert [r.status for r in result.results] == ["patched"]
    assert (
        "        if residual:\n"
        "            output = dropout_add_layer_norm(attn_out, h, self.dropout, self.layer_norm)\n"
        "        else:\n"
        "            attn_out = self.dropout(attn_out)\n"
        "            output = self.layer_norm(attn_out)  # post-norm\n"
        "        return output\n"
    ) in result.patched
    again = rewrite_text(result.patched, "model.py", Matcher(load_rule_set("paper")))
    assert not again.changed


HELPER_AND_CALLERS = """
class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.output_dropout = nn.Dropout(0.1)

    def forward(self, hidden_states, norm=1):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.output_dropout(hidden_states)
        return hidden_states


class EncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.feed_forward = FeedForward()
        self.final_layer_norm = nn.LayerNorm(4)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.feed_forward(hidden_states)
        hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ffn = FeedForward()
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        y = self.ffn(x)
        return self.norm(x + y)
"""


def test_helper_that_ends_with_dropout_takes_the_callers_values():
    result = rewrite(HELPER_AND_CALLERS)
    assert [r.status for r in result.results] == ["patched"]  # one site, reached twice
    patched = body_of(result.patched)
    # `norm` is already a parameter of the helper, so the new one gets a prefix.
    assert "def forward(self, hidden_states, norm=1, *, residual=None, fused_norm=None):" in patched
    assert (
        "        if fused_norm is not None:\n"
        "            return dropout_add_layer_norm(hidden_states, residual, self.output_dropout, "
        "fused_norm)\n"
        "        hidden_states = self.output_dropout(hidden_states)\n"
    ) in patched
    assert patched.count("if fused_norm is not None") == 1  # one helper edit for two callers
    assert (
        "hidden_states = self.feed_forward(hidden_states, residual=hidden_states, "
        "fused_norm=self.final_layer_norm)\n        return hidden_states"
    ) in patched
    assert "return self.ffn(x, residual=x, fused_norm=self.norm)" in patched
    again = rewrite_text(result.patched, "model.py", Matcher(load_rule_set("paper")))
    assert not again.changed


def test_helper_with_several_returns_is_refused():
    source = HELPER_AND_CALLERS.replace(
        "        hidden_states = self.dense(hidden_states)\n",
        "        if hidden_states is None:\n            return None\n"
        "        hidden_states = self.dense(hidden_states)\n",
    )
    result = rewrite(source)
    assert not result.changed
    assert {r.reason for r in result.results} == {"forward() returns in several places"}


def test_helper_that_does_more_after_the_dropout_is_refused():
    source = HELPER_AND_CALLERS.replace(
        "        hidden_states = self.output_dropout(hidden_states)\n",
        "        hidden_states = self.output_dropout(hidden_states)\n        self.calls = 1\n",
    )
    result = rewrite(source)
    assert not result.changed
    assert {r.reason for r in result.results} == {
        "forward() does not end by returning the matched value"
    }


def test_helper_method_of_the_same_class_is_refused():
    result = rewrite("""
class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.dropout = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(4)

    def feed_forward(self, x):
        return self.dropout(self.dense(x))

    def forward(self, x):
        return self.norm(x + self.feed_forward(x))
""")
    assert not result.changed
    (only,) = result.results
    assert "feed_forward() is a method of the caller's class" in only.reason


def test_sequential_that_ends_with_the_dropout():
    result = rewrite("""
class PositionwiseFF(nn.Module):
    def __init__(self):
        super().__init__()
        self.CoreNet = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Dropout(0.1))
        self.layer_norm = nn.LayerNorm(8)

    def forward(self, inp):
        core_out = self.CoreNet(inp)
        output = self.layer_norm(inp + core_out)
        return output
""")
    # Linear + ReLU in the same nn.Sequential (paper.6) become the dropout fusion's input
    assert [(r.site.rule.id, r.status) for r in result.results] == [
        ("paper.6", "patched"),
        ("paper.5", "patched"),
    ]
    assert (
        "        output = dropout_add_layer_norm(linear_bias_activation(inp, self.CoreNet[0], "
        "self.CoreNet[1]), inp, self.CoreNet[2], self.layer_norm)\n        return output\n"
    ) in result.patched
    assert "core_out" not in result.patched
    assert "import dropout_add_layer_norm, linear_bias_activation\n" in result.patched
    again = rewrite_text(result.patched, "model.py", Matcher(load_rule_set("paper")))
    assert not again.changed


def test_helper_call_moves_into_the_branch_that_norms():
    result = rewrite("""
class SelfOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.LayerNorm = nn.LayerNorm(4)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = hidden_states + input_tensor
        return hidden_states


class Attention(nn.Module):
    def __init__(self, pre_norm):
        super().__init__()
        self.output = SelfOutput()
        self.pre_norm = pre_norm

    def forward(self, x, residual):
        attention_output = self.output(x, residual)
        if not self.pre_norm:
            attention_output = self.output.LayerNorm(attention_output)
        return attention_output
""")
    assert [r.status for r in result.results] == ["patched"]
    patched = body_of(result.patched)
    assert "    def forward(self, hidden_states, input_tensor, *, norm=None):\n" in patched
    assert (
        "        hidden_states = self.dense(hidden_states)\n"
        "        if norm is not None:\n"
        "            return dropout_add_layer_norm(hidden_states, input_tensor, self.dropout, norm)\n"
        "        hidden_states = self.dropout(hidden_states)\n"
    ) in patched
    assert (
        "        if not self.pre_norm:\n"
        "            attention_output = self.output(x, residual, norm=self.output.LayerNorm)\n"
        "        else:\n"
        "            attention_output = self.output(x, residual)\n"
    ) in patched


def test_fused_qkv_becomes_one_tuple_assignment():
    result = rewrite("""
class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.q_proj = nn.Linear(d, d, bias=False)

    def _split_heads(self, tensor, heads, size):
        return tensor.view(tensor.shape[0], tensor.shape[1], heads, size)

    def forward(self, hidden_states):
        query = self.q_proj(hidden_states)
        key = self.k_proj(hidden_states)
        value = self.v_proj(hidden_states)

        query = self._split_heads(query, 2, 4)
        key = self._split_heads(key, 2, 4)
        value = self._split_heads(value, 2, 4)
        return query, key, value
""")
    assert [r.status for r in result.results] == ["patched"]
    assert (
        "        query, key, value = qkv_projection(hidden_states, self.q_proj, self.k_proj, self.v_proj)\n"
        "\n        query = self._split_heads(query, 2, 4)\n" in result.patched
    )


def test_sequential_is_split_around_the_kernel():
    result = rewrite("""
class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x):
        return self.proj(x)
""")
    assert (
        "return self.proj[3](self.proj[2](linear_batch_norm(x, self.proj[0], self.proj[1])))"
        in result.patched
    )


def test_attention_constructor_is_wrapped_and_inner_softmax_left_alone():
    result = rewrite("""
class BertSelfAttention(nn.Module):
    def forward(self, scores):
        return F.softmax(scores, dim=-1)

class BertAttention(nn.Module):
    def __init__(self, config, position_embedding_type=None):
        super().__init__()
        self.self = BertSelfAttention(config, position_embedding_type=position_embedding_type)

    def forward(self, x):
        return self.self(x)
""")
    statuses = {r.site.rule.id: (r.status, r.reason) for r in result.results}
    assert statuses["paper.1"][0] == "patched"
    assert statuses["paper.4"] == (
        "covered",
        "inside BertSelfAttention, which a fused-attention rule replaces as a whole",
    )
    assert (
        "self.self = fused_bert_self_attention(BertSelfAttention)(config, "
        "position_embedding_type=position_embedding_type)" in result.patched
    )
    again = rewrite_text(result.patched, "model.py", Matcher(load_rule_set("paper")))
    assert not again.changed


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (
            """
class L(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(4)

    def forward(self, x, residual):
        y = self.drop(x)
        x = x * 2
        return self.norm(y + residual)
""",
            "reassigns an input of the fused call",
        ),
        (
            """
class L(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(4)

    def forward(self, x, residual):
        y = self.drop(x) if self.training else x
        return self.norm(y + residual)
""",
            "shares its statement with other work",
        ),
        (
            """
class L(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(4)

    def forward(self, x, residual):
        x = self.drop(x)
        if torch.rand([]) > 0.5:
            x = x + residual
        return self.norm(x)
""",
            "the condition calls something",
        ),
        (
            """
class L(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(4)

    def forward(self, x, residual, mask):
        x = self.drop(x)
        if residual is not None:
            x = x + residual
            self.count = 1
        y = self.norm(x)
        return y
""",
            "the fused statement is not the last of its branch",
        ),
    ],
)
def test_unsafe_rewrites_are_refused_with_a_reason(source, reason):
    result = rewrite(source)
    assert not result.changed
    (only,) = result.results
    assert only.status == "skipped" and reason in only.reason


def test_skip_keeps_the_other_sites():
    source = (
        BERT_OUTPUT
        + """
class Bad(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(4)

    def forward(self, x, residual):
        y = self.drop(x) if self.training else x
        return self.norm(y + residual)
"""
    )
    result = rewrite(source)
    assert sorted(r.status for r in result.results) == ["patched", "skipped"]
    assert "dropout_add_layer_norm(hidden_states, input_tensor" in result.patched


def test_construction_arguments_a_replacement_would_drop_are_refused():
    from adopter.dsl import parse_rules

    (rule,) = parse_rules("""
rule test.1 {
    name: "narrow"
    kernel: "adopter.kernels.fused_bert_self_attention"
    site: "init"
    init {
        @SelfAttention($config) -> $attention
    } => {
        @adopter.kernels.fused_bert_self_attention(SelfAttention)($config) -> $attention
    }
    forward {
        $attention(...) -> $output
    }
}
""")
    result = rewrite(
        """
class SelfAttention(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        self.layer_idx = layer_idx

    def forward(self, x):
        return x


class Layer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attention = SelfAttention(config, layer_idx=layer_idx)

    def forward(self, x):
        return self.attention(x)
""",
        rules=[rule],
    )
    assert not result.changed
    (only,) = result.results
    assert "passes layer_idx=layer_idx, which the replacement would drop" in only.reason


def test_every_softmax_spelling_becomes_the_kernel_call():
    result = rewrite("""
        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.softmax = nn.Softmax(dim=-1)

            def forward(self, q, k):
                a = self.softmax(q @ k)
                b = nn.Softmax(dim=-1)(a)
                c = torch.softmax(b, -1, torch.float32)
                return c.float().softmax(-1)
        """)
    assert [r.status for r in result.results] == ["patched"] * 4
    body = body_of(result.patched.replace("from adopter.kernels import softmax\n", ""))
    assert "a = softmax(q @ k, dim=-1)" in body
    assert "b = softmax(a, dim=-1)" in body
    # torch.softmax's third parameter is dtype (F.softmax's is _stacklevel)
    assert "c = softmax(b, dim=-1, dtype=torch.float32)" in body
    assert "return softmax(c.float(), dim=-1)" in body
    assert "self.softmax = nn.Softmax(dim=-1)" in body  # the module stays: no state changes


def test_a_kernel_imported_by_an_earlier_apply_keeps_its_name():
    earlier = "from adopter.kernels import softmax\n"
    result = rewrite_text(
        HEAD
        + earlier
        + textwrap.dedent("""
        class Attend(nn.Module):
            def forward(self, scores):
                return softmax(scores, dim=-1) + F.softmax(scores, dim=-1)
        """),
        "model.py",
        Matcher(load_rule_set("paper")),
    )
    assert [r.status for r in result.results] == ["patched"]
    assert "adopter_softmax" not in result.patched
    assert result.patched.count("from adopter.kernels import") == 1
    assert "return softmax(scores, dim=-1) + softmax(scores, dim=-1)" in result.patched


def test_a_call_chained_on_the_matched_call_stays():
    # `F.softmax(...)` and `F.softmax(...).to(dtype)` start at the same place: only the first
    # is the site; the `.to` must survive (it sets the output dtype)
    result = rewrite("""
        class Attn(nn.Module):
            def forward(self, scores, query):
                weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
                return weights
        """)
    assert [r.status for r in result.results] == ["patched"]
    assert (
        "weights = softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)" in result.patched
    )


LLAMA_ATTENTION = """
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
"""


def test_fused_qkv_read_inside_larger_statements_gets_new_names():
    result = rewrite(LLAMA_ATTENTION)
    assert [r.status for r in result.results] == ["patched"]
    assert (
        "        query, key, value = qkv_projection(hidden_states, self.q_proj, self.k_proj, "
        "self.v_proj)\n"
        "        query_states = query.view(hidden_shape).transpose(1, 2)\n"
        "        key_states = key.view(hidden_shape).transpose(1, 2)\n"
        "        value_states = value.view(hidden_shape).transpose(1, 2)\n"
    ) in result.patched
    again = rewrite_text(result.patched, "model.py", Matcher(load_rule_set("paper")))
    assert not again.changed


def test_fused_qkv_new_names_avoid_the_functions_own():
    result = rewrite(LLAMA_ATTENTION.replace("hidden_shape = (", "query = 1; hidden_shape = ("))
    assert "fused_query, key, value = qkv_projection(" in result.patched


def test_fused_qkv_in_different_blocks_moves_the_query_into_each_arm():
    result = rewrite("""
        class BertSelfAttention(nn.Module):
            def __init__(self):
                super().__init__()
                self.query = nn.Linear(8, 8)
                self.key = nn.Linear(8, 8)
                self.value = nn.Linear(8, 8)

            def forward(self, hidden_states, cross=None):
                q = self.query(hidden_states).view(2, 3, 2, 4)
                if cross is not None:
                    k = self.key(cross).view(2, 3, 2, 4)
                    v = self.value(cross).view(2, 3, 2, 4)
                else:
                    k = self.key(hidden_states).view(2, 3, 2, 4)
                    v = self.value(hidden_states).view(2, 3, 2, 4)
                return q, k, v
        """)
    assert [r.status for r in result.results] == ["patched"]
    assert (
        "        if cross is not None:\n"
        "            q = self.query(hidden_states).view(2, 3, 2, 4)\n"
        "            k = self.key(cross).view(2, 3, 2, 4)\n"
    ) in result.patched
    assert "            q = query.view(2, 3, 2, 4)\n" in result.patched


def test_fused_qkv_nested_deeper_than_an_arm_is_skipped_with_lines():
    result = rewrite("""
        class BertSelfAttention(nn.Module):
            def __init__(self):
                super().__init__()
                self.query = nn.Linear(8, 8)
                self.key = nn.Linear(8, 8)
                self.value = nn.Linear(8, 8)

            def forward(self, hidden_states, cross=None, flag=False):
                q = self.query(hidden_states).view(2, 3, 2, 4)
                if cross is not None:
                    k, v = cross
                else:
                    if flag:
                        k = self.key(hidden_states).view(2, 3, 2, 4)
                        v = self.value(hidden_states).view(2, 3, 2, 4)
                    else:
                        k, v = cross
                return q, k, v
        """)
    assert [r.status for r in result.results] == ["skipped"]
    assert "(lines 14, 19, 20) sit in different blocks, not all directly in one arm" in (
        result.results[0].reason
    )
    assert not result.changed


GENERATED_HEADER = (
    "#           This file was automatically generated from "
    "src/transformers/models/toy/modular_toy.py.\n"
    "#               Do NOT edit this file manually.\n"
)
TOY = """
class Attn(nn.Module):
    def forward(self, scores):
        return F.softmax(scores, dim=-1)
"""


def test_apply_patches_the_generated_modeling_file_by_default():
    matcher = Matcher(load_rule_set("paper"))
    generated = rewrite_text(GENERATED_HEADER + HEAD + TOY, "modeling_toy.py", matcher)
    assert [r.status for r in generated.results] == ["patched"]
    modular = rewrite_text(HEAD + TOY, "modular_toy.py", matcher)
    assert [r.status for r in modular.results] == ["skipped"]
    assert "generates modeling_toy.py from this modular file" in modular.results[0].reason
    assert not modular.changed


def test_modular_option_patches_the_modular_source_instead():
    matcher = Matcher(load_rule_set("paper"))
    modular = rewrite_text(HEAD + TOY, "modular_toy.py", matcher, modular=True)
    assert [r.status for r in modular.results] == ["patched"]
    generated = rewrite_text(
        GENERATED_HEADER + HEAD + TOY, "modeling_toy.py", matcher, modular=True
    )
    assert [r.status for r in generated.results] == ["skipped"]
    assert "generated from modular_toy.py" in generated.results[0].reason
    # a file that is neither is patched either way
    plain = rewrite_text(HEAD + TOY, "modeling_plain.py", matcher, modular=True)
    assert [r.status for r in plain.results] == ["patched"]
