"""Helpers in other files of the package, read statically: factories that build or return
layers, re-exports through ``__init__.py``, module base classes defined elsewhere."""

from __future__ import annotations

import textwrap
from pathlib import Path

from adopter.extract import analyse_file
from adopter.match import Matcher
from adopter.match.scan import scan_paths
from adopter.rules import load_rule_set

FILES = {
    "pkg/__init__.py": "",
    "pkg/layers/__init__.py": """
        from .create_conv2d import create_conv2d
        from .create_norm import get_norm_layer
        """,
    "pkg/layers/padding.py": """
        from torch import nn
        from .same import Conv2dSame

        def create_conv2d_pad(in_chs, out_chs, kernel_size, **kwargs):
            if kwargs.pop("dynamic", False):
                return Conv2dSame(in_chs, out_chs, kernel_size, **kwargs)
            return nn.Conv2d(in_chs, out_chs, kernel_size, **kwargs)
        """,
    "pkg/layers/same.py": """
        from torch import nn

        class Conv2dSame(nn.Conv2d):
            def forward(self, x):
                return super().forward(x)
        """,
    "pkg/layers/create_conv2d.py": """
        from .padding import create_conv2d_pad

        def create_conv2d(in_channels, out_channels, kernel_size, **kwargs):
            m = create_conv2d_pad(in_channels, out_channels, kernel_size, **kwargs)
            return m
        """,
    "pkg/layers/create_norm.py": """
        import functools

        def get_norm_layer(norm_layer):
            if isinstance(norm_layer, functools.partial):
                norm_layer = norm_layer.func
            return norm_layer
        """,
    "pkg/modeling_utils.py": """
        import torch

        class ModelMixin(torch.nn.Module):
            pass
        """,
    "pkg/models/__init__.py": "",
    "pkg/models/net.py": """
        from torch import nn
        from ..layers import create_conv2d, get_norm_layer
        from ..modeling_utils import ModelMixin


        class Stem(ModelMixin):
            def __init__(self, norm_layer=nn.BatchNorm2d):
                super().__init__()
                norm_layer = get_norm_layer(norm_layer)
                self.conv = create_conv2d(3, 8, 3, bias=False)
                self.bn = norm_layer(8)

            def forward(self, x):
                x = self.conv(x)
                return self.bn(x)
        """,
}


def write_package(root: Path) -> Path:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root / "pkg" / "models" / "net.py"


def test_a_factory_in_another_file_builds_what_it_returns(tmp_path):
    net = write_package(tmp_path)
    structure = analyse_file(str(net))
    stem = structure.classes["Stem"]
    assert stem.is_module  # ModelMixin is an nn.Module, read from modeling_utils.py
    kinds = sorted(c.kind for c in stem.bindings["conv"])
    assert kinds == ["same.Conv2dSame", "torch.nn.Conv2d"]
    assert {c.via for c in stem.bindings["conv"]} == {"create_conv2d"}
    assert {c.line for c in stem.bindings["conv"]} == {11}  # the call in net.py
    # get_norm_layer hands back the class it is given
    assert [c.kind for c in stem.bindings["bn"]] == ["torch.nn.BatchNorm2d"]


def test_the_site_is_reported_where_the_user_edits(tmp_path):
    net = write_package(tmp_path)
    result = scan_paths([net], load_rule_set("paper"), jobs=1)
    assert [(s.rule.id, Path(s.path).name, s.line) for s in result.sites] == [
        ("paper.7", "net.py", 15)
    ]


def test_without_the_package_the_names_stay_unknown(tmp_path):
    net = write_package(tmp_path)
    alone = tmp_path / "alone.py"
    alone.write_text(net.read_text(encoding="utf-8"), encoding="utf-8")
    matcher = Matcher(load_rule_set("paper"))
    structure = analyse_file(str(alone), matcher.opaque_methods)
    assert matcher.match_file(structure) == []


PROCESSOR_FILES = {
    "pkg/__init__.py": "",
    "pkg/attention_processor.py": """
        from torch import nn

        class Attention(nn.Module):
            def __init__(self, dim, heads=2):
                super().__init__()
                self.heads = heads
                self.to_q = nn.Linear(dim, dim)
                self.to_k = nn.Linear(dim, dim)
                self.to_v = nn.Linear(dim, dim)

            def head_to_batch_dim(self, x):
                return x.view(x.shape[0], -1, self.heads, x.shape[-1] // self.heads)

        class Helper:
            def __init__(self):
                self.to_q = nn.Linear(4, 4)
        """,
    "pkg/transformer.py": """
        from torch import nn
        from .attention_processor import Attention, Helper


        class DoubleStreamProcessor:
            def __call__(self, attn: Attention, hidden_states):
                query = attn.to_q(hidden_states).unflatten(-1, (attn.heads, -1))
                key = attn.to_k(hidden_states).unflatten(-1, (attn.heads, -1))
                value = attn.to_v(hidden_states).unflatten(-1, (attn.heads, -1))
                return query, key, value


        class HeadsByMethodProcessor:
            def __call__(self, attn: Attention, hidden_states):
                query = attn.head_to_batch_dim(attn.to_q(hidden_states))
                key = attn.head_to_batch_dim(attn.to_k(hidden_states))
                value = attn.head_to_batch_dim(attn.to_v(hidden_states))
                return query, key, value


        class NotAModuleProcessor:
            def __call__(self, attn: Helper, hidden_states):
                query = attn.to_q(hidden_states).unflatten(-1, (2, -1))
                return query
        """,
}


def test_a_processor_reads_the_attention_class_of_another_file(tmp_path):
    """``attn: Attention`` imported from ``attention_processor.py``: its submodules are read
    from that file (never imported), the sites stay in the processor's file, and the other
    file's methods are not inlined here (their lines are that file's)."""
    for name, text in PROCESSOR_FILES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    transformer = tmp_path / "pkg" / "transformer.py"
    result = scan_paths([transformer], load_rule_set("paper"), jobs=1)
    found = [(s.rule.id, Path(s.path).name, s.line, s.cls) for s in result.sites]
    # the heads split by a method of the other file is not seen as a split (not inlined);
    # a plain class of the other file binds nothing
    assert found == [("paper.9", "transformer.py", 8, "DoubleStreamProcessor")]
    alone = tmp_path / "alone.py"
    alone.write_text(transformer.read_text(encoding="utf-8"), encoding="utf-8")
    assert scan_paths([alone], load_rule_set("paper"), jobs=1).sites == []
