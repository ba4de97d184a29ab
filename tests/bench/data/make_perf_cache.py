"""Write the synthetic ``benchmarks/perf_report.py`` cache under ``perf_cache/`` (run by hand).

    python tests/bench/data/make_perf_cache.py

The records have the shape ``perf_report`` saves (``<study>__<model>.json`` plus ``meta.json``)
but made-up numbers, chosen so that the report's branches show up: failed and skipped studies,
reliably faster / slower / undecided speedups, missing memory, variants with their own errors,
profiles with and without data. ``test_perf_report_render.py`` renders them and compares the
Markdown with the saved snapshot, so a change to ``render`` that changes the text shows up as a
diff there. Rerun this only when the record format changes, then update the snapshot.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from adopter.bench import (  # noqa: E402
    BenchResult,
    MemoryStats,
    ModeResult,
    Speedup,
    TimingStats,
    to_json,
)

OUT = Path(__file__).resolve().parent / "perf_cache"
MIB = 1 << 20
ENVIRONMENT = {
    "torch": "2.13.0+cpu",
    "python": "3.11.7",
    "platform": "Linux-synthetic-x86_64",
    "cpu": "Synthetic CPU @ 2.0GHz",
    "cpu_count": 2,
    "threads": 1,
    "device": "cpu",
    "gpu": None,
    "cuda": None,
}

# (ratio, ci_low, ci_high) per variant and mode; a string is that mode's error.
Entry = tuple[float, float, float] | str


def mode_result(base_ms: float, entry: Entry | None, batch: int) -> ModeResult:
    if isinstance(entry, str):
        return ModeResult(error=entry)
    ratio = 1.0 if entry is None else entry[0]
    median_s = base_ms / 1e3 / ratio
    times = [median_s * f for f in (0.97, 0.99, 1.0, 1.01, 1.04)]
    res = ModeResult(timing=TimingStats.from_times(times, batch))
    if entry is not None:
        res.speedup = Speedup(entry[0], entry[1], entry[2], 0.95, "paired")
    return res


def bench_result(
    modes: tuple[str, ...],
    base_ms: dict[str, float],
    variants: dict[str, dict[str, Entry]],
    *,
    sites: dict[str, dict[str, int]],
    memory: dict[str, int | str] | None = None,
    batch: int = 2,
) -> dict[str, Any]:
    """One ``run_bench`` result as JSON; ``memory`` maps variant -> training peak (or error)."""
    out: dict[str, dict[str, ModeResult]] = {
        "original": {m: mode_result(base_ms[m], None, batch) for m in modes}
    }
    for name, entries in variants.items():
        out[name] = {m: mode_result(base_ms[m], entries.get(m), batch) for m in modes}
    if memory is not None and "train" in modes:
        base_peak = memory["original"]
        for name, peak in memory.items():
            res = out[name]["train"]
            if isinstance(peak, str):
                res.memory_error = peak
                continue
            ratio = None if name == "original" else peak / base_peak
            res.memory = MemoryStats("rss_subprocess", peak, peak + 900 * MIB, ratio)
    settings = {"target": {"patched_sites": sites}, "repeats": 5, "warmup": 1}
    return to_json(BenchResult("original", modes, out, settings, dict(ENVIRONMENT)))


BOTH = ("inference", "train")
TEXT_SITES = {
    "bert": {"paper.1": 2, "paper.5": 4, "paper.6": 2},
    "roberta": {"ext.1": 2, "paper.5": 4, "paper.6": 2},
    "gpt2": {"paper.3": 2},
    "gpt_neo": {"ext.4": 2},
    "distilbert": {"ext.2": 2},
    "t5": {"paper.2": 6},
}
# Per text model: patched (all rules) and paper-rules-only speedups, and training peaks.
LONG = {
    "bert": ((1.12, 1.05, 1.19), (1.10, 1.02, 1.18), (1.12, 1.05, 1.19), 191, 148, 148),
    "roberta": ((1.10, 1.01, 1.20), (1.06, 0.98, 1.14), (1.01, 0.95, 1.07), 206, 204, 206),
    "gpt2": ((1.20, 1.12, 1.28), (1.04, 0.97, 1.11), (1.20, 1.12, 1.28), 180, 147, 147),
    "gpt_neo": ((1.08, 0.99, 1.17), (0.96, 0.93, 0.99), (1.00, 0.94, 1.06), 240, 200, 240),
    "distilbert": ((1.15, 1.09, 1.21), (1.09, 1.03, 1.15), (1.00, 0.96, 1.04), 170, 134, 170),
    "t5": ((1.05, 1.00, 1.10), (0.99, 0.94, 1.04), (1.05, 1.00, 1.10), 212, 211, 212),
}


def records() -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for model, (inf, train, paper, base, patched, paper_peak) in LONG.items():
        variants: dict[str, dict[str, Entry]] = {"patched": {"inference": inf, "train": train}}
        sites = {"patched": TEXT_SITES[model]}
        memory: dict[str, int | str] = {"original": base * MIB, "patched": patched * MIB}
        if model in ("bert", "gpt2", "t5"):  # every rule that patches it is a paper rule
            solo = sorted(TEXT_SITES[model])
            for rule in solo if len(solo) > 1 else ():
                variants[f"{rule} only"] = {"inference": (1.03, 0.97, 1.09), "train": train}
                sites[f"{rule} only"] = {rule: TEXT_SITES[model][rule]}
        else:
            variants["paper rules"] = {"inference": paper, "train": (1.01, 0.96, 1.06)}
            sites["paper rules"] = {"paper.4": 2}
            memory["paper rules"] = paper_peak * MIB
        if model == "t5":
            memory["patched"] = "memory measurement failed: probe timed out"
        result = bench_result(
            BOTH, {"inference": 310.0, "train": 905.0}, variants, sites=sites, memory=memory
        )
        files[f"long__{model}"] = {
            "study": "long",
            "model": model,
            "result": result,
            "seconds": 95.0,
        }
    files["long__albert"] = {
        "study": "long",
        "model": "albert",
        "error": "RuntimeError: synthetic failure while building the patched model",
        "seconds": 4.0,
    }
    files["long__groupvit"] = {
        "study": "long",
        "model": "groupvit",
        "result": bench_result(
            BOTH,
            {"inference": 120.0, "train": 400.0},
            {
                "patched": {"inference": (1.02, 0.98, 1.06), "train": (1.00, 0.97, 1.03)},
                "paper.8 only": {"inference": (1.01, 0.99, 1.03), "train": "step failed: boom"},
            },
            sites={"patched": {"paper.4": 4, "paper.8": 2}, "paper.8 only": {"paper.8": 2}},
        ),
        "seconds": 60.0,
    }
    files["long__resnet"] = {
        "study": "long",
        "model": "resnet",
        "result": bench_result(
            BOTH,
            {"inference": 50.0, "train": 160.0},
            {"patched": {"inference": (1.03, 1.00, 1.06), "train": (0.99, 0.97, 1.01)}},
            sites={"patched": {"paper.7": 18}},
        ),
        "seconds": 30.0,
    }

    dropout = {
        "bert": (1.01, 0.97, 1.05),
        "gpt2": (0.97, 0.95, 0.99),
        "distilbert": (0.99, 0.96, 1.02),
        "t5": (1.00, 0.98, 1.02),
    }
    for model, entry in dropout.items():
        result = bench_result(("train",), {"train": 905.0}, {"patched": {"train": entry}}, sites={})
        files[f"long_dropout__{model}"] = {"study": "long_dropout", "result": result, "seconds": 40}
    files["long_dropout__roberta"] = {
        "study": "long_dropout",
        "skipped": "dropout is 0",
        "seconds": 0,
    }
    files["long_dropout__gpt_neo"] = {
        "study": "long_dropout",
        "error": "ValueError: synthetic dropout failure",
        "seconds": 2.5,
    }

    for model in ("bert", "roberta", "gpt2", "distilbert", "t5"):
        result = bench_result(
            BOTH,
            {"inference": 40.0, "train": 120.0},
            {"patched": {"inference": (1.05, 1.01, 1.09), "train": (1.02, 0.98, 1.06)}},
            sites={},
            batch=4,
        )
        files[f"short__{model}"] = {"study": "short", "result": result, "seconds": 20}
    files["short__gpt_neo"] = {"study": "short", "error": "OSError: synthetic", "seconds": 1}

    files["compile__bert"] = {
        "study": "compile",
        "result": bench_result(
            ("inference",),
            {"inference": 35.0},
            {"patched": {"inference": (1.01, 0.98, 1.04)}},
            sites={},
            batch=4,
        ),
        "seconds": 212.0,
    }
    files["compile__resnet"] = {"skipped": "time budget: 44 min already spent", "seconds": 0}

    def profile(ops: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
        return {
            variant: {mode: {"ops_us": per_op} for mode, per_op in modes.items()}
            for variant, modes in ops.items()
        }

    bert_ops = {
        "aten::addmm": 70000.0,
        "aten::bmm": 9000.0,
        "aten::_softmax": 4000.0,
        "aten::native_layer_norm": 3000.0,
        "aten::gelu": 2500.0,
        "aten::embedding": 800.0,
        "aten::add": 1500.0,
    }
    bert_train = {**{k: 2.5 * v for k, v in bert_ops.items()}, "aten::_fused_adamw_": 20000.0}
    patched_ops = {k: v for k, v in bert_ops.items() if k not in ("aten::bmm", "aten::_softmax")}
    patched_ops["aten::_scaled_dot_product_flash_attention_for_cpu"] = 11000.0
    patched_train = {
        k: v for k, v in bert_train.items() if k not in ("aten::bmm", "aten::_softmax")
    }
    patched_train["aten::_scaled_dot_product_flash_attention_for_cpu"] = 36000.0
    files["profile__bert"] = {
        "model": "bert",
        "steps": 3,
        "variants": profile(
            {
                "original": {"inference": bert_ops, "train": bert_train},
                "patched": {"inference": patched_ops, "train": patched_train},
            }
        ),
        "seconds": 70.0,
    }
    resnet_ops = {
        "aten::mkldnn_convolution": 30000.0,
        "aten::_slow_conv2d_forward": 14000.0,
        "aten::native_batch_norm": 2100.0,
        "aten::clamp_min": 900.0,
        "aten::max_pool2d_with_indices": 400.0,
    }
    folded = {k: v for k, v in resnet_ops.items() if k != "aten::native_batch_norm"}
    files["profile__resnet"] = {
        "model": "resnet",
        "steps": 3,
        "variants": profile(
            {"original": {"inference": resnet_ops}, "patched": {"inference": folded}}
        ),
        "seconds": 25.0,
    }

    files["only_faster__bert"] = {
        "kept": ["paper.1", "paper.5"],
        "reasons": {
            "paper.1": "kept: faster in inference, train (inference 1.10x [1.04, 1.16]; ...)",
            "paper.2": "no site",
            "paper.5": "kept: faster in train (inference 1.00x [0.97, 1.03]; ...)",
            "paper.6": "dropped: not reliably faster (inference 1.01x [0.96, 1.06])",
        },
        "result": bench_result(
            BOTH,
            {"inference": 310.0, "train": 905.0},
            {"patched": {"inference": (1.09, 1.03, 1.15), "train": (1.03, 0.99, 1.07)}},
            sites={"patched": {"paper.1": 2, "paper.5": 4}},
        ),
        "seconds": 300.0,
    }
    files["only_faster__gpt2"] = {
        "kept": ["paper.3"],
        "reasons": {"paper.3": "kept: faster in inference (...)"},
        "result": bench_result(
            BOTH,
            {"inference": 280.0, "train": 800.0},
            {"patched": {"inference": (1.10, 1.02, 1.18), "train": (0.96, 0.93, 0.99)}},
            sites={"patched": {"paper.3": 2}},
        ),
        "seconds": 200.0,
    }
    files["only_faster__t5"] = {
        "kept": [],
        "reasons": {
            "paper.2": "dropped: slower in train (train 0.95x [0.92, 0.98])",
            "paper.4": "dropped: inference: step failed: boom",
        },
        "unchanged": "no rule was reliably faster here: the model is left as it is",
        "seconds": 150.0,
    }
    files["only_faster__resnet"] = {"error": "BenchTargetError: synthetic", "seconds": 3.0}

    for model, (base, patched, paper) in {
        "bert": (900, 640, 640),
        "gpt2": (1100, 820, 820),
        "t5": (1300, 1290, 1290),
    }.items():
        files[f"memory_depth__{model}"] = {
            "model": model,
            "layers": "12" if model != "t5" else "6 + 6",
            "patched_sites": {"patched": TEXT_SITES[model]},
            "variants": {
                "original": {"peak_bytes": base * MIB, "absolute_bytes": 3 * base * MIB},
                "patched": {"peak_bytes": patched * MIB, "absolute_bytes": 3 * patched * MIB},
            }
            | ({} if paper == patched else {"paper rules": {"peak_bytes": paper * MIB}}),
            "seconds": 80.0,
        }
    files["memory_depth__roberta"] = {
        "model": "roberta",
        "layers": "12",
        "patched_sites": {"patched": TEXT_SITES["roberta"], "paper rules": {"paper.4": 2}},
        "variants": {
            "original": {"peak_bytes": 1000 * MIB},
            "patched": {"peak_bytes": 700 * MIB},
            "paper rules": {"error": "probe failed: synthetic"},
        },
        "seconds": 90.0,
    }
    files["memory_depth__distilbert"] = {"error": "MemoryError: synthetic", "seconds": 9.0}
    return files


META = {
    "date": "2000-01-01",
    "load_start": "3.5",
    "load_end": "4.0",
    "wall_min": "42.0",
    "transformers": "4.34.0",
    "rule_set": "all",
    "extra_runs": ["re-ran profile for bert separately (3.1 min)"],
}


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for old in OUT.glob("*.json"):
        old.unlink()
    for stem, record in records().items():
        (OUT / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    (OUT / "meta.json").write_text(json.dumps(META, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
