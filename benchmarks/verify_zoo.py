"""Verify the rewrites on a transformers release other than the benchmark's: every modeling file
that `adopter apply` would change is checked by `adopter verify` in an environment where that
release is installed; writes docs/verification-<version>.md.

    python3 -m venv /tmp/v446
    /tmp/v446/bin/pip install torch==2.13.0 transformers==4.46.3
    python benchmarks/verify_zoo.py --version 4.46.3 --python /tmp/v446/bin/python
    python benchmarks/verify_zoo.py --version 4.46.3 --python /tmp/v446/bin/python --executor ray

The corpus is fetched from PyPI into the git-ignored cache like the scan benchmark's and patched
here, statically; the model code is imported only by verify's contained workers, run by
``--python`` (an interpreter with that release and torch installed; adopter itself comes from
this checkout). ``--executor local`` (default) runs ``--jobs`` workers here; ``--executor
ray[:ADDRESS]`` runs each file as a Ray task (see adopter.executor).

transformers 5.x (``--version 5.24.0``): ``--rule-set all`` checks every rule; ``--eager``
builds every configuration with ``attn_implementation="eager"`` (through a ``sitecustomize``
on the verify workers' path), so the attention code that the rewrite patches in
``eager_attention_forward`` runs - the 5.x default, SDPA, never calls it; ``--sample N``
checks N of the changed files, spread evenly over the sorted list; ``--files`` names them.
Generated ``modeling_*.py`` files are what ``apply`` patches (their ``modular_*.py`` sources
are skipped), so those are the ones verified.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine  # noqa: E402

from adopter.corpus import fetch_wheel  # noqa: E402
from adopter.executor import EXECUTOR_HELP, Executor, make_executor  # noqa: E402
from adopter.models.interface import PART_SUFFIX  # noqa: E402
from adopter.rewrite import rewrite_paths  # noqa: E402
from adopter.rules import load_rule_set  # noqa: E402
from adopter.verify import (  # noqa: E402
    FileVerification,
    PatchedFile,
    VerifyOptions,
    verify_patched_files,
)
from adopter.verify.report import verification_rows  # noqa: E402

EAGER = """\
# Written by benchmarks/verify_zoo.py --eager: every transformers configuration asks for eager
# attention, so the attention functions a rewrite patches are the ones that run.
try:
    from transformers import configuration_utils as _configuration_utils

    _config_class = getattr(_configuration_utils, "PreTrainedConfig", None) or getattr(
        _configuration_utils, "PretrainedConfig"
    )
    # 5.x configurations are dataclasses whose keyword arguments reach ``__post_init__``
    _hook = "__post_init__" if hasattr(_config_class, "__post_init__") else "__init__"
    _original = getattr(_config_class, _hook)

    def _eager(self, *args, **kwargs):
        kwargs.setdefault("attn_implementation", "eager")
        _original(self, *args, **kwargs)

    setattr(_config_class, _hook, _eager)
except Exception:  # no transformers here: nothing to force
    pass
"""


def eager_attention() -> dict[str, str]:
    """Environment variables that make every verify worker force eager attention: a folder
    holding the ``sitecustomize`` above, first on ``PYTHONPATH``. They are set in this process
    (the local pool's workers and a Ray instance started here inherit them) and returned for a
    Ray runtime environment's ``env_vars``; the folder must exist where the workers run."""
    site = Path(tempfile.mkdtemp(prefix="adopter-eager-"))
    (site / "sitecustomize.py").write_text(EAGER, encoding="utf-8")
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    os.environ["PYTHONPATH"] = path
    return {"PYTHONPATH": path}


def sample(items: list, count: int | None) -> list:
    """``count`` items spread evenly over the sorted list (all when ``None`` or more)."""
    if count is None or count >= len(items):
        return list(items)
    step = len(items) / count
    return [items[int(index * step)] for index in range(count)]


def changed_files(models: Path, rule_set: str = "paper") -> list[PatchedFile]:
    """Modeling files in which `adopter apply` patches at least one site, with their patched
    text (patched here, statically: nothing is imported)."""
    result = rewrite_paths([models], load_rule_set(rule_set))
    return sorted(
        (PatchedFile(Path(r.path), r.patched) for r in result.changed),
        key=lambda item: str(item.original_path),
    )


def verify_zoo(
    items: Sequence[PatchedFile],
    executor: Executor,
    *,
    timeout: float,
    python: str | None,
    memory_limit: float | None = None,
    progress: Callable[[str], None] = print,
) -> tuple[list[FileVerification], float]:
    """Every file's verdict (in ``items``' order) and the wall time in seconds; each verdict is
    announced through ``progress`` as it comes."""
    done = 0

    def heard(index: int, verdict: FileVerification) -> None:
        nonlocal done
        done += 1
        name = Path(items[index].original_path).name
        progress(f"[{done}/{len(items)}] {verdict.status}: {name} ({verdict.seconds:.1f} s)")

    started = time.perf_counter()
    verdicts = verify_patched_files(
        items,
        VerifyOptions(timeout=timeout, python=python, memory_limit=memory_limit),
        executor=executor,
        on_result=heard,
    )
    return verdicts, time.perf_counter() - started


def _error_kind(reason: str) -> str:
    """The first error a "could not build and run" reason names, its numbers and quoted names
    blanked out (else the reason's opening words): enough to group files by what stopped them."""
    found = re.search(r"\b([A-Z]\w*(?:Error|Exception)): ?([^;()]*)", reason)
    text = f"{found.group(1)}: {found.group(2)}" if found else reason
    text = re.sub(r"`[^`]*`|'[^']*'", "…", re.sub(r"\d[\d,.]*", "N", text))
    return " ".join(text.split()[:9]).replace("|", "/") or "no reason given"


def site_summary(results: list[dict], file_status: dict[str, str]) -> list[str]:
    """Lines saying where every patched site stands: how many ran and matched, and, for those
    that did not, the verdict of their file; then what stopped the not-checkable files."""
    sites: Counter = Counter()
    for row in results:
        if row.get("kind") == "site":
            verdict = file_status.get(Path(row["path"]).name, "not checkable")
            sites["ran and matched" if row["status"] == "exercised" else verdict] += 1
    total = sum(sites.values())
    lines = [
        f"Patched sites: {total}; ran and matched: {sites['ran and matched']}; never ran in a "
        f"matching check, in not-exercised files: {sites['not exercised']}, in not-checkable "
        f"files: {sites['not checkable']}, in refuted files: {sites['refuted']}. "
        "`adopter apply --verify` writes a file's patch only where verify proves it (dropping "
        "the rules whose sites never ran and checking the rest again), so every other site is "
        "skipped with the reason shown below.\n",
    ]
    stopped: Counter = Counter()
    for row in results:
        name = Path(row["path"]).name
        if row.get("kind", "file") == "file" and file_status.get(name) == "not checkable":
            stopped[_error_kind(str(row.get("reason", "")))] += 1
    if stopped:
        lines += [
            "What stopped the not-checkable files (the first error named in the file's reason):\n",
            "| first error | files |",
            "|---|---|",
            *(f"| {kind} | {count} |" for kind, count in stopped.most_common(20)),
            *(
                [
                    f"| (other errors) | {sum(stopped.values()) - sum(dict(stopped.most_common(20)).values())} |"
                ]
                if len(stopped) > 20
                else []
            ),
            "",
        ]
    return lines


def part_summary(results: list[dict], file_status: dict[str, str]) -> list[str]:
    """A line saying how much of the proof came from part checks: sites that matched only
    when their module was checked on its own, and the verified files that hold such a site."""
    only_parts = [
        row
        for row in results
        if row.get("kind") == "site"
        and row["status"] == "exercised"
        and row.get("matched_in")
        and all(PART_SUFFIX in label for label in row["matched_in"])
    ]
    files = {Path(row["path"]).name for row in only_parts}
    verified = sum(1 for name in files if file_status.get(name) == "verified")
    return [
        f"Part checks: {len(only_parts)} patched site(s) in {len(files)} file(s) ran and matched "
        f"only when their module was checked on its own (a part of a checked model, or built "
        f"from its configuration; `{PART_SUFFIX.strip()}` in the check's name); {verified} of "
        "those files are verified.\n",
    ]


def interpreter(python: str | None, adopter: str | None) -> str | None:
    """The worker interpreter: ``--python``, else the ``python`` beside ``--adopter``."""
    if python:
        return python
    if adopter:
        return str(Path(adopter).with_name("python"))
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True, help="transformers release, e.g. 4.46.3")
    parser.add_argument("--python", help="interpreter of an environment with that release")
    parser.add_argument("--adopter", help="or the `adopter` of that environment (its python)")
    parser.add_argument("--rule-set", default="paper", help="paper, extended or all")
    parser.add_argument("--executor", default="local", help=EXECUTOR_HELP)
    parser.add_argument("--jobs", type=int, default=2, help="local workers / local Ray CPUs")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per file")
    parser.add_argument("--memory-limit", type=float, default=None, help="GiB per file")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--eager", action="store_true", help="force eager attention")
    parser.add_argument("--sample", type=int, default=None, help="check N changed files")
    parser.add_argument("--files", nargs="*", default=None, help="model names to check")
    parser.add_argument(
        "--rows", type=Path, default=None, help="also write every row, reasons whole, as JSON"
    )
    args = parser.parse_args()
    output = args.output or ROOT / "docs" / f"verification-{args.version}.md"

    models = fetch_wheel(f"transformers=={args.version}") / "transformers" / "models"
    changed = changed_files(models, args.rule_set)
    if args.files:
        changed = [c for c in changed if Path(c.original_path).parent.name in args.files]
    items = sample(changed, args.sample)
    files = [Path(item.original_path) for item in items]
    limit = args.memory_limit * 1024**3 if args.memory_limit else None
    runtime_env = None
    if args.eager:
        env_vars = eager_attention()
        if args.executor.startswith("ray"):
            runtime_env = {"env_vars": env_vars}
    with make_executor(args.executor, workers=args.jobs, runtime_env=runtime_env) as executor:
        where = executor.describe()
        verdicts, seconds = verify_zoo(
            items,
            executor,
            timeout=args.timeout,
            python=interpreter(args.python, args.adopter),
            memory_limit=limit,
        )
    minutes = seconds / 60
    results = [
        row
        for item, verdict in zip(items, verdicts, strict=True)
        for row in verification_rows(item.original_path, verdict)
    ]

    if args.rows:
        args.rows.write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")

    # `adopter verify --format json` gives one "file" row per file (the verdict that counts:
    # verified only when every patched site ran and matched), "class" rows per check and
    # "site" rows per patched site.
    per_file: dict[str, Counter] = {}
    file_status: dict[str, str] = {}
    sites: dict[str, Counter] = {}
    for row in results:
        name = Path(row["path"]).name
        kind = row.get("kind", "file")
        if kind == "class":
            per_file.setdefault(name, Counter())[row["status"]] += 1
        elif kind == "site":
            sites.setdefault(name, Counter())[row["status"]] += 1
        else:
            file_status[name] = row["status"]
            per_file.setdefault(name, Counter())
    verdicts = Counter(file_status.values())
    refereed = [
        row
        for row in results
        if row.get("kind") == "class"
        and row["status"] == "verified"
        and any(figures.get("settled") for figures in (row.get("referee") or {}).values())
    ]
    lines = [
        f"# Verification on transformers {args.version}\n",
        f"Produced by `python benchmarks/verify_zoo.py --version {args.version} --python "
        f"PYTHON --executor {args.executor} --jobs {args.jobs}"
        + (f" --rule-set {args.rule_set}" if args.rule_set != "paper" else "")
        + (" --eager" if args.eager else "")
        + (f" --sample {args.sample}" if args.sample else "")
        + f"` (PYTHON: the interpreter of an environment with `transformers=={args.version}` "
        f"and `torch==2.13.0` installed) on {describe_machine()}; {minutes:.1f} min on "
        f"{where}; rule set `{args.rule_set}`"
        f"{', eager attention forced (`--eager`)' if args.eager else ''}. "
        f"{len(files)} of the {len(changed)} modeling files the rules change "
        f"{'(an even sample) ' if len(files) < len(changed) else ''}"
        "are checked by `adopter verify`: the original and the patched model are built from the "
        "same small configuration, the original's weights load strictly into the patch, and "
        "outputs and gradients are compared in eval, train and (where the kernels draw random "
        "numbers like the original) train-with-dropout mode.\n",
        "A file counts as verified only when every patched site (each `adopter.kernels` call) "
        "ran in a comparison that matched and none was refuted; when comparisons matched but a "
        "site never ran in one, it is not exercised. Verify checks the base model, one head "
        "and every model class whose code holds a site; while a site has not run, it checks "
        "the model classes whose code reaches it by name and flips the boolean/enum options "
        "that guard the site or the code that builds or calls it; and while a site in a module "
        "that is not a model class has still not run, it checks that module on its own with "
        "random inputs its first layers take (a *part check*, named `(part)`), taken from a "
        "model that verified or, where no inputs ran a model whole, from that model built "
        "small without running it (its own verdict stays not checkable).\n",
        "| files | verified | refuted | not exercised | not checkable |",
        "|---|---|---|---|---|",
        f"| {len(files)} | {verdicts['verified']} | {verdicts['refuted']} | "
        f"{verdicts['not exercised']} | {verdicts['not checkable']} |",
        "",
        f"{len(refereed)} verified check(s) in "
        f"{len({Path(row['path']).name for row in refereed})} file(s) agree only after the "
        "float64 referee (float32 differences beyond the tolerance, no patched value farther "
        "from a float64 run of the original than the original's own float32 run; see "
        "docs/reliability.md).\n",
        *site_summary(results, file_status),
        *part_summary(results, file_status),
        "| file | verdict | checks verified | refuted | not checkable | sites exercised | "
        "sites not exercised | first reason (not verified) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, counts in sorted(per_file.items()):
        status = file_status.get(name, "not checkable")
        reason = next(
            (
                str(r.get("reason", ""))[:160].replace("|", "/")
                for r in results
                if Path(r["path"]).name == name
                and r.get("kind", "file") != "class"
                and r["status"] not in ("verified", "exercised")
            ),
            "",
        )
        site_counts = sites.get(name, Counter())
        lines.append(
            f"| {name} | {status} | {counts['verified']} | {counts['refuted']} | "
            f"{counts['not checkable']} | {site_counts['exercised']} | "
            f"{site_counts['not exercised']} | {reason} |"
        )
    output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {output}: {dict(verdicts)}, {minutes:.1f} min")
    return 1 if verdicts["refuted"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
