"""The factories of the modern benchmarks (benchmarks/modern_models.py): the patched model is the
original build with rewritten classes, same weights, same results, the sites really patched."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.environments import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import modern_models  # noqa: E402


def _bottlenecks(model):
    return [m for m in model.modules() if type(m).__name__ == "Bottleneck"]


def test_the_patched_resnet_runs_the_rewritten_bottleneck_on_the_same_weights():
    original, (image,) = modern_models.resnet50()
    patched, _ = modern_models.resnet50__modern_6()
    from timm.models.resnet import Bottleneck

    blocks = _bottlenecks(patched)
    assert blocks and all(type(b) is not Bottleneck and isinstance(b, Bottleneck) for b in blocks)
    assert all(type(b).__module__.startswith("timm.models._adopter_vision_") for b in blocks)
    # the rewritten method calls the kernel; the original class's does not
    forward = type(blocks[0]).forward
    assert "conv_bn_act" in forward.__code__.co_names
    assert "conv_bn_act" not in Bottleneck.forward.__code__.co_names
    assert list(patched.state_dict()) == list(original.state_dict())
    patched.load_state_dict(original.state_dict())
    original.eval(), patched.eval()
    small = image[:, :, :64, :64]
    with torch.no_grad():
        torch.testing.assert_close(patched(small), original(small), rtol=1e-4, atol=1e-5)
    # The rewritten copy of timm's module registered its own ``resnet50``: the original is
    # still built from the original classes.
    again, _ = modern_models.resnet50()
    assert all(type(b) is Bottleneck for b in _bottlenecks(again))


def test_a_rule_of_all_by_its_name_and_the_files_it_patches():
    assert [rule.id for rule in modern_models.rules_named("modern_6")] == ["modern.6"]
    # five sites in timm's resnet.py since issue 22 taught the drop-block and get_act_layer
    # spellings (tests/modern/test_modern_models.py's resnet test checks the numbers)
    assert modern_models.patched_files("resnet50", "modern") == {
        "timm.models.resnet": {"modern.6": 5}
    }
    with pytest.raises(AttributeError):
        modern_models.rules_named("modern_99")
