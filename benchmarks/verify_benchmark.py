"""Verify every patched model of the paper's benchmark and write docs/verification.md.

    python benchmarks/verify_benchmark.py [--jobs 2] [--timeout 300] [--heads 1]
    python benchmarks/verify_benchmark.py --executor ray[:ADDRESS]   # each file a Ray task

Each of the 199 modeling files is patched with the nine rules (in memory); every file that
changed is differentially tested by ``adopter.verify`` against the installed
``transformers==4.34.0`` (same small config, strict state_dict load, same inputs; outputs and
gradients compared in eval and train mode). Model code is imported only in verify's worker
subprocesses, never in this process.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine, git_revision  # noqa: E402
from scan_benchmark import corpus_paths, load_expected  # noqa: E402

from adopter.executor import EXECUTOR_HELP, make_executor  # noqa: E402
from adopter.gate import file_status  # noqa: E402
from adopter.match import Matcher  # noqa: E402
from adopter.rewrite import rewrite_text  # noqa: E402
from adopter.rules import load_rule_set  # noqa: E402
from adopter.verify import PatchedFile, VerifyOptions, verify_patched_files  # noqa: E402


def installed_models_dir() -> Path | None:
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0]) / "models"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--executor", default="local", help=EXECUTOR_HELP)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument(
        "--heads", type=int, default=1, help="head classes per file besides the base model"
    )
    parser.add_argument("--models", help="comma-separated subset (default: all 199)")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "verification.md")
    parser.add_argument(
        "--rule-set", default="paper", help="built-in rule set to patch with (paper, extended, all)"
    )
    args = parser.parse_args()

    models, _ = load_expected()
    if args.models:
        models = [m for m in models if m in set(args.models.split(","))]
    paths = corpus_paths(models)
    installed = installed_models_dir()
    rules = load_rule_set(args.rule_set)
    matcher = Matcher(rules)

    items: list[tuple[str, PatchedFile, list[str]]] = []
    outcome: dict[str, tuple[str, str, float | None, str | None]] = {}
    rules_of: dict[str, list[str]] = {}
    for model in models:
        path = paths[model]
        rewrite = rewrite_text(path.read_text(encoding="utf-8"), str(path), matcher)
        used = rewrite.rules_patched
        rules_of[model] = used
        if not rewrite.changed:
            outcome[model] = ("unchanged", "no site patched", None, None)
            continue
        target = installed / model / path.name if installed else None
        if target is None or not target.exists():
            outcome[model] = (
                "not checkable",
                "not part of the installed transformers 4.34.0 (first released later)",
                None,
                None,
            )
            continue
        if target.read_text(encoding="utf-8") != path.read_text(encoding="utf-8"):
            outcome[model] = ("not checkable", "installed file differs from the wheel", None, None)
            continue
        items.append((model, PatchedFile(target, rewrite.patched), used))

    started = time.perf_counter()
    sites_of: dict[str, list] = {}

    def heard(index: int, verification) -> None:
        model = items[index][0]
        sites_of[model] = verification.sites
        status, reason = file_status(verification)
        diffs = [c.max_abs_diff for c in verification.classes if c.max_abs_diff is not None]
        where = None
        worst = None
        if diffs:
            worst = max(diffs)
            where = next(
                f"{c.cls}: {c.where}" for c in verification.classes if c.max_abs_diff == worst
            )
        outcome[model] = (status, reason, worst, where)
        print(f"{model}: {status}", flush=True)

    with make_executor(args.executor, workers=args.jobs) as executor:
        verify_patched_files(
            [item for _, item, _ in items],
            VerifyOptions(timeout=args.timeout, max_heads=args.heads),
            executor=executor,
            on_result=heard,
        )
    seconds = time.perf_counter() - started

    kernel_rules = {rule.id: rule.kernel.rpartition(".")[2] for rule in rules}
    site_stats: dict[str, Counter] = defaultdict(Counter)  # rule -> exercised / not exercised
    for model, entries in sites_of.items():
        for entry in entries:
            for rule in rules_of[model]:
                if kernel_rules.get(rule) == entry.site.kernel:
                    site_stats[rule][entry.status] += 1
    counts = Counter(status for status, *_ in outcome.values())
    patched_models = [m for m in models if outcome[m][0] != "unchanged"]
    checked = [m for m in patched_models if outcome[m][0] in ("verified", "refuted")]
    per_rule: dict[str, Counter] = defaultdict(Counter)
    worst_by_rule: dict[str, tuple[float, str]] = {}
    for model in patched_models:
        status, _, worst, where = outcome[model]
        for rule in rules_of[model]:
            per_rule[rule][status] += 1
            if worst is not None and (rule not in worst_by_rule or worst > worst_by_rule[rule][0]):
                worst_by_rule[rule] = (worst, f"{model} ({where})")

    out: list[str] = []
    w = out.append
    w("# Verification: every patched benchmark model, original vs patched\n")
    w(
        f"Produced by `python benchmarks/verify_benchmark.py --jobs {args.jobs}"
        + (f" --executor {args.executor}" if args.executor != "local" else "")
        + f" --timeout "
        f"{args.timeout:g} --heads {args.heads}"
        + (f" --rule-set {args.rule_set}" if args.rule_set != "paper" else "")
        + (f" --models {args.models}" if args.models else "")
        + f"` at commit `{git_revision()}` on {describe_machine()}, "
        f"torch 2.13.0 (CPU), transformers 4.34.0. Wall time: {seconds / 60:.1f} min.\n"
    )
    w(
        f"For each of the {len(models)} modeling files, the {len(rules)} rules of the "
        f"`{args.rule_set}` set are applied (in memory). Every file "
        "that changed is checked by `adopter verify`: the base model class and up to "
        f"{args.heads} head class(es) are built from the same shrunken configuration, the "
        "original's `state_dict` is loaded strictly into the patched model, both get the same "
        "seeded inputs, and outputs, parameter gradients and buffers are compared in eval mode and "
        "in train mode (dropout probabilities set to 0; with the configured dropout too where the "
        "kernels draw random numbers like the original).\n"
    )
    w(
        "Every patched site (each `adopter.kernels` call in the patched file) is counted when it "
        "runs, per check and mode. A model is **verified** only when every one of its patched "
        "sites ran in a comparison that matched; when comparisons matched but a site never ran "
        "in one, it is **not exercised** and the site is named below. To reach sites, verify also "
        "checks every model class whose own code holds a site and, for a site under a condition, "
        "configurations with the boolean/enum options that condition reads flipped (at most 6 "
        "extra checks per file).\n"
    )
    w("## Summary\n")
    w("| outcome | models |")
    w("|---|---|")
    w(f"| patched | {len(patched_models)} of {len(models)} |")
    for status in ("verified", "refuted", "not exercised", "not checkable"):
        w(f"| {status} | {counts.get(status, 0)} |")
    w(
        f"| built and checked (verified or refuted) | {len(checked)} of {len(patched_models)} "
        f"({100 * len(checked) / max(1, len(patched_models)):.1f}%) |"
    )
    w(f"| unchanged (no site) | {counts.get('unchanged', 0)} |")
    w("")
    w("## Per rule\n")
    w(
        "A model counts under every rule that patched it; the largest difference is the largest "
        "absolute difference of any compared output, gradient or buffer in a model patched by "
        "that rule (float32).\n"
    )
    w(
        "| rule | models patched | verified | refuted | not exercised | not checkable | "
        "sites exercised | sites not exercised | largest difference (where) |"
    )
    w("|---|---|---|---|---|---|---|---|---|")
    for rule in sorted(per_rule):
        stats = per_rule[rule]
        worst = worst_by_rule.get(rule)
        worst_text = f"{worst[0]:.2e} in {worst[1]}" if worst else "-"
        w(
            f"| {rule} | {sum(stats.values())} | {stats['verified']} | {stats['refuted']} | "
            f"{stats['not exercised']} | {stats['not checkable']} | "
            f"{site_stats[rule]['exercised']} | {site_stats[rule]['not exercised']} | "
            f"{worst_text} |"
        )
    w("")
    w("## Patched sites per model\n")
    w(
        "Sites counted in the models that were checked (a model that could not be built has no "
        "run to count). A site is exercised when it ran in a comparison that matched.\n"
    )
    w("| model | sites | exercised | not exercised |")
    w("|---|---|---|---|")
    for model in patched_models:
        entries = sites_of.get(model)
        if not entries:
            continue
        ran = sum(entry.exercised for entry in entries)
        w(f"| `{model}` | {len(entries)} | {ran} | {len(entries) - ran} |")
    w("")
    missing = [
        (model, entry)
        for model in patched_models
        for entry in sites_of.get(model, [])
        if not entry.exercised and outcome[model][0] in ("verified", "not exercised")
    ]
    w(f"## Sites not exercised in models whose checks matched ({len(missing)})\n")
    for model, entry in missing:
        w(f"- `{model}`: {entry.site.describe()}: {entry.reason}")
    w("")
    for title, status in (
        ("Refuted", "refuted"),
        ("Not exercised", "not exercised"),
        ("Not checkable", "not checkable"),
    ):
        chosen = [m for m in patched_models if outcome[m][0] == status]
        w(f"## {title} ({len(chosen)})\n")
        for model in chosen:
            w(f"- `{model}` ({', '.join(rules_of[model])}): {outcome[model][1]}")
        w("")
    w("## Verified\n")
    w(", ".join(f"`{m}`" for m in patched_models if outcome[m][0] == "verified") + "\n")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(out) + "\n", encoding="utf-8")
    print(f"wrote {args.output}: {dict(counts)}, {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
