"""The match trace (``scan --explain``, ``ADOPTER_EXPLAIN=1``): where a rule could have started
and why it did not fire, with the exact messages a rule author reads."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from adopter.cli import app
from adopter.dsl import load_rule_file
from adopter.extract import analyse_source
from adopter.match import Matcher
from adopter.rules import RULES_DIR, rule_files
from tests.rules.fixture_cases import fixture_path, read_fixture

try:  # keep stderr out of the parsed stdout on every click version
    runner = CliRunner(mix_stderr=False)
except TypeError:  # click >= 8.2 always keeps them apart
    runner = CliRunner()


def explained(rule_stem: str, title: str) -> list[str]:
    """The trace of one fixture case, scanned with its own rule file."""
    rule_file = RULES_DIR / f"{rule_stem}.adopt"
    case = next(c for c in read_fixture(fixture_path(rule_file)) if c.title == title)
    return trace(case.source, load_rule_file(rule_file), path=fixture_path(rule_file).name)


def trace(source: str, rules, path: str = "model.py") -> list[str]:
    matcher = Matcher(rules, explain=True)
    matcher.match_file(analyse_source(textwrap.dedent(source), path, matcher.opaque_methods))
    return [str(miss) for miss in matcher.misses]


FILE = "paper_5_dropout_add_layernorm.py"


def test_wrong_callee_names_the_step_and_the_line():
    assert explained("paper_5_dropout_add_layernorm", "a product is not a residual add") == [
        f"{FILE}:49:13: paper.5 did not fire in Layer.forward at step 2 "
        "`add($dropped, $residual) -> $sum`: wrong callee: line 50 calls `mul`, not `add`"
    ]


def test_init_construction_that_the_rule_does_not_accept():
    assert explained("paper_6_bias_activation", "no bias to fuse") == [
        "paper_6_bias_activation.py:28:25: paper.6 did not fire in Intermediate.forward at step 1 "
        "`$linear($x) -> $projected`: init construction `torch.nn.Linear` (line 25) does not "
        "match `@torch.nn.Linear(..., bias=True) -> $linear`: `bias=`: `False` is not the "
        "literal True"
    ]


def test_missing_keyword_of_the_init_construction():
    assert explained(
        "paper_2_t5_attention", "the pattern requires has_relative_attention_bias"
    ) == [
        "paper_2_t5_attention.py:25:16: paper.2 did not fire in T5Layer.forward at step 1 "
        "`$attention(...) -> $output`: init construction `T5Attention` (line 23) does not match "
        "`@T5Attention($config, has_relative_attention_bias=$relative, ...) -> $attention`: "
        "`has_relative_attention_bias=` is missing"
    ]


def test_literal_argument_of_a_call():
    lines = explained(
        "paper_4_softmax",
        "every spelling over the last dimension; dim=1 of a tensor of unknown rank is not",
    )
    assert lines == [
        "paper_4_softmax.py:17:13: paper.4 did not fire in Attn.forward at step 1 "
        "`torch.nn.functional.softmax($x, dim=-1, ...) -> $probabilities`: line 17 "
        "`torch.nn.functional.softmax`, `dim=`: `1` is not the literal -1"
    ]


def test_a_match_that_is_not_applicable_says_why():
    assert explained(
        "paper_5_dropout_add_layernorm", "the sum is returned too: fusing would lose it"
    ) == [
        f"{FILE}:38:13: paper.5 did not fire in Layer.forward: matched, but not applicable: "
        "$sum (line 39) is also used elsewhere (line 40)"
    ]


def test_a_rule_with_no_candidate_in_the_file():
    assert explained("ext_1_roberta_attention", "BertSelfAttention is paper.1's, not ext.1's") == [
        "ext_1_roberta_attention.py: ext.1 did not fire at step 1 `$attention(...) -> $output`: "
        "no call in this file can start the match"
    ]


def test_broken_data_flow():
    source = """
        from torch import nn
        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.drop = nn.Dropout(0.1)
                self.norm = nn.LayerNorm(4)
            def forward(self, x, residual):
                y = self.drop(x)
                return self.norm(residual + x)
    """
    rules = load_rule_file(RULES_DIR / "paper_5_dropout_add_layernorm.adopt")
    assert trace(source, rules) == [
        "model.py:9:13: paper.5 did not fire in Layer.forward at step 2 "
        "`add($dropped, $residual) -> $sum`: data flow broken: no call uses $dropped (line 9)"
    ]


def test_calls_of_a_site_are_not_reported_as_other_candidates():
    # three projections: the key and value projections could each start a match, but they are
    # part of the site, so the trace says nothing about them
    assert explained("paper_9_fused_qkv", "q, k and v projections of one input") == []


@pytest.mark.parametrize("rule_file", rule_files("all"), ids=lambda path: path.stem)
def test_explaining_changes_no_match(rule_file):
    rules = load_rule_file(rule_file)
    for case in read_fixture(fixture_path(rule_file)):
        quiet, loud = Matcher(rules), Matcher(rules, explain=True)
        found = [
            [
                site.as_record()
                for site in matcher.match_file(
                    analyse_source(case.source, "fixture.py", matcher.opaque_methods)
                )
            ]
            for matcher in (quiet, loud)
        ]
        assert found[0] == found[1], case.title
        assert quiet.misses == []


@pytest.mark.parametrize("how", ["option", "environment"])
def test_cli_prints_the_trace_on_stderr_and_keeps_json_intact(tmp_path, how):
    fixture = fixture_path(RULES_DIR / "paper_5_dropout_add_layernorm.adopt")
    model = tmp_path / "model.py"
    model.write_text(fixture.read_text(encoding="utf-8"), encoding="utf-8")
    arguments = ["scan", str(model), "--select", "paper.5", "--format", "json"]
    plain = runner.invoke(app, arguments)
    if how == "option":
        result = runner.invoke(app, [*arguments, "--explain"])
    else:
        result = runner.invoke(app, arguments, env={"ADOPTER_EXPLAIN": "1"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json.loads(plain.stdout)
    assert (
        f"{model}:49:13: paper.5 did not fire in Layer.forward at step 2 "
        "`add($dropped, $residual) -> $sum`: wrong callee: line 50 calls `mul`, not `add`"
    ) in result.stderr.splitlines()
    assert "did not fire" not in plain.stderr


# -- rules whose first step matched nothing anywhere -----------------------------------------

SOFTMAX_MODEL = """\
import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, scores):
        scores = torch.matmul(scores, scores)
        return F.log_softmax(self.proj(scores), dim=-1)
"""

USER_RULES = """\
rule mine.1 {
  name: "a misspelled callee"
  forward { torch.nn.functional.sofmax($x, ...) -> $y } => _
}
rule mine.2 {
  name: "starts but does not fire"
  forward { torch.nn.functional.log_softmax($x, dim=1) -> $y } => _
}
rule mine.3 {
  name: "a misspelled constructor"
  init { @torch.nn.Linaer(...) -> $projection }
  forward { $projection($x) -> $y } => _
}
"""


def explain_scan(tmp_path, *files: str) -> list[str]:
    rules = tmp_path / "mine.adopt"
    rules.write_text(USER_RULES)
    for index, source in enumerate(files):
        (tmp_path / f"m{index}.py").write_text(source)
    result = runner.invoke(app, ["scan", "--rules", str(rules), "--explain", str(tmp_path)])
    assert result.exit_code == 0, result.output
    return result.stderr.splitlines()


def test_a_rule_whose_first_step_matched_nothing_names_the_nearest_call(tmp_path):
    other = "import torch\n\n\ndef f(x):\n    return torch.relu(x)\n"
    lines = explain_scan(tmp_path, SOFTMAX_MODEL, other)
    model = tmp_path / "m0.py"
    assert (
        "mine.1 did not fire: its first step `torch.nn.functional.sofmax($x, ...) -> $y` "
        f"matched no call in 2 file(s); nearest: {model}:13:16 "
        "`torch.nn.functional.log_softmax(...)`"
    ) in lines
    assert (
        "mine.3 did not fire: its first step `$projection($x) -> $y` matched no call in 2 "
        f"file(s); nearest: {model}:13:30 `self.proj(...)` (torch.nn.Linear)"
    ) in lines
    # one line for the whole scan, not one per file
    assert not [line for line in lines if "mine.1" in line and "in this file" in line]
    # mine.2 started (at the log_softmax call) and failed at its literal: no such line
    assert not [line for line in lines if line.startswith("mine.2 did not fire: its first")]
    assert any(line.startswith(f"{model}:13:16: mine.2 did not fire") for line in lines)


def test_a_rule_that_started_in_one_file_keeps_its_per_file_lines(tmp_path):
    lines = explain_scan(tmp_path, SOFTMAX_MODEL, "def f(x):\n    return x\n")
    assert not [line for line in lines if line.startswith("mine.2 did not fire: its first")]
    assert f"{tmp_path / 'm1.py'}: mine.2 did not fire at step 1" in "\n".join(lines)


def test_nearest_ranks_the_closest_name_then_the_arity():
    from adopter.match.explain import callee_distance

    wanted = "torch.nn.functional.softmax"
    closest = min(
        ["torch.matmul", "torch.nn.functional.log_softmax", "torch.nn.functional.sofmax"],
        key=lambda kind: callee_distance(wanted, kind),
    )
    assert closest == "torch.nn.functional.sofmax"
    assert callee_distance(wanted, "torch.nn.functional.log_softmax") < callee_distance(
        wanted, "torch.matmul"
    )
