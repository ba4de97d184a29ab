"""Consistency of the built-in rule files: each is documented, named after its id, and calls
kernels that exist. A rule that names a missing kernel would load, scan, and make ``apply``
write a call to nothing."""

from __future__ import annotations

import re

import pytest

from adopter.dsl import load_rule_file
from adopter.rules import RULE_SETS, RULES_DIR, load_rule_set, rule_files

kernels = pytest.importorskip("adopter.kernels")
ALL_FILES = sorted(RULES_DIR.glob("*.adopt"))
FILE_NAME = re.compile(r"^(?P<set>[a-z]+)_(?P<number>[0-9]+)_[a-z0-9_]+$")
KERNEL_NAME = re.compile(r"adopter\.kernels\.([A-Za-z_][A-Za-z0-9_]*)")


def _ids(paths):
    return [path.stem for path in paths]


@pytest.mark.parametrize("path", ALL_FILES, ids=_ids(ALL_FILES))
def test_rule_file_is_named_after_its_single_rule(path):
    name = FILE_NAME.match(path.stem)
    assert name, f"{path.name}: rule files are named <set>_<number>_<what>.adopt"
    rules = load_rule_file(path)
    assert len(rules) == 1, f"{path.name}: one rule per file"
    prefix = {"paper": "paper", "ext": "ext"}.get(name["set"], name["set"])
    assert rules[0].id == f"{prefix}.{int(name['number'])}"


@pytest.mark.parametrize("path", ALL_FILES, ids=_ids(ALL_FILES))
def test_rule_file_documents_what_why_and_before_after(path):
    (rule,) = load_rule_file(path)
    for heading in ("What it does:", "Why:", "Before:", "After", "Site:"):
        assert re.search(rf"^{heading}.*", rule.doc, re.MULTILINE), f"{path.name}: no {heading!r}"
    assert rule.name and rule.description


@pytest.mark.parametrize("path", ALL_FILES, ids=_ids(ALL_FILES))
def test_rule_kernels_exist(path):
    (rule,) = load_rule_file(path)
    named = set(KERNEL_NAME.findall(rule.kernel))
    for section in (rule.init, rule.forward):
        if section is not None and isinstance(section.replacement, tuple):
            named.update(KERNEL_NAME.findall(" ".join(map(str, section.replacement))))
    assert named, f"{path.name}: names no adopter.kernels function"
    missing = sorted(name for name in named if name not in kernels.__all__)
    assert not missing, f"{path.name}: no such kernel in adopter.kernels: {missing}"
    for name in named:
        assert callable(getattr(kernels, name))


def test_every_rule_file_belongs_to_a_set_and_all_is_every_file():
    in_sets = {path for name in RULE_SETS if name != "all" for path in rule_files(name)}
    assert in_sets == set(ALL_FILES)
    assert set(rule_files("all")) == set(ALL_FILES)


def test_rule_ids_are_unique_and_ordered_by_number_within_a_set():
    ids = [rule.id for rule in load_rule_set("all")]
    assert len(ids) == len(set(ids))
    for name in RULE_SETS:
        numbers = [int(rule.id.split(".")[1]) for rule in load_rule_set(name) if "." in rule.id]
        prefixes = [rule.id.split(".")[0] for rule in load_rule_set(name)]
        for prefix in set(prefixes):
            own = [n for n, p in zip(numbers, prefixes) if p == prefix]
            assert own == sorted(own)


def test_an_unknown_rule_set_is_named_in_the_error():
    with pytest.raises(KeyError, match="known: all, extended, modern, paper"):
        rule_files("newest")
