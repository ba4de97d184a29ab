"""Fresh patches only: a cached rewrite is used only while every file its analysis read is
unchanged, a cache entry of the wrong shape is rewritten (never raised), and a module whose
running code is not its file's is left unpatched."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
import torch

import adopter

from .models import BLOCKS

HELPERS = """
import torch


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
"""

ROPE = """
from .helpers import rotate_half


def apply_rotary(q, cos, sin):
    return (q * cos) + (rotate_half(q) * sin)
"""


def _forget(package: str) -> None:
    """Drop the package's modules, as a new process would start without them."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 3, 8, generator=generator) for _ in range(3))  # type: ignore


def test_an_edited_helper_in_another_file_invalidates_the_cached_rewrite(make_package):
    package = make_package("rt_fresh_helper", {"helpers.py": HELPERS, "rope.py": ROPE})
    rope = importlib.import_module("rt_fresh_helper.rope")
    first = adopter.patch(rope, rules="modern", select="modern.3")
    assert first.patched == {"rt_fresh_helper.rope": ["modern.3 apply_rotary line 5"]}
    adopter.unpatch()
    # The helper now computes something else: no longer the rotation the kernel fuses.
    helper = package / "helpers.py"
    helper.write_text(helper.read_text().replace("dim=-1)", "dim=-1) + 8"), encoding="utf-8")
    _forget("rt_fresh_helper")
    rope = importlib.import_module("rt_fresh_helper.rope")
    q, cos, sin = _inputs()
    expected = rope.apply_rotary(q, cos, sin)

    second = adopter.patch(rope, rules="modern", select="modern.3")

    assert second.patched == {}
    torch.testing.assert_close(rope.apply_rotary(q, cos, sin), expected)


# Well-formed JSON of the wrong shape, as an older Adopter or another program might leave.
BAD_ENTRIES = {
    "an extra field": lambda r: {**r, "unexpected": 1},
    "a missing field": lambda r: {k: v for k, v in r.items() if k != "sites"},
    "sites not a list": lambda r: {**r, "sites": "paper.4"},
    "a site missing its status": lambda r: {
        **r,
        "sites": [{k: v for k, v in s.items() if k != "status"} for s in r["sites"]],
    },
    "a site line as text": lambda r: {**r, "sites": [{**s, "line": "21"} for s in r["sites"]]},
    "patched text a number": lambda r: {**r, "patched": 7},
    "wrapped entries of the wrong shape": lambda r: {**r, "wrapped": [["Output", "dense"]]},
    "depends not a mapping": lambda r: {**r, "depends": ["/no/such/file.py"]},
    "a list instead of a record": lambda r: [r],
    "a bare string": lambda r: "patched",
    "the format as a boolean": lambda r: {**r, "format": True},
}


@pytest.mark.parametrize("shape", list(BAD_ENTRIES))
def test_a_cache_entry_of_the_wrong_shape_is_ignored_and_rewritten(
    shape, make_package, private_cache
):
    make_package("rt_bad_entry", {"blocks.py": BLOCKS})
    blocks = importlib.import_module("rt_bad_entry.blocks")
    expected = adopter.patch(blocks, rules="paper").patched
    adopter.unpatch()
    entries = sorted(private_cache.glob("*.json"))
    good = {entry: json.loads(entry.read_text()) for entry in entries}
    for entry, record in good.items():
        entry.write_text(json.dumps(BAD_ENTRIES[shape](record)))
    _forget("rt_bad_entry")
    blocks = importlib.import_module("rt_bad_entry.blocks")

    report = adopter.patch(blocks, rules="paper")  # no exception

    assert report.patched == expected
    assert all(not o.reason for o in report.modules)
    assert {entry: json.loads(entry.read_text()) for entry in entries} == good  # rewritten
