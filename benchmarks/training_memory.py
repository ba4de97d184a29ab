"""Training-step peak memory and time of a transformers 5.x Llama or Qwen2 at vocab 128k (issue 23):
original vs patched (rule set ``all``) x eager vs ``torch.compile`` x default vs fused AdamW.

Each optimizer is one ``adopter bench --compile`` run: the four model variants (original,
patched, each eager and compiled) are timed interleaved, round by round, and each variant's peak
memory is the step's resident-set peak in a fresh process (``rss_subprocess``). The fused AdamW
is what the ``train`` rules make of ``torch.optim.AdamW(params)`` on CPU float parameters
(``adopter.kernels.fused_optimizer`` builds ``AdamW(params, fused=True)``; the proof that it
trains to the same parameters is ``adopter.verify.optimizer``). Times of the two optimizers come
from two runs, not interleaved with each other: compare them with that in mind; memory peaks
are deterministic enough to compare across runs.

    PYTHONPATH=. .cache/venv-modern/bin/python benchmarks/training_memory.py \\
        --output docs/training-memory.md --json docs/training-memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

from adopter.bench.command import BenchOptions, plan_variants, run_bench
from adopter.bench.measure import environment_info, run_memory_probe
from adopter.bench.report import from_json, to_json
from adopter.rules import load_rule_set

OPTIMIZERS = {"adamw": "default AdamW (foreach)", "adamw-fused": "fused AdamW (train rules)"}


# The transformers model types measured, and the causal-LM class built for each (the same
# configuration keys size both).
MODELS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=tuple(MODELS), default="llama")
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=Path("docs/training-memory.md"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--from-json", type=Path, default=None, help="render a saved --json file only"
    )
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="only the step peaks, one fresh process per variant (no timing): for shapes whose "
        "steps are too slow to time interleaved on a CPU; prints a table",
    )
    parser.add_argument("--modes", nargs="+", choices=("eager", "compiled"), default=None)
    parser.add_argument("--optimizers", nargs="+", choices=tuple(OPTIMIZERS), default=None)
    args = parser.parse_args()
    overrides = {
        "vocab_size": args.vocab,
        "hidden_size": args.hidden,
        "intermediate_size": args.hidden * 8 // 3,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
    }
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        results = {k: from_json(v) for k, v in saved["results"].items()}
        args.output.write_text(_markdown(results, saved["loads"], args, overrides))
        return
    if args.memory_only:
        print(_memory_only(args, overrides))
        return
    results = {}
    loads = {}
    for optimizer in OPTIMIZERS:
        loads[optimizer] = [_load()]
        options = _options(
            args,
            overrides,
            compile=True,
            modes=("train",),
            warmup=1,
            repeats=args.repeats,
            memory="auto",
            threads=args.threads,
            optimizer=optimizer,
        )
        results[optimizer] = run_bench(
            args.model,
            options,
            rules=load_rule_set("all"),
            progress=lambda message: print(message, flush=True),
        )
        loads[optimizer].append(_load())
    if args.json is not None:
        saved = {"results": {k: to_json(v) for k, v in results.items()}, "loads": loads}
        args.json.write_text(json.dumps(saved, indent=1, default=str))
    args.output.write_text(_markdown(results, loads, args, overrides), encoding="utf-8")


def _options(args: argparse.Namespace, overrides: dict, **measuring: object) -> BenchOptions:
    """The model both runs build (a causal LM of the arguments' shape), measured so."""
    return BenchOptions(
        model_class=MODELS[args.model],
        config_overrides=overrides,
        layers=args.layers,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        **measuring,
    )


def _memory_only(args: argparse.Namespace, overrides: dict) -> str:
    """Step peak RSS of original and patched, per optimizer and mode, as a markdown table."""
    plan = plan_variants(args.model, _options(args, overrides), rules=load_rule_set("all"))
    rows = ["| optimizer | mode | original | patched | change |", "|---|---|---:|---:|---:|"]
    for optimizer in args.optimizers or OPTIMIZERS:
        for mode in args.modes or ("eager", "compiled"):
            peaks = {}
            for variant in plan.variants:
                measured = run_memory_probe(
                    variant,
                    modes=("train",),
                    compile=mode == "compiled",
                    threads=args.threads,
                    optimizer=optimizer,
                    timeout=3600,
                )["train"]
                peaks[variant.name] = None if isinstance(measured, str) else measured.peak_bytes
                print(f"{optimizer} {mode} {variant.name}: {measured}", flush=True)
            original, patched = peaks.get("original"), peaks.get("patched")
            change = f"{(patched / original - 1) * 100:+.0f}%" if original and patched else "-"
            cells = [f"{p / 2**20:,.0f} MiB" if p else "failed" for p in (original, patched)]
            rows.append(
                f"| {OPTIMIZERS[optimizer]} | {mode} | {cells[0]} | {cells[1]} | {change} |"
            )
    return "\n".join(rows)


def _markdown(results, loads, args, overrides) -> str:
    base = results["adamw"].get("original", "train")
    base_peak = base.memory.peak_bytes if base.memory else None
    rows = [
        "| optimizer | model | mode | median step | vs original eager (same run) | 95% CI "
        "| peak memory | vs original eager, default AdamW |",
        "|---|---|---|---:|---:|---|---:|---:|",
    ]
    for optimizer, result in results.items():
        for name in result.names:
            res = result.get(name, "train")
            model, _, compiled = name.partition(" + ")
            if res.timing is None:
                rows.append(f"| {OPTIMIZERS[optimizer]} | {model} | ... | failed: {res.error} |")
                continue
            speed = res.speedup
            peak = res.memory.peak_bytes if res.memory else None
            change = f"{(peak / base_peak - 1) * 100:+.0f}%" if peak and base_peak else "-"
            rows.append(
                f"| {OPTIMIZERS[optimizer]} | {model} | {'compiled' if compiled else 'eager'} "
                f"| {res.timing.median_s:.2f} s | {speed.ratio:.2f}x "
                f"| [{speed.ci_low:.2f}, {speed.ci_high:.2f}] "
                f"| {peak / 2**20:,.0f} MiB | {change} |"
                if peak
                else f"| {OPTIMIZERS[optimizer]} | {model} | ... | {res.memory_error} |"
            )
    compiled_lines = []
    for optimizer, result in results.items():
        for name, per_mode in result.settings.get("against_compiled", {}).items():
            cell = per_mode.get("train")
            if cell:
                memory = cell["memory_ratio"]
                compiled_lines.append(
                    f"* {OPTIMIZERS[optimizer]}: {name} against original + compile: "
                    f"{cell['speedup']:.2f}x [{cell['ci_low']:.2f}, {cell['ci_high']:.2f}], "
                    f"peak memory {(memory - 1) * 100:+.0f}%"
                    if memory is not None
                    else f"* {OPTIMIZERS[optimizer]}: {name}: no memory ratio"
                )
    env = environment_info("cpu")
    shape = (
        f"{MODELS[args.model]}, {args.layers} layers, hidden {args.hidden}, "
        f"intermediate {overrides['intermediate_size']}, 12 heads / 4 KV heads, vocab {args.vocab:,}, "
        f"batch {args.batch_size} x {args.seq_len} tokens, labels given, float32"
    )
    load_text = "; ".join(f"{OPTIMIZERS[k]}: {v[0]} -> {v[1]}" for k, v in loads.items())
    return "\n".join(
        [
            "# Training memory: model rules, train rules, torch.compile (issue 23)",
            "",
            "Generated by `PYTHONPATH=. .cache/venv-modern/bin/python benchmarks/training_memory.py"
            f" --model {args.model} --vocab {args.vocab} --seq-len {args.seq_len}"
            f" --repeats {args.repeats} --output {args.output} --json {args.json}`"
            f" (`--from-json {args.json}` renders the table again).",
            "",
            f"* model: {shape}",
            f"* machine: {env.get('cpu', platform.processor())}, {os.cpu_count()} cores "
            f"(load average before -> after each run: {load_text}), "
            f"{args.threads} torch threads; torch {env.get('torch')}",
            "* rules: `all` (the model rules; modern.7's chunked loss is what saves memory) via "
            "`adopter bench`'s rewrite of the modeling file; the fused AdamW is what the `train` "
            "rules build (see the benchmark's docstring)",
            f"* timing: warm-up 1, {args.repeats} interleaved rounds per run; memory: step peak "
            "of the resident set above the pre-step level, one fresh process per variant",
            "",
            *rows,
            "",
            "Patched + compiled against the compiled original (same run):",
            "",
            *compiled_lines,
            "",
        ]
    )


if __name__ == "__main__":
    main()
