"""Paper Fig. 4 for a kernel with several results: the query projected before an
``if``/``elif``/``else`` chain whose arms project the keys and values. The query statement is
copied into every arm, the fused call opens each arm that holds a whole match, and the patched
module computes what the original did on every path, with the same parameter names."""

from __future__ import annotations

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set

torch = pytest.importorskip("torch")

HEAD = "import torch\nfrom torch import nn\n\n\n"

ELIF_CHAIN = (
    HEAD
    + """\
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(8, 8)
        self.k_proj = nn.Linear(8, 8)
        self.v_proj = nn.Linear(8, 8)
        self.scaling = 0.5

    def _shape(self, tensor, bsz):
        return tensor.view(bsz, -1, 2, 4).transpose(1, 2)

    def forward(self, hidden_states, key_value_states=None, past_key_value=None):
        is_cross_attention = key_value_states is not None
        bsz = hidden_states.shape[0]
        query_states = self.q_proj(hidden_states) * self.scaling  # the query
        if is_cross_attention and past_key_value is not None:
            key_states, value_states = past_key_value
        elif is_cross_attention:
            key_states = self._shape(self.k_proj(key_value_states), bsz)
            value_states = self._shape(self.v_proj(key_value_states), bsz)
        elif past_key_value is not None:
            key_states = self._shape(self.k_proj(hidden_states), bsz)
            value_states = self._shape(self.v_proj(hidden_states), bsz)
            key_states = torch.cat([past_key_value[0], key_states], dim=2)
            value_states = torch.cat([past_key_value[1], value_states], dim=2)
        else:
            key_states = self._shape(self.k_proj(hidden_states), bsz)
            value_states = self._shape(self.v_proj(hidden_states), bsz)
        return self._shape(query_states, bsz), key_states, value_states
"""
)

PLAIN_NO_ELSE = (
    HEAD
    + """\
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(8, 8)
        self.k_proj = nn.Linear(8, 8)
        self.v_proj = nn.Linear(8, 8)

    def forward(self, x, cache=None, refresh=False):
        query = self.q_proj(x)
        if cache is not None and not refresh:
            return query.view(2, 3, 2, 4), cache[0], cache[1]
        elif refresh:
            key = self.k_proj(x)
            value = self.v_proj(x)
        return query.view(2, 3, 2, 4), key.view(2, 3, 2, 4), value.view(2, 3, 2, 4)
"""
)


def _rewrite(text: str):
    rules = [rule for rule in load_rule_set("all") if rule.id == "paper.9"]
    matcher = Matcher(rules)
    rewrite = rewrite_text(text, "attention.py", matcher)
    return rewrite, matcher


def _module(text: str) -> nn.Module:  # noqa: F821 - torch's nn, imported by the text
    namespace: dict[str, object] = {}
    exec(compile(text, "attention.py", "exec"), namespace)  # noqa: S102 - our own fixture
    torch.manual_seed(0)
    return namespace["Attention"]()  # type: ignore[operator]


def _same_on(original_text: str, patched_text: str, calls: list[dict]) -> None:
    original, patched = _module(original_text), _module(patched_text)
    assert list(original.state_dict()) == list(patched.state_dict())  # checkpoint keys kept
    patched.load_state_dict(original.state_dict(), strict=True)
    for kwargs in calls:
        expected, got = original(**kwargs), patched(**kwargs)
        for want, have in zip(expected, got, strict=True):
            torch.testing.assert_close(have, want)


def test_an_elif_chain_gets_the_query_in_every_arm_and_the_fused_call_where_it_fits():
    rewrite, matcher = _rewrite(ELIF_CHAIN)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert patched.count("qkv_projection(hidden_states, ") == 2  # the two self-attention arms
    # the two other arms keep the query, copied with its comment
    assert (
        patched.count("query_states = self.q_proj(hidden_states) * self.scaling  # the query") == 2
    )
    assert patched.count("query_states = query * self.scaling  # the query") == 2
    assert not rewrite_text(patched, "attention.py", matcher).changed  # second apply: nothing
    h, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    past = (torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4))
    _same_on(
        ELIF_CHAIN,
        patched,
        [
            {"hidden_states": h},
            {"hidden_states": h, "past_key_value": past},
            {"hidden_states": h, "key_value_states": kv},
            {"hidden_states": h, "key_value_states": kv, "past_key_value": past},
        ],
    )


def test_an_arm_that_returns_early_keeps_the_copy_and_a_missing_else_is_added():
    rewrite, matcher = _rewrite(PLAIN_NO_ELSE)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert "query, key, value = qkv_projection(x, self.q_proj, self.k_proj, self.v_proj)" in patched
    assert "        else:\n            query = self.q_proj(x)\n" in patched
    assert not rewrite_text(patched, "attention.py", matcher).changed
    x = torch.randn(2, 3, 8)
    cache = (torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 4))
    _same_on(PLAIN_NO_ELSE, patched, [{"x": x, "refresh": True}, {"x": x, "cache": cache}])


@pytest.mark.parametrize(
    ("arm", "reason"),
    [
        ("x.mul_(2)", "changes an input of the fused call"),
        ("x[0] = 0.0", "changes an input of the fused call"),
    ],
)
def test_an_arm_that_changes_the_input_before_the_projections_is_refused(arm, reason):
    text = PLAIN_NO_ELSE.replace(
        "        elif refresh:\n", f"        elif refresh:\n            {arm}\n"
    )
    rewrite, _ = _rewrite(text)
    (result,) = rewrite.results
    assert result.status.value == "skipped"
    assert reason in result.reason
    assert not rewrite.changed


# The mirror image (BLIP-2's Q-Former attention, UMT5's): the keys and values projected in the
# arms, the query after the chain. Its copies close the arms instead of opening them.
QUERY_AFTER = (
    HEAD
    + """\
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query = nn.Linear(8, 8)
        self.key = nn.Linear(8, 8)
        self.value = nn.Linear(8, 8)

    def split(self, x):
        return x.view(x.shape[0], -1, 2, 4).transpose(1, 2)

    def forward(self, hidden_states, encoder_hidden_states=None, past_key_value=None):
        is_cross_attention = encoder_hidden_states is not None
        if is_cross_attention:
            key_layer = self.split(self.key(encoder_hidden_states))
            value_layer = self.split(self.value(encoder_hidden_states))
        elif past_key_value is not None:
            key_layer = self.split(self.key(hidden_states))
            value_layer = self.split(self.value(hidden_states))
            key_layer = torch.cat([past_key_value[0], key_layer], dim=2)
            value_layer = torch.cat([past_key_value[1], value_layer], dim=2)
        else:
            key_layer = self.split(self.key(hidden_states))
            value_layer = self.split(self.value(hidden_states))

        mixed_query_layer = self.query(hidden_states)  # the query
        return self.split(mixed_query_layer), key_layer, value_layer
"""
)

QUERY_AFTER_NO_ELSE = (
    HEAD
    + """\
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(8, 8)
        self.k_proj = nn.Linear(8, 8)
        self.v_proj = nn.Linear(8, 8)

    def forward(self, x, cache=None, refresh=False):
        key = value = None
        if cache is not None and not refresh:
            return cache[0], cache[1], cache[2]
        elif refresh:
            key = self.k_proj(x).view(2, 3, 2, 4)
            value = self.v_proj(x).view(2, 3, 2, 4)
        query = self.q_proj(x).view(2, 3, 2, 4)
        return query, key, value
"""
)


def test_a_query_after_the_chain_is_copied_to_the_end_of_every_arm():
    rewrite, matcher = _rewrite(QUERY_AFTER)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    fused = "key, value, query = qkv_projection(hidden_states, self.key, self.value, self.query)"
    assert patched.count(fused) == 2  # both self-attention arms, each named after its module
    assert patched.count("mixed_query_layer = query  # the query") == 2
    # the cross-attention arm ends with the plain copy; nothing is left after the chain
    assert patched.count("mixed_query_layer = self.query(hidden_states)  # the query") == 1
    assert "value_layer = self.split(self.value(encoder_hidden_states))\n" in patched
    assert not rewrite_text(patched, "attention.py", matcher).changed  # second apply: nothing
    h, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    past = (torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4))
    _same_on(
        QUERY_AFTER,
        patched,
        [
            {"hidden_states": h},
            {"hidden_states": h, "past_key_value": past},
            {"hidden_states": h, "encoder_hidden_states": kv},
        ],
    )


def test_a_query_after_the_chain_skips_an_arm_that_returns_and_fills_a_new_else():
    rewrite, matcher = _rewrite(QUERY_AFTER_NO_ELSE)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert "k_proj, v_proj, q_proj = qkv_projection(x, self.k_proj, self.v_proj, self.q_proj)" in (
        patched
    )
    # the arm that returns never ran the query: no copy after its return
    assert "return cache[0], cache[1], cache[2]\n        elif refresh:" in patched
    assert "        else:\n            query = self.q_proj(x).view(2, 3, 2, 4)\n" in patched
    assert not rewrite_text(patched, "attention.py", matcher).changed
    x = torch.randn(2, 3, 8)
    cache = (torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 4))
    original, new = _module(QUERY_AFTER_NO_ELSE), _module(patched)
    new.load_state_dict(original.state_dict(), strict=True)
    for kwargs in [{"x": x, "refresh": True}, {"x": x, "cache": cache}]:
        for want, have in zip(original(**kwargs), new(**kwargs), strict=True):
            torch.testing.assert_close(have, want)
    want, key, value = original(x=x)
    have, *rest = new(x=x)
    torch.testing.assert_close(have, want)
    assert key is None and value is None and rest == [None, None]


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        # the query read the input after the arm, the fused call reads it at the arm's start
        (
            ("            value = self.v_proj(x).view(2, 3, 2, 4)\n", "x.mul_(2)"),
            "changes an input",
        ),
        # a call between the chain and the query could see the query's projection run early
        (("        query = self.q_proj(x)", "t = torch.zeros(1)"), "depends on the statement"),
    ],
)
def test_a_query_after_the_chain_is_refused_where_moving_it_could_change_what_runs(edit, reason):
    after, statement = edit
    indent = after[: len(after) - len(after.lstrip())]
    if after.endswith("\n"):
        text = QUERY_AFTER_NO_ELSE.replace(after, f"{after}{indent}{statement}\n")
    else:
        text = QUERY_AFTER_NO_ELSE.replace(after, f"{indent}{statement}\n{after}")
    assert text != QUERY_AFTER_NO_ELSE
    rewrite, _ = _rewrite(text)
    (result,) = rewrite.results
    assert result.status.value == "skipped"
    assert reason in result.reason
    assert not rewrite.changed


# Gemma's and Megatron-BERT's shape: the query's later statements (its norm, its head split)
# use what the projection set, so they move into the arms with it.
QUERY_WITH_FOLLOWERS = (
    HEAD
    + """\
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query = nn.Linear(8, 8)
        self.key = nn.Linear(8, 8)
        self.value = nn.Linear(8, 8)
        self.q_norm = nn.LayerNorm(4)

    def forward(self, hidden_states, shared_kv=None):
        hidden_shape = (*hidden_states.shape[:-1], -1, 4)
        query_layer = self.query(hidden_states)
        query_layer = self.q_norm(query_layer.view(hidden_shape))
        scale = 0.5
        query_layer = query_layer.transpose(1, 2) * scale
        if shared_kv is not None:
            key_layer, value_layer = shared_kv
        else:
            key_layer = self.key(hidden_states)
            key_layer = key_layer.view(hidden_shape).transpose(1, 2)
            value_layer = self.value(hidden_states)
            value_layer = value_layer.view(hidden_shape).transpose(1, 2)
        return query_layer, key_layer, value_layer
"""
)


def test_statements_that_use_the_query_move_into_the_arms_with_it():
    rewrite, matcher = _rewrite(QUERY_WITH_FOLLOWERS)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    # the two statements that read the query are copied into both arms, the one that does not
    # (``scale = 0.5``) stays where it was
    assert patched.count("query_layer = self.q_norm(query_layer.view(hidden_shape))") == 2
    assert patched.count("query_layer = query_layer.transpose(1, 2) * scale") == 2
    assert patched.count("scale = 0.5") == 1
    # the key's own head split sits between the projections: the results get names of their own
    assert (
        "query, key, value = qkv_projection(hidden_states, self.query, self.key, self.value)"
        in (patched)
    )
    assert "key_layer = key\n" in patched
    assert not rewrite_text(patched, "attention.py", matcher).changed
    h = torch.randn(2, 3, 8)
    shared = (torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4))
    _same_on(
        QUERY_WITH_FOLLOWERS,
        patched,
        [{"hidden_states": h}, {"hidden_states": h, "shared_kv": shared}],
    )


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        # a follower that is not a simple line does not move
        (
            "        scale = 0.5\n",
            "        scale = 0.5\n        if scale:\n            query_layer = query_layer * 1.0\n",
            "is not a simple line",
        ),
    ],
)
def test_followers_and_projections_that_cannot_move_are_refused(old, new, reason):
    text = QUERY_WITH_FOLLOWERS.replace(old, new)
    assert text != QUERY_WITH_FOLLOWERS
    rewrite, _ = _rewrite(text)
    (result,) = rewrite.results
    assert result.status.value == "skipped"
    assert reason in result.reason
    assert not rewrite.changed


# SegFormer's and PVT's efficient self-attention: the query first, an `if` that reduces the
# sequence the keys and values read, then the keys and values. The arm that keeps the input
# (here the `else:` added for it) fuses the three.
SEQUENCE_REDUCTION = (
    HEAD
    + """\
class Attention(nn.Module):
    def __init__(self, ratio):
        super().__init__()
        self.ratio = ratio
        self.q_proj = nn.Linear(8, 8)
        self.k_proj = nn.Linear(8, 8)
        self.v_proj = nn.Linear(8, 8)
        self.reduction = nn.Linear(8, 8)

    def forward(self, hidden_states):
        hidden_shape = (*hidden_states.shape[:-1], -1, 4)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        kv_hidden_states = hidden_states
        if self.ratio > 1:
            kv_hidden_states = self.reduction(hidden_states)[:, ::2]

        kv_shape = (*kv_hidden_states.shape[:-1], -1, 4)
        key_states = self.k_proj(kv_hidden_states).view(kv_shape).transpose(1, 2)
        value_states = self.v_proj(kv_hidden_states).view(kv_shape).transpose(1, 2)
        return query_states, key_states, value_states
"""
)


def _reduction_model(text: str, ratio: int):
    namespace: dict[str, object] = {}
    exec(compile(text, "attention.py", "exec"), namespace)  # noqa: S102 - our own fixture
    torch.manual_seed(0)
    return namespace["Attention"](ratio)  # type: ignore[operator]


def test_projections_around_a_sequence_reduction_are_fused_in_the_arm_that_keeps_the_input():
    rewrite, matcher = _rewrite(SEQUENCE_REDUCTION)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    # the reducing arm keeps the three projections, in their order around its work
    assert (
        "            query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n"
        "            kv_hidden_states = self.reduction(hidden_states)[:, ::2]\n"
        "            kv_shape = (*kv_hidden_states.shape[:-1], -1, 4)\n"
    ) in patched
    assert "        else:\n            query, key, value = (\n" in patched
    assert "kv_hidden_states = hidden_states\n" in patched  # stays before the branch
    assert not rewrite_text(patched, "attention.py", matcher).changed
    h = torch.randn(2, 6, 8)
    for ratio in (1, 2):
        original = _reduction_model(SEQUENCE_REDUCTION, ratio)
        new = _reduction_model(patched, ratio)
        new.load_state_dict(original.state_dict(), strict=True)
        for want, have in zip(original(h), new(h), strict=True):
            torch.testing.assert_close(have, want)


def test_projections_around_a_branch_whose_every_arm_changes_the_input_are_refused():
    # changed in place on both paths (no rebinding, so the match still holds)
    text = SEQUENCE_REDUCTION.replace(
        "            kv_hidden_states = self.reduction(hidden_states)[:, ::2]\n",
        "            kv_hidden_states.mul_(2)\n        else:\n            kv_hidden_states.add_(1)\n",
    )
    rewrite, _ = _rewrite(text)
    (result,) = rewrite.results
    assert result.status.value == "skipped"
    assert "every arm of the branch between the projections changes their input" in result.reason
    assert not rewrite.changed


# Gemma 4's shared K=V layers: no value projection, the keys stand in for the values
OPTIONAL_VALUE = (
    HEAD
    + """\
class Attention(nn.Module):
    def __init__(self, with_values):
        super().__init__()
        self.q_proj = nn.Linear(8, 8)
        self.k_proj = nn.Linear(8, 8)
        self.v_proj = nn.Linear(8, 8) if with_values else None

    def forward(self, hidden_states):
        query_states = self.q_proj(hidden_states).view(2, 3, 2, 4)
        key_states = self.k_proj(hidden_states).view(2, 3, 2, 4)
        value_states = self.v_proj(hidden_states).view(2, 3, 2, 4) if self.v_proj is not None else key_states
        return query_states, key_states, value_states
"""
)


def test_a_projection_in_an_arm_of_a_conditional_expression_is_fused_where_that_arm_runs():
    rewrite, matcher = _rewrite(OPTIONAL_VALUE)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert (
        "            qkv_projection(hidden_states, self.q_proj, self.k_proj, self.v_proj)\n"
        "            if self.v_proj is not None\n"
        "            else (self.q_proj(hidden_states), self.k_proj(hidden_states), None)\n"
    ) in patched
    assert "value.view(2, 3, 2, 4) if self.v_proj is not None else key_states" in patched
    assert not rewrite_text(patched, "attention.py", matcher).changed
    h = torch.randn(2, 3, 8)
    for with_values in (True, False):
        original, new = (
            _reduction_model(OPTIONAL_VALUE, with_values),
            _reduction_model(patched, with_values),
        )
        new.load_state_dict(original.state_dict(), strict=True)
        for want, have in zip(original(h), new(h), strict=True):
            torch.testing.assert_close(have, want)


# diffusers' AttnProcessor: the query first, then `encoder_hidden_states = hidden_states` when
# no encoder states are given (self-attention) or their norm, then the keys and values. The
# self-attention arm makes the two spellings one tensor, so it fuses at its end with no
# identity test; the arm that passes the given states through fuses behind one.
ENCODER_STATES_DEFAULTED = (
    HEAD
    + """\
class Attention(nn.Module):
    def __init__(self, norm_cross):
        super().__init__()
        self.to_q = nn.Linear(8, 8)
        self.to_k = nn.Linear(8, 8)
        self.to_v = nn.Linear(8, 8)
        self.norm_cross = nn.LayerNorm(8) if norm_cross else None

    def forward(self, hidden_states, encoder_hidden_states=None):
        query = self.to_q(hidden_states)

        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif self.norm_cross is not None:
            encoder_hidden_states = self.norm_cross(encoder_hidden_states)

        key = self.to_k(encoder_hidden_states)
        value = self.to_v(encoder_hidden_states)
        query = query.view(2, 3, 2, 4).transpose(1, 2)
        key = key.view(2, -1, 2, 4).transpose(1, 2)
        value = value.view(2, -1, 2, 4).transpose(1, 2)
        return query, key, value
"""
)


def test_an_arm_that_copies_one_spelling_into_the_other_fuses_at_its_end_without_a_test():
    rewrite, matcher = _rewrite(ENCODER_STATES_DEFAULTED)
    assert [r.status.value for r in rewrite.results] == ["patched"]
    patched = rewrite.patched
    assert (
        "        if encoder_hidden_states is None:\n"
        "            encoder_hidden_states = hidden_states\n"
        "            fused_query, fused_key, fused_value = qkv_projection("
        "hidden_states, self.to_q, self.to_k, self.to_v)\n"
        "            query = fused_query\n"
    ) in patched
    # the norm's arm keeps the three projections; the pass-through arm tests the identity
    assert "            encoder_hidden_states = self.norm_cross(encoder_hidden_states)\n" in patched
    assert patched.count("if encoder_hidden_states is hidden_states") == 1
    assert not rewrite_text(patched, "attention.py", matcher).changed
    h, e = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    for norm_cross in (True, False):
        original = _reduction_model(ENCODER_STATES_DEFAULTED, norm_cross)
        new = _reduction_model(patched, norm_cross)
        new.load_state_dict(original.state_dict(), strict=True)
        for kwargs in ({}, {"encoder_hidden_states": e}, {"encoder_hidden_states": h}):
            for want, have in zip(original(h, **kwargs), new(h, **kwargs), strict=True):
                torch.testing.assert_close(have, want)


@pytest.mark.parametrize(
    "after_copy",
    [
        "            hidden_states = hidden_states * 2\n",  # the first spelling changes after
        "            self.norm_cross(hidden_states)\n",  # a call the query would move past
    ],
)
def test_an_arm_whose_copy_does_not_last_or_that_calls_something_keeps_the_plain_copies(after_copy):
    text = ENCODER_STATES_DEFAULTED.replace(
        "            encoder_hidden_states = hidden_states\n",
        "            encoder_hidden_states = hidden_states\n" + after_copy,
    )
    rewrite, _ = _rewrite(text)
    patched = rewrite.patched
    assert "            fused_query, fused_key, fused_value = qkv_projection(" not in patched
    assert (
        "            query = self.to_q(hidden_states)\n"
        "            encoder_hidden_states = hidden_states\n"
    ) in patched
