"""Verify a sample of the transformers 5.x zoo on the local pool and on Ray; write docs/scale.md.

    python3 -m venv .venv5 && .venv5/bin/pip install torch==2.13.0 transformers==5.24.0
    python benchmarks/scale_report.py --python .venv5/bin/python [--sample 16] [--eager]
    python benchmarks/scale_report.py --render-only      # re-render from docs/scale.json

The files `adopter apply --rule-set all` changes in transformers 5.24.0 are counted (statically,
nothing imported); an evenly spread sample of them is verified four times - on the local pool
with 1 and 2 workers and on a Ray instance started here with 1 and 2 CPUs - by the same
`verify_patched_files` call, only the executor differs. The report compares the verdicts of all
four runs file by file, gives the wall times (with the load average before each run, since other
work on the machine slows a run down) and projects the time for every changed file of the
release on N nodes from the measured cost per file. Raw figures go to docs/scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine, git_revision  # noqa: E402
from verify_zoo import changed_files, eager_attention, sample, verify_zoo  # noqa: E402

from adopter.corpus import fetch_wheel  # noqa: E402
from adopter.executor import make_executor  # noqa: E402
from adopter.verify import FileVerification  # noqa: E402

VERSION = "5.24.0"
RULE_SET = "all"
RUNS = (("local", 1), ("local", 2), ("ray", 1), ("ray", 2))
NODE_COUNTS = (1, 2, 4, 8, 16, 32, 64)


def cpu_ticks() -> tuple[int, int]:
    """Busy and total CPU ticks of the whole machine since boot (``/proc/stat``): their
    difference over a run says how much of the machine was busy, with our work or others'."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


class TreeCpu:
    """CPU seconds used by this process and everything it starts (the local pool's workers,
    a Ray instance started here with its workers, and the verify subprocesses of both), read
    from ``/proc`` every ``interval`` seconds while a run lasts. This is the work's own cost,
    apart from what other work on a shared machine takes; a process's last fraction of an
    interval before it exits is missed, so it undercounts slightly."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self._start: dict[tuple[int, int], int] = {}
        self._last: dict[tuple[int, int], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    @staticmethod
    def _table() -> dict[tuple[int, int], tuple[int, int]]:
        """(pid, start time) -> (parent pid, user + system ticks) for every process."""
        table = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2 :].split()  # after "pid (name) "
            parent, ticks, started = int(fields[1]), int(fields[11]) + int(fields[12]), fields[19]
            table[(int(entry.name), int(started))] = (parent, ticks)
        return table

    def _sample(self) -> dict[tuple[int, int], int]:
        table = self._table()
        children: dict[int, list[tuple[int, int]]] = {}
        for key, (parent, _) in table.items():
            children.setdefault(parent, []).append(key)
        mine = [key for key in table if key[0] == os.getpid()]
        found, queue = {}, list(mine)
        while queue:
            key = queue.pop()
            found[key] = table[key][1]
            queue.extend(children.get(key[0], []))
        return found

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self._last.update(self._sample())

    def __enter__(self) -> TreeCpu:
        self._start = self._sample()
        self._last = dict(self._start)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._last.update(self._sample())

    @property
    def seconds(self) -> float:
        ticks = sum(last - self._start.get(key, 0) for key, last in self._last.items())
        return ticks / os.sysconf("SC_CLK_TCK")


def outcome(verdict: FileVerification) -> dict[str, Any]:
    """What must be identical between executors: the verdict, its reason, every check and
    every site (the run's seconds and the worker's notes are not outcomes)."""
    return {
        "status": verdict.status,
        "reason": verdict.reason(),
        "checks": [[c.label, c.status, c.reason] for c in verdict.classes],
        "sites": [[s.site.describe(), s.status] for s in verdict.sites],
    }


def count_zoo(corpus: Path) -> tuple[dict[str, Any], list[Any]]:
    """Python files in the release, and the files the rule set changes (static rewrite)."""
    package = corpus / "transformers"
    started = time.perf_counter()
    changed = changed_files(package, RULE_SET)
    seconds = time.perf_counter() - started
    models = package / "models"
    stats = {
        "py_files": sum(1 for _ in package.rglob("*.py")),
        "model_py_files": sum(1 for _ in models.rglob("*.py")),
        "changed": len(changed),
        "changed_models": sum(1 for c in changed if models in Path(c.original_path).parents),
        "apply_seconds": round(seconds, 1),
    }
    return stats, changed


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    import torch

    corpus = fetch_wheel(f"transformers=={VERSION}")
    zoo, changed = count_zoo(corpus)
    models = corpus / "transformers" / "models"
    candidates = [item for item in changed if models in Path(item.original_path).parents]
    chosen = sample(candidates, args.sample)
    names = [str(Path(item.original_path).relative_to(models)) for item in chosen]
    print(f"{zoo['changed']} changed files; verifying {len(chosen)} of them", flush=True)
    env_vars = eager_attention() if args.eager else None
    runs = []
    for name, workers in RUNS:
        runtime_env = {"env_vars": env_vars} if env_vars and name == "ray" else None
        load = os.getloadavg()
        busy_before, total_before = cpu_ticks()
        started = time.perf_counter()
        with make_executor(name, workers=workers, runtime_env=runtime_env) as executor:
            ready = time.perf_counter() - started
            where = executor.describe()
            print(f"== {where}", flush=True)
            with TreeCpu() as cpu:
                verdicts, seconds = verify_zoo(
                    chosen, executor, timeout=args.timeout, python=args.python
                )
            busy_after, total_after = cpu_ticks()
        runs.append(
            {
                "executor": name,
                "workers": workers,
                "describe": where,
                "start_seconds": round(ready, 1),
                "wall_seconds": round(seconds, 1),
                "load_before": [round(x, 2) for x in load],
                "load_after": [round(x, 2) for x in os.getloadavg()],
                "cpu_seconds": round(cpu.seconds, 1),
                "machine_busy": round(
                    (busy_after - busy_before) / max(1, total_after - total_before), 3
                ),
                "file_seconds": [v.seconds for v in verdicts],
                "outcomes": [outcome(v) for v in verdicts],
            }
        )
        print(f"   {seconds:.0f} s", flush=True)
    return {
        "version": VERSION,
        "rule_set": RULE_SET,
        "timeout": args.timeout,
        "sample": args.sample,
        "eager": args.eager,
        "files": names,
        "zoo": zoo,
        "runs": runs,
        "machine": describe_machine(),
        "revision": git_revision(),
        "ray": ray.__version__,
        "torch": torch.__version__,
    }


def _label(run: dict[str, Any]) -> str:
    kind = "local pool" if run["executor"] == "local" else "Ray (started here)"
    unit = "worker" if run["executor"] == "local" else "CPU"
    return f"{kind}, {run['workers']} {unit}{'s' if run['workers'] > 1 else ''}"


def render(data: dict[str, Any]) -> str:
    runs = data["runs"]
    files = data["files"]
    zoo = data["zoo"]
    reference = runs[0]["outcomes"]
    differing = [
        (files[index], _label(run))
        for run in runs[1:]
        for index, (mine, theirs) in enumerate(zip(run["outcomes"], reference))
        if mine != theirs
    ]
    out: list[str] = []
    w = out.append
    w("# Scale: verifying a model zoo on the local pool and on Ray\n")
    w(
        f"Produced by `python benchmarks/scale_report.py --python .venv5/bin/python --sample "
        f"{data['sample']}{' --eager' if data.get('eager') else ''}` at commit "
        f"`{data['revision']}` on {data['machine']}; torch "
        f"{data['torch']}, Ray {data['ray']}; the verify workers run transformers "
        f"{data['version']} (`.venv5`: `torch==2.13.0 transformers=={data['version']}`). "
        f"Timeout {data['timeout']:g} s per file"
        + (
            "; eager attention forced (`--eager`: every configuration is built with "
            '`attn_implementation="eager"`, so the patched `eager_attention_forward` runs; the '
            "5.x default, SDPA, never calls it)"
            if data.get("eager")
            else ""
        )
        + ".\n"
    )
    w(
        f"The sample: {len(files)} of the {zoo['changed']} files that `adopter apply --rule-set "
        f"{data['rule_set']}` changes in transformers {data['version']}, evenly spread over them "
        "in path order. Each run is the same `verify_patched_files` call (through "
        "`benchmarks/verify_zoo.py`'s `verify_zoo`); only the executor differs. The local pool "
        "deals the files round-robin to its workers, each a contained worker process that "
        "imports torch and transformers once for its files; Ray runs every file as a task of its "
        "own, so every file pays one worker start.\n"
    )
    w("## The same report from every executor\n")
    if differing:
        w(f"**{len(differing)} verdict(s) differ** from the first run's:\n")
        for name, label in differing:
            w(f"- `{name}` on {label}")
        w("")
    else:
        w(
            f"Identical outcomes: for every file, the verdict, its reason, every check (class, "
            f"status, reason) and every patched site's status are equal in all {len(runs)} runs "
            "(compared field by field by the script).\n"
        )
    counts: dict[str, dict[str, int]] = {}
    for run in runs:
        tally: dict[str, int] = {}
        for item in run["outcomes"]:
            tally[item["status"]] = tally.get(item["status"], 0) + 1
        counts[_label(run)] = tally
    statuses = ("verified", "refuted", "not exercised", "not checkable")
    w("| run | " + " | ".join(statuses) + " |")
    w("|---|" + "---|" * len(statuses))
    for label, tally in counts.items():
        w(f"| {label} | " + " | ".join(str(tally.get(s, 0)) for s in statuses) + " |")
    w("")
    local, ray = runs[1], runs[3]
    w(f"| file | {_label(local)} | {_label(ray)} | checks | sites |")
    w("|---|---|---|---|---|")
    for index, name in enumerate(files):
        mine, theirs = local["outcomes"][index], ray["outcomes"][index]
        same = "same" if mine == theirs else "**differs**"
        ran = sum(1 for _, status in mine["sites"] if status == "exercised")
        w(
            f"| `{name}` | {mine['status']} | {theirs['status']} ({same}) | "
            f"{len(mine['checks'])} | {ran} of {len(mine['sites'])} ran |"
        )
    w("")
    w("## Wall time on this machine\n")
    w(
        "Wall time of the verification alone; starting the executor (a Ray instance: a few "
        "seconds) is given apart. This machine is shared: other work runs on the same cores, so "
        "each run gives the load average (1, 5, 15 min) before it, the share of the whole "
        "machine's CPU time that was busy during it (`/proc/stat`: this run's work and everyone "
        "else's), and the CPU time the run's own processes used (the executor, its workers and "
        "their verify subprocesses, read from `/proc`; *cores* = that CPU time over the wall "
        "time, the share of the machine the run actually got).\n"
    )
    w(
        "| run | wall | per file | speed-up over 1 | CPU used | cores | executor start | "
        "load before | machine busy |"
    )
    w("|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        single = _single(runs, run)
        speedup = single["wall_seconds"] / run["wall_seconds"] if run["wall_seconds"] else 0
        load = ", ".join(f"{x:.2f}" for x in run["load_before"])
        cpu = run.get("cpu_seconds")
        cores = f"{cpu / run['wall_seconds']:.2f}" if cpu and run["wall_seconds"] else "-"
        w(
            f"| {_label(run)} | {run['wall_seconds']:.0f} s | "
            f"{run['wall_seconds'] / len(files):.1f} s | {speedup:.2f}x | "
            f"{'-' if cpu is None else f'{cpu:.0f} s'} | {cores} | "
            f"{run['start_seconds']:.1f} s | {load} | {_share(run.get('machine_busy'))} |"
        )
    w("")
    if all(r.get("cpu_seconds") for r in runs):
        for pair in (runs[0:2], runs[2:4]):
            one, two = pair
            measured = one["wall_seconds"] / two["wall_seconds"]
            extra = two["cpu_seconds"] / one["cpu_seconds"] - 1
            free = 2 * one["cpu_seconds"] / two["cpu_seconds"]
            unit = "workers" if one["executor"] == "local" else "CPUs"
            w(
                f"- {_label(one).split(',')[0]}: 2 {unit} were {measured:.2f}x as fast as 1 "
                f"while getting {two['cpu_seconds'] / two['wall_seconds']:.2f} cores "
                f"against {one['cpu_seconds'] / one['wall_seconds']:.2f}; the work cost "
                f"{extra:+.0%} CPU time over the 1-{unit[:-1]} run's, so on two free cores the "
                f"speed-up would be about {free:.2f}x (the CPU time split over two cores; an "
                "estimate, not a measurement: an uneven split of the files lowers it)."
            )
        w("")
    ray_one, local_one = runs[2], runs[0]
    basis = "cpu_seconds" if ray_one.get("cpu_seconds") and local_one.get("cpu_seconds") else None
    cost_key = basis or "wall_seconds"
    start_cost = (ray_one[cost_key] - local_one[cost_key]) / len(files)
    w(
        f"A Ray task costs {start_cost:+.1f} s of {'CPU' if basis else 'wall'} time per file "
        "against the local pool's batches: the verify worker it starts imports torch and "
        "transformers for one file instead of once for many, and Ray's own processes run beside "
        "it. It buys per-file isolation (one file's global side effects cannot reach another), "
        "retries of a dead worker, and any number of machines.\n"
    )
    w(f"## Projection: every changed file of transformers {data['version']}\n")
    w(
        f"transformers {data['version']} holds {zoo['py_files']:,} `.py` files "
        f"({zoo['model_py_files']:,} under `models/`); `adopter apply --rule-set "
        f"{data['rule_set']}` changes {zoo['changed']} of them ({zoo['changed_models']} under "
        f"`models/`; the static rewrite of the whole package took {zoo['apply_seconds']:.0f} s "
        "here). Those are the files verify has to check.\n"
    )
    per_file = ray_one[cost_key] / len(files)
    wall_per_file = ray_one["wall_seconds"] / len(files)
    what = "CPU time (the run's own processes, Ray's included)" if basis else "wall time"
    w(
        f"Cost per file on Ray with one CPU: {per_file:.1f} s of {what}; {wall_per_file:.1f} s "
        "of wall time here, where other work shared the cores. "
        "Verification is one independent task per file, so N nodes of c CPUs take about "
        f"`files x {per_file:.1f} s / (N x c)` plus the longest single file (the tail); that is "
        "what the table gives for nodes like this one (2 CPUs) and for 16-CPU nodes, assuming "
        "dedicated nodes whose CPUs are as fast as these and tasks that keep to one CPU each "
        "(verify's worker runs torch on one thread). Ray's start-up (seconds, above) comes on "
        "top; on a machine as busy as this one, multiply by the wall-to-CPU ratio "
        f"({wall_per_file / per_file:.1f}x in this run).\n"
    )
    tail = max(max(r["file_seconds"]) for r in runs)
    w("| nodes | 2-CPU nodes | 16-CPU nodes |")
    w("|---|---|---|")
    for nodes in NODE_COUNTS:
        cells = []
        for cpus in (2, 16):
            seconds = zoo["changed"] * per_file / (nodes * cpus) + tail
            cells.append(_duration(seconds))
        w(f"| {nodes} | {cells[0]} | {cells[1]} |")
    w("")
    w(
        f"The tail is the slowest file measured here ({tail:.0f} s of wall time on the shared "
        f"cores); the timeout ({data['timeout']:g} s) bounds it for any file.\n"
    )
    return "\n".join(out) + "\n"


def _single(runs: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in runs if r["executor"] == run["executor"] and r["workers"] == 1)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", help="interpreter with transformers 5.24.0 and torch")
    parser.add_argument("--sample", type=int, default=16, help="files to verify")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per file")
    parser.add_argument("--eager", action="store_true", help="force eager attention")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "scale.json")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "scale.md")
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args()
    if args.render_only:
        data = json.loads(args.json.read_text(encoding="utf-8"))
    else:
        if not args.python:
            parser.error("--python is required unless --render-only")
        data = measure(args)
        args.json.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    args.output.write_text(render(data), encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
