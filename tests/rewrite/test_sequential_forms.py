"""nn.Sequential elements are indexed as they exist, however the container is built.

Each fixture builds a Linear + BatchNorm1d pair (paper.8) inside an ``nn.Sequential`` in one
construction form. Where the element indexes are static, the rewrite indexes the container and
the patched model must run and match the original for every constructor setting; where they
are not, the site must be skipped with a reason, never indexed by a guess. Regression for a
conditional element counted twice (``nn.ReLU() if act else nn.Identity()``), which made the
rewrite call ``self.body[4]`` on a four-element container (IndexError at run time).
"""

from __future__ import annotations

import textwrap

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set

HEAD = """\
from collections import OrderedDict

import torch
from torch import nn
"""

# name -> (class body, constructor keyword settings, "patched" or a fragment of the skip reason)
FORMS: dict[str, tuple[str, list[dict], str]] = {
    "conditional_element": (
        """
        class Model(nn.Module):
            def __init__(self, act=True):
                super().__init__()
                self.body = nn.Sequential(
                    nn.Linear(4, 4), nn.ReLU() if act else nn.Identity(), nn.Linear(4, 4),
                    nn.BatchNorm1d(4),
                )

            def forward(self, x):
                return self.body(x)
        """,
        [{"act": True}, {"act": False}],
        "patched",
    ),
    "starred_literal": (
        """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(*[nn.ReLU(), nn.Linear(4, 4)], *(nn.BatchNorm1d(4),))

            def forward(self, x):
                return self.body(x)
        """,
        [{}],
        "patched",
    ),
    "starred_local_list": (
        """
        class Model(nn.Module):
            def __init__(self, act=True):
                super().__init__()
                layers = [nn.Identity()]
                layers.append(nn.ReLU() if act else nn.Identity())
                layers += [nn.Linear(4, 4)]
                layers.extend([nn.BatchNorm1d(4)])
                self.body = nn.Sequential(*layers, nn.Tanh())

            def forward(self, x):
                return self.body(x)
        """,
        [{"act": True}, {"act": False}],
        "patched",
    ),
    "ordered_dict": (
        """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(
                    OrderedDict([("act", nn.ReLU()), ("fc", nn.Linear(4, 4)), ("bn", nn.BatchNorm1d(4))])
                )

            def forward(self, x):
                return self.body(x)
        """,
        [{}],
        "patched",
    ),
    "add_module": (
        """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(nn.ReLU())
                self.body.add_module("fc", nn.Linear(4, 4))
                self.body.append(nn.BatchNorm1d(4))
                self.body.add_module("out", nn.Tanh())

            def forward(self, x):
                return self.body(x)
        """,
        [{}],
        "patched",
    ),
    "subclass_super_init": (
        """
        class LinearNorm(nn.Sequential):
            def __init__(self, width, act=True):
                super().__init__(
                    nn.ReLU() if act else nn.Identity(), nn.Linear(width, width),
                    nn.BatchNorm1d(width),
                )


        class Model(nn.Module):
            def __init__(self, act=True):
                super().__init__()
                self.body = LinearNorm(4, act)

            def forward(self, x):
                return self.body(x)
        """,
        [{"act": True}, {"act": False}],
        "patched",
    ),
    "subclass_add_module": (
        """
        class LinearNorm(nn.Sequential):
            def __init__(self, width):
                super().__init__()
                self.add_module("act", nn.ReLU())
                self.add_module("fc", nn.Linear(width, width))
                self.add_module("bn", nn.BatchNorm1d(width))


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = LinearNorm(4)

            def forward(self, x):
                return self.body(x)
        """,
        [{}],
        "patched",
    ),
    "module_list_of_sequentials": (
        """
        class Model(nn.Module):
            def __init__(self, depth=2):
                super().__init__()
                self.layers = nn.ModuleList(
                    [nn.Sequential(nn.ReLU(), nn.Linear(4, 4), nn.BatchNorm1d(4)) for _ in range(depth)]
                )

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return x
        """,
        [{"depth": 2}, {"depth": 0}],
        "patched",
    ),
    "comprehension": (
        """
        class Model(nn.Module):
            def __init__(self, depth=2):
                super().__init__()
                self.body = nn.Sequential(*[nn.Linear(4, 4) for _ in range(depth)], nn.BatchNorm1d(4))

            def forward(self, x):
                return self.body(x)
        """,
        [{"depth": 2}, {"depth": 1}],
        "comprehension",
    ),
    "loop_append": (
        """
        class Model(nn.Module):
            def __init__(self, depth=2):
                super().__init__()
                layers = []
                for _ in range(depth):
                    layers.append(nn.Linear(4, 4))
                    layers.append(nn.BatchNorm1d(4))
                self.body = nn.Sequential(*layers)

            def forward(self, x):
                return self.body(x)
        """,
        [{"depth": 2}],
        "inside a loop or under a condition",
    ),
    "conditional_append": (
        """
        class Model(nn.Module):
            def __init__(self, pre=True):
                super().__init__()
                self.body = nn.Sequential()
                if pre:
                    self.body.append(nn.ReLU())
                self.body.append(nn.Linear(4, 4))
                self.body.append(nn.BatchNorm1d(4))

            def forward(self, x):
                return self.body(x)
        """,
        [{"pre": True}, {"pre": False}],
        "inside a loop or under a condition",
    ),
    "list_from_a_parameter": (
        """
        class Model(nn.Module):
            def __init__(self, extra=()):
                super().__init__()
                self.body = nn.Sequential(*extra, nn.Linear(4, 4), nn.BatchNorm1d(4))

            def forward(self, x):
                return self.body(x)
        """,
        [{}],
        "elements taken from `extra`",
    ),
    "if_else_arms": (
        """
        class Model(nn.Module):
            def __init__(self, wide=True):
                super().__init__()
                if wide:
                    body = [nn.ReLU(), nn.Linear(4, 4)]
                else:
                    body = [nn.Linear(4, 4)]
                self.body = nn.Sequential(*body, nn.BatchNorm1d(4))

            def forward(self, x):
                return self.body(x)
        """,
        [{"wide": True}, {"wide": False}],
        "built under a condition",
    ),
}


def _rewrite(name: str):
    body, _, _ = FORMS[name]
    code = HEAD + textwrap.dedent(body)
    return code, rewrite_text(code, "model.py", Matcher(load_rule_set("paper")))


@pytest.mark.parametrize("name", sorted(FORMS))
def test_each_form_is_indexed_correctly_or_skipped_with_a_reason(name):
    _, rewrite = _rewrite(name)
    expected = FORMS[name][2]
    linear_norm = [r for r in rewrite.results if r.site.rule.id == "paper.8"]
    assert linear_norm, f"{name}: the Linear + BatchNorm1d site was not found"
    if expected == "patched":
        assert [r.status for r in linear_norm] == ["patched"], [r.reason for r in linear_norm]
    else:
        assert all(r.status == "skipped" for r in linear_norm)
        assert expected in linear_norm[0].reason, linear_norm[0].reason
        assert not rewrite.changed


def test_conditional_element_is_one_position():
    """The 12-line reproduction: ``body[2]``/``body[3]`` are the Linear and the BatchNorm."""
    _, rewrite = _rewrite("conditional_element")
    assert "linear_batch_norm(self.body[1](self.body[0](x)), self.body[2], self.body[3])" in (
        rewrite.patched
    )
    assert "self.body[4]" not in rewrite.patched


def _build(code: str, settings: dict):
    torch = pytest.importorskip("torch")
    namespace: dict = {}
    exec(compile(code, "<fixture>", "exec"), namespace)  # noqa: S102 - our own fixture code
    torch.manual_seed(0)
    return namespace["Model"](**settings)


@pytest.mark.parametrize("name", sorted(n for n, form in FORMS.items() if form[2] == "patched"))
@pytest.mark.parametrize("training", [False, True])
def test_patched_form_runs_and_matches(name, training):
    torch = pytest.importorskip("torch")
    code, rewrite = _rewrite(name)
    assert rewrite.changed
    for settings in FORMS[name][1]:
        original = _build(code, settings)
        patched = _build(rewrite.patched, settings)
        patched.load_state_dict(original.state_dict(), strict=True)
        original.train(training)
        patched.train(training)
        inputs = torch.randn(6, 4)
        torch.testing.assert_close(patched(inputs), original(inputs), rtol=1e-5, atol=1e-5)


def test_timm_repghost_indexes_the_elements_that_exist(monkeypatch):
    """timm 1.0.31's RepGhostModule: ``primary_conv`` holds conv, bn and a conditional
    activation (three elements, not four). Fetched from PyPI at run time; skipped offline."""
    from adopter.corpus import FetchError, fetch_wheel

    monkeypatch.setenv("PIP_RETRIES", "1")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "15")
    try:
        root = fetch_wheel("timm==1.0.31")
    except (FetchError, OSError) as error:
        pytest.skip(f"timm==1.0.31 is not available here: {error}")
    path = root / "timm" / "models" / "repghost.py"
    text = path.read_text(encoding="utf-8")
    rewrite = rewrite_text(text, str(path), Matcher(load_rule_set("all")))
    compile(rewrite.patched, str(path), "exec")
    assert (
        "self.primary_conv[2](conv_batch_norm(x, self.primary_conv[0], self.primary_conv[1]))"
        in rewrite.patched
    )
    assert "self.primary_conv[3]" not in rewrite.patched
