"""``scan`` and ``apply`` never disagree silently: over every case of every rule fixture, a site
scan reports as rewritable is patched by apply (or covered by an enclosing rewrite), and a site
scan marks not rewritable is skipped by apply with the very reason scan printed."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from adopter.cli import app
from adopter.dsl import load_rule_file
from adopter.extract.structure import analyse_source
from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rewrite.judge import mark_unwritable
from adopter.rewrite.outcome import SiteStatus
from adopter.rules import rule_files
from tests.rules.fixture_cases import fixture_path, read_fixture

RULE_FILES = rule_files("all")


def _scan(text: str, matcher: Matcher):
    sites = matcher.match_file(analyse_source(text, "fixture.py", matcher.opaque_methods))
    mark_unwritable(text, "fixture.py", sites)
    return [site for site in sites if site.applicable]


@pytest.mark.parametrize("rule_file", RULE_FILES, ids=[path.stem for path in RULE_FILES])
def test_scan_says_what_apply_does_on_every_fixture_case(rule_file):
    matcher = Matcher(load_rule_file(rule_file))
    disagreements: list[str] = []
    for case in read_fixture(fixture_path(rule_file)):
        scanned = _scan(case.source, matcher)
        applied = {
            (r.site.rule.id, r.site.line, r.site.column): r
            for r in rewrite_text(case.source, "fixture.py", matcher).results
        }
        for site in scanned:
            result = applied.get((site.rule.id, site.line, site.column))
            where = f"{case.title}: {site.rule.id} at {site.line}:{site.column}"
            if result is None:
                disagreements.append(f"{where}: scan reports it, apply has no result")
            elif site.rewritable and result.status is SiteStatus.SKIPPED:
                disagreements.append(f"{where}: scan says rewritable, apply skips: {result.reason}")
            elif not site.rewritable and (
                result.status is not SiteStatus.SKIPPED or result.reason != site.rewrite_reason
            ):
                disagreements.append(
                    f"{where}: scan says not rewritable ({site.rewrite_reason}), apply: "
                    f"{result.status} {result.reason}"
                )
    assert not disagreements, "\n".join(disagreements)


def test_the_fixtures_hold_refusals_so_the_agreement_is_not_vacuous():
    refused = 0
    for rule_file in RULE_FILES:
        matcher = Matcher(load_rule_file(rule_file))
        for case in read_fixture(fixture_path(rule_file)):
            refused += sum(not site.rewritable for site in _scan(case.source, matcher))
    assert refused >= 5


def test_scan_json_and_table_show_what_apply_would_skip(tmp_path):
    (case,) = [
        c
        for c in read_fixture(fixture_path(rule_files("paper")[-1]))
        if c.title.startswith("Fig. 4 refused: an arm changes")
    ]
    model = tmp_path / "model.py"
    model.write_text(case.source, encoding="utf-8")
    runner = CliRunner()
    scanned = runner.invoke(app, ["scan", "--select", "paper.9", "-f", "json", str(model)])
    (record,) = json.loads(scanned.stdout)
    assert record["rewritable"] is False
    applied = runner.invoke(app, ["apply", "--select", "paper.9", str(model)])
    assert f"skipped paper.9 at {model}:{record['line']}:{record['col']}: " + record[
        "rewrite_reason"
    ] in " ".join(applied.output.split())
    table = runner.invoke(app, ["scan", "--select", "paper.9", str(model)], env={"COLUMNS": "300"})
    assert f"not rewritable: {record['rewrite_reason']}" in table.stdout
    assert "1 not rewritable" in table.stdout
