"""A model patched in place pickles as the original classes with the original state: it loads
where Adopter cannot be imported, and where it can, it loads (and deep-copies) unpatched until
``adopter.patch`` is called on it."""

from __future__ import annotations

import copy
import importlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import adopter

from .models import BERT_LIKE

# Run where ``import adopter`` fails: a None in sys.modules makes every import of it (and of
# anything under it, which a pickle naming Adopter code would need) raise.
LOAD_WITHOUT_ADOPTER = """
import sys
sys.modules["adopter"] = None
import torch
try:
    import adopter
except ImportError:
    pass
else:
    raise SystemExit("adopter is importable")
model, x, expected = torch.load(sys.argv[1], weights_only=False)
model.eval()
print(type(model.attention.self).__module__, type(model.attention.self).__qualname__)
torch.testing.assert_close(model(x), expected)
print("same outputs")
print(not any(name.startswith("adopter") for name in sys.modules if sys.modules[name]))
"""


@pytest.fixture
def patched_model(make_package):
    bert = pytest.importorskip("transformers.models.bert.modeling_bert")
    make_package("rt_pickled", {"encoder.py": BERT_LIKE})
    encoder = importlib.import_module("rt_pickled.encoder")
    config = bert.BertConfig(
        hidden_size=32, num_attention_heads=4, attention_probs_dropout_prob=0.0
    )
    torch.manual_seed(0)
    model = encoder.Encoder(config).eval()
    keys = list(model.state_dict())
    report = adopter.patch(model, rules="paper")
    assert report.wrapped_children == 1
    assert type(model.attention.self).__name__ == "FusedBertSelfAttention"
    return model, bert.BertSelfAttention, keys


def test_a_patched_model_loads_where_adopter_cannot_be_imported(patched_model, tmp_path):
    model, _, _ = patched_model
    x = torch.randn(2, 5, 32)
    saved = tmp_path / "model.pt"
    torch.save((model, x, model(x)), saved)
    site = os.path.dirname(os.path.dirname(sys.modules["rt_pickled.encoder"].__file__))
    env = {**os.environ, "PYTHONPATH": site}  # the model's package, not this worktree
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LOAD_WITHOUT_ADOPTER), str(saved)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == [
        "transformers.models.bert.modeling_bert BertSelfAttention",
        "same outputs",
        "True",
    ]


def test_with_adopter_it_loads_unpatched_until_patch_is_called(patched_model, tmp_path):
    model, original_class, keys = patched_model
    x = torch.randn(2, 5, 32)
    expected = model(x)
    saved = tmp_path / "model.pt"
    torch.save(model, saved)
    for clone in (torch.load(saved, weights_only=False), copy.deepcopy(model)):
        assert type(clone.attention.self) is original_class
        assert list(clone.state_dict()) == keys
        torch.testing.assert_close(clone.eval()(x), expected)
        adopter.patch(clone, rules="paper")
        assert type(clone.attention.self).__name__ == "FusedBertSelfAttention"
        torch.testing.assert_close(clone(x), expected)
        adopter.unpatch(clone)
        assert type(clone.attention.self) is original_class
    assert type(model.attention.self).__name__ == "FusedBertSelfAttention"  # untouched
