"""The ``train`` set's call-site rules (``adopter/rules/train.py``): each has a fixture of marked
cases in ``tests/rules/call_fixtures/`` and a reviewed snapshot of what scan reports and apply
writes, as the DSL rules do (``tests/rules/README.md``); the set is reachable as every set is."""

from __future__ import annotations

import difflib
import textwrap
from pathlib import Path

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import CALL_RULES, DEFAULT_RULE_SET, RULE_SETS, load_rule_set
from tests.helpers import scan_snippet
from tests.rules.fixture_cases import SNAPSHOTS, read_fixture
from tests.rules.test_rule_fixtures import UPDATE, snapshot_text

CALL_FIXTURES = Path(__file__).parent / "call_fixtures"
TRAIN = load_rule_set("train")


def _stem(rule) -> str:
    return f"{rule.id.replace('.', '_')}_{rule.name.replace('-', '_')}"


def test_the_train_set_is_registered_and_not_in_all():
    assert "train" in RULE_SETS
    assert [rule.id for rule in TRAIN] == ["train.1", "train.2"]
    assert all(rule.call is not None and not rule.detect_only for rule in TRAIN)
    assert not any(rule.id.startswith("train.") for rule in load_rule_set(DEFAULT_RULE_SET))
    assert {_stem(rule) + ".py" for rule in CALL_RULES["train"]} == {
        path.name for path in CALL_FIXTURES.glob("*.py")
    }


@pytest.mark.parametrize("rule", TRAIN, ids=_stem)
def test_fixture_cases_report_exactly_the_marked_lines(rule):
    cases = read_fixture(CALL_FIXTURES / f"{_stem(rule)}.py")
    assert any(case.sites for case in cases)
    for case in cases:
        found = scan_snippet(case.source, [rule], path="train.py")
        # Two sites may share a line (two optimizers in one statement): lines, not sites.
        applicable = sorted({site.line for site in found if site.applicable})
        not_applicable = sorted({site.line for site in found if not site.applicable})
        assert (applicable, not_applicable) == (case.sites, case.not_applicable), case.title


@pytest.mark.parametrize("rule", TRAIN, ids=_stem)
def test_snapshot_of_scan_and_apply(rule):
    path = SNAPSHOTS / f"{_stem(rule)}.snap"
    current = snapshot_text(CALL_FIXTURES / f"{_stem(rule)}.py", [rule])
    current = current.replace("tests/rules/fixtures/", "tests/rules/call_fixtures/").replace(
        "test_rule_fixtures.py", "test_train_rules.py"
    )
    if UPDATE:
        path.write_text(current, encoding="utf-8")
        return
    assert path.exists(), f"no snapshot {path.name}: run with ADOPTER_UPDATE_SNAPSHOTS=1"
    recorded = path.read_text(encoding="utf-8")
    diff = "\n".join(
        difflib.unified_diff(recorded.split("\n"), current.split("\n"), "recorded", "current")
    )
    assert recorded == current, f"{path.name} changed; review, then update:\n{diff}"


def _apply(source: str) -> str:
    result = rewrite_text(textwrap.dedent(source), "train.py", Matcher(TRAIN))
    assert result.error is None
    return result.patched


def test_two_optimizers_on_one_line_are_both_rewritten():
    patched = _apply(
        """\
        import torch
        a, b = torch.optim.SGD(p, lr=0.1), torch.optim.Adam(q)
        """
    )
    assert patched.splitlines()[2] == (
        "a, b = fused_optimizer(torch.optim.SGD, p, lr=0.1), fused_optimizer(torch.optim.Adam, q)"
    )


def test_the_import_comes_before_a_module_level_use_after_later_imports():
    patched = _apply(
        """\
        import torch
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.AdamW(model.parameters())
        import os
        """
    )
    lines = patched.splitlines()
    assert lines.index("from adopter.kernels import fused_optimizer") < lines.index(
        "optimizer = fused_optimizer(torch.optim.AdamW, model.parameters())"
    )


def test_a_taken_kernel_name_gets_an_alias():
    patched = _apply(
        """\
        import torch
        def fused_optimizer():
            pass
        def build(model):
            return torch.optim.Adam(model.parameters())
        """
    )
    compile(patched, "train.py", "exec")
    assert "def fused_optimizer():" in patched
    assert "return fused_optimizer(" not in patched


def test_call_rules_and_model_rules_patch_one_file_together():
    source = textwrap.dedent(
        """\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        class Attn(nn.Module):
            def forward(self, scores):
                return F.softmax(scores, dim=-1)


        optimizer = torch.optim.AdamW(Attn().parameters())
        """
    )
    rules = load_rule_set("paper") + TRAIN
    result = rewrite_text(source, "train.py", Matcher(rules))
    assert sorted(r.site.rule.id for r in result.results) == ["paper.4", "train.1"]
    assert "from adopter.kernels import fused_optimizer, softmax" in result.patched
    assert not rewrite_text(result.patched, "train.py", Matcher(rules)).changed


def test_call_rules_may_call_only_an_optimizer_kernel():
    from dataclasses import replace

    from adopter.dsl import DslError, check_declared_kernels
    from adopter.runtime.rulechoice import RuleChoice

    check_declared_kernels(TRAIN)
    assert [rule.id for rule in RuleChoice.of("train").rules()] == ["train.1", "train.2"]
    with pytest.raises(DslError, match="is a kernel of adopter.kernels, not a call-site rule's"):
        check_declared_kernels([replace(TRAIN[0], kernel="adopter.kernels.softmax")])
