"""Layer factories of another file run statically on the classes they are passed: a norm class
mapped by its name to the norm-with-activation class, an activation factory that hands back a
class it is given, and factories whose result depends on what cannot be decided."""

from __future__ import annotations

import textwrap
from pathlib import Path

from adopter.extract import analyse_file

FILES = {
    "zoo/__init__.py": "",
    "zoo/layers/__init__.py": """
        from .norm_act import NormAct2d
        from .factories import get_act, get_norm_act, pick_by_flag
        """,
    "zoo/layers/norm_act.py": """
        from torch import nn

        class NormAct2d(nn.BatchNorm2d):
            def __init__(self, num_features, eps=1e-5, apply_act=True, act_layer=nn.ReLU):
                super().__init__(num_features, eps=eps)
                self.act = act_layer() if apply_act else nn.Identity()

            def forward(self, x):
                return self.act(super().forward(x))

        class GroupNormAct(nn.GroupNorm):
            pass
        """,
    "zoo/layers/factories.py": """
        import functools
        import types
        from .norm_act import NormAct2d, GroupNormAct

        _BY_NAME = dict(batchnorm2d=NormAct2d, groupnorm=GroupNormAct)
        _TYPES = {m for n, m in _BY_NAME.items()}
        _TABLE = dict(relu=None)

        def is_exportable():
            return False

        def get_act(name='relu'):
            if name is None:
                return None
            if not isinstance(name, str):
                return name
            name = name.lower()
            if not is_exportable():
                return _TABLE[name]
            return _TABLE[name]

        def get_norm_act(norm_layer, act_layer=None):
            if norm_layer is None:
                return None
            kwargs = {}
            if isinstance(norm_layer, functools.partial):
                kwargs.update(norm_layer.keywords)
                norm_layer = norm_layer.func
            if isinstance(norm_layer, str):
                layer = _BY_NAME[norm_layer.lower()]
            elif norm_layer in _TYPES:
                layer = norm_layer
            elif isinstance(norm_layer, types.FunctionType):
                layer = norm_layer
            else:
                layer = _BY_NAME.get(norm_layer.__name__.lower(), None)
            kwargs.setdefault('act_layer', act_layer)
            if kwargs:
                layer = functools.partial(layer, **kwargs)
            return layer

        def pick_by_flag(flag, layer):
            if flag:
                return layer
            return None
        """,
    "zoo/models/__init__.py": "",
    "zoo/models/net.py": """
        from functools import partial
        from torch import nn
        from ..layers import get_act, get_norm_act, pick_by_flag


        class Block(nn.Module):
            def __init__(self, flag, act_layer=nn.SiLU, norm_layer=nn.BatchNorm2d):
                super().__init__()
                act_layer = get_act(act_layer)
                norm_act_layer = get_norm_act(norm_layer, act_layer)
                eps_layer = get_norm_act(partial(nn.BatchNorm2d, eps=1e-3), act_layer)
                either = pick_by_flag(flag, nn.GELU)
                self.act = act_layer(inplace=True)
                self.bn = norm_act_layer(8)
                self.bn_eps = eps_layer(8, apply_act=False)
                self.gelu = either()
        """,
}


def write_package(root: Path) -> Path:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root / "zoo" / "models" / "net.py"


def test_factories_are_run_on_the_classes_they_are_given(tmp_path):
    block = analyse_file(str(write_package(tmp_path))).classes["Block"]
    # ``return name`` is read where it stands, before ``name`` is rebound to a string
    assert [c.kind for c in block.bindings["act"]] == ["torch.nn.SiLU"]
    # BatchNorm2d -> "batchnorm2d" -> NormAct2d, named by its file in the package
    [bn] = block.bindings["bn"]
    assert bn.kind == "zoo.layers.norm_act.NormAct2d"
    assert bn.context == frozenset()
    # the class's own ``__init__`` defaults fill the arguments the call leaves out
    assert bn.arguments["apply_act"].constant is True


def test_a_partial_keeps_the_keywords_its_caller_bound(tmp_path):
    block = analyse_file(str(write_package(tmp_path))).classes["Block"]
    [bn] = block.bindings["bn_eps"]
    assert bn.kind == "zoo.layers.norm_act.NormAct2d"
    assert bn.arguments["eps"].constant == 1e-3
    assert bn.arguments["apply_act"].constant is False


def test_an_undecided_factory_keeps_the_flow_insensitive_reading(tmp_path):
    block = analyse_file(str(write_package(tmp_path))).classes["Block"]
    # ``flag`` is not known statically: the factory may return GELU, as before
    assert [c.kind for c in block.bindings["gelu"]] == ["torch.nn.GELU"]
