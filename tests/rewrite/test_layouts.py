"""Exact edits on any statement layout: statements joined on one line (``a; b``) and one-line
compound bodies (``if c: x = f(x)``). The fused call replaces exactly the matched statements,
the others on their line stay, in order, and the patched module computes what the original
does, in training and in evaluation, on the same random draws."""

from __future__ import annotations

import ast

import pytest
import torch

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rewrite.checks import check_edit
from adopter.rewrite.plan import Plan
from adopter.rewrite.source import SourceText
from adopter.rules import load_rule_set

HEAD = """\
import torch
from torch import nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(8, 8)
        self.dropout = nn.Dropout(0.5)
        self.LayerNorm = nn.LayerNorm(8)

"""

# name -> (forward's source, the lines the patched forward must hold, verbatim)
LAYOUTS = {
    # the whole line became ``pass``: the return on it was lost
    "joined_with_return": (
        "    def forward(self, h, r):\n"
        "        h = self.dense(h)\n"
        "        h = self.dropout(h); h = self.LayerNorm(h + r); return h\n",
        ["        h = dropout_add_layer_norm(h, r, self.dropout, self.LayerNorm); return h\n"],
    ),
    # the dropout after another statement on its line was kept: it ran twice in training
    "dropout_joined_after_other_work": (
        "    def forward(self, h, r):\n"
        "        h = self.dense(h); h = self.dropout(h)\n"
        "        h = self.LayerNorm(h + r)\n"
        "        return h\n",
        ["        h = self.dense(h)\n"],
    ),
    # the one-line arm kept the dropout and the norm became an ``else:`` arm without the kernel
    "one_line_if_arm": (
        "    def forward(self, h, r, flag=True):\n"
        "        h = self.dense(h)\n"
        "        if flag: h = self.dropout(h)\n"
        "        h = self.LayerNorm(h + r)\n"
        "        return h\n",
        [
            "        if flag: h = dropout_add_layer_norm(h, r, self.dropout, self.LayerNorm)\n",
            "        else:\n",
            "            h = self.LayerNorm(h + r)\n",
        ],
    ),
    "one_line_with_body": (
        "    def forward(self, h, r):\n"
        "        with torch.enable_grad(): h = self.dropout(h); h = self.LayerNorm(h + r)\n"
        "        return h\n",
        ["        with torch.enable_grad(): h = dropout_add_layer_norm("],
    ),
    "joined_in_the_middle": (
        "    def forward(self, h, r):\n"
        "        s = h.sum(); h = self.dropout(h); t = r.sum()\n"
        "        h = self.LayerNorm(h + r)\n"
        "        return h, s, t\n",
        ["        s = h.sum(); t = r.sum()\n"],
    ),
}


def _rewrite(code: str):
    return rewrite_text(code, "model.py", Matcher(load_rule_set("all")))


def _run(code: str, training: bool, inputs):
    namespace: dict = {}
    exec(compile(code, "<layout>", "exec"), namespace)  # noqa: S102 - our own fixture code
    torch.manual_seed(0)
    model = namespace["Model"]().train(training)
    torch.manual_seed(1)  # the same dropout draws for the original and the patched model
    return model(*inputs)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layout_is_edited_exactly(name):
    forward, expected_lines = LAYOUTS[name]
    code = HEAD + forward
    result = _rewrite(code)
    statuses = [(r.site.rule.id, r.status, r.reason) for r in result.results]
    assert [s[:2] for s in statuses] == [("paper.5", "patched")], statuses
    for line in expected_lines:
        assert line in result.patched, result.patched
    assert "self.dropout(h)" not in result.patched.split("def forward")[1]
    assert _rewrite(result.patched).patched == result.patched  # a second apply changes nothing
    torch.manual_seed(2)
    inputs = (torch.randn(3, 8), torch.randn(3, 8))
    for training in (False, True):
        want = _run(code, training, inputs)
        have = _run(result.patched, training, inputs)
        torch.testing.assert_close(have, want)


def test_guarded_or_block_replacement_refuses_statements_sharing_its_line():
    """A replacement of whole statements (modern.1 takes the RMSNorm body) next to other code on
    the same line: skipped with the reason rather than wrapping or dropping that code."""
    code = (
        "import torch\nfrom torch import nn\n\n\nclass RMSNorm(nn.Module):\n"
        "    def __init__(self, n, eps=1e-6):\n"
        "        super().__init__()\n"
        "        self.weight = nn.Parameter(torch.ones(n))\n"
        "        self.eps = eps\n\n"
        "    def forward(self, x):\n"
        "        self.calls = 1; dtype = x.dtype\n"
        "        x = x.to(torch.float32)\n"
        "        v = x.pow(2).mean(-1, keepdim=True)\n"
        "        x = x * torch.rsqrt(v + self.eps)\n"
        "        return self.weight * x.to(dtype)\n"
    )
    result = _rewrite(code)
    assert "        self.calls = 1" in result.patched
    compile(result.patched, "model.py", "exec")


def test_post_condition_refuses_an_edit_that_keeps_a_replaced_statement():
    """The final check on every edit: an edit whose new lines still hold a deleted statement, or
    lack the kernel call, is refused (then skipped with the reason), never written."""
    text = "x = drop(x)\ny = norm(x + r)\n"
    tree = ast.parse(text)
    source = SourceText(text)
    deleted, final = tree.body
    plan = Plan(site=None, function=None)  # type: ignore[arg-type]
    plan.delete_statements.append(deleted)
    plan.replace_expressions.append((final.value, "kernel(x, r, drop, norm)"))
    plan.kernel_calls.append("kernel")
    assert check_edit(source, 1, 2, ["y = kernel(x, r, drop, norm)\n"], [plan]) is None
    kept = check_edit(source, 1, 2, ["x = drop(x); y = kernel(x, r, drop, norm)\n"], [plan])
    assert kept is not None and "keeps a computation" in kept.reason
    missing = check_edit(source, 1, 2, ["pass\n"], [plan])
    assert missing is not None and "does not call kernel" in missing.reason
