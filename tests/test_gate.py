"""``apply --verify``'s safety net: a refuted rule is dropped, a proven one is kept."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from adopter.dsl import parse_rules
from adopter.gate import describe, gate_rewrites
from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None, reason="needs transformers"
    ),
]

# Softmax over the wrong dimension: a plausible-looking but wrong rule.
WRONG_SOFTMAX = """
rule bad.1 {
    name: "softmax over the wrong dimension"
    forward { torch.nn.functional.softmax($x, dim=-1, ...) -> $p }
    => { adopter.kernels.softmax($x, dim=0, ...) -> $p }
}
"""


def test_refuted_rule_is_dropped_and_the_good_one_kept():
    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.submodule_search_locations
    path = Path(spec.submodule_search_locations[0]) / "models" / "bert" / "modeling_bert.py"
    rules = [r for r in load_rule_set("paper") if r.id == "paper.6"] + parse_rules(WRONG_SOFTMAX)
    rewrite = rewrite_text(path.read_text(encoding="utf-8"), str(path), Matcher(rules))
    assert {r.site.rule.id for r in rewrite.results if r.status == "patched"} == {
        "paper.6",
        "bad.1",
    }
    (gated,) = gate_rewrites([rewrite], rules, timeout=300, modes=("eval",), max_heads=0)
    assert gated.status == "verified"
    assert gated.kept_rules == ["paper.6"]
    assert "bad.1" in gated.dropped_rules and "refuted" in gated.dropped_rules["bad.1"]
    assert gated.text is not None and "dim=0" not in gated.text
    assert "linear_bias_activation(" in gated.text
    said = describe(path, gated).splitlines()
    assert said[0].startswith(f"{path}: verified")
    assert said[1].startswith("  not written: bad.1: refuted")
