"""Fusions learned from one example we wrote (docs/learn.md), scanned, patched and verified:

* ``--example gated``: the activated gate times the up value, ``act(gate) * up``, as
  ``adopter.kernels.gated_activation`` (SwiGLU/GeGLU's element-wise half; the built-in modern.2
  only takes it together with the projections around it, as ``gated_mlp``);
* ``--example add_norm``: a decoder layer's residual add and RMSNorm,
  ``h = r + h; r = h; h = norm(h)``, as ``adopter.kernels.add_rms_norm`` (no built-in rule).

    python benchmarks/learn_fusion.py [--example gated|add_norm] [--sample N] [--jobs N]
        [--json FILE]

Learns the rule from ``benchmarks/learn_fusion/<example>_before.py`` / ``_after.py``, scans
transformers, timm and diffusers as installed in the modern environment
(``.cache/venv-modern``), counts the sites (and those inside a built-in rule's site of the same
kernel family, which ``apply --rule-set all`` would patch with that rule instead), applies the
learned rule alone, checks that each patched text compiles and that rewriting it again changes
nothing, and proves ``--sample`` of the patched files (every one with ``--sample 0``; transformers
modeling files, timm and diffusers files alike, spread evenly over the sorted list) with
``adopter verify``'s entry point in that environment's interpreter. Nothing is imported here;
verify's contained workers import the model code (run with ``PYTHONPATH`` set to this checkout
so that they import its kernels).
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
from adopter.match import Matcher  # noqa: E402
from adopter.match.scan import scan_paths  # noqa: E402
from adopter.rewrite import rewrite_paths, rewrite_text  # noqa: E402
from adopter.rules import load_rule_set  # noqa: E402
from adopter.verify import PatchedFile, VerifyOptions, verify_patched_files  # noqa: E402
from adopter.verify.report import verification_rows  # noqa: E402

EXAMPLE = Path(__file__).with_name("learn_fusion")
# example -> (rule id, the kernel prefix of the built-in rules a site may sit inside)
EXAMPLES = {
    "gated": ("learned.gated", "adopter.kernels.gated"),
    "add_norm": ("learned.add_rms_norm", "adopter.kernels.add_rms_norm"),
}
MODERN = ROOT / ".cache" / "venv-modern"
SITE_PACKAGES = MODERN / "lib" / "python3.11" / "site-packages"
PACKAGES = {
    "transformers 5.24": SITE_PACKAGES / "transformers" / "models",
    "timm": SITE_PACKAGES / "timm",
    "diffusers": SITE_PACKAGES / "diffusers",
}


def _patched_files(rewrite, package: str) -> list:
    """The changed files the learned rule patched: in transformers its modeling files (the
    ``modular_*.py`` sources are patched only with ``--modular``)."""
    if package.startswith("transformers"):
        return [file for file in rewrite.changed if Path(file.path).name.startswith("modeling_")]
    return list(rewrite.changed)


def _stable(files: list, rule) -> dict[str, int]:
    """Each patched text compiles, and rewriting it again changes nothing."""
    compiled = again = 0
    for file in files:
        compile(file.patched, file.path, "exec")
        compiled += 1
        second = rewrite_text(file.patched, file.path, Matcher([rule]))
        if second.patched != file.patched:
            raise SystemExit(f"{file.path}: a second rewrite changes the patched text")
        again += 1
    return {"compiles": compiled, "second_apply_unchanged": again}


def _scan(package: str, paths: list[Path], rule, builtins: list, jobs: int) -> tuple[dict, list]:
    started = time.perf_counter()
    ours: list = []
    inside: list = []
    if builtins:  # the scan only tells which sites lie inside a built-in rule's
        result = scan_paths(paths, [rule, *builtins], jobs=jobs, keep_details=True)
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
    rewrite = rewrite_paths(paths, [rule], jobs=jobs)
    if not builtins:  # every applicable site is patched or skipped by the rewrite
        ours = [outcome.site for file in rewrite.files for outcome in file.results]
    statuses: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for file in rewrite.files:
        for outcome in file.results:
            statuses[str(outcome.status)] = statuses.get(str(outcome.status), 0) + 1
            if outcome.reason:
                reasons[outcome.reason] = reasons.get(outcome.reason, 0) + 1
    patched = _patched_files(rewrite, package)
    summary = {
        "sites": len(ours),
        "files": len({site.path for site in ours}),
        "inside_builtin_sites": len(inside),
        "apply": statuses,
        "skip_reasons": reasons,
        "patched_files": len(patched),
        **_stable(patched, rule),
        "seconds": round(time.perf_counter() - started, 1),
    }
    return summary, patched


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", choices=list(EXAMPLES), default="gated")
    parser.add_argument("--sample", type=int, default=8, help="patched files to verify (0: all)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--modeling-files",
        action="store_true",
        help="transformers: its modeling_*.py files only (what runs; not the modular sources)",
    )
    args = parser.parse_args()
    rule_id, family = EXAMPLES[args.example]
    learned = learn(
        [Example.read(EXAMPLE / f"{args.example}_before.py", EXAMPLE / f"{args.example}_after.py")],
        rule_id=rule_id,
    )
    rule = learned.rule
    builtins = [r for r in load_rule_set("all") if r.kernel.startswith(family)]
    report: dict[str, object] = {
        "revision": git_revision(),
        "machine": describe_machine(),
        "rule": learned.text,
        "packages": {},
    }
    patched: list = []
    for package, path in PACKAGES.items():
        paths = [path]
        if args.modeling_files and package.startswith("transformers"):
            paths = sorted(path.rglob("modeling_*.py"))
        summary, files = _scan(package, paths, rule, builtins, args.jobs)
        report["packages"][package] = summary
        patched += files
        print(package, summary, flush=True)
    chosen = sorted(patched, key=lambda f: f.path)
    if args.sample and len(chosen) > args.sample:
        step = len(chosen) / args.sample
        chosen = [chosen[int(i * step)] for i in range(args.sample)]
    report["verified"] = _verify(chosen, args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    return 0


def _verify(chosen: list, args: argparse.Namespace) -> list[dict[str, str]]:
    items = [PatchedFile(file.path, file.patched) for file in chosen]
    options = VerifyOptions(timeout=args.timeout, python=str(MODERN / "bin" / "python"))
    found = []

    def heard(index: int, verdict) -> None:
        rows = verification_rows(items[index].original_path, verdict)
        ran: dict[str, int] = {}  # backend -> kernel calls, over every class and mode
        for row in rows:
            for per_site in row.get("backends", {}).values():
                for counts in per_site.values():
                    for backend, calls in dict(counts).items():
                        ran[backend] = ran.get(backend, 0) + calls
        for row in rows:
            if row["kind"] == "file":
                entry = {
                    "file": str(Path(row["path"]).relative_to(SITE_PACKAGES)),
                    "status": str(row["status"]),
                    "reason": str(row["reason"] or ""),
                    "backends": ran,
                }
                found.append(entry)
                print(entry, flush=True)

    verify_patched_files(items, options, on_result=heard)
    return sorted(found, key=lambda entry: entry["file"])


if __name__ == "__main__":
    raise SystemExit(main())
