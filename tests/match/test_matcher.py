"""Matching semantics: data flow, paths, scope, other uses, user rules."""

from tests.helpers import scan_snippet, sites_of

LINEAR_RELU = """
rule user.1 {
    name: "linear-relu"
    init { @torch.nn.Linear(...) -> $linear; @torch.nn.ReLU(...) -> $act }
    forward { $linear($x) -> $h; $act($h) -> $y } => _
}
"""

MODEL = """
from torch import nn
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.relu = nn.ReLU()
    def forward(self, x, flag):
{body}
"""


def body(text: str) -> str:
    return MODEL.format(body="\n".join("        " + line for line in text.strip().splitlines()))


def test_data_flow_not_names():
    sites = sites_of(body("a = self.fc(x)\nb = a\nreturn self.relu(b)"), rules=LINEAR_RELU)
    assert [s.line for s in sites] == [9]


def test_unrelated_value_does_not_match():
    sites = sites_of(body("a = self.fc(x)\nreturn self.relu(x), a"), rules=LINEAR_RELU)
    assert sites == []


def test_other_use_on_the_same_path_is_not_applicable():
    matches = scan_snippet(body("a = self.fc(x)\nb = self.relu(a)\nreturn b + a"), LINEAR_RELU)
    assert len(matches) == 1 and not matches[0].applicable
    assert "$h" in matches[0].reason and "line 11" in matches[0].reason


def test_use_on_an_exclusive_path_is_fine():
    # Paper Fig. 4: the fused pair lives in one arm; the other arm uses the Linear output alone.
    source = body(
        "a = self.fc(x)\nif flag:\n    out = self.relu(a)\nelse:\n    out = a * 2\nreturn out"
    )
    (site,) = scan_snippet(source, LINEAR_RELU)
    assert site.applicable


def test_use_after_the_branch_on_the_unfused_path_is_fine():
    source = body("a = self.fc(x)\nif flag:\n    a = self.relu(a)\nreturn a")
    (site,) = scan_snippet(source, LINEAR_RELU)
    assert site.applicable


def test_construction_must_match_init_pattern():
    source = MODEL.replace("nn.ReLU()", "nn.GELU()").format(
        body="        return self.relu(self.fc(x))"
    )
    assert scan_snippet(source, LINEAR_RELU) == []


def test_conditional_construction_matches_under_its_condition():
    source = MODEL.replace(
        "self.relu = nn.ReLU()",
        "if cfg:\n            self.relu = nn.ReLU()\n        else:\n            self.relu = nn.Identity()",
    ).format(body="        return self.relu(self.fc(x))")
    assert [s.applicable for s in scan_snippet(source, LINEAR_RELU)] == [True]


def test_module_list_elements_and_loops():
    source = """
    from torch import nn
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.relu = nn.ReLU()
        def forward(self, x):
            return self.relu(self.fc(x))
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block() for _ in range(3)])
        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x
    """
    sites = sites_of(source, rules=LINEAR_RELU)
    assert [(s.cls, s.line) for s in sites] == [("Block", 9)]


def test_pattern_across_a_helper_class():
    source = """
    from torch import nn
    class Proj(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)
        def forward(self, x):
            return self.fc(x)
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = Proj()
            self.relu = nn.ReLU()
        def forward(self, x):
            return self.relu(self.proj(x))
    """
    rule = LINEAR_RELU.replace("@torch.nn.Linear(...) -> $linear; ", "").replace(
        "$linear($x)", "torch.nn.Linear($x)"
    )
    sites = sites_of(source, rules=rule)
    assert [(s.cls, s.method, s.line) for s in sites] == [("Proj", "forward", 8)]


def test_where_clause_requires_context_steps():
    rule = """
    rule user.2 {
        forward { torch.nn.functional.softmax($x, dim=-1) -> $p }
        where { self._mix($p) -> _ }
        => _
    }
    """
    source = """
    import torch.nn.functional as F
    from torch import nn
    class A(nn.Module):
        def _mix(self, p):
            return p
        def forward(self, x, y):
            a = self._mix(F.softmax(x, dim=-1))
            b = F.softmax(y, dim=-1)
            return a, b
    """
    assert [s.line for s in sites_of(source, rules=rule)] == [8]


def test_index_callee_binds_the_key():
    rule = """
    rule user.3 {
        init { @ACT2FN[$name] -> $act }
        forward { $act($x) -> $y } => _
    }
    """
    source = """
    from torch import nn
    from ...activations import ACT2FN
    class A(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.act = ACT2FN[config.anything]
        def forward(self, x):
            return self.act(x)
    """
    (site,) = sites_of(source, rules=rule)
    assert site.bindings["name"] == "config.anything"


def test_json_record_shape():
    (site,) = sites_of(body("return self.relu(self.fc(x))"), rules=LINEAR_RELU)
    assert site.as_record() == {
        "rule": "user.1",
        "name": "linear-relu",
        "path": "model.py",
        "line": 9,
        "col": 26,
        "class": "M",
        "method": "forward",
        "message": "linear-relu",
    }


LINEAR_ACT_VARIANTS = """
rule user.2 {
    name: "linear-act"
    init { @torch.nn.Linear(...) -> $linear; @torch.nn.ReLU(...) -> $act }
    forward { $linear($x) -> $h; $act($h) -> $y } => _
    init { @torch.nn.Linear(...) -> $linear }
    forward { $linear($x) -> $h; torch.relu($h) -> $y } => _
}
"""


def test_each_variant_of_a_rule_is_matched_as_that_rule():
    module = body("a = self.fc(x)\nb = self.relu(a)\nc = self.fc(b)\nreturn torch.relu(c)")
    sites = sites_of("import torch\n" + module, rules=LINEAR_ACT_VARIANTS)
    assert [(s.rule.id, s.line) for s in sites] == [("user.2", 10), ("user.2", 12)]


TRANSPOSE_THEN_MATMUL = """
rule user.2 {
    name: "scores"
    forward { Tensor.transpose($k, -2, -1) -> $kt; matmul($q, $kt) -> $s } => _
}
"""


def test_a_transpose_names_its_two_dimensions_in_either_order():
    for dims, found in (("-2, -1", True), ("-1, -2", True), ("-3, -1", False), ("1, 2", False)):
        source = body(f"return x @ flag.transpose({dims})")
        assert bool(sites_of(source, rules=TRANSPOSE_THEN_MATMUL)) is found, dims
