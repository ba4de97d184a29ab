"""Verify the rewrites on a transformers release other than the benchmark's: every modeling file
that `adopter apply` would change is checked by `adopter verify` in an environment where that
release is installed; writes docs/verification-<version>.md.

    python3 -m venv /tmp/v446
    /tmp/v446/bin/pip install torch==2.13.0 transformers==4.46.3 -e '.[torch]'
    python benchmarks/verify_zoo.py --version 4.46.3 --adopter /tmp/v446/bin/adopter

The corpus is fetched from PyPI into the git-ignored cache like the scan benchmark's; the
model code is imported only by `adopter verify`, in its own subprocesses.

transformers 5.x (``--version 5.24.0``): ``--rule-set all`` checks every rule; ``--eager``
builds every configuration with ``attn_implementation="eager"`` (through a ``sitecustomize``
on the verify subprocesses' path), so the attention code that the rewrite patches in
``eager_attention_forward`` runs - the 5.x default, SDPA, never calls it; ``--sample N``
checks N of the changed files, spread evenly over the sorted list; ``--files`` names them.
Generated ``modeling_*.py`` files are what ``apply`` patches (their ``modular_*.py`` sources
are skipped), so those are the ones verified.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine  # noqa: E402

from adopter.corpus import fetch_wheel  # noqa: E402

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


def changed_files(models: Path, rule_set: str) -> list[Path]:
    """Modeling files in which `adopter apply` patches at least one site."""
    out = subprocess.run(
        [
            sys.executable, "-m", "adopter", "apply", str(models), "--format", "json",
            "--rule-set", rule_set,
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout  # fmt: skip
    records = json.loads(out)
    return sorted({Path(r["path"]) for r in records if r.get("status") == "patched"})


def sample(files: list[Path], count: int | None) -> list[Path]:
    """``count`` files spread evenly over the sorted list (all when ``None``)."""
    if count is None or count >= len(files):
        return files
    step = len(files) / count
    return [files[int(index * step)] for index in range(count)]


def verify(
    adopter: str, path: Path, timeout: float, rule_set: str, env: dict[str, str] | None = None
) -> list[dict]:
    command = [
        adopter, "verify", str(path), "--timeout", str(timeout), "--format", "json",
        "--rule-set", rule_set,
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout + 60, check=False, env=env
        )
        return json.loads(done.stdout)
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as error:
        return [{"path": str(path), "status": "not checkable", "reason": repr(error)[:200]}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True, help="transformers release, e.g. 4.46.3")
    parser.add_argument("--adopter", required=True, help="`adopter` of that environment")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per file")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--rule-set", default="paper", help="paper, extended or all")
    parser.add_argument("--eager", action="store_true", help="force eager attention")
    parser.add_argument("--sample", type=int, default=None, help="check N changed files")
    parser.add_argument("--files", nargs="*", default=None, help="model names to check")
    args = parser.parse_args()
    output = args.output or ROOT / "docs" / f"verification-{args.version}.md"

    models = fetch_wheel(f"transformers=={args.version}") / "transformers" / "models"
    changed = changed_files(models, args.rule_set)
    if args.files:
        changed = [p for p in changed if p.parent.name in args.files]
    files = sample(changed, args.sample)
    env = None
    if args.eager:
        site = Path(tempfile.mkdtemp(prefix="adopter-eager-"))
        (site / "sitecustomize.py").write_text(EAGER, encoding="utf-8")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = [
            r
            for rows in pool.map(
                lambda p: verify(args.adopter, p, args.timeout, args.rule_set, env), files
            )
            for r in rows
        ]
    minutes = (time.perf_counter() - started) / 60

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
    lines = [
        f"# Verification on transformers {args.version}\n",
        f"Produced by `python benchmarks/verify_zoo.py --version {args.version} --adopter "
        f"ADOPTER` (ADOPTER: the `adopter` of an environment with `transformers=={args.version}` "
        f"and `torch==2.13.0` installed) on {describe_machine()}; {minutes:.1f} min with "
        f"{args.jobs} jobs; rule set `{args.rule_set}`"
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
        "and every model class whose code holds a site, and flips the boolean/enum options "
        "that guard a site that has not run.\n",
        "| files | verified | refuted | not exercised | not checkable |",
        "|---|---|---|---|---|",
        f"| {len(files)} | {verdicts['verified']} | {verdicts['refuted']} | "
        f"{verdicts['not exercised']} | {verdicts['not checkable']} |",
        "",
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
