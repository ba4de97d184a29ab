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
from adopter.models.diffusers import small_config
from adopter.models.origin import find_origin, pristine_of
from adopter.models.registry import library_of
from adopter.models.timm import smallness
from adopter.verify.library import attribute_flips
from adopter.verify.sites import PatchedSite, calls_kernels

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


def test_timm_names_that_sound_small_come_first():
    names = ["resnet152", "resnet18", "vit_large_patch16_384", "vit_tiny_patch16_224", "test_vit"]
    assert sorted(names, key=smallness)[:2] == ["test_vit", "resnet18"]
    assert sorted(names, key=smallness)[-1] == "vit_large_patch16_384"


def test_a_diffusers_config_is_shrunk_by_argument_name():
    class Model:
        def __init__(
            self,
            block_out_channels=(320, 640, 1280, 1280),
            layers_per_block=2,
            cross_attention_dim=1024,
            attention_head_dim=(5, 10, 20, 20),
            num_attention_heads=24,
            sample_size=64,
            in_channels=4,
            use_linear_projection=False,
        ):
            pass

    assert small_config(Model) == {
        "block_out_channels": (32, 64, 96, 128),
        "layers_per_block": 1,
        "cross_attention_dim": 32,
        "attention_head_dim": (5, 8, 8, 8),
        "num_attention_heads": 2,
        "sample_size": 16,
    }


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
