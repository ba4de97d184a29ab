"""A fusion no built-in rule has, learned from one example we wrote (docs/learn.md): the
activated gate times the up value, ``act(gate) * up``, as ``adopter.kernels.gated_activation``
(SwiGLU/GeGLU's element-wise half; the built-in modern.2 only takes it together with the
projections around it, as ``gated_mlp``).

    python benchmarks/learn_fusion.py [--sample N] [--jobs N] [--json FILE]

Learns the rule from ``benchmarks/learn_fusion/gated_before.py`` / ``gated_after.py``, scans
transformers, timm and diffusers as installed in the modern environment
(``.cache/venv-modern``), counts the sites (and those inside a built-in rule's site, which
``apply --rule-set all`` would patch with that rule instead), applies the learned rule alone, and
proves ``--sample`` of the patched transformers modeling files with ``adopter verify``'s entry
point in that environment's interpreter. Nothing is imported here; verify's contained workers
import the model code.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine, git_revision  # noqa: E402

from adopter.learn import Example, learn  # noqa: E402
from adopter.match.scan import scan_paths  # noqa: E402
from adopter.rewrite import rewrite_paths  # noqa: E402
from adopter.rules import load_rule_set  # noqa: E402
from adopter.verify import PatchedFile, verify_patched_files  # noqa: E402
from adopter.verify.report import verification_rows  # noqa: E402

EXAMPLE = Path(__file__).with_name("learn_fusion")
MODERN = ROOT / ".cache" / "venv-modern"
SITE_PACKAGES = MODERN / "lib" / "python3.11" / "site-packages"
PACKAGES = {
    "transformers 5.24": SITE_PACKAGES / "transformers" / "models",
    "timm": SITE_PACKAGES / "timm",
    "diffusers": SITE_PACKAGES / "diffusers",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=8, help="transformers files to verify")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    learned = learn(
        [Example.read(EXAMPLE / "gated_before.py", EXAMPLE / "gated_after.py")],
        rule_id="learned.gated",
    )
    rule = learned.rule
    # the built-in rules of the same kernel family: a learned site inside one of theirs is
    # code apply --rule-set all patches with the built-in rule (gated_mlp) instead
    builtins = [r for r in load_rule_set("all") if r.kernel.startswith("adopter.kernels.gated")]
    report: dict[str, object] = {
        "revision": git_revision(),
        "machine": describe_machine(),
        "rule": learned.text,
        "packages": {},
    }
    patched_transformers: list = []
    for package, path in PACKAGES.items():
        started = time.perf_counter()
        result = scan_paths([path], [rule, *builtins], jobs=args.jobs, keep_details=True)
        builtin_calls = {
            (site.path, step.line, step.column)
            for site in result.sites
            if site.rule is not rule
            for step in site.steps
        }
        ours = [site for site in result.sites if site.rule is rule]
        inside = [
            site
            for site in ours
            if any((site.path, step.line, step.column) in builtin_calls for step in site.steps)
        ]
        rewrite = rewrite_paths([path], [rule])
        statuses: dict[str, int] = {}
        for file in rewrite.files:
            for outcome in file.results:
                statuses[str(outcome.status)] = statuses.get(str(outcome.status), 0) + 1
        report["packages"][package] = {
            "sites": len(ours),
            "files": len({site.path for site in ours}),
            "inside_builtin_sites": len(inside),
            "apply": statuses,
            "seconds": round(time.perf_counter() - started, 1),
        }
        if package.startswith("transformers"):
            patched_transformers = [
                file for file in rewrite.changed if Path(file.path).name.startswith("modeling_")
            ]
        print(package, report["packages"][package], flush=True)
    chosen = sorted(patched_transformers, key=lambda f: f.path)
    if args.sample and len(chosen) > args.sample:
        step = len(chosen) / args.sample
        chosen = [chosen[int(i * step)] for i in range(args.sample)]
    items = [PatchedFile(file.path, file.patched) for file in chosen]
    verdicts = verify_patched_files(
        items, timeout=args.timeout, python=str(MODERN / "bin" / "python")
    )
    rows = []
    for item, verdict in zip(items, verdicts, strict=True):
        rows += [
            row for row in verification_rows(item.original_path, verdict) if row["kind"] == "file"
        ]
    report["verified"] = [
        {"file": str(Path(row["path"]).relative_to(SITE_PACKAGES)), "status": str(row["status"])}
        for row in rows
    ]
    for row in report["verified"]:
        print(row, flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
