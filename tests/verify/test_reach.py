"""Reaching patched sites that the planned checks did not run: which classes reach a site by
name, which options decide whether its callers build it, and the order of further checks.

All static or dict-level: no transformers, no torch models.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from adopter.models.interface import CACHED_STEP
from adopter.models.sites import find_sites
from adopter.models.transformers.reach import (
    EveryLayer,
    SubConfig,
    documented_values,
    flips,
    reach_attempts,
    resolve_deferred,
)
from adopter.verify.job import ResultWriter
from adopter.verify.reach import Reach, reach, reach_time_left
from adopter.verify.results import ClassVerification, site_coverage

SOURCE = textwrap.dedent(
    """\
    from adopter.kernels import softmax, rotary

    def apply_rotary(q):
        return rotary(q)

    class FullAttention:
        def forward(self, x):
            return apply_rotary(x)

    class SparseAttention:
        def forward(self, x):
            return softmax(x, dim=-1)

    class Attention:
        def __init__(self, config):
            self.kind = config.attention_type
            if self.kind == "full":
                self.inner = FullAttention()
            elif config.attention_type == "block_sparse":
                self.inner = SparseAttention()

    class Pooler:
        def forward(self, x):
            return softmax(x, dim=0)

    class PreTrained:
        _can_record_outputs = {"attentions": SparseAttention}

        def _init_weights(self, module):
            if isinstance(module, Pooler):
                pass

    class Model(PreTrained):
        def __init__(self, config, add_pooling_layer=True):
            self.attention = Attention(config)
            self.pooler = Pooler() if add_pooling_layer else None

    class ForMasking(PreTrained):
        def __init__(self, config):
            self.model = Model(config, add_pooling_layer=False)

    class Unrelated(PreTrained):
        pass
    """
)


def _sites() -> dict[str, object]:
    return {site.function: site for site in find_sites(SOURCE)}


def test_hosts_are_the_classes_reaching_a_site_by_name_nearest_first() -> None:
    sites = _sites()
    rotary = sites["apply_rotary"]
    assert rotary.hosts == ["FullAttention", "Attention", "Model", "ForMasking"]
    # type tests and class-body attributes of the shared base run nothing: no host through them
    assert sites["Pooler.forward"].hosts == ["Pooler", "Model", "ForMasking"]
    assert "PreTrained" not in sites["SparseAttention.forward"].hosts
    assert "Unrelated" not in sites["SparseAttention.forward"].hosts


def test_caller_fields_are_the_options_guarding_where_a_site_is_built() -> None:
    sites = _sites()
    # self.kind comes from config.attention_type in __init__; both spellings compare with it
    assert sites["SparseAttention.forward"].caller_fields == {
        "attention_type": ["full", "block_sparse"],
        "kind": ["full"],
    }
    assert sites["apply_rotary"].caller_fields["attention_type"] == ["full"]
    assert sites["Pooler.forward"].caller_fields == {}  # a constructor argument, not config


def test_flips_set_the_caller_options_to_the_constants_compared_with() -> None:
    sparse = _sites()["SparseAttention.forward"]
    defaults = {"attention_type": "full", "hidden_size": 8}
    assert flips(sparse, defaults) == [{"attention_type": "block_sparse"}]


def test_reach_tries_unchecked_host_classes_before_flipping_unrelated_ones() -> None:
    pooler = _sites()["Pooler.forward"]
    available = ["Model", "ForMasking", "Unrelated"]
    # only Unrelated was checked: it cannot reach the pooler, so Model goes first, as it is
    attempts = reach_attempts(pooler, ["Unrelated"], available, False, {})
    assert attempts[0] == ("Model", {})
    assert ("Unrelated", {}) not in attempts


def test_reach_flips_the_checked_host_and_falls_back_to_checked_classes() -> None:
    sparse = _sites()["SparseAttention.forward"]
    defaults = {name: {"attention_type": "full"} for name in ("Model", "ForMasking", "Other")}
    attempts = reach_attempts(sparse, ["Model"], ["Model", "ForMasking"], False, defaults)
    assert attempts[0] == ("Model", {"attention_type": "block_sparse"})
    assert attempts[-1] == ("ForMasking", {})
    # not worked out: the checked classes stand in as hosts, then the unchecked classes
    sparse.hosts = None
    attempts = reach_attempts(sparse, ["Model"], ["Model", "Other"], False, defaults)
    assert attempts == [("Model", {"attention_type": "block_sparse"}), ("Other", {})]
    assert reach_attempts(sparse, ["Model"], ["Model", "Other"], True, {}) == []


def test_flips_skip_hosts_whose_model_could_not_be_built() -> None:
    sparse = _sites()["SparseAttention.forward"]
    defaults = {name: {"attention_type": "full"} for name in ("Model", "ForMasking")}
    available = ["Model", "ForMasking"]
    attempts = reach_attempts(sparse, ["Model"], available, False, defaults, frozenset({"Model"}))
    # the only checked host is broken: the other host first, as it is, then flipped
    assert attempts[:2] == [("ForMasking", {}), ("ForMasking", {"attention_type": "block_sparse"})]
    assert all(name != "Model" for name, _ in attempts)


def test_a_site_no_model_class_reaches_gets_no_checks_and_says_so() -> None:
    dead = find_sites("from adopter.kernels import softmax\ndef f(x):\n    return softmax(x)\n")[0]
    assert dead.hosts == []
    assert reach_attempts(dead, ["Model"], ["Model", "Other"], False, {}) == []
    (entry,) = site_coverage([dead], [])
    assert "no model class of the file builds or calls its code" in entry.reason


def test_reach_stops_when_one_more_check_would_run_past_the_time_share() -> None:
    assert reach_time_left(0.0, 10.0, None, now=1000.0)
    assert reach_time_left(0.0, 10.0, 150.0, now=90.0)  # 100 s <= 0.7 * 150
    assert not reach_time_left(0.0, 20.0, 150.0, now=90.0)


def test_per_layer_kinds_are_flipped_to_every_layer_of_the_shrunk_length() -> None:
    text = textwrap.dedent(
        """\
        from adopter.kernels import softmax

        class Sparse:
            def forward(self, x):
                return softmax(x, dim=-1)

        class Layer:
            def __init__(self, config, layer_idx):
                self.mlp = Sparse() if config.mlp_layer_types[layer_idx] == "sparse" else None
        """
    )
    (site,) = find_sites(text)
    assert site.caller_fields["mlp_layer_types[]"] == ["sparse"]
    defaults = {"mlp_layer_types": ["dense", "sparse", "sparse"]}
    (flip,) = flips(site, defaults)
    assert flip == {"mlp_layer_types": EveryLayer("sparse")}
    assert repr(flip["mlp_layer_types"]) == "every layer 'sparse'"

    class Shrunk:  # what a recipe built without the flip: two layers left
        mlp_layer_types = ["dense", "dense"]

    built = []
    resolved = resolve_deferred({**flip, "x": 1}, lambda plain: built.append(plain) or Shrunk)
    assert resolved == {"x": 1, "mlp_layer_types": ["sparse", "sparse"]} and built == [{"x": 1}]
    assert resolve_deferred({"x": 1}, lambda plain: 1 / 0) == {"x": 1}  # nothing to resolve
    assert flips(site, {"mlp_layer_types": [1, 2]}) == []  # constants of another element type


def test_guards_of_self_method_calls_and_of_locals_set_from_config_count() -> None:
    text = textwrap.dedent(
        """\
        from adopter.kernels import softmax

        def balancing_loss(logits):
            return softmax(logits, dim=-1)

        class Attention:
            def __init__(self, config):
                self.reorder = config.reorder_and_upcast_attn

            def _reordered(self, x):
                return softmax(x, dim=-1)

            def forward(self, x):
                if self.reorder:
                    return self._reordered(x)
                return x

        class ForCausalLM:
            def forward(self, x, output_router_logits=None):
                output_router_logits = (
                    output_router_logits
                    if output_router_logits is not None
                    else self.config.output_router_logits
                )
                if output_router_logits:
                    return balancing_loss(x)
                return Attention(self.config)(x)
        """
    )
    loss, reordered = find_sites(text)
    assert loss.hosts == ["ForCausalLM"]
    assert loss.caller_fields == {"output_router_logits": []}
    assert reordered.hosts == ["Attention", "ForCausalLM"]
    assert "reorder_and_upcast_attn" in reordered.caller_fields
    found = flips(loss, {"output_router_logits": False})
    assert found == [{"output_router_logits": True}]


def test_a_field_only_a_sub_configuration_has_is_flipped_there() -> None:
    text = textwrap.dedent(
        """\
        from adopter.kernels import softmax

        class Layer:
            def forward(self, x):
                if self.config.use_gated_mlp:
                    return softmax(x, dim=-1)
                return x
        """
    )
    (site,) = find_sites(text)
    defaults = {"text_config": {"use_gated_mlp": False, "hidden_size": 8}, "hidden_size": 8}
    assert flips(site, defaults) == [{"text_config": SubConfig({"use_gated_mlp": True})}]

    class Sub:
        def to_dict(self) -> dict:
            return {"use_gated_mlp": False, "hidden_size": 2, "layer_types": ["a", "a", "a"]}

    class Built:
        text_config = Sub()

    fixes = {"text_config": SubConfig({"use_gated_mlp": True, "layer_types": EveryLayer("b")})}
    resolved = resolve_deferred(fixes, lambda plain: Built)
    assert resolved == {
        "text_config": {"use_gated_mlp": True, "hidden_size": 2, "layer_types": ["b", "b", "b"]}
    }
    assert repr(fixes["text_config"]) == "{use_gated_mlp=True, layer_types=every layer 'b'}"


def test_reach_runs_the_flipped_host_until_the_site_ran_then_stops(tmp_path: Path) -> None:
    sparse = _sites()["SparseAttention.forward"]
    sparse.hosts = ["Model", "ForMasking"]  # as the worker narrows it to the model classes
    writer = ResultWriter(tmp_path / "result.json", "modeling_x.py")
    calls: list[tuple[str, dict]] = []

    def check(name: str, overrides: dict) -> dict:
        calls.append((name, overrides))
        ran = {sparse.key: 1} if overrides == {"attention_type": "block_sparse"} else {}
        verdict = ClassVerification(
            name, "verified", "agrees", modes={"eval": "verified"}, runs={"eval": ran}
        ).to_json()
        verdict["setting"] = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
        return verdict

    verdicts = [check("Model", {})]
    defaults = {"Model": {"attention_type": "full"}, "ForMasking": {"attention_type": "full"}}
    available = ["Model", "ForMasking"]

    def plan(budget: float | None = None, slowest: float = 0.0) -> Reach:
        return Reach(["Model"], available, False, defaults, reach_attempts, budget, slowest)

    reach(plan(150.0, 1.0), verdicts, [sparse], check, writer)
    assert calls == [("Model", {}), ("Model", {"attention_type": "block_sparse"})]
    # no time left for even one more check: none is started, and the result says why
    calls.clear()
    writer.started -= 200
    reach(plan(), [check("Model", {})], [sparse], check, writer)
    assert len(calls) == 2  # without a time budget, reach goes on
    calls.clear()
    reach(plan(150.0, 1.0), [], [sparse], check, writer)
    assert calls == [] and "time is short" in writer.data["notes"][-1]


def test_a_guard_on_a_field_alias_flips_the_field_it_names() -> None:
    qwen = _sites()["SparseAttention.forward"]
    defaults = {"attention_kind": "full", "_aliases": {"attention_type": "attention_kind"}}
    assert flips(qwen, defaults) == [{"attention_kind": "block_sparse"}]


def test_per_layer_kinds_the_docstring_names_are_tried_absent_ones_first() -> None:
    doc = """
    Args:
        mlp_layer_types (`list[str]`, *optional*):
            Per-layer MLP type - `"dense"` or `"sparse"`. Defaults to all sparse.
        hidden_act (`str`, *optional*, defaults to `"silu"`):
            The activation.
    """
    documented = documented_values(doc)
    assert documented == {"mlp_layer_types": ["dense", "sparse"]}  # not the default named
    text = textwrap.dedent(
        """\
        from adopter.kernels import softmax

        class Dense:
            def forward(self, x):
                return softmax(x, dim=-1)

        class Layer:
            def __init__(self, config, layer_idx):
                self.mlp = None if config.mlp_layer_types[layer_idx] == "sparse" else Dense()
        """
    )
    (site,) = find_sites(text)
    defaults = {"mlp_layer_types": ["sparse"] * 4, "_documented": documented}
    assert flips(site, defaults)[0] == {"mlp_layer_types": EveryLayer("dense")}


def test_integer_comparisons_also_try_the_neighbours_of_the_constant() -> None:
    text = textwrap.dedent(
        """\
        from adopter.kernels import softmax

        class Moe:
            def forward(self, x):
                if self.config.sparse_step > 1:
                    return softmax(x, dim=-1)
                return x

        class Layer:
            def __init__(self, config):
                self.mlp = None if config.num_experts == 1 else Moe()
        """
    )
    (site,) = find_sites(text)
    assert site.config_fields == {"sparse_step": [1, 2, 0]}
    assert site.caller_fields == {"num_experts": [1, 2]}
    defaults = {"sparse_step": 1, "num_experts": 1}
    assert flips(site, defaults)[:3] == [
        {"sparse_step": 2},
        {"sparse_step": 0},
        {"num_experts": 2},
    ]


EXPERTS = textwrap.dedent(
    """\
    def dispatch(forward):
        def wrapped(self, *args):
            chosen = self.config._experts_implementation
            return forward(self, *args) if chosen == "eager" else args[0]
        return wrapped

    class Experts:
        @dispatch
        def forward(self, x):
            return x

    class Dense:
        def forward(self, x):
            return x
    """
)


def test_experts_whose_forward_the_configuration_dispatches_get_an_eager_experts_check() -> None:
    import types

    from adopter.models.transformers.reach import dispatched_experts

    module = types.ModuleType("modeling_experts")
    exec(compile(EXPERTS, "modeling_experts.py", "exec"), module.__dict__)  # noqa: S102
    assert dispatched_experts(module) == ["Experts"]
    defaults = {"Model": {"_dispatched_experts": ["Experts"]}}
    in_experts = types.SimpleNamespace(
        cls="Experts", hosts=["Model"], guards=[], config_fields={}, caller_fields={}
    )
    attempts = reach_attempts(in_experts, ["Model"], ["Model"], False, defaults)
    assert ("Model", {"experts_implementation": "eager"}) in attempts
    in_dense = types.SimpleNamespace(
        cls="Dense", hosts=["Model"], guards=[], config_fields={}, caller_fields={}
    )
    assert ("Model", {"experts_implementation": "eager"}) not in reach_attempts(
        in_dense, ["Model"], ["Model"], False, defaults
    )


def test_a_site_under_a_cache_guard_is_tried_on_a_cached_step_first() -> None:
    sparse = _sites()["SparseAttention.forward"]
    sparse.guards = ["past_key_value is not None"]
    encoder = {"attention_type": "full", "is_decoder": False, "is_encoder_decoder": False}
    defaults = {"Model": encoder, "ForMasking": dict(encoder, is_decoder=True)}
    attempts = reach_attempts(sparse, ["Model"], ["Model", "ForMasking"], False, defaults)
    # a model that is no decoder by default is configured as one, so that it returns a cache
    assert attempts[0] == ("Model", {CACHED_STEP: True, "is_decoder": True})
    flipped = {"attention_type": "block_sparse", CACHED_STEP: True, "is_decoder": True}
    assert attempts[1] == ("Model", flipped)
    assert ("ForMasking", {CACHED_STEP: True}) in attempts  # another host, a decoder already
    sparse.guards = ["self.use_sparse"]
    assert all(CACHED_STEP not in overrides for _, overrides in reach_attempts(
        sparse, ["Model"], ["Model", "ForMasking"], False, defaults
    ))  # fmt: skip


def test_a_class_default_reaches_the_code_of_the_class_it_names() -> None:
    source = textwrap.dedent(
        """\
        from adopter.kernels import qkv_projection

        class AttnProcessor:
            def __call__(self, attn, x):
                return qkv_projection(x, attn.to_q, attn.to_k, attn.to_v)

        class Attention:
            _default_processor_cls = AttnProcessor
            _available_processors = [AttnProcessor]

        class Block:
            def __init__(self):
                self.attn = Attention()
        """
    )
    (site,) = find_sites(source)
    # the attention module makes its processor when given none: it reaches the processor's
    # code, and the block through it; a list of classes in a class body only describes
    assert site.hosts == ["AttnProcessor", "Attention", "Block"]
