"""Each structure-extraction feature on a small fixture of our own."""

import pytest

from adopter.extract import SourceError, analyse_source
from adopter.extract.printer import format_class, paths_of
from tests.helpers import extract


def kinds(flow):
    return [s.kind for s in flow.steps if not s.transparent]


@pytest.mark.parametrize(
    "header",
    [
        "import torch.nn as nn",
        "from torch import nn",
        "import torch\nnn = None\nfrom torch import nn",
    ],
)
def test_import_aliases_resolve_to_torch_nn(header):
    structure = extract(
        f"""
        {header.replace(chr(10), chr(10) + "        ")}
        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(4, 4)
            def forward(self, x):
                return self.proj(x)
        """
    )
    info = structure.classes["Block"]
    assert info.is_module
    assert [c.kind for c in info.bindings["proj"]] == ["torch.nn.Linear"]
    assert kinds(info.flows["forward"]) == ["torch.nn.Linear"]


def test_torch_nn_and_functional_aliases():
    structure = extract(
        """
        import torch
        import torch.nn.functional as F
        from torch.nn import functional as G
        from torch import nn

        class A(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = torch.nn.LayerNorm(8)
            def forward(self, x):
                a = F.softmax(x, dim=-1)
                b = nn.functional.softmax(x, -1)
                c = G.softmax(x, dim=-1)
                d = torch.nn.functional.softmax(x, dim=-1)
                e = torch.softmax(x, -1)
                f = x.softmax(dim=-1)
                return self.norm(a + b + c + d + e + f)
        """
    )
    flow = structure.classes["A"].flows["forward"]
    softmaxes = [s for s in flow.steps if "softmax" in s.kind]
    # every spelling is one canonical callee
    assert [s.kind for s in softmaxes] == ["torch.nn.functional.softmax"] * 6
    # keyword or positional, the dimension is known by name
    assert all(s.arguments["dim"].constant == -1 for s in softmaxes)
    assert structure.classes["A"].bindings["norm"][0].kind == "torch.nn.LayerNorm"


def test_module_classes_detected_through_local_and_imported_bases():
    structure = extract(
        """
        from torch import nn
        from ...modeling_utils import PreTrainedModel

        class Base(nn.Module):
            pass
        class Child(Base):
            pass
        class Model(PreTrainedModel):
            def forward(self, x):
                return x
        class Plain:
            def forward(self, x):
                return x
        """
    )
    assert structure.classes["Child"].is_module
    assert structure.classes["Model"].is_module
    assert not structure.classes["Plain"].is_module


def test_conditional_bindings_are_alternatives_with_contexts():
    structure = extract(
        """
        from torch import nn
        class Layer(nn.Module):
            def __init__(self, config):
                super().__init__()
                if config.use_bn:
                    self.norm = nn.BatchNorm2d(8)
                else:
                    self.norm = nn.Identity()
        """
    )
    alternatives = structure.classes["Layer"].bindings["norm"]
    assert [c.kind for c in alternatives] == ["torch.nn.BatchNorm2d", "torch.nn.Identity"]
    assert alternatives[0].context != alternatives[1].context
    text = format_class(structure.classes["Layer"], labels=structure.branch_labels)
    assert "when config.use_bn" in text and "when not (config.use_bn)" in text


def test_activation_lookup_alias_helper_class_and_containers():
    structure = extract(
        """
        from torch import nn
        from ...activations import ACT2FN, get_activation

        def make_conv(channels):
            return nn.Conv2d(channels, channels, 3)

        class Helper(nn.Module):
            def __init__(self):
                super().__init__()
                self.dense = nn.Linear(2, 2)
            def forward(self, x):
                return self.dense(x)

        class Net(nn.Module):
            def __init__(self, config):
                super().__init__()
                act = ACT2FN[config.hidden_act]
                self.act = act
                self.other = get_activation("gelu")
                self.helper = Helper()
                self.conv = make_conv(4)
                self.layers = nn.ModuleList([Helper() for _ in range(3)])
                self.seq = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
                self.extra = nn.ModuleList()
                self.extra.append(nn.ReLU())
        """
    )
    bindings = structure.classes["Net"].bindings
    assert bindings["act"][0].kind == "activations.ACT2FN[config.hidden_act]"
    assert bindings["other"][0].kind == "activations.get_activation"
    assert bindings["helper"][0].kind == "Helper"
    assert bindings["conv"][0].kind == "torch.nn.Conv2d"
    assert bindings["layers"][0].container == "list"
    assert [e.kind for e in bindings["layers"][0].elements] == ["Helper"]
    assert [e.kind for e in bindings["seq"][0].elements] == [
        "torch.nn.Linear",
        "torch.nn.BatchNorm1d",
    ]
    assert [e.kind for e in bindings["extra"][0].elements] == ["torch.nn.ReLU"]


def test_temporaries_and_reassignments_follow_values_not_names():
    structure = extract(
        """
        from torch import nn
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(2, 2)
                self.b = nn.ReLU()
            def forward(self, x):
                h = self.a(x)
                y = h
                h = x * 2
                return self.b(y), h
        """
    )
    flow = structure.classes["M"].flows["forward"]
    (linear,) = [s for s in flow.steps if s.kind == "torch.nn.Linear"]
    (relu,) = [s for s in flow.steps if s.kind == "torch.nn.ReLU"]
    assert {f.value for f in relu.positional[0].flows} == {linear.output}


def test_methods_functions_and_submodule_forward_are_inlined():
    structure = extract(
        """
        from torch import nn
        import torch.nn.functional as F

        def helper(x):
            return F.softmax(x, dim=-1)

        class Inner(nn.Module):
            def __init__(self):
                super().__init__()
                self.dense = nn.Linear(2, 2)
            def forward(self, x):
                return self.dense(x)

        class Outer(nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = Inner()
                self.act = nn.GELU()
            def _project(self, x):
                return self.inner(x)
            def forward(self, x):
                h = self._project(x)
                return helper(self.act(h))
        """
    )
    flow = structure.classes["Outer"].flows["forward"]
    assert kinds(flow) == ["torch.nn.Linear", "torch.nn.GELU", "torch.nn.functional.softmax"]
    dense = flow.steps[[s.kind for s in flow.steps].index("torch.nn.Linear")]
    assert dense.module == "self.inner.dense"
    assert dense.inline_chain == ("_project", "forward")
    gelu = next(s for s in flow.steps if s.kind == "torch.nn.GELU")
    assert {f.value for f in gelu.positional[0].flows} == {dense.output}


def test_recursion_and_depth_are_bounded():
    structure = extract(
        """
        from torch import nn
        class R(nn.Module):
            def loop(self, x):
                return self.loop(x) + 1
            def forward(self, x):
                return self.loop(x)
        """
    )
    flow = structure.classes["R"].flows["forward"]
    assert "self.loop" in kinds(flow)  # the recursive call stays an opaque step


def test_branches_give_one_sequence_per_path():
    structure = extract(
        """
        from torch import nn
        class DPTLike(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(2, 2, 1)
                self.bn = nn.BatchNorm2d(2)
                self.act = nn.ReLU()
            def forward(self, x, use_bn: bool):
                h = self.conv(x)
                if use_bn:
                    h = self.bn(h)
                return self.act(h)
        """
    )
    flow = structure.classes["DPTLike"].flows["forward"]
    paths, truncated = paths_of(flow, 8)
    assert not truncated
    assert sorted([s.kind.split(".")[-1] for s in p] for p in paths) == [
        ["Conv2d", "BatchNorm2d", "ReLU"],
        ["Conv2d", "ReLU"],
    ]
    relu = next(s for s in flow.steps if s.kind == "torch.nn.ReLU")
    assert len(relu.positional[0].flows) == 2  # from bn (if taken) or from conv (if not)


def test_path_printing_is_bounded():
    branches = "\n".join(f"        if flag{i}:\n            x = self.act(x)" for i in range(12))
    structure = extract(
        "from torch import nn\n"
        "class Many(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.act = nn.ReLU()\n"
        "    def forward(self, x):\n"
        + branches.replace("        ", "        ")
        + "\n        return x\n"
    )
    paths, truncated = paths_of(structure.classes["Many"].flows["forward"], 4)
    assert len(paths) == 4 and truncated


def test_early_return_constrains_the_rest():
    structure = extract(
        """
        from torch import nn
        class E(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.ReLU()
                self.b = nn.GELU()
            def forward(self, x, fast):
                if fast:
                    return self.a(x)
                return self.b(x)
        """
    )
    flow = structure.classes["E"].flows["forward"]
    relu = next(s for s in flow.steps if s.kind == "torch.nn.ReLU")
    gelu = next(s for s in flow.steps if s.kind == "torch.nn.GELU")
    ((point, arm_a),) = relu.context
    assert (point, 1 - arm_a) in gelu.context


def test_invalid_python_is_located():
    with pytest.raises(SourceError) as caught:
        analyse_source("class A(:\n    pass\n", "broken.py")
    assert str(caught.value).startswith("broken.py:1:")
    assert "invalid Python" in str(caught.value)


def test_structure_printer_uses_dsl():
    structure = extract(
        """
        from torch import nn
        class S(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.dense = nn.Linear(config.h, config.h)
            def forward(self, hidden_states):
                hidden_states = self.dense(hidden_states)
                return hidden_states
        """
    )
    text = format_class(structure.classes["S"])
    assert "@torch.nn.Linear(config.h, config.h) -> $dense;" in text
    assert "torch.nn.Linear($hidden_states) -> $hidden_states_1  # self.dense" in text


def test_static_rank_turns_dim_3_of_a_4d_tensor_into_the_last_dimension():
    structure = extract(
        """
        import torch
        from torch import nn
        class A(nn.Module):
            def forward(self, q, k, mask):
                scores = torch.einsum("ibnd,jbnd->bnij", q, k)
                scores = scores * 0.5 - 1e30 * torch.einsum("ijbn->bnij", mask)
                last = nn.functional.softmax(scores, dim=3)
                other = nn.functional.softmax(scores, dim=1)
                flat = scores.reshape(scores.shape[0], -1)
                return last, other, nn.functional.softmax(flat, dim=1)
        """
    )
    flow = structure.classes["A"].flows["forward"]
    dims = [s.arguments["dim"].constant for s in flow.steps if s.kind.endswith("softmax")]
    assert dims == [-1, 1, -1]
