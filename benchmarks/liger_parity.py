"""Liger-Kernel parity on transformers 5.x, written down: docs/liger-parity.md.

    python benchmarks/liger_parity.py --version 5.24.0 --jobs 2

For every model type Liger-Kernel patches (benchmarks/liger_models.toml, read from Liger's
``monkey_patch.py``) and every kernel cell it turns on by default, this says whether Adopter's
rules patch the same computation in that model type's own modeling file, statically: ``apply``
writes a site of the cell's rule at the class or function Liger replaces (*patched*), only
elsewhere in the file (*elsewhere*), the site is found but not written (*scan-only*, with the
reason apply or scan gives), or there is no site (*missing*, with the reason written down in
benchmarks/liger_parity_gaps.toml after reading the file). Then the same four rule families
over every other model type of the release, and the verify verdict of each patched file from
docs/verification-<version>-all-rules.md. Nothing is imported or run; the wheel is fetched
(``adopter fetch``) into the git-ignored cache.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import re
import subprocess
import sys
import tomllib
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: the package is the checkout's
    sys.path.insert(0, str(ROOT))

from adopter.match.scan import scan_paths  # noqa: E402
from adopter.rewrite import rewrite_paths  # noqa: E402
from adopter.rules import load_rule_set  # noqa: E402

LIGER_DATA = ROOT / "benchmarks" / "liger_models.toml"
GAPS_DATA = ROOT / "benchmarks" / "liger_parity_gaps.toml"

# Liger's kernel cells -> the Adopter rule that does the same computation. Cells with no
# rule (plain LayerNorm, the unfused cross-entropy, relu^2) are listed, never counted as gaps
# of a rule.
CELL_RULE: dict[str, str | None] = {
    "rope": "modern.3",
    "rms_norm": "modern.1",
    "swiglu": "modern.2",
    "geglu": "modern.2",
    "fused_linear_cross_entropy": "modern.7",
    "layer_norm": None,
    "cross_entropy": None,
    "relu_squared": None,
}
CELL_ORDER = list(CELL_RULE)
FAMILY = {
    "modern.3": "rotary (rope)",
    "modern.1": "RMSNorm",
    "modern.2": "gated MLP (swiglu/geglu)",
    "modern.7": "linear + cross-entropy",
}
FAMILY_RULES = list(FAMILY)
# The adopter.kernels names a verify report gives for a rule's sites.
KERNEL_NAMES = {
    "modern.1": ("rms_norm",),
    "modern.2": ("gated_mlp",),
    "modern.3": ("rotary",),
    "modern.7": ("causal_lm_loss", "fused_loss_applies"),
}

PATCHED, PARTIAL, ELSEWHERE, SCAN_ONLY, MISSING, NO_RULE = (
    "patched",
    "partial",
    "elsewhere",
    "scan-only",
    "missing",
    "no rule",
)


@dataclass(frozen=True)
class LigerModel:
    """One ``apply_liger_kernel_to_<name>`` function, as benchmarks/liger_models.toml has it."""

    name: str
    directory: str
    cells: dict[str, list[str]]
    instance: dict[str, list[str]] = field(default_factory=dict)
    module: dict[str, str] = field(default_factory=dict)
    off: dict[str, str] = field(default_factory=dict)
    delegates: list[str] = field(default_factory=list)
    note: str = ""

    def directory_of(self, cell: str) -> str:
        return self.module.get(cell, self.directory)


@dataclass(frozen=True)
class LigerList:
    commit: str
    date: str
    source: str
    models: list[LigerModel]


def load_liger(path: Path = LIGER_DATA) -> LigerList:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    models = [LigerModel(**entry) for entry in data["model"]]
    unknown = {cell for m in models for cell in m.cells} - set(CELL_RULE)
    if unknown:  # a new Liger cell needs a line in CELL_RULE, even when no rule does it
        raise ValueError(f"{path}: cells with no entry in CELL_RULE: {sorted(unknown)}")
    return LigerList(data["liger_commit"], data["liger_date"], data["liger_file"], models)


@dataclass(frozen=True)
class Outcome:
    """One site of a family rule in a file: what apply did with it (or scan said of it)."""

    rule: str
    status: str  # patched, covered, skipped, not-applicable
    line: int
    cls: str | None
    method: str | None
    reason: str = ""

    @property
    def owner(self) -> str | None:
        """The class holding the site, or the module-level function when it is in none."""
        return self.cls or self.method

    @property
    def written(self) -> bool:
        return self.status in ("patched", "covered")


@dataclass(frozen=True)
class MissNote:
    rule: str
    line: int
    where: str
    step: str
    reason: str


@dataclass
class FileFindings:
    path: Path
    outcomes: list[Outcome] = field(default_factory=list)
    misses: list[MissNote] = field(default_factory=list)
    defined: dict[str, int] = field(default_factory=dict)  # module-level name -> line
    imported: dict[str, str] = field(default_factory=dict)  # name -> module it comes from
    bases: dict[str, list[str]] = field(default_factory=dict)  # class -> base names
    own_methods: dict[str, set[str]] = field(default_factory=dict)
    error: str | None = None

    def of(self, rule: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.rule == rule]


def read_names(findings: FileFindings) -> None:
    """The module-level names of the file: what a Liger target must be to exist there."""
    tree = ast.parse(findings.path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            findings.defined[node.name] = node.lineno
            findings.bases[node.name] = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
            findings.own_methods[node.name] = {
                n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            }
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            findings.defined[node.name] = node.lineno
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    findings.defined[target.id] = node.lineno
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                findings.imported[alias.asname or alias.name] = "." * node.level + (
                    node.module or ""
                )


def analyse(
    files: Iterable[Path], *, explain: Iterable[Path] = (), jobs: int | None = None
) -> dict[Path, FileFindings]:
    """Apply (and, for ``explain``, scan with --explain) every family rule's view of each file.

    All rules run, as ``--rule-set all`` does, so a family site that another rule's longer
    rewrite covers reads as covered, exactly as ``adopter apply --rule-set all`` prints it."""
    files = [Path(f) for f in files]
    rules = load_rule_set("all")
    found = {path: FileFindings(path) for path in files}
    by_name = {str(path): path for path in files}
    result = rewrite_paths(files, rules, jobs=jobs)
    for rewrite in result.files:
        findings = found[by_name[rewrite.path]]
        findings.error = rewrite.error
        for r in rewrite.results:
            if r.site.rule.id in FAMILY:
                findings.outcomes.append(
                    Outcome(
                        r.site.rule.id, str(r.status), r.line, r.site.cls, r.site.method, r.reason
                    )
                )
    explain = [Path(f) for f in explain]
    if explain:
        scanned = scan_paths(explain, rules, jobs=jobs, explain=True)
        for file in scanned.files:
            findings = found[by_name[file.path]]
            for site in file.sites:
                if not site.applicable and site.rule.id in FAMILY:
                    findings.outcomes.append(
                        Outcome(
                            site.rule.id,
                            "not-applicable",
                            site.line,
                            site.cls,
                            site.method,
                            site.reason,
                        )
                    )
            for miss in file.misses:
                if miss.rule in FAMILY:
                    findings.misses.append(
                        MissNote(miss.rule, miss.line, miss.where, miss.step, miss.reason)
                    )
    for findings in found.values():
        if findings.error is None:
            read_names(findings)
    return found


@dataclass
class CellResult:
    model: LigerModel
    cell: str
    rule: str | None
    path: Path | None
    status: str  # at Liger's targets: PATCHED ... NO_RULE
    file_status: str  # anywhere in the file: PATCHED, SCAN_ONLY, MISSING, NO_RULE
    where: str = ""  # the lines patched (or found), for the table
    detail: str = ""  # why not, as apply/scan/explain say it, and what was not found
    targets: list[str] = field(default_factory=list)  # Liger's names present in the file
    absent: list[str] = field(default_factory=list)  # Liger's names the 5.24 file lacks
    inherited: list[str] = field(default_factory=list)
    verified: str = ""
    gap: Gap | None = None
    explained: str = ""  # the explain line(s) of a missed target, for the gap list

    @property
    def liger_noop(self) -> bool:
        """Liger's patch has nothing to replace in this file: none of its names exist here."""
        return (
            self.rule is not None and self.path is not None and not (self.targets or self.inherited)
        )


@dataclass(frozen=True)
class Gap:
    """A missed cell's cause, written down by hand (benchmarks/liger_parity_gaps.toml)."""

    cause: str
    detail: str


def load_gaps(path: Path = GAPS_DATA) -> dict[str, Gap]:
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {key: Gap(**value) for key, value in data.get("gap", {}).items()}


def load_patterns(path: Path = GAPS_DATA) -> dict[str, str]:
    """Cause -> a regular expression for its spelling (the gaps file's ``[pattern]`` table)."""
    if not path.exists():
        return {}
    return dict(tomllib.loads(path.read_text(encoding="utf-8")).get("pattern", {}))


def spelling_counts(per_type: dict[str, list[Path]], patterns: dict[str, str]) -> dict[str, int]:
    """Cause -> the model types whose modeling files hold its spelling somewhere."""
    compiled = {cause: re.compile(pattern) for cause, pattern in patterns.items()}
    counts = dict.fromkeys(compiled, 0)
    for files in per_type.values():
        texts = [path.read_text(encoding="utf-8") for path in files]
        for cause, pattern in compiled.items():
            counts[cause] += any(pattern.search(text) for text in texts)
    return counts


def owners_of(target: str, findings: FileFindings) -> set[str]:
    """The classes whose code runs for ``target``: itself and, for a class that inherits a
    method it does not define, its bases in the same file (a modular file's ``class
    B(A): pass`` generates code that runs A's forward)."""
    owners, todo = set(), [target]
    while todo:
        name = todo.pop()
        if name in owners:
            continue
        owners.add(name)
        if "forward" not in findings.own_methods.get(name, {"forward"}):
            todo.extend(b for b in findings.bases.get(name, []) if b in findings.defined)
    return owners


def classify(model: LigerModel, cell: str, findings: FileFindings | None) -> CellResult:
    rule = CELL_RULE[cell]
    path = findings.path if findings else None
    if rule is None:
        return CellResult(model, cell, None, path, NO_RULE, NO_RULE, detail="no Adopter rule")
    if findings is None or findings.error is not None:
        why = findings.error if findings else f"no modeling_{model.directory_of(cell)}.py"
        return CellResult(model, cell, rule, path, MISSING, MISSING, detail=why)
    outcomes = findings.of(rule)
    written = [o for o in outcomes if o.written]
    found = [o for o in outcomes if not o.written]
    file_status = PATCHED if written else SCAN_ONLY if found else MISSING
    names = [*model.cells.get(cell, []), *model.instance.get(cell, [])]
    names = list(dict.fromkeys(names))
    targets = [n for n in names if n in findings.defined]
    absent = [n for n in names if n not in findings.defined]
    inherited = [f"{n} from {findings.imported[n]}" for n in absent if n in findings.imported]
    result = CellResult(
        model,
        cell,
        rule,
        path,
        MISSING,
        file_status,
        targets=targets,
        absent=absent,
        inherited=inherited,
    )
    if not targets:  # Liger's names are not in this release's file: judge the file as a whole
        result.status = file_status
        result.where = _lines(written or found)
        result.detail = _reasons(found) if not written else ""
        return result
    hit, seen = [], []
    for target in targets:
        owners = owners_of(target, findings)
        mine = [o for o in outcomes if o.owner in owners]
        if any(o.written for o in mine):
            hit.append(target)
        seen.extend(o for o in mine if not o.written)
    if len(hit) == len(targets):
        result.status = PATCHED
    elif hit:
        result.status = PARTIAL
    elif seen:
        result.status = SCAN_ONLY
    elif written:
        result.status = ELSEWHERE
    mine_written = [
        o for o in written if o.owner in {x for t in hit for x in owners_of(t, findings)}
    ]
    result.where = _lines(mine_written or seen or written)
    missed = [t for t in targets if t not in hit]
    if missed:
        notes = [
            f"{target}: {note}"
            for target in missed
            if (note := _explain_note(findings, rule, owners_of(target, findings)))
        ]
        result.explained = "; ".join(notes)
        parts = [_reasons(seen)] if seen else []
        if result.status in (ELSEWHERE, PARTIAL):
            parts.insert(0, "not at " + ", ".join(missed))
        result.detail = "; ".join(parts + notes)
    return result


def _lines(outcomes: list[Outcome]) -> str:
    return ", ".join(sorted({f"{o.owner}:{o.line}" for o in outcomes}, key=_line_key))


def _line_key(text: str) -> tuple[int, str]:
    owner, _, line = text.rpartition(":")
    return int(line), owner


def _reasons(outcomes: list[Outcome]) -> str:
    return "; ".join(
        dict.fromkeys(f"line {o.line} ({o.status}): {o.reason}" for o in outcomes if o.reason)
    )


def _explain_note(findings: FileFindings, rule: str, owners: set[str]) -> str:
    """The explain line that got furthest inside the target: the step where the rule
    stopped. Empty when the rule never started there."""
    best: tuple[int, MissNote] | None = None
    for miss in findings.misses:
        if miss.rule != rule or miss.where.split(".")[0] not in owners:
            continue
        number = re.match(r"step (\d+)", miss.step)
        depth = int(number.group(1)) if number else 0
        if best is None or depth > best[0]:
            best = (depth, miss)
    if best is None:
        return ""
    miss = best[1]
    return f"{rule} stops at line {miss.line} in {miss.where} at {miss.step}: {miss.reason}"


def parse_verification(path: Path) -> dict[str, tuple[str, str]]:
    """``modeling_x.py`` -> (verdict, first reason) from a verify_zoo report's file table."""
    return parse_verification_text(path.read_text(encoding="utf-8")) if path.exists() else {}


def parse_verification_text(text: str) -> dict[str, tuple[str, str]]:
    rows: dict[str, tuple[str, str]] = {}
    in_table = False
    for line in text.splitlines():
        if line.startswith("| file | verdict"):
            in_table = True
            continue
        if in_table and line.startswith("|---"):
            continue
        if in_table and line.startswith("| "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = (cells[1], cells[-1] if len(cells) >= 8 else "")
        elif in_table:
            in_table = False
    return rows


def verified_label(result: CellResult, report: dict[str, tuple[str, str]]) -> str:
    if result.status not in (PATCHED, PARTIAL) or result.path is None:
        return ""  # a verdict on sites Liger does not replace would say nothing of the cell
    row = report.get(result.path.name)
    if row is None:
        return "not in the verify run"
    verdict, reason = row
    if verdict == "verified":
        return "verified"
    # the report names the first kernels whose sites never ran; say when this rule's is one
    names = KERNEL_NAMES.get(result.rule or "", ())
    named = any(re.search(rf"\b{name} at line", reason) for name in names)
    return f"{verdict} (this kernel's site named)" if named else f"file {verdict}"


@dataclass
class Parity:
    liger: LigerList
    version: str
    cells: list[CellResult]
    coverage: dict[str, dict[str, set[str]]]  # rule -> {"adopter": dirs, "liger": dirs}
    types: list[str]  # model types with a modeling file
    no_modeling: list[str]
    stale_gaps: list[str]
    report_name: str
    report_files: int
    spellings: dict[str, int] = field(default_factory=dict)  # cause -> model types with it


def modeling_files(models: Path) -> dict[str, list[Path]]:
    """Model type -> its modeling files (generated ones; modular sources are not what runs)."""
    found: dict[str, list[Path]] = {}
    for folder in sorted(p for p in models.iterdir() if p.is_dir() and p.name != "__pycache__"):
        found[folder.name] = sorted(folder.glob("modeling_*.py"))
    return found


def own_file(models: Path, directory: str) -> Path:
    return models / directory / f"modeling_{directory}.py"


def assess(
    models: Path,
    liger: LigerList,
    gaps: dict[str, Gap],
    report: dict[str, tuple[str, str]],
    *,
    version: str,
    report_name: str = "",
    patterns: dict[str, str] | None = None,
    jobs: int | None = None,
) -> Parity:
    """The whole comparison over the ``transformers/models`` folder ``models``."""
    per_type = modeling_files(models)
    liger_files = {
        own_file(models, m.directory_of(cell))
        for m in liger.models
        for cell in m.cells
        if own_file(models, m.directory_of(cell)).exists()
    }
    every = sorted({p for files in per_type.values() for p in files} | liger_files)
    findings = analyse(every, explain=sorted(liger_files), jobs=jobs)
    cells = []
    for model in liger.models:
        for cell in sorted(model.cells, key=CELL_ORDER.index):
            path = own_file(models, model.directory_of(cell))
            result = classify(model, cell, findings.get(path))
            result.verified = verified_label(result, report)
            if result.status not in (PATCHED, NO_RULE):
                result.gap = gaps.get(f"{model.name}.{cell}")
            cells.append(result)
    missed = {f"{c.model.name}.{c.cell}" for c in cells if c.status not in (PATCHED, NO_RULE)}
    stale = sorted(set(gaps) - missed)
    coverage: dict[str, dict[str, set[str]]] = {
        rule: {"adopter": set(), "liger": set()} for rule in FAMILY_RULES
    }
    for model in liger.models:
        for cell in model.cells:
            if CELL_RULE[cell] in coverage:
                coverage[CELL_RULE[cell]]["liger"].add(model.directory_of(cell))
    for kind, files in per_type.items():
        for path in files:
            for outcome in findings[path].outcomes:
                if outcome.written:
                    coverage[outcome.rule]["adopter"].add(kind)
    types = [kind for kind, files in per_type.items() if files]
    no_modeling = [kind for kind, files in per_type.items() if not files]
    spellings = spelling_counts(per_type, patterns or {})
    return Parity(
        liger,
        version,
        cells,
        coverage,
        types,
        no_modeling,
        stale,
        report_name,
        len(report),
        spellings,
    )


# ---------------------------------------------------------------------------- rendering

MARK = {
    PATCHED: "patched",
    PARTIAL: "partial",
    ELSEWHERE: "elsewhere",
    SCAN_ONLY: "scan-only",
    MISSING: "**missing**",
    NO_RULE: "no rule",
}
SHORT = {PATCHED: "✔", PARTIAL: "◐", ELSEWHERE: "○", SCAN_ONLY: "S", MISSING: "✘", NO_RULE: "·"}


def _pct(part: int, whole: int) -> str:
    return f"{part}/{whole} = {100 * part / whole:.0f}%" if whole else "0/0"


def headline(parity: Parity) -> dict[str, object]:
    ruled = [c for c in parity.cells if c.rule]
    counts = Counter(c.status for c in ruled)
    file_patched = sum(c.file_status == PATCHED for c in ruled)
    return {
        "cells": len(parity.cells),
        "ruled": len(ruled),
        "no_rule": len(parity.cells) - len(ruled),
        "patched": counts[PATCHED],
        "partial": counts[PARTIAL],
        "elsewhere": counts[ELSEWHERE],
        "scan_only": counts[SCAN_ONLY],
        "missing": counts[MISSING],
        "file_patched": file_patched,
        "noop": [c for c in ruled if c.liger_noop],
        "verified": sum(c.status == PATCHED and c.verified == "verified" for c in ruled),
    }


def render(parity: Parity, *, command: str, today: str, adopter_commit: str) -> str:
    h = headline(parity)
    liger_dirs = sorted({m.directory for m in parity.liger.models})
    lines = [
        f"# Liger-Kernel parity on transformers {parity.version}",
        "",
        f"Produced by `{command}` on {today}, Adopter at `{adopter_commit}`; statically (no "
        "model code is imported or run). Liger-Kernel's model list is "
        f"[benchmarks/liger_models.toml](../benchmarks/liger_models.toml), read from "
        f"`{parity.liger.source}` of linkedin/Liger-Kernel at commit "
        f"`{parity.liger.commit}` ({parity.liger.date}): {len(parity.liger.models)} "
        f"`apply_liger_kernel_to_*` functions over {len(liger_dirs)} model types, "
        f"{h['cells']} kernel cells on by default.",
        "",
        "Each Liger cell maps onto the Adopter rule that does the same computation: rope → "
        "`modern.3` (rotary), rms_norm → `modern.1`, swiglu / geglu → `modern.2` (gated MLP), "
        "fused_linear_cross_entropy → `modern.7` (LM head + cross-entropy). layer_norm (plain "
        "`nn.LayerNorm`), cross_entropy (the unfused loss, a global patch) and relu_squared "
        "have no Adopter rule. Adopter runs `--rule-set all` on the model type's own "
        "`modeling_<type>.py` (what runs; the modular sources are not scanned) and the cell "
        "reads:",
        "",
        "* **patched**: `adopter apply` writes a site of the rule in the class or function "
        "Liger replaces (or in the class it inherits its `forward` from in the same file); a "
        "site covered by another rule's enclosing rewrite counts, as apply reports it;",
        "* **partial**: Liger replaces several names for the cell (an MoE's MLP and its "
        "experts) and Adopter patches some;",
        "* **elsewhere**: apply writes the rule in that file, but not at Liger's target;",
        "* **scan-only**: the site is found but not written (apply's skip reason, or scan's "
        "not-applicable reason);",
        "* **missing**: no site; the reason was found by reading the file (list at the end).",
        "",
        "Where Liger's names do not exist in the file of this release (Liger patches a name "
        "that transformers renamed), the file as a whole is judged and the table says so. "
        "*Verified* is the file's verdict in "
        f"[{parity.report_name}]({parity.report_name}) (all rules, {parity.report_files} "
        "files), which proves every patched site of a file together: *verified* means every "
        "site ran in a check that matched. That report comes from its own run (see its header); "
        "a file whose patch changed since may read differently now.",
        "",
        _inheritance_note(parity),
        "",
        "## Headline",
        "",
        f"* Liger cells with an Adopter rule: **{h['ruled']}** of {h['cells']} "
        f"({h['no_rule']} have none: layer_norm, cross_entropy, relu_squared).",
        f"* Patched at Liger's target: **{_pct(h['patched'], h['ruled'])}**; with partial "
        f"cells: {_pct(h['patched'] + h['partial'], h['ruled'])}.",
        f"* Patched anywhere in the model type's file (the rule writes a site there at all): "
        f"{_pct(h['file_patched'], h['ruled'])}.",
        f"* Not patched at the target: {h['partial']} partial, {h['elsewhere']} elsewhere in "
        f"the file, {h['scan_only']} scan-only, {h['missing']} missing.",
        f"* Of all {h['cells']} Liger cells: {_pct(h['patched'], h['cells'])} patched.",
        f"* Patched cells whose file verify proves (verdict *verified*): "
        f"{_pct(h['verified'], h['patched'])}.",
    ]
    noop = h["noop"]
    if noop:
        kept = [c for c in parity.cells if c.rule and not c.liger_noop]
        lines.append(
            f"* {len(noop)} cells name only classes or functions this release's file lacks, so "
            "Liger's patch replaces nothing there ("
            + ", ".join(f"`{c.model.name}` {c.cell}" for c in noop)
            + "); without them, patched at the target: "
            + _pct(sum(c.status == PATCHED for c in kept), len(kept))
            + "."
        )
    lines.append("")
    lines += _coverage_section(parity)
    lines += _matrix(parity)
    lines += _detail_table(parity)
    lines += _gap_section(parity)
    return "\n".join(lines) + "\n"


def _inheritance_note(parity: Parity) -> str:
    imported = [c for c in parity.cells if c.inherited]
    if not imported:
        return (
            "No Liger target is imported from another model type's file: transformers' "
            "generated modeling files define the classes their modular sources inherit, so "
            "each type's own file holds the code that runs."
        )
    listed = ", ".join(f"`{c.model.name}` {c.cell} ({'; '.join(c.inherited)})" for c in imported)
    return f"Liger targets imported from another model type's file (the file as a whole is judged): {listed}."


def _coverage_section(parity: Parity) -> list[str]:
    liger_dirs = {m.directory for m in parity.liger.models} | {
        m.directory_of(c) for m in parity.liger.models for c in m.cells
    }
    others = [t for t in parity.types if t not in liger_dirs]
    lines = [
        "## The four families over every model type",
        "",
        f"transformers {parity.version} has {len(parity.types) + len(parity.no_modeling)} "
        f"folders under `models/`; {len(parity.types)} have a modeling file (all "
        f"`modeling_*.py` of the folder count for its type), {len(others)} of them are types "
        f"Liger does not patch. A type counts for a family when `adopter apply --rule-set all` "
        "writes a site of the rule in one of its modeling files (anywhere in it). Liger's "
        "count is the model types whose apply function turns the cell on by default.",
        "",
        "| family | Liger | Adopter, all types | Adopter, Liger's types | Adopter, other types | Adopter / Liger |",
        "|---|---|---|---|---|---|",
    ]
    union_adopter: set[str] = set()
    union_liger: set[str] = set()
    for rule in FAMILY_RULES:
        adopter, liger = parity.coverage[rule]["adopter"], parity.coverage[rule]["liger"]
        union_adopter |= adopter
        union_liger |= liger
        on_liger = len(adopter & liger_dirs)
        ratio = f"{len(adopter) / len(liger):.1f}×" if liger else "–"
        lines.append(
            f"| `{rule}` {FAMILY[rule]} | {len(liger)} | {len(adopter)} | {on_liger} | "
            f"{len(adopter) - on_liger} | {ratio} |"
        )
    ratio = f"{len(union_adopter) / len(union_liger):.1f}×" if union_liger else "–"
    on_liger = len(union_adopter & liger_dirs)
    lines.append(
        f"| any of the four | {len(union_liger)} | {len(union_adopter)} | {on_liger} | "
        f"{len(union_adopter) - on_liger} | {ratio} |"
    )
    target = 3 * len(union_liger)
    lines += [
        "",
        f"The issue's bar, the families patched in at least 3× as many model types as Liger "
        f"covers ({len(union_liger)} types, so {target}): "
        + (
            f"**met** for the four together ({len(union_adopter)} types)"
            if len(union_adopter) >= target
            else f"**not met** for the four together ({len(union_adopter)} types)"
        )
        + "; per family: "
        + ", ".join(
            f"{FAMILY[r].split(' (')[0]} "
            + (
                "met"
                if len(parity.coverage[r]["adopter"]) >= 3 * len(parity.coverage[r]["liger"])
                else "not met"
            )
            for r in FAMILY_RULES
        )
        + ".",
        "",
        f"The {len(union_adopter - liger_dirs)} other types with a family patched: "
        + ", ".join(sorted(union_adopter - liger_dirs))
        + ".",
        "",
        f"Folders with no modeling file ({len(parity.no_modeling)}; tokenizer-only, "
        f"configuration-only or moved): {', '.join(parity.no_modeling)}.",
        "",
    ]
    return lines


def _matrix(parity: Parity) -> list[str]:
    present = [c for c in CELL_ORDER if any(r.cell == c for r in parity.cells)]
    lines = [
        "## Model type × cell",
        "",
        "✔ patched, ◐ partial, ○ elsewhere in the file, S scan-only, ✘ missing, · no Adopter "
        "rule; – Liger does not turn the cell on (off by default, or delegated to another "
        "apply function).",
        "",
        "| Liger function | module (`transformers.models.…`) | " + " | ".join(present) + " |",
        "|---|---|" + "---|" * len(present),
    ]
    by_model: dict[str, dict[str, CellResult]] = defaultdict(dict)
    for r in parity.cells:
        by_model[r.model.name][r.cell] = r
    for model in parity.liger.models:
        row = [
            SHORT[by_model[model.name][c].status] if c in by_model[model.name] else "–"
            for c in present
        ]
        module = f"`{model.directory}.modeling_{model.directory}`"
        lines.append(f"| `{model.name}` | {module} | " + " | ".join(row) + " |")
    lines.append("")
    return lines


def _detail_table(parity: Parity) -> list[str]:
    lines = [
        "## Every cell",
        "",
        "Lines are the edit locations `adopter apply` reports (`Class:line`, or the function "
        "for a module-level one).",
        "",
        "| Liger function | cell | rule | Adopter | where | verified | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in parity.cells:
        notes = []
        if r.absent:
            notes.append("not in this file: " + ", ".join(f"`{a}`" for a in r.absent))
        if r.inherited:
            notes.append("imported: " + ", ".join(r.inherited))
        if r.model.directory_of(r.cell) != r.model.directory:
            notes.append(f"module: modeling_{r.model.directory_of(r.cell)}")
        if r.cell in r.model.instance and not r.model.cells.get(r.cell):
            notes.append("Liger: live model only")
        if r.liger_noop:
            notes.append("none of Liger's names is in this file: the file as a whole is judged")
        if r.status not in (PATCHED, NO_RULE):
            if r.gap:
                notes.append(f"{r.gap.cause}: {r.gap.detail}")
            elif r.detail:
                notes.append(r.detail)
            else:
                notes.append("(no reason written down)")
        text = "; ".join(notes).replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| `{r.model.name}` | {r.cell} | {r.rule or '–'} | {MARK[r.status]} | "
            f"{r.where} | {r.verified} | {text} |"
        )
    lines.append("")
    extra = [m for m in parity.liger.models if m.off or m.delegates or m.note]
    if extra:
        lines += ["Liger's own notes (cells off by default, delegation):", ""]
        for m in extra:
            parts = [f"{cell} {why}" for cell, why in m.off.items()]
            if m.delegates:
                parts.append("delegates to " + ", ".join(f"`{d}`" for d in m.delegates))
            if m.note:
                parts.append(m.note)
            lines.append(f"* `{m.name}`: " + "; ".join(parts) + ".")
        lines.append("")
    return lines


def _gap_section(parity: Parity) -> list[str]:
    missed = [r for r in parity.cells if r.status not in (PATCHED, NO_RULE)]
    lines = [
        "## Missed cells, by cause",
        "",
        f"{len(missed)} cells with an Adopter rule are not patched at Liger's target. The cause "
        "of each was found by reading the model file (with `adopter scan --explain`); they "
        "are kept in [benchmarks/liger_parity_gaps.toml](../benchmarks/liger_parity_gaps.toml) "
        "so that the script flags one that no longer applies.",
        "",
    ]
    groups: dict[str, list[CellResult]] = defaultdict(list)
    for r in missed:
        groups[r.gap.cause if r.gap else "not written down yet"].append(r)
    for cause in sorted(groups, key=lambda c: (-len(groups[c]), c)):
        lines += [f"### {cause} ({len(groups[cause])})", ""]
        if cause in parity.spellings:
            lines += [
                f"The spelling is in the modeling files of {parity.spellings[cause]} model types "
                "of the release (a text search, see the gaps file's `[pattern]`): what a rule "
                "change for it would reach at most.",
                "",
            ]
        for r in groups[cause]:
            where = f"modeling_{r.model.directory_of(r.cell)}.py"
            detail = r.gap.detail if r.gap else (r.detail or "no site")
            if r.gap and r.explained:
                detail += f". `--explain`: {r.explained}"
            lines.append(
                f"* `{r.model.name}` {r.cell} ({r.rule}, {MARK[r.status]}, {where}): {detail}"
            )
        lines.append("")
    if parity.stale_gaps:
        lines += [
            "Written-down causes whose cell is now patched (delete them from the gaps file): "
            + ", ".join(f"`{k}`" for k in parity.stale_gaps)
            + ".",
            "",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="5.24.0", help="transformers release")
    parser.add_argument("--transformers", type=Path, help="an unpacked transformers package")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "liger-parity.md")
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args(argv)
    if args.transformers is None:
        from adopter.corpus import fetch_wheel

        args.transformers = fetch_wheel(f"transformers=={args.version}") / "transformers"
    report_path = ROOT / "docs" / f"verification-{args.version}-all-rules.md"
    parity = assess(
        args.transformers / "models",
        load_liger(),
        load_gaps(),
        parse_verification(report_path),
        version=args.version,
        report_name=report_path.name,
        patterns=load_patterns(),
        jobs=args.jobs,
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    command = f"python benchmarks/liger_parity.py --version {args.version}"
    text = render(
        parity, command=command, today=datetime.date.today().isoformat(), adopter_commit=commit
    )
    args.output.write_text(text, encoding="utf-8")
    h = headline(parity)
    print(
        f"{args.output}: {h['patched']}/{h['ruled']} Liger cells patched at the target, "
        f"{h['file_patched']}/{h['ruled']} in the file",
        file=sys.stderr,
    )
    for key in parity.stale_gaps:
        print(f"stale gap note: {key} is patched now", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
