"""Before/after examples from the rule fixtures: a case's source (BEFORE) and, applying the diff
its reviewed snapshot records, what apply wrote for it (AFTER). Used by the leave-one-out
measurement of ``adopter learn`` and by its round-trip tests."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.rules.fixture_cases import fixture_path, read_fixture, snapshot_path  # noqa: E402

HUNK = re.compile(r"^@@ -(?P<start>\d+)(?:,(?P<count>\d+))? \+\d+(?:,\d+)? @@")


@dataclass(frozen=True)
class FixtureExample:
    rule_file: Path
    title: str
    before: str
    after: str
    sites: tuple[int, ...]


def _apply_diff(text: str, diff: list[str]) -> str:
    """``text`` with the unified diff's hunks applied (the snapshot's diffs are of ``text``)."""
    lines = text.split("\n")
    out: list[str] = []
    position = 0  # index into lines
    index = 0
    while index < len(diff):
        found = HUNK.match(diff[index])
        if found is None:
            index += 1
            continue
        start = int(found["start"]) - 1
        if found["count"] == "0":
            start += 1
        out.extend(lines[position:start])
        position = start
        index += 1
        while index < len(diff) and not diff[index].startswith("@@"):
            line = diff[index]
            if line.startswith("+"):
                out.append(line[1:])
            elif not line:  # the blank line that ends a snapshot section
                break
            elif line.startswith("-"):
                assert lines[position] == line[1:], (lines[position], line)
                position += 1
            else:
                assert lines[position] == line[1:], (lines[position], line)
                out.append(lines[position])
                position += 1
            index += 1
    out.extend(lines[position:])
    return "\n".join(out)


def _snapshot_diffs(rule_file: Path) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    title = None
    for line in snapshot_path(rule_file).read_text(encoding="utf-8").split("\n"):
        if line.startswith("## "):
            title = line[3:]
            sections[title] = []
        elif title is not None and not line.startswith(("scan ", "apply ")):
            sections[title].append(line)
    return sections


def positive_examples(rule_file: Path) -> list[FixtureExample]:
    """The fixture's cases with a marked site whose snapshot records a patch, in file order."""
    diffs = _snapshot_diffs(rule_file)
    examples = []
    for case in read_fixture(fixture_path(rule_file)):
        diff = diffs.get(case.title, [])
        if not case.sites or not any(HUNK.match(line) for line in diff):
            continue
        after = _apply_diff(case.source, diff)
        examples.append(
            FixtureExample(rule_file, case.title, case.source, after, tuple(case.sites))
        )
    return examples
