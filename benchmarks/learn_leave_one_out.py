"""Leave-one-out measurement of ``adopter learn`` over the built-in rules (docs/learn.md).

For each built-in rule: take the first positive case of its fixture that the learner accepts
(BEFORE: the case; AFTER: what its reviewed snapshot says apply writes), learn a rule from that
one example, and scan the corpora with the learned rule and the built-in one side by side:

* recall: the share of the built-in rule's sites the learned rule finds;
* precision: the share of the learned rule's sites the built-in rule also reports.

Sites are compared by file and line (both rules report the first matched call, or the
construction for ``site: "init"`` rules; a learned rule whose first step reads an attribute,
``module.num_key_value_groups``, reports that read's column on the same line). Every
disagreement is listed for reading by hand.

A second configuration adds the fixture's negative cases (those with no marked line: the near
misses the built-in rule must not take) as counter-examples (``learn --not``); its rule is
scanned only where the counter-examples changed it.

    python benchmarks/learn_leave_one_out.py [--corpus 4.34|5.24 ...] [--rule ID ...] [--jobs N]
        [--json FILE]

``--rule`` measures only the rules named (each is still learnt the same way; the corpora are
scanned with those rules alone, which is what a rule's figures depend on).

4.34 is the paper benchmark (the 199 modeling files of benchmarks/scan_benchmark.py), 5.24 is
every file under transformers 5.24.0's ``models/`` (``adopter fetch transformers==5.24.0``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from learn_examples import positive_examples  # noqa: E402
from machine import describe_machine, git_revision  # noqa: E402
from scan_benchmark import corpus_paths, load_expected  # noqa: E402

from adopter.corpus import fetch_wheel  # noqa: E402
from adopter.dsl import Rule  # noqa: E402
from adopter.learn import Example, LearnError, learn  # noqa: E402
from adopter.match.scan import scan_paths  # noqa: E402
from adopter.rules import load_rule_set, rule_files  # noqa: E402
from tests.rules.fixture_cases import fixture_path, read_fixture  # noqa: E402

LEARNED_PREFIX = "learned."
NEGATIVE_PREFIX = "negatives."
TARGET_RECALL, TARGET_PRECISION = 0.90, 0.95


def corpus(name: str) -> list[Path]:
    if name == "4.34":
        models, _ = load_expected()
        return list(corpus_paths(models).values())
    if name == "5.24":
        return [fetch_wheel("transformers==5.24.0") / "transformers" / "models"]
    raise SystemExit(f"unknown corpus {name!r}")


def negative_cases(rule_file: Path) -> list[tuple[str, str]]:
    return [
        (f"{rule_file.stem}.py", case.source)
        for case in read_fixture(fixture_path(rule_file))
        if not case.sites and not case.not_applicable
    ]


def learn_each(
    negatives: bool = False,
) -> tuple[dict[str, Rule], dict[str, str]]:
    """The rule learned for each built-in rule id, and which case (or why none) was used;
    ``negatives``: with the fixture's negative cases as counter-examples."""
    learned: dict[str, Rule] = {}
    notes: dict[str, str] = {}
    prefix = NEGATIVE_PREFIX if negatives else LEARNED_PREFIX
    for rule_file, builtin in zip(rule_files("all"), load_rule_set("all"), strict=True):
        tried = []
        counters = negative_cases(rule_file) if negatives else []
        for number, case in enumerate(positive_examples(rule_file)):
            example = Example(
                f"{rule_file.stem}.py", f"{rule_file.stem}.after.py", case.before, case.after
            )
            try:
                result = learn(
                    [example], rule_id=f"{prefix}{builtin.id}", counter_examples=counters
                )
            except LearnError as error:
                tried.append(f"case {number + 1} ({case.title}): {error.message}")
                continue
            learned[builtin.id] = result.rule
            if negatives:
                notes[builtin.id] = f"{result.construction_level} ({len(counters)} negatives)"
                break
            notes[builtin.id] = f"case {number + 1}: {case.title}" + (
                f" (earlier cases refused: {'; '.join(tried)})" if tried else ""
            )
            break
        else:
            notes[builtin.id] = "no case learnt: " + "; ".join(tried)
    return learned, notes


def keyed(sites) -> dict[str, set[tuple[str, int]]]:
    found: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for site in sites:
        found[site.rule.id].add((site.path, site.line))
    return found


def _row(expected: set, got: set) -> dict[str, object]:
    both = expected & got
    return {
        "builtin": len(expected),
        "learned": len(got),
        "agree": len(both),
        "recall": len(both) / len(expected) if expected else None,
        "precision": len(both) / len(got) if got else None,
        "missed": sorted(expected - got)[:12],
        "extra": sorted(got - expected)[:12],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", action="append", choices=["4.34", "5.24"])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the figures as JSON")
    parser.add_argument(
        "--rule",
        action="append",
        metavar="ID",
        help="measure only this built-in rule (repeat it; default: every rule)",
    )
    args = parser.parse_args()
    corpora = args.corpus or ["4.34", "5.24"]
    started = time.perf_counter()
    learned, notes = learn_each()
    narrowed, levels = learn_each(negatives=True)
    if args.rule:
        unknown = set(args.rule) - set(notes)
        if unknown:
            raise SystemExit(f"unknown rule id(s): {', '.join(sorted(unknown))}")
        learned = {k: v for k, v in learned.items() if k in args.rule}
        narrowed = {k: v for k, v in narrowed.items() if k in args.rule}
        notes = {k: v for k, v in notes.items() if k in args.rule}
    changed = {
        rule_id: rule
        for rule_id, rule in narrowed.items()
        if rule_id not in learned or _text(rule) != _text(learned[rule_id])
    }
    learn_seconds = time.perf_counter() - started
    builtins = [rule for rule in load_rule_set("all") if rule.id in notes]
    rules = builtins + list(learned.values()) + list(changed.values())
    report: dict[str, object] = {
        "revision": git_revision(),
        "machine": describe_machine(),
        "learn_seconds": round(learn_seconds, 1),
        "notes": notes,
        "with_negatives": {k: levels.get(k, "") for k in notes},
        "changed_by_negatives": sorted(changed),
        "corpora": {},
    }
    for name in corpora:
        t0 = time.perf_counter()
        result = scan_paths(corpus(name), rules, jobs=args.jobs)
        found = keyed(result.sites)
        rows = {}
        negative_rows = {}
        for builtin in builtins:
            expected = found.get(builtin.id, set())
            got = found.get(LEARNED_PREFIX + builtin.id, set())
            rows[builtin.id] = _row(expected, got)
            if builtin.id in changed:
                negative_rows[builtin.id] = _row(
                    expected, found.get(NEGATIVE_PREFIX + builtin.id, set())
                )
            else:
                negative_rows[builtin.id] = rows[builtin.id]
        report["corpora"][name] = {
            "scan_seconds": round(time.perf_counter() - t0, 1),
            "errors": len(result.errors),
            "rows": rows,
            "rows_with_negatives": negative_rows,
        }
    text = json.dumps(report, indent=1, default=str)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(table(report, "rows"))
    print()
    print(table(report, "rows_with_negatives"))
    return 0


def _text(rule: Rule) -> str:
    from adopter.learn.render import rule_text

    return rule_text(rule).split("\n", 1)[1]  # without the id line


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def table(report: dict, key: str = "rows") -> str:
    corpora = report["corpora"]
    head = "| rule | " + " | ".join(
        f"{name}: built-in / learned / agree | recall | precision" for name in corpora
    )
    lines = [head + " | met |", "|---" * (1 + 3 * len(corpora) + 1) + "|"]
    met_count = 0
    measured = 0
    for rule_id in report["notes"]:
        cells = [rule_id]
        verdicts = []
        for data in corpora.values():
            row = data[key][rule_id]
            cells += [
                f"{row['builtin']} / {row['learned']} / {row['agree']}",
                _percent(row["recall"]),
                _percent(row["precision"]),
            ]
            if row["builtin"]:
                recall_ok = (row["recall"] or 0) >= TARGET_RECALL
                precision_ok = row["precision"] is not None and row["precision"] >= TARGET_PRECISION
                verdicts.append(recall_ok and precision_ok)
        if verdicts:
            measured += 1
            met = all(verdicts)
            met_count += met
            cells.append("yes" if met else "no")
        else:
            cells.append("no sites")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"{met_count} of {measured} rules with sites reach >= 90% recall at >= 95% precision "
        "on every corpus where the built-in rule has sites."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
