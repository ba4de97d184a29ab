"""The comparison half of the coverage benchmark: hand-labelled sites (benchmarks/coverage/*.tsv)
against the records a scan produced, per package x family x split. Pure Python, no Adopter
import, so that it can be tested on tiny synthetic tables.

A record matches a label when both name the same file and family and, in this order of
preference: the same line; a line at most ``tolerance`` lines away (a rule may anchor a site on a
neighbouring statement of the same computation); the same scope (class and method, or function).
Each label and each record is used at most once. Labels left over are misses. A record left over in
the scope of a label it would have matched, had the label not been taken, is a *part* of that
labelled site (a label may count several statements as one site: rotary's "q ..., same for k"
line is one label, while the rule reports the q and the k statement); parts are listed, and
counted neither as found nor as extra. Records left over after that are extras.
"""

from __future__ import annotations

import csv
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Families of issue 14's `modern` rule set; a rule is mapped to one of these by its `name:`.
MODERN_FAMILIES = (
    "rms-norm",
    "gated-mlp",
    "rotary",
    "attention-function",
    "groupnorm-silu",
    "conv-bn-act",
    "linear-cross-entropy",
)
PAPER_FAMILIES = tuple(f"paper.{n}" for n in range(1, 10))
EXTENDED_FAMILIES = tuple(f"ext.{n}" for n in range(1, 5))
EXISTING_FAMILIES = PAPER_FAMILIES + EXTENDED_FAMILIES
ALL_FAMILIES = EXISTING_FAMILIES + MODERN_FAMILIES
SPLITS = ("dev", "test", "test2", "test3", "test4", "test5", "test6")
# A label whose note starts with this is a site the labeller judged not clear-cut (test2, test3).
EDGE_MARK = "[edge]"
MATCH_KINDS = ("line", "near", "scope")


@dataclass(frozen=True)
class LabelledFile:
    package: str
    version: str
    path: str  # relative to the unpacked wheel, e.g. transformers/models/llama/modeling_llama.py
    split: str
    sites: int
    note: str


@dataclass(frozen=True)
class Label:
    package: str
    path: str
    line: int
    family: str
    scope: str
    static: bool
    static_reason: str
    note: str
    split: str

    @property
    def clear_cut(self) -> bool:
        return not self.note.startswith(EDGE_MARK)


@dataclass(frozen=True)
class Record:
    """One site a scan reported, reduced to what the comparison needs."""

    package: str
    path: str
    line: int
    family: str
    rule: str
    scope: str
    message: str = ""


@dataclass
class Comparison:
    matched: list[tuple[Label, Record, str]] = field(default_factory=list)  # (label, record, kind)
    missed: list[Label] = field(default_factory=list)
    extra: list[Record] = field(default_factory=list)
    parts: list[tuple[Label, Record]] = field(default_factory=list)  # (matched label, record)


@dataclass
class Cell:
    """Counts for one group of labels and records (e.g. one package x family x split)."""

    expected: int = 0
    expected_static: int = 0
    found: int = 0
    matched: int = 0
    matched_static: int = 0
    expected_clear: int = 0
    matched_clear: int = 0

    @property
    def missed(self) -> int:
        return self.expected - self.matched

    @property
    def extra(self) -> int:
        return self.found - self.matched

    @property
    def precision(self) -> float | None:
        return self.matched / self.found if self.found else None

    @property
    def recall(self) -> float | None:
        return self.matched / self.expected if self.expected else None

    @property
    def static_recall(self) -> float | None:
        return self.matched_static / self.expected_static if self.expected_static else None

    @property
    def clear_recall(self) -> float | None:
        return self.matched_clear / self.expected_clear if self.expected_clear else None

    def add(self, other: Cell) -> None:
        self.expected += other.expected
        self.expected_static += other.expected_static
        self.found += other.found
        self.matched += other.matched
        self.matched_static += other.matched_static
        self.expected_clear += other.expected_clear
        self.matched_clear += other.matched_clear


def read_tsv(path: Path) -> list[dict[str, str]]:
    """Rows of a tab-separated table whose header follows any number of `#` comment lines."""
    with path.open(encoding="utf-8", newline="") as handle:
        lines = [line for line in handle if line.strip() and not line.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))


def load_labels(sites_tsv: Path, files_tsv: Path) -> tuple[list[LabelledFile], list[Label]]:
    """The labelled files and their sites; a site's split is its file's. Inconsistent tables
    (a site in an unlisted file, an unknown split, a site count that disagrees) raise
    ``ValueError``: the tables are data the benchmark's figures rest on."""
    files = [
        LabelledFile(
            row["package"],
            row["version"],
            row["path"],
            row["split"],
            int(row["sites"]),
            row.get("note", ""),
        )
        for row in read_tsv(files_tsv)
    ]
    split_of = {}
    for file in files:
        if file.split not in SPLITS:
            raise ValueError(f"{files_tsv}: {file.path}: unknown split {file.split!r}")
        if (file.package, file.path) in split_of:
            raise ValueError(f"{files_tsv}: {file.path} listed twice")
        split_of[(file.package, file.path)] = file.split
    labels = []
    for row in read_tsv(sites_tsv):
        key = (row["package"], row["path"])
        if key not in split_of:
            raise ValueError(f"{sites_tsv}: {row['path']}:{row['line']} is in no labelled file")
        static = row["static"].strip()
        labels.append(
            Label(
                row["package"],
                row["path"],
                int(row["line"]),
                row["family"],
                row["scope"],
                static == "yes" or static.startswith("yes "),
                static,
                row["note"],
                split_of[key],
            )
        )
    counts = Counter((label.package, label.path) for label in labels)
    for file in files:
        if counts[(file.package, file.path)] != file.sites:
            raise ValueError(
                f"{files_tsv}: {file.path} says {file.sites} sites, sites.tsv has "
                f"{counts[(file.package, file.path)]}"
            )
    return files, labels


def family_of(rule_id: str, rule_name: str) -> str:
    """The family a rule reports: the existing rules by id (paper.N, ext.N), the modern ones by
    their `name:` (issue 14 names each rule after its family); anything else by its id."""
    if rule_name in MODERN_FAMILIES:
        return rule_name
    return rule_id


def record_scope(cls: str | None, method: str | None) -> str:
    return ".".join(part for part in (cls, method) if part)


def scopes_agree(label_scope: str, record_scope_: str) -> bool:
    """Equal, or one names an enclosing scope of the other (a nested function)."""
    if not label_scope or not record_scope_:
        return False
    return (
        label_scope == record_scope_
        or label_scope.startswith(record_scope_ + ".")
        or record_scope_.startswith(label_scope + ".")
    )


def _pair(
    labels: list[Label],
    records: list[Record],
    accept,
    kind: str,
    out: list[tuple[Label, Record, str]],
) -> None:
    """Greedily pair the closest accepted (label, record) pairs; removes what it pairs."""
    candidates = sorted(
        (abs(label.line - record.line), label.line, record.line, i, j)
        for i, label in enumerate(labels)
        for j, record in enumerate(records)
        if accept(label, record)
    )
    used_labels: set[int] = set()
    used_records: set[int] = set()
    for _, _, _, i, j in candidates:
        if i in used_labels or j in used_records:
            continue
        used_labels.add(i)
        used_records.add(j)
        out.append((labels[i], records[j], kind))
    labels[:] = [label for i, label in enumerate(labels) if i not in used_labels]
    records[:] = [record for j, record in enumerate(records) if j not in used_records]


def compare(labels: Iterable[Label], records: Iterable[Record], tolerance: int = 2) -> Comparison:
    by_group: dict[tuple[str, str, str], tuple[list[Label], list[Record]]] = defaultdict(
        lambda: ([], [])
    )
    for label in labels:
        by_group[(label.package, label.path, label.family)][0].append(label)
    for record in records:
        by_group[(record.package, record.path, record.family)][1].append(record)
    result = Comparison()
    for key in sorted(by_group):
        group_labels, group_records = (list(items) for items in by_group[key])
        _pair(group_labels, group_records, lambda a, b: a.line == b.line, "line", result.matched)
        _pair(
            group_labels,
            group_records,
            lambda a, b: abs(a.line - b.line) <= tolerance,
            "near",
            result.matched,
        )
        _pair(
            group_labels,
            group_records,
            lambda a, b: scopes_agree(a.scope, b.scope),
            "scope",
            result.matched,
        )
        result.missed.extend(group_labels)
        taken = [
            label
            for label, record, _ in result.matched
            if (label.package, label.path, label.family) == key
        ]
        for record in group_records:
            owner = next(
                (label for label in taken if scopes_agree(label.scope, record.scope)), None
            )
            if owner is None:
                result.extra.append(record)
            else:
                result.parts.append((owner, record))
    return result


def tabulate(
    comparison: Comparison, split_of: dict[tuple[str, str], str]
) -> dict[tuple[str, str, str], Cell]:
    """Counts per (package, family, split)."""
    cells: dict[tuple[str, str, str], Cell] = defaultdict(Cell)
    for label, _record, _kind in comparison.matched:
        cell = cells[(label.package, label.family, label.split)]
        cell.expected += 1
        cell.found += 1
        cell.matched += 1
        cell.expected_static += label.static
        cell.matched_static += label.static
        cell.expected_clear += label.clear_cut
        cell.matched_clear += label.clear_cut
    for label in comparison.missed:
        cell = cells[(label.package, label.family, label.split)]
        cell.expected += 1
        cell.expected_static += label.static
        cell.expected_clear += label.clear_cut
    for record in comparison.extra:
        cells[(record.package, record.family, split_of[(record.package, record.path)])].found += 1
    return dict(cells)


def total(cells: dict[tuple[str, str, str], Cell], keep) -> Cell:
    """The sum of the cells whose (package, family, split) key ``keep`` accepts."""
    out = Cell()
    for key, cell in cells.items():
        if keep(*key):
            out.add(cell)
    return out


def family_order(families: Iterable[str]) -> list[str]:
    known = [family for family in ALL_FAMILIES if family in set(families)]
    return known + sorted(set(families) - set(ALL_FAMILIES))


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def split_table(files: Sequence[LabelledFile]) -> dict[tuple[str, str], str]:
    return {(file.package, file.path): file.split for file in files}
