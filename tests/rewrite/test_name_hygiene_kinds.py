"""Hygienic kernel names: a name the function already binds (a parameter, a local of any kind,
...) never captures the kernel call the rewrite puts there; the kernel comes in under a fresh
alias instead, and the patched module runs and gives the original's results."""

from __future__ import annotations

import ast
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

from adopter.match import Matcher  # noqa: E402
from adopter.rewrite import SiteStatus, rewrite_text  # noqa: E402
from adopter.rules import load_rule_set  # noqa: E402

HEAD = """\
import torch
from torch import nn
import torch.nn.functional as F
"""


@dataclass(frozen=True)
class RuleSite:
    """One rule's site in a function that ``{params}`` and ``{body}`` bind more names in;
    ``{guard}`` is a parameter that is never ``None`` (a binding under ``if guard is None:``
    never runs and still makes the name local)."""

    rule: str
    rule_set: str
    kernel: str
    guard: str
    code: str
    run: Callable[[types.ModuleType, object | None], object]  # (module, original model)


def _run_model(make_input: Callable[[], object]):
    def run(module: types.ModuleType, original: object | None) -> object:
        torch.manual_seed(0)
        model = module.Model().eval()
        if original is not None:
            model.load_state_dict(original.state_dict(), strict=True)
        torch.manual_seed(1)
        return model, model(make_input())

    return run


def _run_attention(module: types.ModuleType, original: object | None) -> object:
    torch.manual_seed(1)
    owner = torch.nn.Module().eval()
    owner.num_key_value_groups = 2
    query = torch.randn(2, 4, 5, 8)
    key = torch.randn(2, 2, 5, 8)
    value = torch.randn(2, 2, 5, 8)
    output, _ = module.eager_attention_forward(owner, query, key, value, None, 8**-0.5)
    return None, output  # the kernel returns no weights when SDPA runs (as transformers does)


SITES = {
    "paper.4": RuleSite(
        "paper.4",
        "paper",
        "softmax",
        "scores",
        """
class Model(nn.Module):
    def forward(self, scores{params}):
{body}        probs = F.softmax(scores, dim=-1)
        return probs * 2
""",
        _run_model(lambda: torch.randn(2, 3, 5)),
    ),
    "paper.5": RuleSite(
        "paper.5",
        "paper",
        "dropout_add_layer_norm",
        "hidden_states",
        """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.LayerNorm = nn.LayerNorm(4, eps=1e-12)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden_states{params}):
{body}        input_tensor = hidden_states * 2
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
        return hidden_states
""",
        _run_model(lambda: torch.randn(2, 3, 4)),
    ),
    "modern.1": RuleSite(
        "modern.1",
        "modern",
        "rms_norm",
        "hidden_states",
        """
class Model(nn.Module):
    def __init__(self, hidden_size=8, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(hidden_size) + 0.5)
        self.variance_epsilon = eps

    def forward(self, hidden_states{params}):
{body}        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)
""",
        _run_model(lambda: torch.randn(2, 3, 8)),
    ),
    "modern.2": RuleSite(
        "modern.2",
        "modern",
        "gated_mlp",
        "x",
        """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(8, 16, bias=False)
        self.up_proj = nn.Linear(8, 16, bias=False)
        self.down_proj = nn.Linear(16, 8, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x{params}):
{body}        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj
""",
        _run_model(lambda: torch.randn(2, 3, 8)),
    ),
    "modern.4": RuleSite(
        "modern.4",
        "modern",
        "attention_function",
        "query",
        """
def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(
        batch, num_key_value_heads, n_rep, slen, head_dim
    )
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0{params}):
{body}    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights
""",
        _run_attention,
    ),
}

# Extra parameters: each leaves the function callable as before.
PARAMETER_KINDS = {
    "parameter": ", {N}=None",
    "positional-only parameter": ", {N}=None, /",
    "keyword-only parameter": ", *, {N}=None",
    "*args": ", *{N}",
    "**kwargs": ", **{N}",
}
# Statements at the top of the function, under ``if <guard> is None:`` (never true): each makes
# the name local to the whole function, which is what captures the call. ``live`` ones run.
BODY_KINDS = {
    "assignment": "{N} = None",
    "tuple target": "_, {N} = 1, 2",
    "starred target": "*{N}, _ = 1, 2",
    "augmented assignment": "{N} += 1",
    "annotated assignment": "{N}: int = 0",
    "bare annotation": "{N}: int",
    "walrus": "print(({N} := 1))",
    "for target": "for {N} in range(2):\n    pass",
    "del": "del {N}",
    "import in the function": "import math as {N}",
    "from-import in the function": "from math import pi as {N}",
    "nested def": "def {N}():\n    return None",
    "nested class": "class {N}:\n    pass",
    "with ... as": "with open(__file__) as {N}:\n    pass",
    "except ... as": "try:\n    pass\nexcept Exception as {N}:\n    pass",
    "match capture": "match 0:\n    case {N}:\n        pass",
    "match star capture": "match [0]:\n    case [*{N}]:\n        pass",
    "global, rebound": "global {N}\n{N} = None",
    # These bind the name in a scope of their own, which does not capture a call outside it;
    # the kernel is aliased all the same (a replaced expression could sit inside them).
    "comprehension target": "print([{N} for {N} in range(2)])",
    "lambda parameter": "print(lambda {N}: {N})",
    "nested function's parameter": "def helper({N}):\n    return {N}",
}
LIVE_BODY_KINDS = {"global, rebound"}  # runs every call: the module's global is rebound


def _render(
    case: RuleSite, params: str = "", body: str = "", tail: str = "", live: bool = False
) -> str:
    """The case's text with ``params`` added to the function's parameters and ``body`` at the
    top of its body: under the never-true guard, or run on every call when ``live``."""
    indent = "    " if case.rule == "modern.4" else "        "
    lines = ""
    if body and live:
        lines = textwrap.indent(body, indent) + "\n"
    elif body:
        lines = f"{indent}if {case.guard} is None:\n" + textwrap.indent(body, indent + "    ")
        lines += "\n"
    code = case.code.replace("{params}", params).replace("{body}", lines)
    return HEAD + code + tail


def _load(text: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = __file__
    exec(compile(text, f"<{name}>", "exec"), module.__dict__)  # noqa: S102 - our own test code
    return module


def _rewrite(text: str, rule_set: str):
    return rewrite_text(text, "model.py", Matcher(load_rule_set(rule_set)))


def _kernel_imports(text: str) -> dict[str, str]:
    """Local name -> kernel, of the module's ``from adopter.kernels import`` lines."""
    tree = ast.parse(text)
    return {
        alias.asname or alias.name: alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "adopter.kernels"
        for alias in node.names
    }


def _called_names(text: str) -> set[str]:
    return {
        node.func.id
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }


def _check(case: RuleSite, text: str, expected_local: str | None = None) -> str:
    """Patch ``text``: the rule's site is patched, the kernel is called by a name bound to it at
    module level (``expected_local`` when given), the patched module gives the original's
    output, and a second apply changes nothing. Returns the kernel's local name."""
    result = _rewrite(text, case.rule_set)
    statuses = {r.site.rule.id: r.status for r in result.results}
    assert statuses.get(case.rule) is SiteStatus.PATCHED, result.results
    patched = result.patched
    compile(patched, "model.py", "exec", dont_inherit=True)
    bound = [local for local, kernel in _kernel_imports(patched).items() if kernel == case.kernel]
    called = [local for local in bound if local in _called_names(patched)]
    assert len(called) == 1, (called, patched)
    local = called[0]
    if expected_local is not None:
        assert local == expected_local, patched

    original_module = _load(text, "hygiene_original")
    model, expected = case.run(original_module, None)
    patched_module = _load(patched, "hygiene_patched")
    assert getattr(patched_module, local).__module__.startswith("adopter.kernels")
    _, actual = case.run(patched_module, model)
    torch.testing.assert_close(actual, expected)

    again = _rewrite(patched, case.rule_set)
    assert again.patched == patched
    return local


CAPTURE_CASES = [(rule, "parameter", kind) for rule in SITES for kind in PARAMETER_KINDS] + [
    (rule, "body", kind) for rule in SITES for kind in BODY_KINDS
]


@pytest.mark.parametrize(("rule", "where", "kind"), CAPTURE_CASES)
def test_a_binding_of_the_kernels_name_in_the_function_gets_a_fresh_alias(rule, where, kind):
    case = SITES[rule]
    name = case.kernel
    if where == "parameter":
        text = _render(case, params=PARAMETER_KINDS[kind].replace("{N}", name))
    else:
        body = BODY_KINDS[kind].replace("{N}", name)
        text = _render(case, body=body, live=kind in LIVE_BODY_KINDS)
    # A binding in a scope of its own (a lambda's or nested def's parameter, a comprehension
    # target) cannot capture a call outside it: the plain name is right there, an alias too.
    expected = None if kind in SCOPE_OF_ITS_OWN else f"adopter_{name}"
    _check(case, text, expected_local=expected)


SCOPE_OF_ITS_OWN = {"comprehension target", "lambda parameter", "nested function's parameter"}


@pytest.mark.parametrize("rule", list(SITES))
def test_without_a_clash_the_kernel_keeps_its_own_name(rule):
    case = SITES[rule]
    _check(case, _render(case), expected_local=case.kernel)


@pytest.mark.parametrize("rule", list(SITES))
def test_a_binding_in_another_function_does_not_rename_the_kernel(rule):
    case = SITES[rule]
    tail = f"\n\ndef unrelated({case.kernel}=None):\n    return {case.kernel}\n"
    _check(case, _render(case, tail=tail), expected_local=case.kernel)


def test_a_class_attribute_or_method_of_the_kernels_name_is_not_seen_from_the_method():
    case = SITES["paper.4"]
    text = _render(case).replace(
        "class Model(nn.Module):\n",
        "class Model(nn.Module):\n    softmax = None\n\n    def rms_norm(self):\n        pass\n\n",
    )
    _check(case, text, expected_local="softmax")


def test_the_alias_is_fresh_in_every_scope_of_the_module():
    case = SITES["paper.4"]
    # the module binds the first alias (after the place the import goes), a function the second
    tail = "\n\nadopter_softmax = None\n\n\ndef other(adopter_softmax_2=1):\n    return 0\n"
    text = _render(case, params=", softmax=None", tail=tail)
    # `other`'s parameter shadows the import only inside `other`, which never calls the kernel
    assert _check(case, text) not in ("softmax", "adopter_softmax")


def test_a_module_level_binding_inside_a_try_statement_is_seen():
    case = SITES["modern.1"]
    fallback = (
        "try:\n    from no_such_package import rms_norm\nexcept ImportError:\n    rms_norm = None\n"
    )
    text = _render(case).replace(HEAD, HEAD + fallback)
    _check(case, text, expected_local="adopter_rms_norm")


def test_a_star_import_is_never_shadowed_by_the_kernel():
    case = SITES["modern.1"]
    star = "from torch.nn.functional import *\n"
    reader = "\n\ndef extra_norm(t):\n    return rms_norm(t, (t.shape[-1],))\n"
    text = _render(case, tail=reader).replace(HEAD, HEAD + star)
    _check(case, text, expected_local="adopter_rms_norm")
    patched = _load(_rewrite(text, case.rule_set).patched, "hygiene_star")
    assert patched.rms_norm is torch.nn.functional.rms_norm  # the star import's, as before
    t = torch.randn(3, 8)
    torch.testing.assert_close(patched.extra_norm(t), torch.nn.functional.rms_norm(t, (8,)))


def test_a_global_the_module_reads_elsewhere_is_not_rebound():
    case = SITES["paper.4"]
    # a name the module reads as a global but binds only at run time (through globals())
    tail = (
        "\n\nglobals()['softmax'] = lambda t, dim: t\n\n\n"
        "def identity(t):\n    return softmax(t, dim=0)\n"
    )
    text = _render(case, tail=tail)
    _check(case, text, expected_local="adopter_softmax")
    patched = _load(_rewrite(text, case.rule_set).patched, "hygiene_globals")
    t = torch.randn(3, 4)
    torch.testing.assert_close(patched.identity(t), t)


def test_a_module_that_imports_the_kernel_reuses_it_where_nothing_shadows_it():
    case = SITES["paper.4"]
    text = _render(case).replace(HEAD, HEAD + "from adopter.kernels import softmax\n")
    _check(case, text, expected_local="softmax")
    patched = _rewrite(text, case.rule_set).patched
    assert patched.count("from adopter.kernels import") == 1
    assert patched.count("import softmax") == 1


def test_an_imported_kernel_shadowed_at_the_site_is_imported_again_under_an_alias():
    case = SITES["paper.4"]
    text = _render(case, params=", softmax=None").replace(
        HEAD, HEAD + "from adopter.kernels import softmax\n"
    )
    _check(case, text, expected_local="adopter_softmax")
    patched = _rewrite(text, case.rule_set).patched
    assert "from adopter.kernels import softmax, softmax as adopter_softmax" in patched


def test_an_alias_the_module_imports_already_is_reused():
    case = SITES["paper.4"]
    head = HEAD + "from adopter.kernels import softmax as adopter_softmax_7\n"
    text = _render(case, params=", softmax=None").replace(HEAD, head)
    _check(case, text, expected_local="adopter_softmax_7")
    assert _rewrite(text, case.rule_set).patched.count("import softmax") == 1


def test_two_kernels_in_one_module_each_get_their_own_alias():
    first, second = SITES["paper.4"], SITES["modern.1"]
    text = _render(first, params=", softmax=None, rms_norm=None") + second.code.replace(
        "{params}", ", softmax=None, rms_norm=None"
    ).replace("{body}", "").replace("class Model(", "class Norm(")
    result = rewrite_text(text, "model.py", Matcher(load_rule_set("all")))
    imports = _kernel_imports(result.patched)
    assert imports == {"adopter_softmax": "softmax", "adopter_rms_norm": "rms_norm"}
    module = _load(result.patched, "hygiene_two")
    torch.manual_seed(0)
    norm = module.Norm()
    x = torch.randn(2, 8)
    expected = _load(text, "hygiene_two_original")
    reference = expected.Norm()
    reference.load_state_dict(norm.state_dict())
    torch.testing.assert_close(norm(x), reference(x))
    torch.testing.assert_close(module.Model()(x), expected.Model()(x))


# -- the analysis itself --------------------------------------------------------------------
CLOSURES = """
def outer():
    softmax = None

    def inner(x):
        return x

    class Local:
        def method(self, x):
            return x

    return inner, Local


def with_nonlocal():
    rms_norm = 1

    def inner(x):
        nonlocal rms_norm
        return x

    return inner


class Owner:
    softmax = None

    def method(self, x):
        return x
"""


def _function(tree: ast.AST, *path: str) -> ast.FunctionDef:
    """The function at ``path`` (names of the definitions it is nested in, then its own)."""
    node = tree
    for name in path:
        node = next(
            child
            for child in ast.iter_child_nodes(node)
            if isinstance(child, (ast.FunctionDef, ast.ClassDef)) and child.name == name
        )
    assert isinstance(node, ast.FunctionDef)
    return node
