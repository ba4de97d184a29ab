"""The model-library adapters' own logic, on tiny modules of our own (no timm or diffusers
needed): class adoption, entry points, which installed file a copy came from, shrinking."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from adopter.bench.command import _bench_widths
from adopter.models.base import adopt_patched_classes, defined_names, entry_point
from adopter.models.origin import find_origin, pristine_of
from adopter.models.registry import library_of
from adopter.models.sites import PatchedSite, attribute_flips, calls_kernels
from adopter.models.surveys import SurveyStore, covering_order
from adopter.models.timm import (
    choosing_keywords,
    literal_size,
    registration_bodies,
    static_rank,
)

ORIGINAL = """
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x) * 2

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x)
"""


def _module(name: str, text: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(text, name, "exec"), module.__dict__)  # our own fixture text
    for value in vars(module).values():
        if isinstance(value, type) and value.__module__ == "builtins":
            value.__module__ = name
    sys.modules[name] = module
    return module


def test_adopting_patched_classes_swaps_methods_and_keeps_weights_and_isinstance():
    original = _module("fakelib.blocks", ORIGINAL)
    patched = _module("fakelib._patched_blocks", ORIGINAL.replace("* 2", "* 3"))
    model = original.Net()
    keys = list(model.state_dict())
    swapped = adopt_patched_classes(model, "fakelib.blocks", patched)
    assert swapped == {"Block", "Net"}
    assert isinstance(model.block, original.Block) and type(model.block) is not original.Block
    assert list(model.state_dict()) == keys
    x = torch.ones(1, 4)
    assert torch.allclose(model(x), model.block.linear(x) * 3)


SUPER_CALLING = """
from torch import nn

class ChannelsLastNorm(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
"""


def test_an_adopted_method_that_calls_super_reaches_the_base_not_the_originals_override():
    original = _module("fakelib.norms", SUPER_CALLING)
    patched = _module("fakelib._patched_norms", SUPER_CALLING)
    norm = original.ChannelsLastNorm(6)
    x = torch.randn(2, 6, 4, 5)
    expected = norm(x)
    assert adopt_patched_classes(norm, "fakelib.norms", patched) == {"ChannelsLastNorm"}
    assert isinstance(norm, original.ChannelsLastNorm)
    assert torch.equal(norm(x), expected)  # one permute each way, as in the original


def test_adopting_leaves_classes_of_other_modules_alone():
    original = _module("fakelib.other", ORIGINAL)
    patched = _module("fakelib._patched_other", ORIGINAL)
    model = original.Net()
    assert adopt_patched_classes(model, "fakelib.unrelated", patched) == set()
    assert type(model) is original.Net


def test_an_entry_point_calls_the_named_method_and_keeps_the_parameters():
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))

        def forward_twice(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale * 2

    wrapped = entry_point(Two(), "forward_twice")
    assert list(wrapped.state_dict()) == ["model.scale"]
    assert wrapped(torch.ones(2)).tolist() == [2.0, 2.0]


def test_defined_names_reads_top_level_classes_and_functions():
    assert defined_names("class A(B):\n    def inner(self): ...\ndef f():\n    pass\n") == {
        "A",
        "f",
    }


MODEL_MODULE = """
class ConvNeXt:
    def __init__(self, use_grn=False, conv_mlp=False):
        # the MLP follows the block's options
        mlp_layer = partial(GlobalResponseNormMlp if use_grn else Mlp, use_conv=conv_mlp)


@register_model
def convnext_atto(pretrained=False, **kwargs):
    \"\"\"ConvNeXt-Atto, 3.7M.\"\"\"
    model_args = dict(depths=(2, 2, 6, 2), dims=(40, 80, 160, 320), conv_mlp=True)
    return _create(model_args)


@register_model
def convnextv2_atto(pretrained=False, **kwargs):
    model_args = dict(depths=(2, 2, 6, 2), dims=(40, 80, 160, 320), use_grn=True)
    return _create(model_args)


@register_model
def gated_tiny(
    pretrained=False, **kwargs
):
    return _create(dict(mlp_layer=GatedMlp, dims=(8,)))
"""


def test_timm_registration_bodies_and_the_keywords_that_choose_a_class_are_read_statically():
    bodies = registration_bodies(MODEL_MODULE)
    assert set(bodies) == {"convnext_atto", "convnextv2_atto", "gated_tiny"}
    assert "pretrained=False, **kwargs\n):" in bodies["gated_tiny"]  # a ")" line stays inside
    keywords = choosing_keywords(MODEL_MODULE, {"GlobalResponseNormMlp"})
    assert {"use_grn", "conv_mlp", "mlp_layer"} <= keywords
    assert "GlobalResponseNormMlp" not in keywords and "if" not in keywords
    names = {"GlobalResponseNormMlp", "GatedMlp"}
    assert static_rank(bodies["gated_tiny"], names, keywords) == (1, 1)
    assert static_rank(bodies["convnextv2_atto"], names, {"use_grn"}) == (0, 1)
    assert static_rank(bodies["convnext_atto"], names, {"use_grn"}) == (0, 0)


def test_timm_literal_size_sums_the_configuration_not_the_docstring():
    bodies = registration_bodies(MODEL_MODULE)
    assert literal_size(bodies["convnext_atto"]) == 12 + 600
    assert literal_size(bodies["gated_tiny"]) == 8


def test_the_covering_order_takes_few_small_models_that_build_every_needed_class():
    builds = {
        "big_all": frozenset({"Mlp", "SwiGLU", "GatedMlp"}),
        "tiny_mlp": frozenset({"Mlp"}),
        "small_swiglu": frozenset({"SwiGLU", "Other"}),
        "small_gated": frozenset({"GatedMlp"}),
        "unrelated": frozenset({"Other"}),
    }
    sizes = {"big_all": 900, "tiny_mlp": 1, "small_swiglu": 5, "small_gated": 6, "unrelated": 0}
    order = covering_order(builds, sizes, {"Mlp", "SwiGLU", "GatedMlp"})
    assert order == ["big_all", "tiny_mlp", "small_swiglu", "small_gated"]
    order = covering_order(
        {k: v for k, v in builds.items() if k != "big_all"}, sizes, {"Mlp", "SwiGLU"}
    )
    assert order == ["tiny_mlp", "small_swiglu"]  # the one needing none is left out


def test_a_class_only_large_models_build_is_given_its_smallest_builder_after_the_small_ones(
    tmp_path,
):
    from adopter.models.surveys import survey_in_order

    looks = {
        "tiny": ({"lib.attn": ["ChannelAttention", "Mlp"]}, 10),
        "base": ({"lib.attn": ["ChannelAttention", "ChannelAttentionV2"]}, 90),
        "huge": ({"lib.attn": ["ChannelAttentionV2"]}, 400),
        "large": ({"lib.attn": ["ChannelAttentionV2", "Mlp"]}, 200),
        "large_mlp": ({"lib.attn": ["Mlp"]}, 50),
    }
    needed = {"ChannelAttention", "ChannelAttentionV2", "Mlp"}
    store = SurveyStore("lib", "1.0", tmp_path)

    def survey(fallback):
        return survey_in_order(
            list(looks),
            looks.get,
            store,
            "lib.attn",
            needed,
            budget=10,
            choices=3,
            max_parameters=20,
            fallback_parameters=fallback,
        )

    builds, sizes, _ = survey(None)
    assert set(builds) == {"tiny"}
    builds, sizes, _ = survey(300)
    # base, the smallest builder of ChannelAttentionV2 under 300, for that class alone; no
    # large model for the classes tiny builds, and huge is above the fallback
    assert builds == {
        "tiny": frozenset({"ChannelAttention", "Mlp"}),
        "base": frozenset({"ChannelAttentionV2"}),
    }
    assert covering_order(builds, sizes, needed) == ["tiny", "base"]


def test_a_survey_store_merges_what_other_workers_wrote(tmp_path):
    first, second = SurveyStore("lib", "1.0", tmp_path), SurveyStore("lib", "1.0", tmp_path)
    first.put("a", {"parameters": 1})
    second.put("b", None)
    first.save()
    second.save()
    again = SurveyStore("lib", "1.0", tmp_path)
    assert "a" in again and "b" in again and again.get("b") is None
    assert "a" not in SurveyStore("lib", "2.0", tmp_path)
    (tmp_path / "lib-1.0.json").write_text("{half")
    assert SurveyStore("lib", "1.0", tmp_path).entries == {}


def test_library_of_names_only_libraries_with_an_adapter():
    assert library_of("timm.models.resnet") == "timm"
    assert library_of("diffusers.models.resnet") == "diffusers"
    assert library_of("mypackage.timm") is None


def _installed(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    for package, text in (("timm", "import timm_only\nx = 1\n"), ("diffusers", "y = 2\n")):
        (site / package / "models").mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
        (site / package / "models" / "__init__.py").write_text("")
        (site / package / "models" / "resnet.py").write_text(text)
    return site


def test_a_copied_file_is_found_in_the_installed_library_with_the_closest_text(tmp_path):
    site = _installed(tmp_path)
    copy = tmp_path / "copy" / "models" / "resnet.py"
    copy.parent.mkdir(parents=True)
    copy.write_text("y = 2\n")
    origin = find_origin(copy, [str(site)])
    assert origin is not None and origin.module_name == "diffusers.models.resnet"
    copy.write_text("import timm_only\nx = 1\n")
    assert find_origin(copy, [str(site)]).module_name == "timm.models.resnet"
    assert find_origin(tmp_path / "nothing_like_it.py", [str(site)]) is None


def test_a_file_apply_patched_is_compared_with_the_installed_pristine_text(tmp_path, monkeypatch):
    site = _installed(tmp_path)
    monkeypatch.setattr(sys, "path", [str(site)])
    patched = "from adopter.kernels import softmax\n\ndef f(x):\n    return softmax(x, dim=-1)\n"
    assert calls_kernels(patched) and not calls_kernels("y = 2\n")
    copy = tmp_path / "copy" / "diffusers" / "models" / "resnet.py"
    copy.parent.mkdir(parents=True)
    copy.write_text(patched)
    found = pristine_of(copy, patched, calls_kernels)
    assert found is not None
    path, text, module_name = found
    assert module_name == "diffusers.models.resnet" and text == "y = 2\n"
    assert path == site / "diffusers" / "models" / "resnet.py"


def test_self_flag_guards_give_the_flag_value_that_reaches_the_site():
    site = PatchedSite("softmax", 1, 0, 1, 5, "Attention.forward", "Attention")
    site.guards = ["not (self.fused_attn)", "self.training", "x is None"]
    assert attribute_flips([site]) == {"fused_attn": False, "training": True}


@pytest.mark.parametrize(
    ("defaults", "expected"),
    [
        ({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
          "intermediate_size": 11008},
         {"hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 12,
          "intermediate_size": 2048}),
        ({"hidden_size": 768, "num_attention_heads": 12}, {}),
    ],
)  # fmt: skip
def test_bench_narrows_a_wide_default_configuration(defaults, expected):
    assert _bench_widths(defaults) == expected


def test_guards_are_flipped_after_an_agreeing_check_where_no_site_ran(monkeypatch):
    """An attribute guard is set after the build; a ``self.x is None`` guard is built so."""
    from types import SimpleNamespace

    from adopter.verify import library
    from adopter.verify.results import VERIFIED, ClassVerification

    flagged = PatchedSite("softmax", 1, 0, 1, 5, "Attention.forward", "Attention")
    flagged.guards = ["not (self.fused_attn)"]
    built = PatchedSite("qkv_projection", 2, 0, 2, 5, "Attention.forward", "Attention")
    built.guards = ["not (self.qkv is not None)"]
    tried: list[dict[str, object]] = []

    def checked(candidate, entry, checks):
        setting = {**checks.sides.flags, **checks.sides.overrides}
        tried.append(setting)
        ran = flagged if checks.sides.flags else built if checks.sides.overrides else None
        runs = {"eval": {ran.key: 1}} if ran else {}  # the guards kept both from running
        modes = {"eval": "verified"}
        return ClassVerification(candidate.name, VERIFIED, "agrees", modes=modes, runs=runs)

    monkeypatch.setattr(library, "_checked", checked)
    sides = SimpleNamespace(
        flags={},
        overrides={},
        entries_reaching=lambda name, remaining: [],
        construction_flips=lambda remaining: {"qkv_fused": False},
    )
    writer = SimpleNamespace(rows=[], add=lambda row: writer.rows.append(row))
    matched: set[str] = set()
    candidate = SimpleNamespace(name="vit", reason="builds Attention")
    checks = SimpleNamespace(sides=sides, writer=writer)
    library._check_one(candidate, "", [flagged, built], matched, checks)
    assert tried == [{}, {"fused_attn": False}, {"qkv_fused": False}]
    assert matched == {flagged.key, built.key}


def test_a_none_guard_names_the_constructor_keyword_that_builds_the_attribute_so():
    from adopter.models.construction import construction_flips

    text = """
class Attention(nn.Module):
    def __init__(self, dim, qkv_fused=True, scale=0.0, norm=None):
        if qkv_fused:
            self.qkv = nn.Linear(dim, dim * 3)
            self.q = self.k = None
        else:
            self.qkv = None
            self.q = nn.Linear(dim, dim)
        if scale > 0:
            self.gamma = nn.Parameter(torch.ones(dim) * scale)
        else:
            self.gamma = None
        self.norm = norm  # set from an argument: no keyword decides it alone
"""

    def guarded(*guards: str) -> PatchedSite:
        site = PatchedSite("k", 1, 0, 1, 2, "Attention.forward", "Attention")
        site.guards = list(guards)
        return site

    assert construction_flips([guarded("not (self.qkv is not None)")], text) == {"qkv_fused": False}
    assert construction_flips([guarded("self.q is not None")], text) == {"qkv_fused": False}
    assert construction_flips([guarded("self.qkv is not None")], text) == {"qkv_fused": True}
    assert construction_flips([guarded("self.gamma is not None")], text) == {"scale": 1.0}
    assert construction_flips([guarded("self.norm is not None")], text) == {}
    assert construction_flips([guarded("self.training")], text) == {}


def test_a_parameter_stored_as_it_is_gets_a_value_of_its_annotated_type():
    from adopter.models.construction import construction_flips

    text = """
class Pool(nn.Module):
    def __init__(self, dim, gamma: Optional[float] = None, mask: bool = False, other=None):
        self.gamma = gamma
        self.mask = mask
        self.other = other
"""

    def guarded(*guards: str) -> PatchedSite:
        site = PatchedSite("k", 1, 0, 1, 2, "Pool.forward", "Pool")
        site.guards = list(guards)
        return site

    assert construction_flips([guarded("self.gamma is not None")], text) == {"gamma": 2.0}
    assert construction_flips([guarded("not (self.gamma is not None)")], text) == {"gamma": None}
    # sites in both arms: the arm that needs a value (the default build ran the other)
    both = [guarded("not (self.gamma is not None)"), guarded("self.gamma is not None")]
    assert construction_flips(both, text) == {"gamma": 2.0}
    assert construction_flips([guarded("self.mask is not None")], text) == {"mask": True}
    assert construction_flips([guarded("self.other is not None")], text) == {}  # no type


def test_a_parameter_compared_with_a_constant_is_given_that_constant():
    from adopter.models.construction import construction_flips

    text = """
class Upsampler(nn.Module):
    def __init__(self, channels, dims: int = 3, mode="nearest"):
        self.dims = dims
        self.kind = "fixed"
"""

    def guarded(guard: str) -> PatchedSite:
        site = PatchedSite("k", 1, 0, 1, 2, "Upsampler.forward", "Upsampler")
        site.guards = [guard]
        return site

    assert construction_flips([guarded("self.dims == 2")], text) == {"dims": 2}
    # no parameter stored as it is, or no equality: nothing to build differently
    assert construction_flips([guarded("self.kind == 'learned'")], text) == {}
    assert construction_flips([guarded("not (self.dims == 2)")], text) == {}
    assert construction_flips([guarded("self.dims > 2")], text) == {}


def test_an_entry_is_taken_when_its_method_holds_a_site_or_its_construction_builds_a_host():
    from adopter.models.library_sides import LibrarySides

    class Adapter:
        built = {"features_only": frozenset({"NetFeatures"})}

        def entries(self, name):
            return ["forward_intermediates", "features_only"]

        def entry_classes(self, name, entry, module_name):
            return self.built.get(entry)

    sides = LibrarySides(Adapter(), "lib.net", None, None, None)  # type: ignore[arg-type]

    def site(function: str, hosts: list[str]) -> PatchedSite:
        cls = function.split(".")[0]
        return PatchedSite("conv_bn_act", 1, 0, 1, 5, function, cls, hosts=hosts)

    features = site("NetFeatures.forward", ["NetFeatures"])
    assert sides.entries_reaching("net", [features]) == ["features_only"]
    intermediates = site("Net.forward_intermediates", ["Net"])
    assert sides.entries_reaching("net", [intermediates]) == ["forward_intermediates"]
    assert sides.entries_reaching("net", [site("Net.forward", ["Net"])]) == []
    Adapter.built = {"features_only": frozenset()}  # the feature build holds no host
    assert sides.entries_reaching("net", [features]) == []


def test_candidates_keep_models_the_survey_did_not_rule_out_after_the_covering_set():
    from adopter.models.surveys import candidate_order

    ranked = [("own", "defined here"), ("big", "names it"), ("unseen", "names it"), ("none", "x")]
    builds = {"own": frozenset({"Block"})}
    order = candidate_order(ranked, builds, {"own": 5}, {"none"}, {"Block"})
    assert [model for model, _ in order] == ["own", "big", "unseen"]
    assert order[0][1].startswith("builds Block (5 parameters") and order[1][1] == "names it"
