"""A kernel call inserted by the rewrite always calls the kernel: no binding the edited code can
see (a parameter, a local, a loop/with/except/match target, a nested def, a module name, a
global the module reads) captures its name; the import takes a fresh alias."""

from __future__ import annotations

import ast
import textwrap

import pytest

torch = pytest.importorskip("torch")

from adopter.match import Matcher  # noqa: E402
from adopter.rewrite import rewrite_text  # noqa: E402
from adopter.rules import load_rule_set  # noqa: E402

HEAD = """\
import torch
from torch import nn
import torch.nn.functional as F
"""

# A softmax site (paper.4) whose method binds the kernel's name `softmax` in the way each case
# says; the binding holds something else, so a captured call raises or computes another value.
SOFTMAX_CASES = {
    "parameter": ("def forward(self, scores, softmax=None):", ""),
    "keyword-only parameter": ("def forward(self, scores, *, softmax=1):", ""),
    "local assignment": ("def forward(self, scores):", "softmax = 3"),
    "for target": ("def forward(self, scores):", "for softmax in range(2):\n    pass"),
    "with target": (
        "def forward(self, scores):",
        "import contextlib\nwith contextlib.nullcontext(5) as softmax:\n    pass",
    ),
    "except target": (
        "def forward(self, scores):",
        "try:\n    raise ValueError\nexcept ValueError as softmax:\n    pass",
    ),
    "nested def": ("def forward(self, scores):", "def softmax(x):\n    return x * 0"),
    "local import": ("def forward(self, scores):", "from math import pi as softmax"),
    "walrus": ("def forward(self, scores):", "if (softmax := 7):\n    pass"),
    "match capture": (
        "def forward(self, scores):",
        "match 4:\n    case softmax:\n        pass",
    ),
}


def _module(signature: str, binding: str) -> str:
    body = textwrap.indent(textwrap.dedent(binding), " " * 8) + "\n" if binding else ""
    return (
        HEAD
        + "\n\nclass Attention(nn.Module):\n"
        + f"    {signature}\n"
        + body
        + "        return F.softmax(scores, dim=-1)\n"
    )


def _rewrite(text: str, rule_set: str = "paper"):
    return rewrite_text(text, "model.py", Matcher(load_rule_set(rule_set)))


def _run(text: str, inputs: torch.Tensor) -> torch.Tensor:
    namespace: dict[str, object] = {"__name__": "model_under_test"}
    exec(compile(text, "model.py", "exec"), namespace)
    module = namespace["Attention"]()
    return module(inputs)


@pytest.mark.parametrize("case", sorted(SOFTMAX_CASES))
def test_a_binding_of_the_kernels_name_in_the_method_gets_a_fresh_alias(case):
    original = _module(*SOFTMAX_CASES[case])
    result = _rewrite(original)
    assert [r.status for r in result.results] == ["patched"], result.results
    patched = result.patched
    assert "from adopter.kernels import softmax as adopter_softmax" in patched
    assert "return adopter_softmax(scores, dim=-1)" in patched
    inputs = torch.randn(2, 5)
    torch.testing.assert_close(_run(patched, inputs), _run(original, inputs))
    assert not _rewrite(patched).changed  # the alias is known as the kernel: nothing to redo


def test_a_global_the_module_reads_elsewhere_is_not_rebound_by_the_import():
    # `softmax` here is a builtin-like global the module expects to find at run time (a star
    # import or injected name): importing the kernel as `softmax` would change `other`.
    original = HEAD + textwrap.dedent("""
        from math import *

        def other(x):
            return softmax(x)

        class Attention(nn.Module):
            def forward(self, scores):
                return F.softmax(scores, dim=-1)
        """)
    patched = _rewrite(original).patched
    tree = ast.parse(patched)
    imports = [
        n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "adopter.kernels"
    ]
    assert [(a.name, a.asname) for a in imports[0].names] == [("softmax", "adopter_softmax")]


def test_the_alias_itself_is_fresh():
    original = _module("def forward(self, scores, softmax=None, adopter_softmax=None):", "")
    patched = _rewrite(original).patched
    assert "from adopter.kernels import softmax as adopter_softmax_2" in patched
    inputs = torch.randn(2, 5)
    torch.testing.assert_close(_run(patched, inputs), _run(original, inputs))


def test_an_existing_kernel_import_that_a_local_shadows_is_not_reused():
    original = "from adopter.kernels import softmax\n" + _module(
        "def forward(self, scores):", "softmax = 3"
    )
    patched = _rewrite(original).patched
    assert "return adopter_softmax(scores, dim=-1)" in patched
    inputs = torch.randn(2, 5)
    torch.testing.assert_close(_run(patched, inputs), _run(original, inputs))


def test_an_existing_kernel_import_nothing_shadows_is_still_reused():
    original = "from adopter.kernels import softmax\n" + _module("def forward(self, scores):", "")
    patched = _rewrite(original).patched
    assert "return softmax(scores, dim=-1)" in patched
    assert patched.count("adopter.kernels") == 1 and "adopter_softmax" not in patched


def test_a_binding_in_another_class_does_not_force_an_alias():
    original = _module("def forward(self, scores):", "") + textwrap.dedent("""

        class Other(nn.Module):
            def forward(self, softmax):
                return softmax
        """)
    patched = _rewrite(original).patched
    assert "from adopter.kernels import softmax\n" in patched


RMS_NORM = HEAD + textwrap.dedent("""
    class RMSNorm(nn.Module):
        def __init__(self, hidden_size, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden_size))
            self.variance_epsilon = eps

        def forward(self, hidden_states, rms_norm=None):
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return self.weight * hidden_states.to(input_dtype)
    """)


def test_a_modern_kernel_name_is_kept_hygienic_too():
    result = _rewrite(RMS_NORM, "all")
    assert any(r.status == "patched" for r in result.results), result.results
    assert "import rms_norm as adopter_rms_norm" in result.patched
    namespace: dict[str, object] = {}
    exec(compile(RMS_NORM, "model.py", "exec"), namespace)
    original = namespace["RMSNorm"](8)
    exec(compile(result.patched, "model.py", "exec"), namespace)
    patched = namespace["RMSNorm"](8)
    patched.load_state_dict(original.state_dict())
    inputs = torch.randn(2, 3, 8)
    torch.testing.assert_close(patched(inputs), original(inputs))


NAME_READS = """
import torch
softmax = None

def top():
    return softmax(1) + adopter_softmax + other

class Holder:
    def method(self, softmax):
        def inner():
            return softmax, adopter_softmax_2, gelu
        return inner

def binds():
    gelu = 1
    return gelu
"""


@pytest.mark.parametrize(
    "kernels", [["softmax"], ["gelu"], ["dropout_add_layer_norm"], [], ["softmax", "gelu"]]
)
def test_reads_limited_to_the_kernels_are_the_full_reads_of_those_names(kernels):
    # The narrowed analysis apply uses must answer exactly as the full one for every name
    # it is asked about: the kernels and their fresh_alias spellings.
    from adopter.rewrite.names import ALIAS_PREFIX, names_a_kernel_import_must_avoid

    tree = ast.parse(NAME_READS)
    full = names_a_kernel_import_must_avoid(tree, set())
    narrow = names_a_kernel_import_must_avoid(tree, set(), kernels)
    asked = {name for name in full if name in kernels or name.startswith(ALIAS_PREFIX)}
    assert {name for name in narrow if name in kernels or name.startswith(ALIAS_PREFIX)} == asked
    assert narrow <= full
    if "gelu" in kernels:
        assert "gelu" in narrow  # read as a global in Holder.method.inner
    assert "adopter_softmax" in narrow and "adopter_softmax_2" in narrow
