"""Measure ``adopter.patch`` / ``adopter run`` and write docs/patch.md.

    python3 -m venv .venv5
    .venv5/bin/pip install torch==2.13.0 transformers==5.24.0 diffusers==0.42.1 -e .
    python benchmarks/patch_report.py --python .venv5/bin/python

1. Start-up: fresh interpreters of ``--python``, in interleaved order, each importing
   transformers and building a tiny Llama (which imports the ~170 transformers modules a Llama
   needs): plainly; after ``adopter.patch("transformers")`` with an empty cache (cold); and with
   the cache a previous run filled (warm). Adopter's cost is the patched run's time from
   ``adopter.patch`` to the built model minus the plain run's build time.
2. For scale, the time to rewrite every file of the installed transformers (what an eager patch
   of the whole package would cost cold; ``adopter.patch`` never does this).
3. The example training scripts, plainly and under ``adopter run``, alternately: losses and the
   peak memory of a training step (``MALLOC_MMAP_THRESHOLD_=65536``, see examples/_common.py),
   and what was patched.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine  # noqa: E402

STARTUP = """
import json, sys, time
clock = lambda: (time.perf_counter(), time.process_time())
started = clock()
import torch, transformers
torch.set_num_threads(1)
imported = clock()
if sys.argv[1] == "patched":
    import adopter
    adopter.patch("transformers")
patched = clock()
from transformers import LlamaConfig, LlamaForCausalLM
config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)
model = LlamaForCausalLM(config)
built = clock()
modules = sum(1 for name in sys.modules if name.startswith("transformers"))
span = lambda a, b: {"wall": b[0] - a[0], "cpu": b[1] - a[1]}
print(json.dumps({"import": span(started, imported), "patch": span(imported, patched),
                  "build": span(patched, built), "modules": modules}))
"""

WHOLE_PACKAGE = """
import json, os, resource, sys, time
import transformers
from adopter.rewrite import rewrite_paths
from adopter.rules import load_rule_set

def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

started, started_cpu = time.perf_counter(), cpu()
result = rewrite_paths([os.path.dirname(transformers.__file__)], load_rule_set("all"), jobs=2)
print(json.dumps({"files": len(result.files), "changed": len(result.changed),
                  "seconds": time.perf_counter() - started, "cpu": cpu() - started_cpu}))
"""

DESIGN = [
    "",
    "## How it works",
    "",
    "* **What is patched.** `adopter.patch(target)` takes a module (object or name), a package "
    "(its submodules imported now, and through an import hook each one imported later; the rest "
    "are never imported for the purpose) or an `nn.Module` (the modules defining its classes). "
    "`adopter run -- COMMAND` and `import adopter.auto` hook transformers, timm and diffusers "
    "(`--packages` / `ADOPTER_PACKAGES`); user code only when named.",
    "* **Static rewrite, in-place code.** A module's file is read and rewritten by the pipeline "
    "of `adopter apply` (nothing else is executed). The rewrite only edits statements inside "
    "functions and adds a kernel import, so the runtime compiles just the functions whose source "
    "changed - each inside empty copies of its enclosing classes, so qualified names, private-name "
    "mangling and the `__class__` cell of `super()` are the original's - and assigns the new code "
    "to the live function objects (`function.__code__`, plus defaults of keyword-only parameters "
    "the rewrite added); the kernel names become module globals. Classes keep their identity: "
    "references from other modules, lazy-module caches, auto-class registries, subclasses, "
    "`isinstance`, pickles and models already built all see the patch, and the module body is not "
    "executed twice. A rewrite that changes anything else (module-level code, parameters, "
    "closures) or a function that cannot be found in the live module (a decorator without "
    "`__wrapped__`) leaves the whole module original, with the reason logged.",
    "* **Models built before the patch.** Forward-level rewrites reach them through the shared "
    "functions. Where the rewrite changes a constructor to build `kernel(Class)(...)` (the fused "
    "attention rules), `adopter.patch(model)` changes the class of the submodules already built "
    "to `kernel(Class)`, a subclass that keeps `__init__` and so every parameter; "
    "`adopter.unpatch(model)` changes them back.",
    "* **Line numbers.** The changed functions are compiled under the original file name with "
    "their line numbers mapped back onto the original file (unchanged lines exactly; lines of an "
    "edited statement onto the first original line it replaced; the added import line is not "
    "compiled at all), so tracebacks, debuggers and `inspect` show the original file's lines.",
    "* **Cache.** Per user: `$ADOPTER_CACHE_DIR`, else `$XDG_CACHE_HOME/adopter/runtime`, else "
    "`~/.cache/adopter/runtime`, created `0700`; refused (the runtime then works without it and "
    "says so) when owned by someone else, writable by group or others, or a link. An entry is a "
    "JSON record - the patched text, the sites, the verdict - named by a digest of the source "
    "bytes, the rule files' bytes, Adopter's own source, the torch version and the Python version; "
    "entries are read only when they are regular files of this user. Nothing is unpickled. "
    "`adopter cache clear` empties it.",
    "* **`verify=True`** (`adopter run --verify`): a module's rewrite is used only when "
    "`adopter verify` proves it, run once in a subprocess on the module's file (with the import "
    "hook off there, so it compares against the original) and cached with the rewrite; otherwise "
    "the original stays and the verdict is logged once. Modules verify cannot build a model from "
    '(utilities, files without a `PreTrainedModel`) are "not checkable" and stay original.',
    "* **Logging.** Logger `adopter`: one INFO line per patched module with its sites, one per "
    "module left original or site skipped, with the reason; DEBUG for modules without sites. "
    "`adopter run` prints them on stderr (`--quiet` does not); elsewhere set `ADOPTER_LOG=INFO` "
    "or configure `logging`.",
    "* **Limits.** `importlib.reload` of a patched module makes new, unpatched functions (the next "
    "`patch` patches them again). `adopter run` reaches every Python the command starts through "
    "`PYTHONPATH` (so `torchrun` workers too), except those started with `-I`, `-E` or `-S`; "
    "`import adopter.auto` works there. `adopter.patch` in a process does not reach processes it "
    "starts with `spawn` unless they call it too.",
]

EXAMPLES = ("train_tiny_llama.py", "train_tiny_diffusers.py", "train_tiny_timm.py")


def _json_run(command: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def startup(python: str, repeats: int, scratch: Path) -> dict[str, list[dict]]:
    warm = scratch / "warm"
    base = dict(os.environ, PYTHONWARNINGS="ignore")
    _json_run([python, "-c", STARTUP, "patched"], base | {"ADOPTER_CACHE_DIR": str(warm)})
    runs: dict[str, list[dict]] = {"plain": [], "cold": [], "warm": []}
    for repeat in range(repeats):
        for variant in runs:
            cache = warm if variant == "warm" else scratch / f"cold-{repeat}"
            mode = "plain" if variant == "plain" else "patched"
            env = base | {"ADOPTER_CACHE_DIR": str(cache)}
            runs[variant].append(_json_run([python, "-c", STARTUP, mode], env))
    return runs


def whole_package(python: str) -> dict:
    return _json_run([python, "-c", WHOLE_PACKAGE], dict(os.environ))


def example(python: str, script: str, repeats: int, scratch: Path) -> dict | None:
    probe = subprocess.run([python, str(ROOT / "examples" / script), "--help"], capture_output=True)
    if probe.returncode != 0:
        return {"error": probe.stderr.decode(errors="replace").strip().splitlines()[-1]}
    env = dict(
        os.environ,
        MALLOC_MMAP_THRESHOLD_="65536",
        PYTHONWARNINGS="ignore",
        ADOPTER_CACHE_DIR=str(scratch / "examples"),
    )
    records: dict[str, list[dict]] = {"plain": [], "adopter run": []}
    patched: list[str] = []
    for repeat in range(repeats):
        for variant in records:
            out = scratch / f"{script}-{variant.replace(' ', '-')}-{repeat}.json"
            command = [python, str(ROOT / "examples" / script), "--json", str(out)]
            if variant == "adopter run":
                command = [python, "-m", "adopter", "run", "--", "python", *command[1:]]
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
            records[variant].append(json.loads(out.read_text()))
            if variant == "adopter run" and not patched:
                patched = re.findall(r"^adopter: (patched .*)$", done.stderr, re.MULTILINE)
    plain, adopted = records["plain"][0]["losses"], records["adopter run"][0]["losses"]
    return {
        "python": python,
        "versions": _versions(python),
        "losses": plain,
        "max_loss_diff": max(abs(a - b) for a, b in zip(plain, adopted)),
        "peak_plain": [r["peak_bytes"] for r in records["plain"]],
        "peak_adopter": [r["peak_bytes"] for r in records["adopter run"]],
        "patched": patched,
    }


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _mib(values: list[int | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "n/a"
    return f"{_median(known) / 2**20:.1f} MiB ({min(known) / 2**20:.1f}-{max(known) / 2**20:.1f})"


def render(args: argparse.Namespace, runs, package, examples, version: str, rules) -> str:
    lines = [
        "# Adopting kernels without editing files: `adopter.patch` and `adopter run`",
        "",
        f"Command: `python benchmarks/patch_report.py --python {args.python} "
        f"--repeats {args.repeats}{' --whole-package' if package else ''}`  ",
        *[
            f"`{script}` ran with `--python-for {script}={result['python']}` "
            "(an environment where its library imports).  "
            for script, result in examples.items()
            if result.get("python", args.python) != args.python
        ],
        f"Machine: {describe_machine()}  ",
        f"Environment: {version}; rules: the built-in `all` set (paper, extended and modern).",
        "",
        "## Start-up cost",
        "",
        "A fresh interpreter imports transformers, then (patched runs) calls "
        '`adopter.patch("transformers")`, then builds a tiny `LlamaForCausalLM`, which imports '
        f"the transformers modules a Llama needs ({runs['plain'][0]['modules']} modules in all). "
        f"Medians of {args.repeats} interleaved runs (min-max in brackets) of the process's CPU "
        "time (user + system, one torch thread), which a busy machine disturbs far less than "
        "wall time (shown for the patch and the build together); cold runs start with an empty "
        "cache, warm runs with the cache a previous run filled. Adopter's cost: the patched "
        "run's patch and build minus the plain run's build.",
        "",
        "| variant | `adopter.patch` call | build of the model (imports included) | "
        "Adopter's cost | patch + build, wall |",
        "|---|---|---|---|---|",
    ]
    plain_cpu = _median([r["build"]["cpu"] for r in runs["plain"]])
    for variant, values in runs.items():
        patch = [r["patch"]["cpu"] for r in values]
        build = [r["build"]["cpu"] for r in values]
        cost = [p + b - plain_cpu for p, b in zip(patch, build)]
        wall = [r["patch"]["wall"] + r["build"]["wall"] for r in values]
        shown_cost = "-" if variant == "plain" else f"{_median(cost):+.2f} s"
        lines.append(
            f"| {variant} | {_median(patch):.2f} s | {_median(build):.2f} s "
            f"({min(build):.2f}-{max(build):.2f}) | {shown_cost} | {_median(wall):.1f} s |"
        )
    lines += [
        "",
        '`adopter.patch("transformers")` rewrites the transformers modules imported at that '
        "point and hooks the package, so each module imported later is rewritten (or read "
        "from the cache) as it is imported. It never imports the other modules of the package: "
        "importing all of transformers executes thousands of files and needs every optional "
        "dependency. Rewriting every file on disk instead, as an eager patch would, costs:",
        "",
    ]
    if package is not None:
        lines.append(
            f"* all {package['files']} files of the installed transformers rewritten "
            f"(`rewrite_paths`, 2 worker processes): {package['seconds']:.1f} s wall, "
            f"{package['cpu']:.1f} s CPU, {package['changed']} files changed."
        )
    else:
        lines.append("* (not measured in this run; pass `--whole-package`)")
    lines += [
        "",
        "## Example training scripts",
        "",
        "Each script trains for 5 steps with a fixed seed, once plainly and once under "
        "`adopter run -- python examples/SCRIPT`, alternately, "
        f"{args.repeats} times each. Peak memory: the largest resident-set growth of one "
        "training step after the first (`MALLOC_MMAP_THRESHOLD_=65536`), median (min-max).",
        "",
        "| script | losses (plain) | max \\|loss difference\\| | peak step memory plain | "
        "peak step memory with Adopter | what `adopter run` patched |",
        "|---|---|---|---|---|---|",
    ]
    for script, result in examples.items():
        if "error" in result:
            lines.append(f"| {script} | not run: {result['error']} | | | | |")
            continue
        losses = ", ".join(f"{loss:.4f}" for loss in result["losses"])
        if result.get("python", args.python) != args.python:
            losses += f" (with `{result['python']}`: {result['versions']})"
        patched = (
            "<br>".join(
                p.replace("patched ", "", 1).replace(" (cached)", "") for p in result["patched"]
            )
            or "-"
        )
        lines.append(
            f"| {script} | {losses} | {result['max_loss_diff']:.1e} | "
            f"{_mib(result['peak_plain'])} | {_mib(result['peak_adopter'])} | {patched} |"
        )
    lines += ["", *_findings(runs, package, examples, rules), *DESIGN]
    return "\n".join(lines) + "\n"


def _findings(runs, package, examples, rules: list[str]) -> list[str]:
    """What the figures say, computed from them (so a rerun cannot leave stale claims)."""
    plain_cpu = _median([r["build"]["cpu"] for r in runs["plain"]])
    plain_wall = _median([r["build"]["wall"] for r in runs["plain"]])

    def cost(variant: str) -> float:
        values = runs[variant]
        return _median([r["patch"]["cpu"] + r["build"]["cpu"] - plain_cpu for r in values])

    warm, cold = cost("warm"), cost("cold")
    found = [
        "## Findings",
        "",
        f"* Warm start: Adopter adds {warm:.2f} s of CPU time "
        f"({'within' if warm < 1 else 'over'} the 1 s goal); cold start: {cold:.2f} s "
        f"({'within' if cold < 30 else 'over'} the 30 s goal). The machine was shared with other "
        f"jobs while measuring: a plain build took {plain_wall:.1f} s of wall time for "
        f"{plain_cpu:.2f} s of CPU time ({plain_wall / plain_cpu:.0f}x), so the wall times "
        "above are mostly waiting for a core.",
    ]
    if package is not None:
        found.append(
            f"* An eager rewrite of the whole package would cost {package['cpu']:.0f} s of CPU "
            f"time ({package['files']} files) on the first start, "
            f"{package['cpu'] / max(cold, 1e-9):.0f}x the cold cost of patching on import."
        )
    for script, result in examples.items():
        if "error" in result:
            found.append(f"* {script} did not run here: {result['error']}.")
            continue
        plain = [v for v in result["peak_plain"] if v is not None]
        adopted = [v for v in result["peak_adopter"] if v is not None]
        same = result["max_loss_diff"] == 0
        losses = "identical losses" if same else f"losses within {result['max_loss_diff']:.1e}"
        if plain and adopted:
            change = (_median(adopted) - _median(plain)) / _median(plain)
            memory = (
                "no measurable change in peak step memory"
                if abs(change) < 0.05
                else f"peak step memory {change:+.0%}"
            )
        else:
            memory = "peak memory not measured"
        found.append(
            f"* {script}: {losses}, {memory}, with {len(result['patched'])} module(s) patched."
        )
    found.append(
        f"* What applies is what the rules cover (this run: {', '.join(rules)}). A Llama's "
        "training step is where the modern rules save memory (the chunked loss of modern.7 "
        "above all); the GroupNorm and conv + batch-norm fusions of the diffusers and timm "
        "examples act in inference only (in training their kernels run the original modules), "
        "so those training steps keep their memory, and the paper rules there save a pass, "
        "not a buffer."
    )
    return found


def _rule_ids() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from adopter.rules import load_rule_set

    return [rule.id for rule in load_rule_set("all")]


def _versions(python: str) -> str:
    return subprocess.run(
        [
            python,
            "-c",
            "import importlib.metadata as m; print(', '.join(f'{p} {m.version(p)}' for p in "
            "('torch', 'transformers', 'diffusers', 'timm') if __import__('importlib.util')"
            ".util.find_spec(p)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="interpreter with transformers 5.x")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--whole-package", action="store_true")
    parser.add_argument("--output", default=str(ROOT / "docs" / "patch.md"))
    parser.add_argument("--raw", help="also save the measurements here (JSON)")
    parser.add_argument("--from-raw", help="render saved measurements instead of measuring")
    parser.add_argument(
        "--python-for",
        action="append",
        default=[],
        metavar="SCRIPT=PYTHON",
        help="run one example with another interpreter (e.g. where timm imports)",
    )
    parser.add_argument(
        "--update-raw",
        help="measure again only the examples that did not run in these saved measurements",
    )
    args = parser.parse_args()
    pythons = dict(item.split("=", 1) for item in args.python_for)
    started = time.perf_counter()
    if args.update_raw:
        saved = json.loads(Path(args.update_raw).read_text(encoding="utf-8"))
        with tempfile.TemporaryDirectory(prefix="adopter-patch-report-") as folder:
            for script, result in saved["examples"].items():
                if "error" in result:
                    python = pythons.get(script, args.python)
                    measured = example(python, script, args.repeats, Path(folder))
                    saved["examples"][script] = measured
        Path(args.update_raw).write_text(json.dumps(saved, indent=1), encoding="utf-8")
        args.from_raw = args.update_raw
    if args.from_raw:
        saved = json.loads(Path(args.from_raw).read_text(encoding="utf-8"))
        runs, package, examples, version = (
            saved[key] for key in ("runs", "package", "examples", "version")
        )
        rules = saved.get("rules") or _rule_ids()
    else:
        version = _versions(args.python)
        rules = _rule_ids()
        with tempfile.TemporaryDirectory(prefix="adopter-patch-report-") as folder:
            scratch = Path(folder)
            runs = startup(args.python, args.repeats, scratch)
            package = whole_package(args.python) if args.whole_package else None
            examples = {
                s: example(pythons.get(s, args.python), s, args.repeats, scratch) for s in EXAMPLES
            }
        if args.raw:
            raw = {
                "runs": runs,
                "package": package,
                "examples": examples,
                "version": version,
                "rules": rules,
            }
            Path(args.raw).write_text(json.dumps(raw, indent=1), encoding="utf-8")
    report = render(args, runs, package, examples, version, rules)
    Path(args.output).write_text(report, encoding="utf-8")
    print(report)
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
