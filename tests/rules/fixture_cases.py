"""Reading rule fixtures: one ``tests/rules/fixtures/<rule file stem>.py`` per rule file.

A fixture is model source of our own. The lines before the first ``# %%`` line are its preamble
(imports); every ``# %% <title>`` line starts a case. A case is scanned and rewritten on its own:
the other cases' lines are blanked, so reported lines are the fixture's own line numbers. A line
that ends in ``# site`` must be reported as an applicable site, a line that ends in
``# not-applicable`` as a match that is not applicable; no other line may be reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
SNAPSHOTS = Path(__file__).parent / "snapshots"
CASE_MARKER = re.compile(r"^# %%\s*(?P<title>.*)$")
SITE_MARKER = re.compile(r"#\s*(?P<kind>site|not-applicable)\s*$")


@dataclass
class FixtureCase:
    title: str
    source: str  # the whole fixture with the other cases blanked
    sites: list[int] = field(default_factory=list)
    not_applicable: list[int] = field(default_factory=list)


def read_fixture(path: Path) -> list[FixtureCase]:
    """The cases of one fixture file; raises ValueError for a fixture with no case."""
    lines = path.read_text(encoding="utf-8").split("\n")
    starts = [index for index, line in enumerate(lines) if CASE_MARKER.match(line)]
    if not starts:
        raise ValueError(f"{path}: no '# %% <title>' case")
    cases: list[FixtureCase] = []
    for number, start in enumerate(starts):
        end = starts[number + 1] if number + 1 < len(starts) else len(lines)
        kept = [
            line if index < starts[0] or start <= index < end else ""
            for index, line in enumerate(lines)
        ]
        case = FixtureCase(CASE_MARKER.match(lines[start]).group("title"), "\n".join(kept))
        for index in range(start, end):
            marker = SITE_MARKER.search(lines[index])
            if marker is not None:
                expected = case.sites if marker.group("kind") == "site" else case.not_applicable
                expected.append(index + 1)
        cases.append(case)
    return cases


def fixture_path(rule_file: Path) -> Path:
    return FIXTURES / f"{rule_file.stem}.py"


def snapshot_path(rule_file: Path) -> Path:
    return SNAPSHOTS / f"{rule_file.stem}.snap"
