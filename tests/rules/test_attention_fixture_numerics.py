"""The attention-function rules' fixture cases run: each case ``apply`` patches computes what
the original case computes, in eval and in train mode (dropout on a CPU: the kernels run the
original and its random draws, so train mode is compared bit for bit)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adopter.dsl import load_rule_file
from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import RULES_DIR
from tests.kernels.conftest import assert_close
from tests.rules.fixture_cases import FIXTURES, read_fixture

RULE_FILES = ("modern_4_attention_function", "modern_8_scaled_attention")


def _patched_cases(stem: str) -> list[tuple[str, str, str]]:
    matcher = Matcher(load_rule_file(RULES_DIR / f"{stem}.adopt"))
    found = []
    for case in read_fixture(FIXTURES / f"{stem}.py"):
        result = rewrite_text(case.source, f"{stem}.py", matcher)
        if any(r.status == "patched" for r in result.results):
            found.append((case.title, case.source, result.patched))
    return found


CASES = [(stem, *case) for stem in RULE_FILES for case in _patched_cases(stem)]


def _namespace(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "<fixture>", "exec"), namespace)  # our own fixture code
    return namespace


class _Heads(nn.Module):
    num_key_value_groups = 2


def _eager_function_outputs(namespace: dict, train: bool, grouped: bool) -> list[torch.Tensor]:
    function = namespace["eager_attention_forward"]
    module = _Heads().train(train)
    generator = torch.Generator().manual_seed(0)
    heads = 4
    # the Llama spelling repeats grouped keys and values; the others take one per query head
    kv_heads = heads // 2 if grouped else heads
    q = torch.randn(2, heads, 5, 8, generator=generator)
    k = torch.randn(2, kv_heads, 5, 8, generator=generator)
    v = torch.randn(2, kv_heads, 5, 8, generator=generator)
    mask = torch.zeros(2, 1, 5, 5).masked_fill(torch.ones(5, 5).triu(1).bool(), -1e9)
    outputs = []
    for attention_mask in (None, mask):
        kwargs = {}
        if "position_bias" in function.__code__.co_varnames:
            kwargs["position_bias"] = torch.randn(1, heads, 5, 5, generator=generator)
        torch.manual_seed(1)
        outputs.append(function(module, q, k, v, attention_mask, 0.3, 0.25, **kwargs)[0])
    return outputs


# modern.8's other module spellings: constructor arguments (width 8, 2 heads, dropout 0.25
# where there is one, 6 tokens for a learned bias) and whether forward takes a mask
_OTHER_MODULES = {
    "ScoresScaled": ((8, 2, 0.25), False),
    "DividedScores": ((8, 2, 0.25), True),
    "NoDropout": ((8, 2), False),
    "NoDropoutBias": ((8, 2, 6), False),
    "KeptAround": ((8, 2, 0.25), False),
}


def _module_outputs(namespace: dict, train: bool, grouped: bool) -> list[torch.Tensor]:
    outputs = []
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(0))
    mask = torch.randn(2, 1, 6, 6, generator=torch.Generator().manual_seed(1))
    for name in ("Processor", "SlicedProcessor"):
        if name in namespace:
            torch.manual_seed(0)
            attn = namespace["Attention"](8, heads=2).train(train)
            processor = namespace[name](3) if name == "SlicedProcessor" else namespace[name]()
            additive = mask[:, 0].repeat_interleave(2, dim=0)[:, :1]  # (batch * heads, 1, keys)
            for attention_mask in (None, additive):
                outputs.append(processor(attn, x, attention_mask))
    keep = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(2)) > 0.4
    keep |= torch.eye(6, dtype=torch.bool)  # every query keeps a key
    for name in ("TimmAttention", "TimmMaskedAttention", "TimmOptionalAddAttention"):
        if name in namespace:
            torch.manual_seed(0)
            module = namespace[name](8, num_heads=2, attn_drop=0.25).train(train)
            torch.manual_seed(1)
            if name != "TimmAttention":
                outputs.append(module(x, mask))
            outputs.append(module(x))
    for name, (args, takes_mask) in _OTHER_MODULES.items():
        if name in namespace:
            torch.manual_seed(0)
            module = namespace[name](*args).train(train)
            for extra in ((), (mask,)) if takes_mask else ((),):
                torch.manual_seed(1)
                outputs.append(module(x, *extra))
    if "TimmMaskHelperAttention" in namespace:  # masks as SDPA reads them, and causal
        torch.manual_seed(0)
        module = namespace["TimmMaskHelperAttention"](8, num_heads=2, attn_drop=0.25)
        module.train(train)
        for attn_mask, is_causal in ((None, False), (mask, False), (keep, False), (keep, True)):
            torch.manual_seed(1)
            outputs.append(module(x, attn_mask, is_causal=is_causal))
    return outputs


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize(
    ("stem", "title", "original", "patched"),
    CASES,
    ids=[f"{stem.split('_')[1]}-{title[:40]}" for stem, title, _, _ in CASES],
)
def test_a_patched_case_computes_what_the_original_computes(stem, title, original, patched, train):
    assert "adopter.kernels" in patched
    run = _eager_function_outputs if stem.startswith("modern_4") else _module_outputs
    before = _namespace(original)
    function = before.get("eager_attention_forward")
    grouped = function is not None and "repeat_kv" in function.__code__.co_names
    expected = run(before, train, grouped)
    got = run(_namespace(patched), train, grouped)
    assert expected and len(got) == len(expected)
    # with dropout active on a CPU the kernels run the original and its draws: bit for bit
    dropout = train and "Processor" not in title and "processor" not in title
    dropout = dropout and (function is not None or "nn.Dropout(" in original)
    # scores divided by s are handed over as scale=1 / s: the replay multiplies by the rounded
    # reciprocal, so it matches to rounding (assert_close), not bit for bit
    dropout = dropout and "1 / " not in patched
    for ours, theirs in zip(got, expected, strict=True):
        assert_close(ours, theirs)
        assert not dropout or torch.equal(ours, theirs), title
