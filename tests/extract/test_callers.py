"""Layer classes a constructor parameter receives from the file's constructions
(``adopter.extract.callers``), as ``__init__`` bindings see them."""

from adopter.extract.printer import format_class
from tests.helpers import extract

CHAIN = """
from torch import nn

class Mlp(nn.Module):
    def __init__(self, dim, act_layer):
        super().__init__()
        self.act = act_layer()

class Block(nn.Module):
    def __init__(self, dim, act_layer, **kwargs):
        super().__init__()
        self.mlp = Mlp(dim, act_layer)

class Net(nn.Module):
    def __init__(self, act_layer=nn.GELU):
        super().__init__()
        self.blocks = nn.ModuleList([Block(8, act_layer=act_layer) for _ in range(2)])
"""


def kinds(structure, cls, attr):
    return [c.kind for c in structure.classes[cls].bindings.get(attr, [])]


def test_a_parameter_without_default_takes_what_every_builder_passes_up_to_a_default():
    structure = extract(CHAIN)
    assert kinds(structure, "Mlp", "act") == ["torch.nn.GELU"]


def test_builders_passing_different_classes_give_alternatives_of_one_branch_point():
    structure = extract(
        CHAIN
        + """
class Other(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = Mlp(4, nn.ReLU)
"""
    )
    alternatives = structure.classes["Mlp"].bindings["act"]
    assert [c.kind for c in alternatives] == ["torch.nn.GELU", "torch.nn.ReLU"]
    assert alternatives[0].context != alternatives[1].context
    text = format_class(structure.classes["Mlp"], labels=structure.branch_labels)
    assert "act_layer" in text


def test_one_builder_passing_an_unknown_value_leaves_the_parameter_unknown():
    for builder in (
        "Mlp(4, make_act())",  # a call
        "Mlp(4, **options)",  # may or may not carry it
        "Mlp(*args)",  # a starred argument before its position
        "Mlp(4)",  # nothing passed, and no default
    ):
        structure = extract(
            CHAIN
            + f"""
class Other(nn.Module):
    def __init__(self, options, args):
        super().__init__()
        self.mlp = {builder}
"""
        )
        assert kinds(structure, "Mlp", "act") == ["act_layer"], builder  # the unresolved name


def test_a_class_built_nowhere_or_in_a_cycle_learns_nothing():
    structure = extract(
        """
        from torch import nn
        class Lonely(nn.Module):
            def __init__(self, act_layer):
                super().__init__()
                self.act = act_layer()
        class Net(nn.Module):
            def __init__(self, act_layer=nn.GELU):
                super().__init__()
                self.a = A(act_layer)
        class A(nn.Module):
            def __init__(self, act_layer):
                super().__init__()
                self.act = act_layer()
                self.b = B(act_layer)
        class B(nn.Module):
            def __init__(self, act_layer):
                super().__init__()
                self.a = A(act_layer)
        """
    )
    assert kinds(structure, "Lonely", "act") == ["act_layer"]
    # Net passes GELU to A, but B builds A too, from what A passes B: the cycle decides nothing
    assert kinds(structure, "A", "act") == ["act_layer"]
