"""A module whose running code is not what its file compiles to now (edited after import,
upgraded in place) is left unpatched, with the reason logged."""

from __future__ import annotations

import importlib
import logging

import torch

import adopter
from adopter.runtime import patching

from .models import BLOCKS


def _edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_a_module_edited_after_import_is_left_unpatched(make_package, caplog):
    package = make_package("rt_edited", {"blocks.py": BLOCKS})
    blocks = importlib.import_module("rt_edited.blocks")
    # The file changes under the running module: the running Scores.forward is not the file's.
    _edit(package / "blocks.py", "F.softmax(scores, dim=-1)", "F.softmax(scores * 2, dim=-1)")
    caplog.set_level(logging.INFO, logger="adopter")

    report = adopter.patch(blocks, rules="paper")

    assert report.patched == {}
    reason = report.skipped["rt_edited.blocks"]
    assert "Scores.forward" in reason and "not what" in reason
    assert "left rt_edited.blocks unpatched" in caplog.text
    assert blocks.Scores()(torch.zeros(1, 2)).tolist() == [[0.5, 0.5]]  # still the running code
    assert not hasattr(blocks, "softmax")


def test_a_module_upgraded_in_place_after_import_is_left_unpatched(make_package, caplog):
    package = make_package("rt_upgraded", {"blocks.py": BLOCKS})
    blocks = importlib.import_module("rt_upgraded.blocks")
    # An upgrade replaces the file (a new inode), with one more line at the top: every
    # function of the file moved, the patched ones included.
    upgraded = package / "blocks.py.new"
    upgraded.write_text('"""Version 2."""\n' + (package / "blocks.py").read_text())
    upgraded.replace(package / "blocks.py")
    caplog.set_level(logging.INFO, logger="adopter")

    report = adopter.patch(blocks, rules="paper")

    assert report.patched == {}
    assert "not what" in report.skipped["rt_upgraded.blocks"]
    assert "left rt_upgraded.blocks unpatched" in caplog.text
    assert not hasattr(blocks, "dropout_add_layer_norm")
    assert patching.patched_modules() == {}


def test_an_unchanged_module_whose_other_functions_are_edited_is_refused_too(make_package):
    # Model.__init__ is not rewritten, but the analysis read it: it must be the running one.
    package = make_package("rt_edited_init", {"blocks.py": BLOCKS})
    blocks = importlib.import_module("rt_edited_init.blocks")
    _edit(package / "blocks.py", "self.out = Output(hidden)", "self.out = Output(hidden * 2)")
    report = adopter.patch(blocks, rules="paper")
    assert "Model.__init__" in report.skipped["rt_edited_init.blocks"]
