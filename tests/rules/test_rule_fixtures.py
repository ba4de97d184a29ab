"""Every rule file has a fixture of marked cases and a reviewed snapshot of what scan reports and
apply writes for it (Ruff-style fixtures and snapshots, ast-grep-style valid/invalid cases).

Regenerate snapshots after an intended change with
``ADOPTER_UPDATE_SNAPSHOTS=1 python -m pytest tests/rules/test_rule_fixtures.py`` and review
the snapshot diff like code.
"""

from __future__ import annotations

import difflib
import os

import pytest

from adopter.dsl import load_rule_file
from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import RULES_DIR, rule_files
from tests.helpers import scan_snippet
from tests.rules.fixture_cases import FIXTURES, fixture_path, read_fixture, snapshot_path

RULE_FILES = rule_files("all")
UPDATE = os.environ.get("ADOPTER_UPDATE_SNAPSHOTS") == "1"


def _ids(paths):
    return [path.stem for path in paths]


def test_every_fixture_belongs_to_a_rule_file():
    stems = {path.stem for path in RULES_DIR.glob("*.adopt")}
    orphans = sorted(path.name for path in FIXTURES.glob("*.py") if path.stem not in stems)
    assert not orphans, f"fixtures without a rule file: {orphans}"


@pytest.mark.parametrize("rule_file", RULE_FILES, ids=_ids(RULE_FILES))
def test_fixture_cases_report_exactly_the_marked_lines(rule_file):
    fixture = fixture_path(rule_file)
    assert fixture.exists(), f"{rule_file.name} has no fixture: add {fixture}"
    rules = load_rule_file(rule_file)
    cases = read_fixture(fixture)
    assert any(case.sites for case in cases), f"{fixture.name}: no case marks a site"
    for case in cases:
        found = scan_snippet(case.source, rules, path=fixture.name)
        applicable = sorted(site.line for site in found if site.applicable)
        not_applicable = sorted(site.line for site in found if not site.applicable)
        assert (applicable, not_applicable) == (case.sites, case.not_applicable), case.title


def _snapshot(rule_file) -> str:
    return snapshot_text(fixture_path(rule_file), load_rule_file(rule_file))


def snapshot_text(fixture, rules) -> str:
    """What scan reports and apply writes for each case of ``fixture`` under ``rules``."""
    matcher = Matcher(rules)
    out = [
        f"# What scan reports and apply writes for tests/rules/fixtures/{fixture.name}.",
        "# Regenerate: ADOPTER_UPDATE_SNAPSHOTS=1 python -m pytest tests/rules/test_rule_fixtures.py",
    ]
    for case in read_fixture(fixture):
        out += ["", f"## {case.title}"]
        for site in sorted(scan_snippet(case.source, rules, path=fixture.name), key=_where):
            where = f"{site.cls}.{site.method}" if site.cls else site.method
            state = "applicable" if site.applicable else f"not applicable: {site.reason}"
            out.append(f"scan {site.line}:{site.column} {site.rule.id} in {where}: {state}")
        rewrite = rewrite_text(case.source, fixture.name, matcher)
        assert rewrite.error is None, rewrite.error
        for result in sorted(rewrite.results, key=lambda r: _where(r.site)):
            reason = f": {result.reason}" if result.reason else ""
            out.append(f"apply {result.site.line}:{result.site.column} {result.status}{reason}")
        if rewrite.changed:
            compile(rewrite.patched, fixture.name, "exec")
            again = rewrite_text(rewrite.patched, fixture.name, matcher)
            assert not again.changed, f"{case.title}: a second apply changed the file"
            out.extend(_hunks(rewrite.original.split("\n"), rewrite.patched.split("\n")))
    return "\n".join(out) + "\n"


def _hunks(before: list[str], after: list[str]) -> list[str]:
    """``unified_diff``'s hunks with one line of context, from a matcher without its
    popular-line heuristic: a fixture of 200 lines or more is mostly the other cases' blank
    lines, which the heuristic would ignore, leaving hunks that span the rest of the file."""
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    lines: list[str] = []
    for group in matcher.get_grouped_opcodes(1):
        first, last = group[0], group[-1]
        lines.append(f"@@ -{_span(first[1], last[2])} +{_span(first[3], last[4])} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines.extend(" " + line for line in before[i1:i2])
                continue
            lines.extend("-" + line for line in before[i1:i2])
            lines.extend("+" + line for line in after[j1:j2])
    return lines


def _span(start: int, stop: int) -> str:
    """A hunk's range as ``unified_diff`` writes it."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + (1 if length else 0)},{length}"


def _where(site):
    return (site.line, site.column, site.rule.id)


@pytest.mark.parametrize("rule_file", RULE_FILES, ids=_ids(RULE_FILES))
def test_snapshot_of_scan_and_apply(rule_file):
    path = snapshot_path(rule_file)
    current = _snapshot(rule_file)
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(current, encoding="utf-8")
        return
    assert path.exists(), f"no snapshot {path.name}: run with ADOPTER_UPDATE_SNAPSHOTS=1"
    recorded = path.read_text(encoding="utf-8")
    if recorded != current:
        diff = "\n".join(
            difflib.unified_diff(
                recorded.split("\n"), current.split("\n"), "recorded", "current", lineterm=""
            )
        )
        pytest.fail(
            f"{path.name} changed; review and update with ADOPTER_UPDATE_SNAPSHOTS=1:\n{diff}"
        )
