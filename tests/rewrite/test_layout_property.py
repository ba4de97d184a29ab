"""Property: a rule site written in any statement layout - joined statements, one-line
``def``/``with``/``if``/``for`` bodies, nested blocks, comments and continuation lines between
the statements - is either patched exactly or skipped with a reason, never mis-edited. For each
generated layout: the patched text compiles, computes what the original does in training and in
evaluation on the same random draws, a second apply changes nothing, and the lines before the
edited function are byte-identical."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
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
        self.gate_proj = nn.Linear(8, 16, bias=False)
        self.up_proj = nn.Linear(8, 16, bias=False)
        self.down_proj = nn.Linear(16, 8, bias=False)
        self.act_fn = nn.SiLU()
        self.weight = nn.Parameter(torch.rand(8) + 0.5)
        self.eps = 1e-6

"""

# One representative site per rule kind: (statements, the value returned). Statements are
# simple statements, so that every layout below can hold them.
SITES = {
    "paper.4": (["h = self.dense(h)", "p = F.softmax(h, dim=-1)"], "p"),
    "paper.5": (
        ["h = self.dense(h)", "h = self.dropout(h)", "h = self.LayerNorm(h + r)"],
        "h",
    ),
    "modern.1": (
        [
            "dtype = h.dtype",
            "h = h.to(torch.float32)",
            "v = h.pow(2).mean(-1, keepdim=True)",
            "h = h * torch.rsqrt(v + self.eps)",
            "h = self.weight * h.to(dtype)",
        ],
        "h",
    ),
    "modern.2": (["h = self.down_proj(self.act_fn(self.gate_proj(h)) * self.up_proj(h))"], "h"),
}

SEPARATORS = ["\n", "; ", "\n# a comment between\n", "\n\n"]


def _layout(statements: list[str], result: str, draw) -> str:
    """The forward method, its statements in a drawn layout."""
    wrapper = draw(st.sampled_from(["plain", "def", "with", "if", "for", "nested", "backslash"]))
    if wrapper == "def":  # one-line def: every statement and the return on the def line
        return "    def forward(self, h, r): " + "; ".join([*statements, f"return {result}"]) + "\n"
    body = ""
    for index, statement in enumerate(statements):
        if wrapper == "backslash" and "(" in statement:
            statement = statement.replace("(", "(\\\n            ", 1)
        body += statement
        if index + 1 < len(statements):
            separator = draw(st.sampled_from(SEPARATORS))
            body += separator if "\n" not in separator else separator.replace("\n", "\n@")
    lines = body.split("\n@")
    if wrapper in ("with", "if", "for") and draw(st.booleans()):
        head = {
            "with": "with torch.enable_grad(): ",
            "if": "if r is not None: ",
            "for": "for _ in range(1): ",
        }[wrapper]
        simple = [part for line in lines for part in line.split("\n") if part and part[0] != "#"]
        text = head + "; ".join(simple) + "\n"
        return "    def forward(self, h, r):\n        " + text + f"        return {result}\n"
    indent = "        "
    head_line = ""
    if wrapper in ("with", "if", "for", "nested"):
        head_line = {
            "with": "        with torch.enable_grad():\n",
            "if": "        if r is not None:\n",
            "for": "        for _ in range(1):\n",
            "nested": "        if r is not None:\n            with torch.enable_grad():\n",
        }[wrapper]
        indent += "    " * (2 if wrapper == "nested" else 1)
    text = "".join(
        indent + line.lstrip("#").strip() + "\n" if line.startswith("#") else indent + line + "\n"
        for line in lines
        if line != ""
    )
    text = text.replace(indent + "a comment between\n", indent + "# a comment between\n")
    return (
        "    def forward(self, h, r):\n"
        + head_line
        + text
        + ("        else:\n            pass\n" if wrapper == "if" else "")
        + f"        return {result}\n"
    )


def _run(code: str, training: bool, inputs):
    namespace: dict = {}
    exec(compile(code, "<layout>", "exec"), namespace)  # noqa: S102 - our own generated code
    torch.manual_seed(0)
    model = namespace["Model"]().train(training)
    torch.manual_seed(1)  # the same dropout draws for both
    return model(*inputs)


MATCHER = Matcher(load_rule_set("all"))


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(rule=st.sampled_from(sorted(SITES)), data=st.data())
def test_every_layout_is_patched_exactly_or_skipped(rule, data):
    statements, result = SITES[rule]
    code = HEAD + _layout(statements, result, data.draw)
    compile(code, "model.py", "exec")
    rewritten = rewrite_text(code, "model.py", MATCHER)
    patched = rewritten.patched
    compile(patched, "model.py", "exec")
    unimported = "".join(
        line
        for line in patched.splitlines(keepends=True)
        if not line.startswith("from adopter.kernels import")
    )
    assert unimported.startswith(HEAD)  # the lines outside the edited function are untouched
    for site in rewritten.results:
        if site.status == "skipped":
            assert site.reason
    assert rewrite_text(patched, "model.py", MATCHER).patched == patched
    torch.manual_seed(2)
    inputs = (torch.randn(3, 8), torch.randn(3, 8))
    for training in (False, True):
        want = _run(code, training, inputs)
        have = _run(patched, training, inputs)
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)
