"""``adopter learn``: rules learned from small before/after examples of our own, applied to other
code (codemod-style: source in, expected source out), anti-unification, counter-examples, and
clear errors for examples it cannot use."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adopter.cli import app
from adopter.learn import Example, LearnError, learn
from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from tests.helpers import scan_snippet

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:  # click >= 8.2 keeps them apart
    runner = CliRunner()

HEADER = "import torch\nfrom torch import nn\nimport torch.nn.functional as F\n"
KERNELS = "from adopter.kernels import {}\n"

DROPOUT_BEFORE = HEADER + textwrap.dedent(
    """
    class Block(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.norm = nn.LayerNorm(hidden)
            self.drop = nn.Dropout(0.1)

        def forward(self, x, residual):
            y = self.drop(x)
            return self.norm(y + residual)
    """
)
DROPOUT_AFTER = (
    HEADER
    + KERNELS.format("dropout_add_layer_norm")
    + textwrap.dedent(
        """
        class Block(nn.Module):
            def __init__(self, hidden):
                super().__init__()
                self.norm = nn.LayerNorm(hidden)
                self.drop = nn.Dropout(0.1)

            def forward(self, x, residual):
                return dropout_add_layer_norm(x, residual, self.drop, self.norm)
        """
    )
)


def example(before: str, after: str, name: str = "example") -> Example:
    return Example(f"{name}.py", f"{name}.after.py", before, after)


def assert_codemod(rule, before: str, after: str) -> None:
    """The rule rewrites ``before`` to ``after`` (compared as ASTs: formatting is apply's)."""
    rewrite = rewrite_text(textwrap.dedent(before), "model.py", Matcher([rule]))
    assert rewrite.error is None, rewrite.error
    assert ast.dump(ast.parse(rewrite.patched)) == ast.dump(ast.parse(textwrap.dedent(after))), (
        rewrite.patched
    )


def test_learned_rule_rewrites_other_code_with_other_names_and_spellings():
    learned = learn([example(DROPOUT_BEFORE, DROPOUT_AFTER)], rule_id="my.1")
    assert learned.rule.id == "my.1"
    assert learned.rule.kernel == "adopter.kernels.dropout_add_layer_norm"
    assert_codemod(
        learned.rule,
        """
        import torch
        from torch import nn

        class Output(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.dense = nn.Linear(8, 8)
                self.LayerNorm = nn.LayerNorm(8, eps=1e-12)
                self.dropout = nn.Dropout(config.p)

            def forward(self, hidden_states, input_tensor):
                hidden_states = self.dense(hidden_states)
                hidden_states = self.dropout(hidden_states)
                hidden_states = self.LayerNorm(input_tensor + hidden_states)
                return hidden_states
        """,
        """
        import torch
        from torch import nn
        from adopter.kernels import dropout_add_layer_norm

        class Output(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.dense = nn.Linear(8, 8)
                self.LayerNorm = nn.LayerNorm(8, eps=1e-12)
                self.dropout = nn.Dropout(config.p)

            def forward(self, hidden_states, input_tensor):
                hidden_states = self.dense(hidden_states)
                hidden_states = dropout_add_layer_norm(hidden_states, input_tensor, self.dropout, self.LayerNorm)
                return hidden_states
        """,
    )


def test_learned_rule_leaves_a_near_miss_alone():
    learned = learn([example(DROPOUT_BEFORE, DROPOUT_AFTER)])
    near_miss = DROPOUT_BEFORE.replace("y + residual", "y * residual")
    assert scan_snippet(near_miss, [learned.rule]) == []


def test_the_rule_file_has_the_house_header_and_loads(tmp_path):
    learned = learn([example(DROPOUT_BEFORE, DROPOUT_AFTER)], rule_id="my.1")
    for section in ("What it does:", "Why:", "Before:", "After:", "Site:"):
        assert section in learned.text
    from adopter.dsl import load_rule_file

    path = tmp_path / "my_1.adopt"
    path.write_text(learned.text)
    (loaded,) = load_rule_file(path, use_cache=False)
    assert loaded.id == "my.1"
    assert "# %% the example it was learned from" in learned.fixture
    assert learned.fixture.count("# site") == 1


SOFTMAX_BEFORE = HEADER + textwrap.dedent(
    """
    class Attn(nn.Module):
        def forward(self, scores):
            return F.softmax(scores, dim=-1)
    """
)
SOFTMAX_AFTER = (
    HEADER
    + KERNELS.format("softmax")
    + textwrap.dedent(
        """
        class Attn(nn.Module):
            def forward(self, scores):
                return softmax(scores, dim=-1)
        """
    )
)


def test_constants_are_kept_from_one_example_and_become_variables_across_two():
    one = learn([example(SOFTMAX_BEFORE, SOFTMAX_AFTER)])
    other_dim = SOFTMAX_BEFORE.replace("dim=-1", "dim=1")
    assert scan_snippet(other_dim, [one.rule]) == []  # one example: only dim=-1
    two = learn(
        [
            example(SOFTMAX_BEFORE, SOFTMAX_AFTER, "a"),
            example(other_dim, SOFTMAX_AFTER.replace("dim=-1", "dim=1"), "b"),
        ]
    )
    assert not two.rule.variants  # one shape: anti-unified into one spelling
    assert len(scan_snippet(SOFTMAX_BEFORE.replace("dim=-1", "dim=2"), [two.rule])) == 1


CONV_BEFORE = HEADER + textwrap.dedent(
    """
    class Stem(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, bias=False)
            self.bn = nn.BatchNorm2d(8)

        def forward(self, x):
            x = self.conv(x)
            x = self.bn(x)
            return x
    """
)
CONV_AFTER = (
    HEADER
    + KERNELS.format("conv_batch_norm")
    + textwrap.dedent(
        """
        class Stem(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 8, 3, bias=False)
                self.bn = nn.BatchNorm2d(8)

            def forward(self, x):
                x = conv_batch_norm(x, self.conv, self.bn)
                return x
        """
    )
)


def test_a_counter_example_narrows_the_construction_constraints():
    counter = CONV_BEFORE.replace(
        "nn.Conv2d(3, 8, 3, bias=False)", "nn.Conv2d(3, 8, 5, bias=False)"
    )
    general = learn([example(CONV_BEFORE, CONV_AFTER)])
    assert scan_snippet(counter, [general.rule])  # flags alone: any kernel size
    narrowed = learn([example(CONV_BEFORE, CONV_AFTER)], counter_examples=[("not.py", counter)])
    assert narrowed.construction_level == "literals"
    assert scan_snippet(counter, [narrowed.rule]) == []
    assert scan_snippet(CONV_BEFORE, [narrowed.rule])


def test_a_counter_example_that_computes_the_same_thing_is_refused():
    with pytest.raises(LearnError, match="counter-example"):
        learn([example(CONV_BEFORE, CONV_AFTER)], counter_examples=[("not.py", CONV_BEFORE)])


BIAS_ACT_BEFORE = HEADER + textwrap.dedent(
    """
    class Intermediate(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.dense = nn.Linear(hidden, 4 * hidden)
            self.act = nn.GELU()

        def forward(self, x):
            h = self.dense(x)
            return self.act(h)
    """
)
BIAS_ACT_AFTER = (
    HEADER
    + KERNELS.format("linear_bias_activation")
    + textwrap.dedent(
        """
        class Intermediate(nn.Module):
            def __init__(self, hidden):
                super().__init__()
                self.dense = nn.Linear(hidden, 4 * hidden)
                self.act = nn.GELU()

            def forward(self, x):
                return linear_bias_activation(x, self.dense, self.act)
        """
    )
)


def test_a_learned_rule_asks_what_its_kernel_declares_of_a_construction():
    """``linear_bias_activation``'s registry entry declares a Linear with ``bias=True``: one
    example, whose Linear is biased by default, gives a rule that asks it, at the class level,
    so an unbiased Linear before an activation is no site and a configured bias is."""
    learned = learn([example(BIAS_ACT_BEFORE, BIAS_ACT_AFTER)])
    assert learned.construction_level == "class"
    assert "@torch.nn.Linear(..., bias=True) -> $dense" in learned.text
    unbiased = BIAS_ACT_BEFORE.replace("4 * hidden)", "4 * hidden, bias=False)")
    assert scan_snippet(unbiased, [learned.rule]) == []
    configured = BIAS_ACT_BEFORE.replace("4 * hidden)", "4 * hidden, bias=config.mlp_bias)")
    assert len(scan_snippet(configured, [learned.rule])) == 1
    # the counter-example the declaration already excludes narrows nothing further
    narrowed = learn(
        [example(BIAS_ACT_BEFORE, BIAS_ACT_AFTER)], counter_examples=[("not.py", unbiased)]
    )
    assert narrowed.construction_level == "class"


def test_flags_a_kernel_does_not_declare_stay_unasked():
    """qkv_projection declares nothing of its Linears: an example of bias-free projections
    learns a rule that takes biased ones too (paper.9's)."""
    unbiased_before = QKV_BEFORE.replace("nn.Linear(d, d)", "nn.Linear(d, d, bias=False)")
    unbiased_after = QKV_AFTER.replace("nn.Linear(d, d)", "nn.Linear(d, d, bias=False)")
    assert unbiased_before.count("bias=False") == 3
    learned = learn([example(unbiased_before, unbiased_after)])
    assert "bias" not in learned.text.split("rule learned.1", 1)[1]
    assert len(scan_snippet(QKV_BEFORE, [learned.rule])) == 1


def test_an_example_that_contradicts_its_kernels_declaration_is_refused():
    before = BIAS_ACT_BEFORE.replace("4 * hidden)", "4 * hidden, bias=False)")
    after = BIAS_ACT_AFTER.replace("4 * hidden)", "4 * hidden, bias=False)")
    with pytest.raises(LearnError, match=r"bias=False, but .*linear_bias_activation is declared"):
        learn([example(before, after)])


def test_a_factory_edit_in_init_becomes_an_init_site_rule():
    before = HEADER + textwrap.dedent(
        """
        class Layer(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.attention = MyAttention(config, kind="self")

            def forward(self, x):
                return self.attention(x)
        """
    )
    after = before.replace(
        "MyAttention(config", "fused_bert_self_attention(MyAttention)(config"
    ).replace(HEADER, HEADER + KERNELS.format("fused_bert_self_attention"))
    learned = learn([example(before, after)])
    assert learned.rule.site == "init"
    other = before.replace('kind="self"', 'kind="cross", extra=1')
    assert len(scan_snippet(other, [learned.rule])) == 1


@pytest.mark.parametrize(
    ("after", "message"),
    [
        (DROPOUT_BEFORE, "no change between"),
        (
            DROPOUT_AFTER.replace("dropout_add_layer_norm", "dropout_add_layer_nrom"),
            "unknown kernel 'adopter.kernels.dropout_add_layer_nrom'; did you mean",
        ),
        (
            DROPOUT_BEFORE.replace("y = self.drop(x)\n", "y = x\n"),
            "not a recognisable kernel call",
        ),
    ],
    ids=["no-change", "unknown-kernel", "no-kernel-call"],
)
def test_bad_examples_are_located_errors(after, message):
    with pytest.raises(LearnError, match=message) as raised:
        learn([example(DROPOUT_BEFORE, after)])
    assert raised.value.line >= 1 and raised.value.column >= 1


def test_cli_prints_the_rule_scans_and_reports_bad_input_without_a_traceback(tmp_path: Path):
    before, after = tmp_path / "before.py", tmp_path / "after.py"
    before.write_text(DROPOUT_BEFORE)
    after.write_text(DROPOUT_AFTER)
    out = tmp_path / "rule.adopt"
    result = runner.invoke(
        app,
        ["learn", str(before), str(after), "--name", "my.1", "-o", str(out), "--scan", str(before)],
    )
    assert result.exit_code == 0, result.output
    assert "rule my.1 {" in out.read_text()
    assert f"{before}:" in result.stderr and "1 site(s)" in result.stderr
    broken = tmp_path / "broken.py"
    broken.write_text(DROPOUT_AFTER.replace("dropout_add_layer_norm", "no_such_kernel"))
    failed = runner.invoke(app, ["learn", str(before), str(broken)])
    assert failed.exit_code == 2
    assert f"{broken}:" in failed.stderr and "unknown kernel" in failed.stderr
    assert "Traceback" not in failed.stderr + failed.stdout
    odd = runner.invoke(app, ["learn", str(before)])
    assert odd.exit_code == 2 and "pairs" in odd.stderr


def test_cli_verify_checks_the_sites_the_learned_rule_patches(tmp_path: Path):
    """``--verify`` hands the patched files to verify and prints a verdict per file."""
    before, after = tmp_path / "before.py", tmp_path / "after.py"
    before.write_text(DROPOUT_BEFORE)
    after.write_text(DROPOUT_AFTER)
    result = runner.invoke(
        app, ["learn", str(before), str(after), "--scan", str(before), "--verify"]
    )
    assert result.exit_code == 0, result.output + str(result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "before.py" in result.stdout


# -- two results, a copy of one of them, a submodule whose class the file defines ------------
EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "learn_fusion"


def _add_norm_example() -> Example:
    return Example.read(EXAMPLE_DIR / "add_norm_before.py", EXAMPLE_DIR / "add_norm_after.py")


def test_two_results_and_a_copy_learn_one_rule_with_both_outputs():
    """The decoder layer's ``h = r + h; r = h; h = norm(h)``: the kernel returns the normalised
    value and the sum, which the copy keeps under ``residual``; the norm's class is defined in
    the file (extraction inlines it), so the call is kept whole as the module the kernel is
    handed, and named by the ``rms_norm`` family."""
    learned = learn([_add_norm_example()], rule_id="my.1")
    rule = learned.rule
    assert rule.kernel == "adopter.kernels.add_rms_norm"
    (construction,) = rule.init.steps
    assert construction.callee.dotted == "rms_norm"
    (replacement,) = rule.forward.replacement
    assert len(replacement.targets) == 2
    assert [step.callee.dotted for step in rule.forward.steps[:1]] == ["add"]


ADD_NORM_OTHER = HEADER + textwrap.dedent(
    """
    class MyRMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = 1e-5

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


    class Layer(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.mix = nn.Linear(n, n)
            self.norm2 = MyRMSNorm(n)
            self.ffn = nn.Linear(n, n)

        def forward(self, x):
            skip = x
            x = self.mix(x)
            x = skip + x
            skip = x
            x = self.norm2(x)
            return skip + self.ffn(x)
    """
)


def test_learned_add_norm_rule_rewrites_another_layer_and_its_copy():
    learned = learn([_add_norm_example()], rule_id="my.1")
    after = ADD_NORM_OTHER.replace(
        "        x = skip + x\n        skip = x\n        x = self.norm2(x)\n",
        "        x, skip = add_rms_norm(skip, x, self.norm2)\n",
    ).replace(HEADER, HEADER + KERNELS.format("add_rms_norm"))
    assert "x, skip = add_rms_norm" in after
    assert_codemod(learned.rule, ADD_NORM_OTHER, after)


def test_a_copy_that_leaves_the_sum_under_two_names_is_not_rewritten():
    """``s = x; t = x`` after the add: the sum would need two names; apply refuses."""
    learned = learn([_add_norm_example()], rule_id="my.1")
    source = ADD_NORM_OTHER.replace(
        "        skip = x\n        x = self.norm2(x)\n",
        "        skip = x\n        keep = x\n        x = self.norm2(x)\n",
    ).replace("return skip + self.ffn(x)", "return skip + keep + self.ffn(x)")
    assert "keep = x" in source
    rewrite = rewrite_text(source, "model.py", Matcher([learned.rule]))
    assert rewrite.patched == source
    reasons = [result.reason for result in rewrite.results]
    assert any("under 2 names" in reason for reason in reasons), reasons


def test_a_layer_norm_is_not_an_rms_norm():
    learned = learn([_add_norm_example()], rule_id="my.1")
    source = ADD_NORM_OTHER.replace("self.norm2 = MyRMSNorm(n)", "self.norm2 = nn.LayerNorm(n)")
    assert scan_snippet(source, [learned.rule]) == []


def test_a_sum_the_norm_overwrites_is_not_assigned_last():
    """``x = a + b; x = norm(x)`` with no copy: the sum is dead afterwards; the tuple must not
    assign it to ``x`` after the normalised value (MiniMax's decoder layer)."""
    learned = learn([_add_norm_example()], rule_id="my.1")
    source = ADD_NORM_OTHER.replace(
        "        x = skip + x\n        skip = x\n        x = self.norm2(x)\n",
        "        x = skip * 0.5 + x\n        x = self.norm2(x)\n        skip = x\n",
    )
    assert "skip * 0.5 + x" in source
    after = source.replace(
        "        x = skip * 0.5 + x\n        x = self.norm2(x)\n",
        "        x, unused_x = add_rms_norm(skip * 0.5, x, self.norm2)\n",
    ).replace(HEADER, HEADER + KERNELS.format("add_rms_norm"))
    assert_codemod(learned.rule, source, after)


QKV_BEFORE = HEADER + textwrap.dedent(
    """
    class Attention(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.q_proj = nn.Linear(d, d)
            self.k_proj = nn.Linear(d, d)
            self.v_proj = nn.Linear(d, d)

        def forward(self, hidden_states):
            query = self.q_proj(hidden_states)
            key = self.k_proj(hidden_states)
            value = self.v_proj(hidden_states)
            query = query.view(2, 3, 4, 2)
            key = key.view(2, 3, 4, 2)
            value = value.view(2, 3, 4, 2)
            return query, key, value
    """
)
QKV_AFTER = (
    HEADER
    + KERNELS.format("qkv_projection")
    + textwrap.dedent(
        """
        class Attention(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.q_proj = nn.Linear(d, d)
                self.k_proj = nn.Linear(d, d)
                self.v_proj = nn.Linear(d, d)

            def forward(self, hidden_states):
                query, key, value = qkv_projection(
                    hidden_states, self.q_proj, self.k_proj, self.v_proj
                )
                query = query.view(2, 3, 4, 2)
                key = key.view(2, 3, 4, 2)
                value = value.view(2, 3, 4, 2)
                return query, key, value
        """
    )
)
# Three projections of one input that are not attention heads (Conditional-DETR's content
# projections): nothing splits them, so the fused-QKV example does not describe them.
QKV_NOT_HEADS = HEADER + textwrap.dedent(
    """
    class Decoder(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.q_content = nn.Linear(d, d)
            self.k_content = nn.Linear(d, d)
            self.v = nn.Linear(d, d)

        def forward(self, tgt, pos):
            q = self.q_content(tgt)
            k = self.k_content(tgt)
            v = self.v(tgt)
            return q + pos, k + pos, v
    """
)


def test_consumers_the_example_keeps_become_where_constraints():
    """Each fused result is split into heads by the code AFTER keeps: the rule asks that of a
    site (``split_heads``, the family of every spelling), as the built-in paper.9 does."""
    learned = learn([example(QKV_BEFORE, QKV_AFTER)], rule_id="my.1")
    assert "A site must also hand each result to `split_heads`" in learned.text
    rule = learned.rule
    where = rule.forward.where
    assert [step.callee.dotted for step in where] == ["split_heads"] * 3
    outputs = [step.targets[0].name for step in rule.forward.steps]
    assert [step.args[0].value.name for step in where] == outputs
    other_spelling = HEADER + textwrap.dedent(
        """
        class LlamaAttention(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.wq = nn.Linear(8, 8, bias=False)
                self.wk = nn.Linear(8, 4, bias=False)
                self.wv = nn.Linear(8, 4, bias=False)

            def forward(self, x):
                q = self.wq(x).reshape(2, 3, -1, 2).transpose(1, 2)
                k = self.wk(x).transpose(1, 2)
                v = self.wv(x).unflatten(-1, (2, 2))
                return q, k, v
        """
    )
    assert len(scan_snippet(other_spelling, [rule])) == 1
    assert scan_snippet(QKV_NOT_HEADS, [rule]) == []


def test_one_result_or_results_used_differently_ask_for_no_consumer():
    rule = learn([example(DROPOUT_BEFORE, DROPOUT_AFTER)]).rule
    assert rule.forward.where == ()
    mixed_before = QKV_BEFORE.replace("value = value.view(2, 3, 4, 2)", "value = value * 2")
    mixed_after = QKV_AFTER.replace("value = value.view(2, 3, 4, 2)", "value = value * 2")
    rule = learn([example(mixed_before, mixed_after)]).rule
    assert rule.forward.where == ()


def test_a_consumer_one_example_shows_and_another_lacks_is_anti_unified_away():
    """Projections split into heads in one example, used as they are in the other: the rule of
    both asks for neither, so it takes the unsplit projections too."""
    unsplit_before = QKV_BEFORE.replace(".view(2, 3, 4, 2)", " * 2")
    unsplit_after = QKV_AFTER.replace(".view(2, 3, 4, 2)", " * 2")
    both = learn(
        [example(QKV_BEFORE, QKV_AFTER), example(unsplit_before, unsplit_after, "other")]
    ).rule
    assert both.forward.where == ()
    assert not both.variants or all(v.forward.where == () for v in both.variants)
    assert len(scan_snippet(QKV_NOT_HEADS, [both])) == 1


def test_a_counter_example_the_consumers_already_exclude_keeps_the_class_level():
    learned = learn([example(QKV_BEFORE, QKV_AFTER)], counter_examples=[("n.py", QKV_NOT_HEADS)])
    assert learned.construction_level == "class"
