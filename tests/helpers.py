"""Shared helpers: scan a snippet of model source with the built-in or given rules; tell
whether a process still runs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from adopter.dsl import parse_rules
from adopter.extract import analyse_source
from adopter.match import Matcher, Site
from adopter.rules import load_rule_set


@pytest.fixture(scope="session")
def paper_rules():
    return load_rule_set("paper")


def scan_snippet(source: str, rules=None, path: str = "model.py") -> list[Site]:
    """All matches (applicable or not) of ``rules`` (default: paper) in dedented source."""
    rules = rules if rules is not None else load_rule_set("paper")
    if isinstance(rules, str):
        rules = parse_rules(rules)
    matcher = Matcher(rules)
    structure = analyse_source(textwrap.dedent(source), path, matcher.opaque_methods)
    return matcher.match_file(structure)


def sites_of(source: str, rule_id: str | None = None, rules=None) -> list[Site]:
    return [
        s
        for s in scan_snippet(source, rules)
        if s.applicable and (rule_id is None or s.rule.id == rule_id)
    ]


def extract(source: str, opaque=()):
    return analyse_source(textwrap.dedent(source), "model.py", opaque)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper counts as ended); Linux ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
