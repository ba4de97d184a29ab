"""One ``apply`` reaches the fixpoint: sites nested in each other are all patched in the same run
(or skipped for a reason that still holds), and a kernel import already present is reused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from adopter.corpus import FetchError, fetch_wheel
from adopter.match import Matcher
from adopter.match.scan import scan_source
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set

NESTED = """\
import torch
from torch import nn


def conv_bn(in_chs, out_chs, k=3):
    return nn.Sequential(
        nn.Conv2d(in_chs, out_chs, k, padding=k // 2, bias=False),
        nn.BatchNorm2d(out_chs),
        nn.ReLU(inplace=True),
    )


class Block(nn.Module):
    def __init__(self, chs):
        super().__init__()
        self.conv1 = conv_bn(chs, chs)
        self.conv2 = conv_bn(chs, chs, 1)
        self.conv3 = conv_bn(chs, chs)

    def forward(self, x):
        d1 = self.conv1(x)
        d2 = self.conv3(self.conv2(d1))
        return torch.cat([d1, d2], 1)
"""


def _rewrite(text: str, rule_set: str = "paper"):
    return rewrite_text(text, "model.py", Matcher(load_rule_set(rule_set)))


def _kernel_imports(text: str) -> list[tuple[str, str | None]]:
    return [
        (alias.name, alias.asname)
        for node in ast.parse(text).body
        if isinstance(node, ast.ImportFrom) and node.module == "adopter.kernels"
        for alias in node.names
    ]


def test_nested_sites_are_patched_in_one_run():
    result = _rewrite(NESTED)
    # conv1 and conv2 are one site (the factory's Conv2d) reached through two calls; conv3, nested
    # around conv2, is patched by the same run instead of being skipped as an overlap.
    assert [r.status for r in result.results] == ["patched", "patched"]
    assert "d1 = self.conv1[2](conv_batch_norm(x, self.conv1[0], self.conv1[1]))" in result.patched
    assert (
        "d2 = self.conv3[2](conv_batch_norm(self.conv2[2](conv_batch_norm(d1, self.conv2[0], "
        "self.conv2[1])), self.conv3[0], self.conv3[1]))"
    ) in result.patched
    assert _kernel_imports(result.patched) == [("conv_batch_norm", None)]
    again = _rewrite(result.patched)
    assert not again.changed and again.results == []


def test_nested_site_results_name_lines_of_the_original():
    result = _rewrite(NESTED)
    lines = NESTED.splitlines()
    for item in result.results:
        assert "self.conv" in lines[item.line - 1]
    assert sorted(r.line for r in result.results) == [21, 22]


def test_an_import_already_present_is_reused():
    half_done = NESTED.replace(
        "from torch import nn\n",
        "from torch import nn\nfrom adopter.kernels import conv_batch_norm\n",
    )
    result = _rewrite(half_done)
    assert [r.status for r in result.results] == ["patched", "patched"]
    assert _kernel_imports(result.patched) == [("conv_batch_norm", None)]
    assert "adopter_conv_batch_norm" not in result.patched


def test_an_aliased_kernel_import_is_reused_under_its_alias():
    half_done = NESTED.replace(
        "from torch import nn\n",
        "from torch import nn\nfrom adopter.kernels import conv_batch_norm as cbn\n",
    )
    result = _rewrite(half_done)
    assert _kernel_imports(result.patched) == [("conv_batch_norm", "cbn")]
    assert "cbn(d1, self.conv2[0], self.conv2[1])" in result.patched


@pytest.fixture(scope="module")
def timm_selecsls() -> Path:
    try:
        root = fetch_wheel("timm==1.0.31")
    except (FetchError, OSError) as error:  # offline, or no pip index reachable
        pytest.skip(f"timm 1.0.31 not available: {error}")
    return root / "timm" / "models" / "selecsls.py"


def test_timm_selecsls_reaches_the_fixpoint_in_one_apply(timm_selecsls):
    text = timm_selecsls.read_text(encoding="utf-8")
    result = rewrite_text(text, str(timm_selecsls), Matcher(load_rule_set("paper")))
    assert [r.status for r in result.results if r.status != "patched"] == []
    # Every conv_bn call: conv1..conv6 (conv3 and conv5 around conv2 and conv4), both conv6
    # calls and the stem, in forward_features and in forward_intermediates.
    assert result.patched.count("conv_batch_norm(") == 9
    # With every rule, each conv_bn (conv, batch norm, ReLU) is modern.6's, in the same single
    # apply, and each paper.7 site inside one is covered by it.
    result = rewrite_text(text, str(timm_selecsls), Matcher(load_rule_set("all")))
    assert {r.status for r in result.results if r.site.rule.id == "paper.7"} == {"covered"}
    assert result.patched.count("conv_bn_act(") == 9
    assert "conv_bn_act(conv_bn_act(d1, self.conv2[0], self.conv2[1], self.conv2[2]), " in (
        result.patched
    )
    assert _kernel_imports(result.patched) == [("conv_bn_act", None)]
    again = rewrite_text(result.patched, str(timm_selecsls), Matcher(load_rule_set("all")))
    assert not again.changed
    compile(result.patched, str(timm_selecsls), "exec")


# RT-DETR's encoder layer: the norm after the residual add on one setting, another norm in a
# later `if` on the other. The first round fuses the first; the add it leaves in the other arm
# then meets the later norm, a site the original did not have (scan never reported it). The
# second layer's site (FastSpeech 2's: the add in both arms of an `if`, the norm after it) is
# skipped, so apply runs a second round, which finds that one.
TWO_NORMS = """\
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self, normalize_before):
        super().__init__()
        self.normalize_before = normalize_before
        self.attn = nn.Linear(8, 8)
        self.dropout = 0.1
        self.attn_norm = nn.LayerNorm(8)
        self.final_norm = nn.LayerNorm(8)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.attn(hidden_states)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = residual + hidden_states
        if not self.normalize_before:
            hidden_states = self.attn_norm(hidden_states)

        if self.normalize_before:
            hidden_states = self.final_norm(hidden_states)
        return hidden_states


class ConcatLayer(nn.Module):
    def __init__(self, concat_after, normalize_before):
        super().__init__()
        self.concat_after = concat_after
        self.normalize_before = normalize_before
        self.concat_linear = nn.Linear(16, 8)
        self.dropout = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(8)

    def forward(self, hidden_states, attention_output):
        residual = hidden_states
        if self.concat_after:
            hidden_states = self.concat_linear(torch.cat((hidden_states, attention_output), dim=-1))
            hidden_states = residual + hidden_states
        else:
            hidden_states = self.dropout(attention_output)
            hidden_states = residual + hidden_states
        if not self.normalize_before:
            hidden_states = self.norm(hidden_states)
        return hidden_states
"""


def test_a_later_rounds_skip_of_a_site_the_original_lacked_is_not_reported():
    matcher = Matcher([rule for rule in load_rule_set("paper") if rule.id == "paper.5"])
    sites = [s for s in scan_source(TWO_NORMS, "layer.py", matcher) if s.applicable]
    rewrite = rewrite_text(TWO_NORMS, "layer.py", matcher)
    results = [(r.site.line, r.status.value) for r in rewrite.results]
    assert (17, "patched") in results
    assert any(status == "skipped" for _, status in results)  # so a second round runs
    # every result is a site scan reported
    assert {line for line, _ in results} <= {s.line for s in sites}
    assert not rewrite_text(rewrite.patched, "layer.py", matcher).changed
