"""adopter.patch / adopter.unpatch on a package of our own: modules, packages, models."""

from __future__ import annotations

import dis
import importlib
import sys
import traceback

import pytest
import torch

import adopter
import adopter.runtime as runtime
from adopter.runtime import hook

from .models import BERT_LIKE, BLOCKS, LATER


def _names(function) -> set[str]:
    """The global names the function's code reads (kernels are bound as module globals)."""
    return {
        instruction.argval
        for instruction in dis.get_instructions(function)
        if instruction.opname == "LOAD_GLOBAL"
    }


def test_patch_swaps_the_code_of_changed_functions_and_unpatch_restores_it(make_package):
    make_package("rt_blocks", {"blocks.py": BLOCKS})
    blocks = importlib.import_module("rt_blocks.blocks")
    original_forward = blocks.Output.forward
    original_code = original_forward.__code__
    torch.manual_seed(0)
    model = blocks.Model().eval()  # built before the patch: uses it all the same
    x = torch.randn(3, 8)
    expected = model(x)

    report = adopter.patch(blocks, rules="paper")

    assert report.patched == {
        "rt_blocks.blocks": ["paper.5 Output.forward line 14", "paper.4 Scores.forward line 21"]
    }
    assert blocks.Output.forward is original_forward  # same function, new code
    assert "dropout_add_layer_norm" in _names(blocks.Output.forward)
    assert "softmax" in _names(blocks.Scores.forward)
    assert blocks.dropout_add_layer_norm.__module__.startswith("adopter.kernels")
    torch.testing.assert_close(model(x), expected)

    assert adopter.unpatch(blocks) == ["rt_blocks.blocks"]
    assert blocks.Output.forward.__code__ is original_code
    assert not hasattr(blocks, "dropout_add_layer_norm")
    assert runtime.patched_modules() == {}


def test_patch_of_a_module_name_imports_it(make_package):
    make_package("rt_named", {"blocks.py": BLOCKS})
    assert "rt_named.blocks" not in sys.modules
    report = adopter.patch("rt_named.blocks", rules="paper")
    assert list(report.patched) == ["rt_named.blocks"]
    assert "softmax" in _names(sys.modules["rt_named.blocks"].Scores.forward)


def test_a_package_is_patched_now_and_as_its_submodules_are_imported(make_package):
    make_package("rt_pkg", {"blocks.py": BLOCKS, "later.py": LATER})
    blocks = importlib.import_module("rt_pkg.blocks")

    report = adopter.patch("rt_pkg", rules="paper")

    assert report.hooked == ["rt_pkg"]
    assert list(report.patched) == ["rt_pkg.blocks"]
    assert "rt_pkg.later" not in sys.modules  # not imported for the purpose
    later = importlib.import_module("rt_pkg.later")
    assert "softmax" in _names(later.Probabilities.forward)
    assert later.__loader__.__class__.__name__ == "SourceFileLoader"  # the hook left no trace
    assert sorted(runtime.patched_modules()) == ["rt_pkg.blocks", "rt_pkg.later"]

    assert sorted(adopter.unpatch("rt_pkg")) == ["rt_pkg.blocks", "rt_pkg.later"]
    assert hook.hooked_packages() == []
    assert not any(isinstance(f, hook.PackageHook) for f in sys.meta_path)
    assert "softmax" not in _names(blocks.Scores.forward)


def test_modules_outside_the_hooked_package_are_left_alone(make_package):
    make_package("rt_hooked", {"blocks.py": BLOCKS})
    make_package("rt_other", {"blocks.py": BLOCKS})
    adopter.patch("rt_hooked", rules="paper")
    other = importlib.import_module("rt_other.blocks")
    assert "softmax" not in _names(other.Scores.forward)
    assert list(runtime.patched_modules()) == []


def test_patching_twice_is_a_no_op_and_other_rules_repatch(make_package):
    make_package("rt_twice", {"blocks.py": BLOCKS})
    blocks = importlib.import_module("rt_twice.blocks")
    adopter.patch(blocks, rules="paper")
    again = adopter.patch(blocks, rules="paper")
    assert again.modules[0].status == "already patched"
    only_softmax = adopter.patch(blocks, rules="paper", select="paper.4")
    assert only_softmax.modules[0].status == "patched"
    assert "dropout_add_layer_norm" not in _names(blocks.Output.forward)
    assert "softmax" in _names(blocks.Scores.forward)


def test_tracebacks_show_the_original_file_and_line(make_package):
    make_package("rt_trace", {"blocks.py": BLOCKS})
    blocks = importlib.import_module("rt_trace.blocks")
    adopter.patch(blocks, rules="paper")
    try:
        blocks.Output(8)(torch.randn(2, 5), torch.randn(2, 5))  # wrong width: dense raises
    except RuntimeError as error:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.name == "forward"]
    source = blocks.__file__
    frame = next(f for f in frames if f.filename == source)
    # line 13 of the original file, although the patched text has an import line more
    assert frame.lineno == 13
    assert frame.line == "hidden_states = self.dense(hidden_states)"


def test_patching_a_model_wraps_submodules_built_before_the_patch(make_package):
    transformers_bert = pytest.importorskip("transformers.models.bert.modeling_bert")
    make_package("rt_bert", {"encoder.py": BERT_LIKE})
    encoder_module = importlib.import_module("rt_bert.encoder")
    config = transformers_bert.BertConfig(
        hidden_size=32, num_attention_heads=4, attention_probs_dropout_prob=0.0
    )
    torch.manual_seed(0)
    model = encoder_module.Encoder(config).eval()
    x = torch.randn(2, 5, 32)
    expected = model(x)

    report = adopter.patch(model, rules="paper")

    # The modules of all the model's classes: ours, and transformers' modeling_bert.
    assert report.patched["rt_bert.encoder"] == ["paper.1 Attention.__init__ line 8"]
    assert transformers_bert.__name__ in report.patched
    assert report.wrapped_children == 1
    attention = model.attention.self
    assert type(attention).__name__ == "FusedBertSelfAttention"
    assert isinstance(attention, transformers_bert.BertSelfAttention)
    torch.testing.assert_close(model(x), expected)
    built_after = encoder_module.Encoder(config)
    assert type(built_after.attention.self).__name__ == "FusedBertSelfAttention"

    assert sorted(adopter.unpatch(model)) == sorted(report.patched)
    assert type(model.attention.self) is transformers_bert.BertSelfAttention
    assert type(encoder_module.Encoder(config).attention.self) is (
        transformers_bert.BertSelfAttention
    )


def test_a_target_that_is_not_a_module_is_refused():
    with pytest.raises(TypeError):
        adopter.patch(42)
    with pytest.raises(ModuleNotFoundError):
        adopter.patch("rt_no_such_module_anywhere")
    with pytest.raises(ValueError, match="neither a rule file nor a rule set"):
        adopter.patch("json", rules="no-such-rules")
    with pytest.raises(ValueError, match="adopter's own modules"):
        adopter.patch("adopter.kernels")


def test_a_reloaded_module_is_patched_again(make_package):
    make_package("rt_reload", {"blocks.py": BLOCKS})
    blocks = importlib.import_module("rt_reload.blocks")
    adopter.patch(blocks, rules="paper")
    importlib.reload(blocks)  # executes the original source again: new, unpatched functions
    assert "softmax" not in _names(blocks.Scores.forward)
    assert adopter.patch(blocks, rules="paper").modules[0].status == "patched"
    assert "softmax" in _names(blocks.Scores.forward)
