"""Measure the payoff of the rewrites on the paper's nine models; write docs/performance.md.

    python benchmarks/perf_report.py                 # the full report (~50 min on 2 cores)
    python benchmarks/perf_report.py --quick         # tiny configurations, to test the pipeline
    python benchmarks/perf_report.py --render-only   # re-render the Markdown from saved JSON

For each model (bert, roberta, gpt2, gpt_neo, distilbert, t5, albert, groupvit, resnet) the
original ``transformers==4.34.0`` modeling file is rewritten with a built-in rule set
(``--rule-set``, default ``all``: the nine paper rules and the extended attention rules; the
paper rules alone are measured beside them) and the original and patched models are built
from the same configuration (default widths, 2 layers) and timed interleaved with
:func:`adopter.bench.run_bench`:

* ``long``: 512 tokens (images 224 px), inference and training with attention dropout 0, one
  extra variant per rule (ablation), peak training memory of original and patched
  (fresh-process RSS probe);
* ``long_dropout``: 512 tokens, training with the configured dropout (skipped where the
  configured attention dropout is already 0: the ``long`` run is that configuration);
* ``short``: 128 tokens, inference and training, original and patched;
* ``compile``: ``torch.compile`` on both sides, inference only, BERT (128 tokens) and ResNet;
* ``profile``: ``torch.profiler`` over BERT training and inference steps at 512 tokens and
  ResNet inference steps, ops grouped into what the rules change and what they cannot;
* ``only_faster``: what ``apply --only-faster`` keeps per model, and that rewrite timed;
* ``memory_depth``: peak training memory at the released depth (6-12 layers), memory only.

Each run's result is saved as JSON under ``.cache/perf/`` (``--quick``: ``.cache/perf-quick/``)
and the Markdown is rendered from those files, so the text can be re-rendered without
re-measuring. A model that fails to build or run is reported with the error; the rest go on.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from adopter.bench import BenchResult, from_json, plot, to_json  # noqa: E402
from adopter.bench.command import (  # noqa: E402
    FASTER_OPTIONS,
    BenchOptions,
    base_model_class,
    bench_config,
    only_faster_rules,
    plan_variants,
    resolve_transformers_target,
    run_bench,
)
from adopter.bench.measure import (  # noqa: E402
    make_optimizer,
    make_step,
    prepare_variant,
    run_memory_probe,
)
from adopter.bench.report import SpeedupVerdict, speedup_verdict  # noqa: E402
from adopter.bench.selection import Judgement  # noqa: E402
from adopter.rules import load_rule_set  # noqa: E402

EXTENDED_ATTENTION = ("roberta", "gpt_neo", "distilbert", "albert")
"""The models whose attention only the extended rules (ext.1-ext.4) rewrite."""
PAPER_GROUP = "paper rules"
"""The variant rewritten with the nine paper rules only, next to ``patched`` (all rules)."""
TRANSFORMERS = ("bert", "roberta", "gpt2", "gpt_neo", "distilbert", "t5", "albert")
ALL_MODELS = (*TRANSFORMERS, "groupvit", "resnet")
OPTIMIZER = "adamw-fused"
RELEASED_DEPTH = {"gpt_neo": 12}
"""Layer counts for the ``memory_depth`` study where the class default is not the released base
model's (GPT-Neo's default is the 1.3B model's 24 layers; gpt-neo-125M, whose widths the
report uses, has 12). The other classes default to their base model's depth."""


@dataclass(frozen=True)
class ModelSpec:
    """How one model is benchmarked, and why where it deviates from the defaults."""

    name: str
    family: str
    """``text`` (a transformer judged at 512 tokens), ``image`` or ``multimodal``."""
    overrides: dict[str, Any] = field(default_factory=dict)
    deviation: str = ""
    image_batch: int = 2


SPECS = {
    "bert": ModelSpec("bert", "text"),
    "roberta": ModelSpec(
        "roberta",
        "text",
        {"max_position_embeddings": 514},
        "max_position_embeddings 514 as in the released roberta-base (RoBERTa offsets positions "
        "by the padding index; the class default of 512 fits only 510 tokens)",
    ),
    "gpt2": ModelSpec("gpt2", "text"),
    "gpt_neo": ModelSpec(
        "gpt_neo",
        "text",
        {"hidden_size": 768, "num_heads": 12},
        "widths of gpt-neo-125M (768 wide, 12 heads): the class default is the 1.3B model "
        "(2048 wide), whose step takes ~7x longer than this machine's time budget allows",
    ),
    "distilbert": ModelSpec("distilbert", "text"),
    "t5": ModelSpec("t5", "text"),
    "albert": ModelSpec(
        "albert",
        "text",
        {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072},
        "widths of albert-base-v2 (768 wide, 12 heads, 3072 FFN): the class default is "
        "albert-xxlarge (4096 wide, 16384 FFN), ~25x the work per layer",
    ),
    "groupvit": ModelSpec("groupvit", "multimodal"),
    "resnet": ModelSpec("resnet", "image"),
}


@dataclass
class Settings:
    """Sizes and repetition counts of one report run (full or ``--quick``)."""

    quick: bool
    long_seq: int = 512
    long_batch: int = 2
    short_seq: int = 128
    short_batch: int = 4
    image_size: int = 224
    layers: int = 2
    warmup: int = 1
    repeats: int = 7
    compile_repeats: int = 5
    profile_steps: int = 3
    rule_set: str = "all"
    """The built-in rule set every model is rewritten with (``all``: paper + extended)."""
    threads: int = 1
    """One torch thread: on this shared 2-core machine other CPU-bound jobs run alongside, and
    two OpenMP threads then stall on each other at every barrier - a probe measured BERT's step
    2x *slower* with 2 threads than with 1, with far more spread."""

    @classmethod
    def make(cls, quick: bool, rule_set: str = "all") -> Settings:
        if quick:
            return cls(
                quick, long_seq=32, short_seq=16, image_size=32, repeats=3, rule_set=rule_set
            )
        return cls(quick, rule_set=rule_set)

    def decoder(self, seq: int) -> int:
        """T5's target length: a quarter of the input (summarisation-like), at least 8."""
        return max(8, seq // 4)


def quick_overrides(name: str) -> dict[str, Any]:
    """Tiny configuration for ``--quick`` (shrunk generically, as adopter verify does)."""
    from adopter.models.transformers.shrink import SHRINK_SETTINGS, shrink_config_dict

    return shrink_config_dict(_config_class(name)().to_dict(), SHRINK_SETTINGS[0])


# ----------------------------------------------------------------------------------------------
# running


@dataclass
class Job:
    """One ``run_bench`` call of the report."""

    study: str
    model: str
    options: dict[str, Any]


def jobs_for(settings: Settings, models: list[str]) -> list[Job]:
    """All benchmark runs, most important first (the 512-token targets)."""
    jobs: list[Job] = []
    base = {
        "warmup": settings.warmup,
        "repeats": settings.repeats,
        "optimizer": OPTIMIZER,
        "threads": settings.threads,
    }
    for name in models:
        spec = SPECS[name]
        options: dict[str, Any] = {
            **base,
            "dropout": "no-attention",
            "modes": ("inference", "train"),
            "ablation": True,
        }
        if spec.family == "text":
            options.update(
                seq_len=settings.long_seq,
                batch_size=settings.long_batch,
                decoder_seq_len=settings.decoder(settings.long_seq),
                memory="auto",
                memory_modes=("train",),
                memory_variants=("patched", PAPER_GROUP),
            )
        else:
            options.update(
                seq_len=settings.short_seq,
                batch_size=spec.image_batch,
                image_size=settings.image_size,
            )
        jobs.append(Job("long", name, options))
    text = [name for name in models if SPECS[name].family == "text"]
    for name in text:
        options = {
            **base,
            "seq_len": settings.long_seq,
            "batch_size": settings.long_batch,
            "decoder_seq_len": settings.decoder(settings.long_seq),
            "dropout": "config",
            "modes": ("train",),
        }
        jobs.append(Job("long_dropout", name, options))
    for name in text:
        options = {
            **base,
            "seq_len": settings.short_seq,
            "batch_size": settings.short_batch,
            "decoder_seq_len": settings.decoder(settings.short_seq),
            "dropout": "no-attention",
            "modes": ("inference", "train"),
        }
        jobs.append(Job("short", name, options))
    for name in models:
        # What `apply --only-faster` keeps on this machine, then that rewrite against the
        # original with the configured dropout, both modes.
        spec = SPECS[name]
        text_model = spec.family == "text"
        options = {
            **base,
            "seq_len": settings.long_seq if text_model else settings.short_seq,
            "batch_size": settings.long_batch if text_model else spec.image_batch,
            "image_size": settings.image_size,
            "modes": ("inference", "train"),
        }
        if text_model:
            options["decoder_seq_len"] = settings.decoder(settings.long_seq)
        jobs.append(Job("only_faster", name, options))
    for name in ("bert", "resnet"):
        if name not in models:
            continue
        image = SPECS[name].family != "text"
        options = {
            "warmup": 1,
            "repeats": settings.compile_repeats,
            "seq_len": settings.short_seq,
            "batch_size": SPECS[name].image_batch if image else settings.short_batch,
            "image_size": settings.image_size,
            "modes": ("inference",),
            "compile": True,
            "threads": settings.threads,
        }
        jobs.append(Job("compile", name, options))
    return jobs


def _config_class(name: str) -> type:
    """The configuration class of a model's base class (``BertConfig`` for ``bert``)."""
    target = resolve_transformers_target(name)
    module = importlib.import_module(target.module_name)
    return base_model_class(module, None).config_class


def _dropout_is_configured_zero(name: str, overrides: dict[str, Any]) -> bool:
    """Whether attention dropout is already 0 as configured (then no separate run is needed)."""
    config_class = _config_class(name)
    configured = bench_config(config_class, layers=2, overrides=overrides).to_dict()
    quiet = bench_config(config_class, layers=2, overrides=overrides, dropout="no-attention")
    return configured == quiet.to_dict()


def _rules(settings: Settings) -> list[Any]:
    return load_rule_set(settings.rule_set)


def _paper_group(settings: Settings) -> dict[str, list[Any]]:
    """The paper rules as a variant of their own, unless they are the report's rule set."""
    return {PAPER_GROUP: load_rule_set("paper")} if settings.rule_set != "paper" else {}


def _overrides(name: str, settings: Settings) -> dict[str, Any]:
    return quick_overrides(name) if settings.quick else dict(SPECS[name].overrides)


def run_job(job: Job, settings: Settings, cache: Path, say: Callable[[str], None]) -> None:
    """Run one job and save its result (or the error, or why it was skipped) as JSON."""
    out = cache / f"{job.study}__{job.model}.json"
    overrides = _overrides(job.model, settings)
    record: dict[str, Any] = {"study": job.study, "model": job.model, "overrides": overrides}
    record["options"] = {k: list(v) if isinstance(v, tuple) else v for k, v in job.options.items()}
    started = time.perf_counter()
    try:
        if job.study == "only_faster":
            record.update(run_only_faster(job, settings, overrides, say))
        elif job.study == "long_dropout" and _dropout_is_configured_zero(job.model, overrides):
            record["skipped"] = (
                "the configured attention dropout is already 0: the `long` training run is "
                "this configuration"
            )
        else:
            options = BenchOptions(
                config_overrides=overrides, layers=settings.layers, **job.options
            )
            result = run_bench(
                job.model,
                options,
                rules=_rules(settings),
                rule_groups=_paper_group(settings) if job.study == "long" else None,
                progress=lambda message: say(f"  {job.study}/{job.model}: {message}"),
            )
            record["result"] = to_json(result)
    except Exception as exc:  # the report says which model failed and why; the rest go on
        record.update(_failure(exc))
    _save(record, out, started, f"{job.study}/{job.model}", say)


def _failure(exc: Exception) -> dict[str, str]:
    return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=6)}


def _save(
    record: dict[str, Any], out: Path, started: float, label: str, say: Callable[[str], None]
) -> None:
    """Write one study record as JSON, with its duration, and say how it ended."""
    record["seconds"] = round(time.perf_counter() - started, 1)
    out.write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
    status = "skipped" if "skipped" in record else ("FAILED" if "error" in record else "done")
    say(f"{label}: {status} in {record['seconds']:.0f} s")


def run_only_faster(
    job: Job, settings: Settings, overrides: dict[str, Any], say: Callable[[str], None]
) -> dict[str, Any]:
    """The rules ``apply --only-faster`` keeps for this model, and the kept rewrite timed
    against the original (configured dropout, inference and training)."""
    options = dict(job.options)
    selection = {
        key: options[key]
        for key in ("seq_len", "batch_size", "image_size", "modes", "threads")
        if key in options
    }
    choosing = replace(
        FASTER_OPTIONS,
        config_overrides=overrides,
        layers=settings.layers,
        optimizer=OPTIMIZER,
        **selection,
    )
    kept, reasons = only_faster_rules(
        job.model,
        _rules(settings),
        choosing,
        progress=lambda message: say(f"  only_faster/{job.model}: {message}"),
    )
    record: dict[str, Any] = {"kept": [rule.id for rule in kept], "reasons": reasons}
    if not kept:
        record["unchanged"] = "no rule was reliably faster here: the model is left as it is"
        return record
    result = run_bench(
        job.model,
        BenchOptions(
            config_overrides=overrides, layers=settings.layers, dropout="config", **options
        ),
        rules=kept,
        progress=lambda message: say(f"  only_faster/{job.model}: {message}"),
    )
    record["result"] = to_json(result)
    return record


def memory_depth_job(
    name: str, settings: Settings, cache: Path, say: Callable[[str], None]
) -> None:
    """Peak training memory of original, patched and paper-rules variants at the released depth.

    At the report's 2 layers the largest gradient (the word embeddings) can set a step's peak,
    hiding what the rewrites save in activations; a real model is 6-12 layers deep. Memory
    only: one fresh-process probe per variant, no timing.
    """
    out = cache / f"memory_depth__{name}.json"
    depth = RELEASED_DEPTH.get(name)
    record: dict[str, Any] = {
        "model": name,
        "layers": depth or "class default",
        "batch_size": settings.long_batch,
        "seq_len": settings.long_seq,
    }
    started = time.perf_counter()
    try:
        options = BenchOptions(
            config_overrides=_overrides(name, settings),
            layers=depth,
            seq_len=settings.long_seq,
            batch_size=settings.long_batch,
            decoder_seq_len=settings.decoder(settings.long_seq),
            dropout="no-attention",
        )
        plan = plan_variants(
            name, options, rules=_rules(settings), rule_groups=_paper_group(settings)
        )
        record["patched_sites"] = plan.info["patched_sites"]
        record["variants"] = {}
        for variant in plan.variants:
            if variant.name not in (plan.baseline, "patched", PAPER_GROUP):
                continue
            say(f"  memory_depth/{name}: {variant.name}")
            measured = run_memory_probe(
                variant, modes=("train",), threads=settings.threads, optimizer=OPTIMIZER
            )["train"]
            record["variants"][variant.name] = (
                {"peak_bytes": measured.peak_bytes, "absolute_bytes": measured.absolute_bytes}
                if not isinstance(measured, str)
                else {"error": measured}
            )
        config = bench_config(
            _config_class(name), layers=depth, overrides=_overrides(name, settings)
        )
        record["layers"] = _depth_of(config)
    except Exception as exc:
        record.update(_failure(exc))
    _save(record, out, started, f"memory_depth/{name}", say)


def _depth_of(config: Any) -> str:
    """The layer count(s) of a model configuration."""
    keys = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers")
    found = {k: getattr(config, k) for k in keys if isinstance(getattr(config, k, None), int)}
    if "num_layers" in found and "num_decoder_layers" in found:  # T5: encoder + decoder
        return f"{found['num_layers']} + {found['num_decoder_layers']}"
    return str(next(iter(found.values()), "?"))


# ----------------------------------------------------------------------------------------------
# profiling

GROUPS: list[tuple[str, Callable[[str], bool]]] = [
    ("fused attention (SDPA)", lambda op: "scaled_dot_product" in op or "flash_attention" in op),
    ("linear GEMMs (mm / addmm)", lambda op: op in {"aten::mm", "aten::addmm", "aten::linear"}),
    ("attention matmuls (bmm)", lambda op: op in {"aten::bmm", "aten::baddbmm"}),
    ("convolution", lambda op: "conv" in op),
    ("batch norm", lambda op: "batch_norm" in op),
    ("layer norm", lambda op: "layer_norm" in op),
    ("softmax", lambda op: "softmax" in op),
    ("dropout / RNG", lambda op: "dropout" in op or "bernoulli" in op),
    ("optimizer (fused AdamW)", lambda op: "adam" in op.lower()),
    ("embedding", lambda op: "embedding" in op),
    ("activation", lambda op: any(k in op for k in ("gelu", "tanh", "relu", "clamp_min"))),
    ("pooling", lambda op: "pool" in op),
]
UNCHANGEABLE = {
    "bert": ("linear GEMMs (mm / addmm)", "optimizer (fused AdamW)", "embedding"),
    "resnet": ("convolution", "pooling"),
}
"""Work no paper rule removes: every rewrite still runs these GEMMs, convolutions, optimizer."""
PROFILES = {"bert": ("inference", "train"), "resnet": ("inference",)}


def categorise(op: str) -> str:
    """The group of an op name (``aten::...``), for the profile tables."""
    for label, test in GROUPS:
        if test(op):
            return label
    return "elementwise, copies, other"


def profile_job(name: str, settings: Settings, cache: Path, say: Callable[[str], None]) -> None:
    """Profile ``profile_steps`` steps per mode, original and patched; save per-op self time."""
    out = cache / f"profile__{name}.json"
    image = SPECS[name].family != "text"
    record: dict[str, Any] = {
        "model": name,
        "steps": settings.profile_steps,
        "batch_size": SPECS[name].image_batch if image else settings.long_batch,
        "seq_len": None if image else settings.long_seq,
        "image_size": settings.image_size if image else None,
    }
    started = time.perf_counter()
    try:
        from torch.profiler import ProfilerActivity, profile

        torch.set_num_threads(settings.threads)
        options = BenchOptions(
            config_overrides=_overrides(name, settings),
            layers=settings.layers,
            seq_len=settings.long_seq,
            batch_size=record["batch_size"],
            image_size=settings.image_size,
            dropout="no-attention",
        )
        plan = plan_variants(name, options, rules=_rules(settings))
        reference = None
        record["variants"] = {}
        for variant in plan.variants:
            model, args, kwargs = prepare_variant(variant, torch.device("cpu"), torch.float32, 0)
            if reference is None:
                reference = model.state_dict()
            else:
                model.load_state_dict(reference, strict=True)
            optimizer = make_optimizer(model, OPTIMIZER)
            per_mode: dict[str, Any] = {}
            for mode in PROFILES[name]:
                model.train(mode == "train")
                step = make_step(model, args, kwargs, mode, optimizer)
                step()
                step()
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    for _ in range(settings.profile_steps):
                        step()
                ops = {
                    event.key: float(event.self_cpu_time_total) / settings.profile_steps
                    for event in prof.key_averages()
                    if event.self_cpu_time_total > 0
                }
                per_mode[mode] = {"ops_us": ops}
            record["variants"][variant.name] = per_mode
            del model, optimizer
    except Exception as exc:
        record.update(_failure(exc))
    _save(record, out, started, f"profile/{name}", say)


def profile_groups(record: dict[str, Any] | None, variant: str, mode: str) -> dict[str, float]:
    """Milliseconds per op group for one variant and mode of a profile record."""
    if not record:
        return {}
    ops = record.get("variants", {}).get(variant, {}).get(mode, {}).get("ops_us", {})
    groups: dict[str, float] = {}
    for op, us in ops.items():
        groups[categorise(op)] = groups.get(categorise(op), 0.0) + us / 1e3
    return groups


def unchangeable_share(record: dict[str, Any] | None, model: str, mode: str) -> float | None:
    """Share of the original step spent in work no rule changes (see :data:`UNCHANGEABLE`)."""
    groups = profile_groups(record, "original", mode)
    total = sum(groups.values())
    if not total:
        return None
    return sum(groups.get(g, 0.0) for g in UNCHANGEABLE[model]) / total


# ----------------------------------------------------------------------------------------------
# rendering helpers

Records = dict[tuple[str, str], dict[str, Any]]
"""Every saved record of a report, by (study, model)."""
LongResults = dict[str, BenchResult | None]
"""The ``long`` study's result per model (``None`` where it failed or did not run)."""


def load_records(cache: Path) -> Records:
    """Every saved record, by (study, model)."""
    records: Records = {}
    for path in sorted(cache.glob("*__*.json")):
        study, _, model = path.stem.partition("__")
        records[(study, model)] = json.loads(path.read_text(encoding="utf-8"))
    return records


def result_of(record: dict[str, Any] | None) -> BenchResult | None:
    if not record or "result" not in record:
        return None
    return from_json(record["result"])


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


_VERDICT_MARKS = {SpeedupVerdict.FASTER: " ✓", SpeedupVerdict.SLOWER: " ✗"}


def speed_cell(result: BenchResult | None, variant: str, mode: str) -> str:
    if result is None:
        return "-"
    res = result.get(variant, mode)
    if res.error:
        return f"failed: {res.error[:80]}"
    if res.speedup is None:
        return "-"
    sp = res.speedup
    mark = _VERDICT_MARKS.get(speedup_verdict(res), "")
    return f"{sp.ratio:.2f}× [{sp.ci_low:.2f}, {sp.ci_high:.2f}]{mark}"


def speed_of(result: BenchResult | None, variant: str, mode: str) -> float | None:
    if result is None:
        return None
    res = result.get(variant, mode)
    return res.speedup.ratio if res.speedup is not None and not res.error else None


def ms(result: BenchResult | None, variant: str, mode: str) -> str:
    if result is None:
        return "-"
    timing = result.get(variant, mode).timing
    return f"{timing.median_s * 1e3:,.0f}" if timing else "-"


def memory_ratio(result: BenchResult | None, variant: str = "patched") -> float | None:
    if result is None:
        return None
    memory = result.get(variant, "train").memory
    return memory.ratio if memory is not None else None


def memory_cell(result: BenchResult | None) -> str:
    if result is None:
        return "-"
    base = result.get("original", "train").memory
    res = result.get("patched", "train")
    if res.memory is None or res.memory.ratio is None or base is None:
        return res.memory_error or "not measured"
    mib = 1 << 20
    change = (res.memory.ratio - 1) * 100
    return f"{base.peak_bytes / mib:,.0f} → {res.memory.peak_bytes / mib:,.0f} MiB ({change:+.1f}%)"


def sites(result: BenchResult | None, variant: str = "patched") -> str:
    if result is None:
        return "-"
    found = result.settings.get("target", {}).get("patched_sites", {}).get(variant, {})
    return ", ".join(f"{rule}×{count}" for rule, count in sorted(found.items())) or "-"


def verdict(measured: float | None, target: float, higher: bool = True) -> str:
    if measured is None or math.isnan(measured):
        return "not measured"
    if higher:
        if measured >= target:
            return f"**reached** ({measured:.2f}× ≥ {target:.2f}×)"
        digits = 3 if target - measured < 0.01 else 2  # so a near miss does not read "0.00"
        return (
            f"**missed** by {target - measured:.{digits}f}× ({measured:.{digits}f}× vs "
            f"{target:.2f}×; {(target / measured - 1) * 100:.{digits - 2}f}% more speed needed)"
        )
    if measured <= target:
        return f"**reached** ({(measured - 1) * 100:+.1f}% ≤ {(target - 1) * 100:+.0f}%)"
    return (
        f"**missed** by {(measured - target) * 100:.1f} points ({(measured - 1) * 100:+.1f}% vs "
        f"{(target - 1) * 100:+.0f}%)"
    )


def study_seconds(records: Records) -> str:
    """Seconds spent per study, e.g. ``long 310 s, short 280 s``."""
    totals: dict[str, float] = {}
    for (study, _), record in records.items():
        totals[study] = totals.get(study, 0.0) + float(record.get("seconds") or 0.0)
    return ", ".join(f"{study} {seconds:.0f} s" for study, seconds in totals.items())


def fmt_x(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}×"


def fmt_pct(ratio: float | None) -> str:
    return "-" if ratio is None or math.isnan(ratio) else f"{(ratio - 1) * 100:+.1f}%"


# ----------------------------------------------------------------------------------------------
# the document


@dataclass
class Numbers:
    """The aggregates the targets and the explanations are computed from."""

    inference: dict[str, float] = field(default_factory=dict)
    train: dict[str, float] = field(default_factory=dict)
    train_dropout: dict[str, float] = field(default_factory=dict)
    # models whose configured-dropout interval lies wholly below 1 (measurably slower)
    train_dropout_slower: list[str] = field(default_factory=list)
    memory: dict[str, float] = field(default_factory=dict)
    # the same with the nine paper rules only (the ``paper rules`` variant of the same run)
    paper_inference: dict[str, float] = field(default_factory=dict)
    paper_train: dict[str, float] = field(default_factory=dict)
    paper_memory: dict[str, float] = field(default_factory=dict)
    # peak training memory ratios at the released depth (``memory_depth`` study)
    depth_memory: dict[str, float] = field(default_factory=dict)
    depth_memory_paper: dict[str, float] = field(default_factory=dict)
    resnet_inference: float | None = None
    only_faster_models: list[str] = field(default_factory=list)
    only_faster_slower: list[str] = field(default_factory=list)  # interval wholly below 1
    groupvit_fold: float | None = None


def embedding_gradient_mib(name: str) -> float | None:
    """Size of the word-embedding gradient of a text model as benchmarked (float32)."""
    try:
        config = _config_class(name)(**SPECS[name].overrides)
    except Exception:
        return None
    width = next(
        (
            getattr(config, k)
            for k in ("hidden_size", "d_model", "dim", "embedding_size")
            if isinstance(getattr(config, k, None), int)
        ),
        None,
    )
    if name == "albert":
        width = config.embedding_size  # ALBERT factorises its embeddings
    vocab = getattr(config, "vocab_size", None)
    return vocab * width * 4 / (1 << 20) if vocab and width else None


def depth_ratio(record: dict[str, Any] | None, variant: str) -> float | None:
    """Peak-memory ratio variant / original of a ``memory_depth`` record."""
    variants = (record or {}).get("variants", {})
    base = variants.get("original", {}).get("peak_bytes")
    peak = variants.get(variant, {}).get("peak_bytes")
    return peak / base if base and peak is not None else None


def depth_cell(record: dict[str, Any], ratio: float | None, variant: str) -> str:
    """``peak MiB (change)`` of one variant of a ``memory_depth`` record, or its error."""
    variants = record.get("variants", {})
    base = variants.get("original", {}).get("peak_bytes")
    if ratio is None or not base:
        return variants.get(variant, {}).get("error", "-")
    return f"{base * ratio / (1 << 20):,.0f} MiB ({fmt_pct(ratio)})"


def paper_variant(names: Iterable[str], patched_sites: dict[str, dict[str, int]]) -> str | None:
    """The variant that holds the paper rules' rewrite: its own, or ``patched`` when all the
    rules that patch this model are paper rules (then the two are the same source)."""
    if PAPER_GROUP in names:
        return PAPER_GROUP
    found = patched_sites.get("patched", {})
    return "patched" if found and all(r.startswith("paper.") for r in found) else None


def collect(records: Records) -> Numbers:
    numbers = Numbers()
    for m in TRANSFORMERS:
        long = result_of(records.get(("long", m)))
        found = long.settings.get("target", {}).get("patched_sites", {}) if long else {}
        if long is not None and (paper := paper_variant(long.names, found)) is not None:
            if (v := speed_of(long, paper, "inference")) is not None:
                numbers.paper_inference[m] = v
            if (v := speed_of(long, paper, "train")) is not None:
                numbers.paper_train[m] = v
            if (r := memory_ratio(long, paper)) is not None:
                numbers.paper_memory[m] = r
        if (v := speed_of(long, "patched", "inference")) is not None:
            numbers.inference[m] = v
        if (v := speed_of(long, "patched", "train")) is not None:
            numbers.train[m] = v
        if (r := memory_ratio(long)) is not None:
            numbers.memory[m] = r
        record = records.get(("long_dropout", m)) or {}
        source = long if "skipped" in record else result_of(record)
        if (v := speed_of(source, "patched", "train")) is not None:
            numbers.train_dropout[m] = v
            speedup = source.get("patched", "train").speedup if source else None
            if speedup is not None and speedup.ci_high < 1.0:
                numbers.train_dropout_slower.append(m)
    for m in TRANSFORMERS:
        record = records.get(("memory_depth", m)) or {}
        if (r := depth_ratio(record, "patched")) is not None:
            numbers.depth_memory[m] = r
        paper = paper_variant(record.get("variants", {}), record.get("patched_sites", {}))
        if paper is not None and (r := depth_ratio(record, paper)) is not None:
            numbers.depth_memory_paper[m] = r
    numbers.resnet_inference = speed_of(
        result_of(records.get(("long", "resnet"))), "patched", "inference"
    )
    numbers.groupvit_fold = speed_of(
        result_of(records.get(("long", "groupvit"))), "paper.8 only", "inference"
    )
    for m in ALL_MODELS:
        record = records.get(("only_faster", m))
        if not record or "error" in record:
            continue
        numbers.only_faster_models.append(m)
        result = result_of(record)
        for mode in ("inference", "train"):
            speedup = result.get("patched", mode).speedup if result else None
            if speedup is not None and speedup.ci_high < 1.0:
                numbers.only_faster_slower.append(f"{m} ({mode})")
    return numbers


def targets_section(numbers: Numbers, settings: Settings) -> list[str]:
    inf, train = list(numbers.inference.values()), list(numbers.train.values())
    dropout, memory = list(numbers.train_dropout.values()), list(numbers.memory.values())
    slower = [m for m, v in numbers.train_dropout.items() if v < 1.0]
    lines = [
        "## Targets\n",
        f"Transformer models: {', '.join(TRANSFORMERS)} at {settings.long_seq} tokens, geometric "
        "mean over the models that ran (per-model numbers and intervals in the tables below). "
        "The machine was shared with other CPU-bound jobs: two full runs of this script "
        "differed by up to 0.15× for single models, more than some intervals suggest, so read "
        "single-model numbers with care; the verdicts below do not depend on any one of them.\n",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| inference geomean ≥ 1.30× faster | {fmt_x(geomean(inf))} ({len(inf)} models) | "
        f"{verdict(geomean(inf), 1.30)} |",
        f"| training, attention dropout 0, geomean ≥ 1.15× faster | {fmt_x(geomean(train))} "
        f"({len(train)} models) | {verdict(geomean(train), 1.15)} |",
        f"| training, configured dropout, no slower (geomean ≥ 1.00×) | "
        f"{geomean(dropout):.3f}× ({len(dropout)} models; point estimate below 1 for: "
        f"{', '.join(slower) or 'none'}; interval wholly below 1 for: "
        f"{', '.join(numbers.train_dropout_slower) or 'none'}) | "
        f"{verdict(geomean(dropout), 1.0)} |",
        f"| peak training memory, attention dropout 0, ≥ 10% lower (geomean) | "
        f"{fmt_pct(geomean(memory))} ({len(memory)} models) | "
        f"{verdict(geomean(memory), 0.90, higher=False)} |",
        f"| (inference, training with attention dropout 0 and memory, with the nine paper rules "
        f"only) | inference "
        f"{fmt_x(geomean(list(numbers.paper_inference.values())))}, training "
        f"{fmt_x(geomean(list(numbers.paper_train.values())))}, memory "
        f"{fmt_pct(geomean(list(numbers.paper_memory.values())))} | "
        f"{verdict(geomean(list(numbers.paper_inference.values())), 1.30).split(' (')[0]}, "
        f"{verdict(geomean(list(numbers.paper_train.values())), 1.15).split(' (')[0]}, "
        f"{verdict(geomean(list(numbers.paper_memory.values())), 0.90, higher=False).split(' (')[0]} |",
        f"| (peak training memory at the released depth, 6-12 layers: all rules; paper rules "
        f"only) | {fmt_pct(geomean(list(numbers.depth_memory.values())))} "
        f"({len(numbers.depth_memory)} models); "
        f"{fmt_pct(geomean(list(numbers.depth_memory_paper.values())))} | "
        f"{verdict(geomean(list(numbers.depth_memory.values())), 0.90, higher=False).split(' (')[0]}"
        f"; {verdict(geomean(list(numbers.depth_memory_paper.values())), 0.90, higher=False).split(' (')[0]} |",
        f"| CNN inference with folded conv + batch norm ≥ 1.20× faster (ResNet) | "
        f"{fmt_x(numbers.resnet_inference)} | {verdict(numbers.resnet_inference, 1.20)} |",
        "| no model slower than its original after `apply --only-faster` (no interval wholly "
        f"below 1) | {len(numbers.only_faster_models)} models; measurably slower: "
        f"{', '.join(numbers.only_faster_slower) or 'none'} | "
        + (
            "not measured"
            if not numbers.only_faster_models
            else "**reached**"
            if not numbers.only_faster_slower
            else "**missed**"
        )
        + " |",
        f"| (the same for GroupViT's Linear + BatchNorm1d fold, `paper.8 only`; GroupViT has no "
        f"conv + batch-norm pair) | {fmt_x(numbers.groupvit_fold)} | "
        f"{verdict(numbers.groupvit_fold, 1.20)} |",
        "",
    ]
    return lines


def why_section(records: Records, numbers: Numbers) -> list[str]:
    """Why targets are missed and what would close each gap, from the measured numbers."""
    bert = records.get(("profile", "bert"))
    resnet = records.get(("profile", "resnet"))
    lines = ["### Why the targets are missed, and what would close the gaps\n"]
    share_inf = unchangeable_share(bert, "bert", "inference")
    share_train = unchangeable_share(bert, "bert", "train")
    if share_inf and share_train:
        bound = 1 / share_inf
        conclusion = (
            "**So 1.30× in inference is out of reach on this CPU for any rewrite that keeps "
            f"the GEMMs as they are** (BERT's bound is {bound:.2f}×; the other six models are "
            "built from the same GEMM-dominated layers)."
            if bound < 1.30
            else "The bound leaves room above 1.30×; the gap is in how much of the rest the "
            "kernels remove."
        )
        lines.append(
            f"* **The GEMMs stay, and on a CPU they are most of the step.** In the BERT profile "
            f"below, the linear-layer GEMMs, the optimizer and the embedding lookups - work no "
            f"paper rule changes - are {share_inf * 100:.0f}% of the original inference step "
            f"and {share_train * 100:.0f}% of the training step. Even if the rewrite made "
            f"everything else free, BERT could get at most {bound:.2f}× faster in inference and "
            f"{1 / share_train:.2f}× in training (Amdahl). The rules remove memory-bound work "
            "between the GEMMs (materialised attention scores, separate softmax, dropout, "
            "residual add, layer norm and activation passes); on a GPU that work is a far larger "
            "share of the step, which is where the paper's speedups come from. "
            + conclusion
            + " Closing it needs kernel work on the GEMM side: bf16 (or int8) GEMMs where the "
            "CPU supports them, and oneDNN linear primitives with the bias + activation (and "
            "dropout + residual + layer norm) as fused post-ops, so activations are written once."
        )
    extended = [m for m in EXTENDED_ATTENTION if m in numbers.inference]
    if extended:

        def pair(values: dict[str, float], models: list[str]) -> str:
            return fmt_x(geomean([values[m] for m in models if m in values]))

        lines.append(
            f"* **Attention in all seven models.** paper.1-paper.3 name the attention classes "
            "of BERT, T5 and GPT-2 only; the extended rules ext.1-ext.4 route the attention of "
            f"{', '.join(extended)} through the same SDPA kernels (RoBERTa's class is a verbatim "
            "copy of BERT's under another name; DistilBERT, ALBERT and GPT-Neo got kernels of "
            "their own). For these models the nine paper rules alone give "
            f"{pair(numbers.paper_inference, extended)} inference and "
            f"{pair(numbers.paper_train, extended)} training, all rules "
            f"{pair(numbers.inference, extended)} and {pair(numbers.train, extended)} "
            "(geomeans, same interleaved run). Fused attention removes the score-sized "
            "passes, which the GEMM share above caps."
        )
    if bert and "variants" in bert:
        orig = profile_groups(bert, "original", "train")
        patched = profile_groups(bert, "patched", "train")
        before = sum(orig.get(g, 0.0) for g in ("attention matmuls (bmm)", "softmax"))
        after = patched.get("fused attention (SDPA)", 0.0)
        if before and after:
            ratio = before / after
            lines.append(
                f"* **Fused attention on a CPU core.** In the BERT training profile the unfused "
                f"attention (batched matmuls + softmax, forward and backward) takes "
                f"{before:,.0f} ms per step and the fused SDPA kernel {after:,.0f} ms "
                f"({ratio:.2f}×). "
                + (
                    "The flash kernel's backward recomputes the probabilities blockwise, so on "
                    "a CPU the fusion saves memory and memory traffic but little time. A CPU "
                    "attention backward that keeps the probabilities when they fit in cache, or "
                    "bf16 matmuls inside the kernel, would make it pay in training too."
                    if ratio < 1.3
                    else "The fused kernel is clearly faster; what limits the step is the rest."
                )
            )
    if numbers.train_dropout:
        lines.append(
            "* **Configured dropout.** With attention dropout > 0 PyTorch's CPU "
            "`scaled_dot_product_attention` has no fused path: it runs its math fallback "
            "(batched matmuls, softmax, dropout - the original's work) plus the kernel's "
            "dispatch, and the same happens in T5's training whenever the learned position bias "
            "(a mask that needs a gradient) is passed (both checked with torch.profiler on "
            "direct SDPA calls: they dispatch to `_scaled_dot_product_attention_math`). So the "
            "attention kernels run the module's original forward on a CPU while attention "
            "dropout is active: the patched step does the original's work, geomean "
            f"{geomean(list(numbers.train_dropout.values())):.3f}× "
            + (
                "with no model measurably slower (every interval reaches 1.00×)"
                if not numbers.train_dropout_slower
                else f"({', '.join(numbers.train_dropout_slower)} measurably slower)"
            )
            + ". A real gain needs a CPU flash-attention kernel with in-kernel (counter-based) "
            "dropout, so that the probability matrix is never materialised."
        )
    if numbers.memory:
        saved = {m: r for m, r in numbers.memory.items() if r <= 0.95}
        flat = [m for m in numbers.memory if m not in saved]
        shares = []
        for m in ("bert", *flat):
            long = result_of(records.get(("long", m)))
            base = long.get("original", "train").memory if long else None
            grad_mib = embedding_gradient_mib(m)
            if base is not None and grad_mib:
                shares.append(f"{m} {grad_mib:.0f} of {base.peak_bytes / (1 << 20):.0f} MiB")
        embedding = (
            " At 2 layers much of every step's peak is gradients no rule touches, above all "
            "the word-embedding gradient, which is written at the very end of backward, when "
            "the attention activations are already freed (" + "; ".join(shares) + "); where it "
            "sets the peak, activation savings do not show - the released-depth table below "
            "measures the same step with every layer."
            if shares
            else ""
        )
        paper_only = ""
        if numbers.paper_memory:
            paper_only = (
                " With the nine paper rules only the geomean is "
                f"{fmt_pct(geomean(list(numbers.paper_memory.values())))} "
                f"({', '.join(f'{m} {fmt_pct(r)}' for m, r in numbers.paper_memory.items())}): "
                "the attention rules of the extended set are what saves memory in RoBERTa, "
                "DistilBERT and GPT-Neo."
            )
        lines.append(
            "* **Memory.** The step peak drops where the rewrite stops keeping score-sized or "
            "activation-sized intermediates for backward: "
            + (", ".join(f"{m} {fmt_pct(r)}" for m, r in saved.items()) or "none")
            + (
                f"; it stays within ±5% for {', '.join(flat)}"
                + (
                    " (T5's attention runs its own code in training on a CPU, see the "
                    "previous point)"
                    if "t5" in flat
                    else ""
                )
                + "."
                if flat
                else "."
            )
            + paper_only
            + embedding
        )
    if resnet and "variants" in resnet:
        groups = profile_groups(resnet, "original", "inference")
        total = sum(groups.values())
        bn = groups.get("batch norm", 0.0)
        conv = groups.get("convolution", 0.0)
        ops = resnet["variants"]["original"]["inference"]["ops_us"]
        slow = sum(us for op, us in ops.items() if "slow_conv" in op) / 1e3
        if total and bn:
            lines.append(
                f"* **ResNet: batch norm is {bn / total * 100:.0f}% of the inference step, the "
                f"convolutions {conv / total * 100:.0f}%.** Folding removes the batch-norm pass, "
                f"so {1 / (1 - bn / total):.2f}× is the most the fold can give here, and part of "
                "it goes back: the folded convolutions gain a bias, which PyTorch's non-oneDNN "
                f"convolution (`_slow_conv2d_forward`, {slow / total * 100:.0f}% of the step: "
                "the 1×1 convolutions at batch 2 on one thread) applies as an extra copy of the "
                "output. The lever that is left is the memory layout, and it is not the "
                "fold's: [conv-layout.md](conv-layout.md) (`python "
                "benchmarks/conv_layout_study.py`) times original and patched ResNet in NCHW "
                "and channels-last: channels-last speeds up both sides alike. Its experiment "
                "running every folded convolution as a oneDNN primitive with prepacked weights "
                "beats the 1.20× target, but only by handing channels-last tensors to the caller "
                "(converting each output back to NCHW makes it slower than the original); a "
                "kernel that silently changes the layout a model returns can break later "
                "`.view` calls, so the kernels keep the "
                "layout, and 1.20× from folding stays out of reach on this CPU."
            )
    lines.append(
        "* **`torch.compile`.** The kernels trace without graph breaks (checked with "
        "`torch._dynamo.explain` on BERT and ResNet). A compiled graph cannot keep the folded "
        "conv/linear + batch-norm weights between calls, so under compilation the fold kernels "
        "hand the compiler the original modules (recomputing the fold in every call made "
        "compiled ResNet 0.88× as fast in an earlier run of this report); Inductor already "
        "fuses the original's batch norm + ReLU and softmax chains into single passes, so both "
        "sides end up doing about the same work. Folding at compile time (Inductor's "
        "`freezing` for inference) would serve both sides."
    )
    lines.append("")
    return lines


MODEL_NOTES = {
    "bert": "all three rule kinds: SDPA attention (paper.1; paper.4's softmax is inside it), "
    "dropout + residual + layer norm (paper.5), bias + GELU (paper.6).",
    "roberta": "ext.1 builds `RobertaSelfAttention` (BERT's code under another name) through "
    "BERT's SDPA kernel; paper.4's softmax is inside it; dropout + residual + layer norm "
    "(paper.5) and bias + GELU (paper.6) as in BERT. The paper rules alone leave the attention "
    "unfused (paper.1 names `BertSelfAttention` only).",
    "gpt2": "paper.3 routes `GPT2Attention` through SDPA (its softmax, paper.4, is inside it).",
    "gpt_neo": "ext.4 routes `GPTNeoSelfAttention` through SDPA (unscaled scores, the global "
    "causal or local banded mask; one QKV GEMM), which covers the softmax (paper.4) and QKV "
    "(paper.9) sites inside it - the paper rules' only rewrites here.",
    "distilbert": "ext.2 routes `MultiHeadSelfAttention` through SDPA (one QKV GEMM for "
    "self-attention, the padding mask as an additive mask, none without padding); the paper "
    "rules only rewrite the softmax inside it (paper.4).",
    "t5": "paper.2 routes `T5Attention` through SDPA with T5's relative position bias as a dense "
    "`heads × L × L` additive mask; in training that mask needs a gradient, which sends CPU SDPA "
    "to its unfused math path, so only inference uses the fused kernel.",
    "albert": "ext.3 routes `AlbertAttention` through SDPA and ends it with the fused dropout + "
    "residual + layer norm (covering the paper.4 and paper.5 sites inside it); bias + "
    "`gelu_new` (paper.6: one native tanh-GELU kernel instead of the formula's chain of "
    "elementwise ops, which also cuts training memory).",
    "groupvit": "softmax (paper.4), bias + activation (paper.6) and Linear + BatchNorm1d folding "
    "in the projection heads (paper.8, eval only).",
    "resnet": "conv + batch-norm folding in every `ResNetConvLayer` and shortcut (paper.7, eval "
    "only; training runs the original modules).",
}


def machine_section(records: Records, meta: dict[str, Any]) -> str:
    env: dict[str, Any] = {}
    for record in records.values():
        if "result" in record:
            env = record["result"].get("environment", {})
            break
    extra = "; ".join(meta.get("extra_runs", []))
    lines = [
        "| | |",
        "|---|---|",
        "| device | **CPU only**: no GPU was lent to this session, so no CUDA/Triton kernel ran |",
        f"| CPU | {env.get('cpu', '?')}, {env.get('cpu_count', os.cpu_count())} logical cores |",
        f"| torch threads | {env.get('threads', '?')}, deliberately: other CPU-bound jobs shared "
        "the 2 cores, and two OpenMP threads then stall on each other at every barrier (a probe "
        "before this run measured BERT's step 2× slower with 2 threads than with 1) |",
        f"| software | torch {env.get('torch', torch.__version__)}, transformers "
        f"{meta.get('transformers', '?')}, Python {env.get('python', platform.python_version())} |",
        f"| platform | {env.get('platform', platform.platform())} |",
        f"| load | shared machine: 1-minute load average {meta.get('load_start', '?')} at the "
        f"start, {meta.get('load_end', '?')} at the end |",
        f"| wall time | {meta.get('wall_min', '?')} min ({study_seconds(records)})"
        + (f"; {extra}" if extra else "")
        + " |",
    ]
    return "\n".join(lines)


def profile_table(record: dict[str, Any] | None, modes: tuple[str, ...]) -> list[str]:
    if not record or "variants" not in record:
        return [f"Not available: {record.get('error') if record else 'not run'}\n"]
    columns = [(mode, variant) for mode in modes for variant in ("original", "patched")]
    data = {col: profile_groups(record, col[1], col[0]) for col in columns}
    totals = {col: sum(values.values()) for col, values in data.items()}
    groups = sorted(
        {g for values in data.values() for g in values},
        key=lambda g: -data[(modes[-1], "original")].get(g, 0.0),
    )
    header = " | ".join(f"{mode} {variant} ms" for mode, variant in columns)
    lines = [f"| op group | {header} |", "|---|" + "---|" * len(columns)]
    for group in groups:
        cells = []
        for col in columns:
            value = data[col].get(group, 0.0)
            share = value / totals[col] * 100 if totals[col] else 0.0
            cells.append(f"{value:,.1f} ({share:.0f}%)")
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(f"{totals[c]:,.1f}" for c in columns) + " |")
    lines.append("")
    return lines


def header_section(settings: Settings, meta: dict[str, Any]) -> list[str]:
    """Title and what was measured how, in one paragraph."""
    lines: list[str] = []
    w = lines.append
    w("# Performance: what the rewrites buy, before and after\n")
    kind = "**--quick: tiny configurations, not a measurement**" if settings.quick else "full run"
    w(
        f"Generated by `python benchmarks/perf_report.py` ({kind}) on {meta.get('date', '?')}, "
        "**on a CPU** (no GPU was available). Each model's `transformers==4.34.0` modeling file "
        f"is rewritten with the `{settings.rule_set}` rule set"
        + (
            " (the nine paper rules plus the four extended attention rules ext.1-ext.4, "
            "`adopter/rules/ext_*.adopt`); the variant `paper rules` is the same file rewritten "
            "with the nine paper rules only, measured in the same interleaved run"
            if settings.rule_set == "all"
            else ""
        )
        + ". Original and patched model are built from the "
        "same configuration, the patched one loads the original's `state_dict` strictly, both "
        "get the same inputs and are timed interleaved. Speedup = original median / patched "
        "median step time, with a 95% paired-bootstrap confidence interval (✓: the whole "
        "interval is above 1, ✗: below 1).\n"
    )
    return lines


def method_section(records: Records, meta: dict[str, Any], settings: Settings) -> list[str]:
    """The machine, the command and the method, with the deviations from the defaults."""
    lines: list[str] = []
    w = lines.append
    w("## Machine, command, method\n")
    w(machine_section(records, meta) + "\n")
    w(
        "```bash\npython benchmarks/perf_report.py"
        + (" --quick" if settings.quick else "")
        + "\n```\n"
    )
    w(
        f"* Models: the base model class of each modeling file (`BertModel`, `T5Model`, "
        f"`GroupViTModel`, `ResNetModel`), the class's default configuration with every layer "
        f"stack cut to {settings.layers} layers (ResNet: {settings.layers} blocks per stage; "
        "widths, heads and vocabulary at their defaults), float32, eager PyTorch unless stated."
    )
    w(
        f"* Inputs: {settings.long_batch} × {settings.long_seq} and {settings.short_batch} × "
        f"{settings.short_seq} token ids with an all-ones attention mask (T5: target length a "
        "quarter of the input); GroupViT: its 77-token text context plus "
        f"{SPECS['groupvit'].image_batch} images of {settings.image_size} px; ResNet: "
        f"{SPECS['resnet'].image_batch} images of {settings.image_size} px."
    )
    w(
        "* Training step: zero_grad, forward, loss (mean square of the last hidden state; "
        "GroupViT: its contrastive loss), backward, AdamW step with `fused=True` (the "
        "per-tensor AdamW loop would be a large, rule-independent part of a CPU step)."
    )
    w(
        f"* Timing: {settings.warmup} warm-up step, then {settings.repeats} rounds in which every "
        "variant takes one step in shuffled order (interleaving spreads the shared machine's "
        "load changes over all variants). Few rounds, to fit the time budget: the intervals "
        "are correspondingly wide."
    )
    w(
        "* Memory: the training step's peak resident set above the level just before it, in a "
        "fresh process per variant (activations kept for backward, gradients, temporaries; not "
        "weights, optimizer state or inputs)."
    )
    w(
        "* Attention dropout 0: the attention-probability dropout set to 0 (T5, which has one "
        "shared dropout rate, with all dropout 0); other dropout as configured.\n"
    )
    deviations = [f"* **{s.name}**: {s.deviation}" for s in SPECS.values() if s.deviation]
    if deviations and not settings.quick:
        w("Deviations from the class defaults, all to fit the machine or to be runnable:\n")
        w("\n".join(deviations) + "\n")
    return lines


def dropout_cell(model: str, record: dict[str, Any]) -> str:
    """The configured-dropout training speedup of ``model`` (its ``long_dropout`` record)."""
    if SPECS[model].family != "text":
        return "n/a (configured dropout is 0)"
    if "skipped" in record:
        return "same as the previous column (configured attention dropout is 0)"
    if "error" in record:
        return f"failed: {record['error'][:120]}"
    return speed_cell(result_of(record), "patched", "train")


def long_section(records: Records, long: LongResults, settings: Settings, png: Path) -> list[str]:
    """The main table: every model at the long sequence, and the chart."""
    lines: list[str] = []
    w = lines.append
    w(f"## {settings.long_seq} tokens (images {settings.image_size} px)\n")
    w(
        "| model | patched sites | inference | training, attention dropout 0 | training, "
        "configured dropout | peak training memory, attention dropout 0 | median step ms, "
        "original → patched (inference / training) |"
    )
    w("|---|---|---|---|---|---|---|")
    for m in ALL_MODELS:
        record = records.get(("long", m))
        if record is None:
            continue
        if "error" in record:
            w(f"| {m} | failed: {record['error'][:200]} | | | | | |")
            continue
        res = long[m]
        dropout = dropout_cell(m, records.get(("long_dropout", m)) or {})
        steps = (
            f"{ms(res, 'original', 'inference')} → {ms(res, 'patched', 'inference')} / "
            f"{ms(res, 'original', 'train')} → {ms(res, 'patched', 'train')}"
        )
        memory = memory_cell(res) if SPECS[m].family == "text" else "not measured"
        w(
            f"| {m} | {sites(res)} | {speed_cell(res, 'patched', 'inference')} | "
            f"{speed_cell(res, 'patched', 'train')} | {dropout} | {memory} | {steps} |"
        )
    w("")
    w(f"![speedup and memory per model]({png.name})\n")
    return lines


def ablation_section(long: LongResults, settings: Settings) -> list[str]:
    """One row per variant of the ``long`` run: what each rule contributes."""
    lines: list[str] = []
    w = lines.append
    w(f"### What each rule contributes ({settings.long_seq} tokens / {settings.image_size} px)\n")
    w(
        "One variant per rule that patches something on its own (`paper.5 only`: the source "
        "rewritten with that rule alone), measured in the same interleaved run as `patched` "
        "(all rules). Training with attention dropout 0. Models with a single rewriting rule "
        "(its solo rewrite is `patched` itself) have no extra rows.\n"
    )
    w("| model | variant | patched sites | inference | training |")
    w("|---|---|---|---|---|")
    for m in ALL_MODELS:
        res = long[m]
        if res is None:
            continue
        for variant in res.candidates:
            w(
                f"| {m} | {variant} | {sites(res, variant)} | "
                f"{speed_cell(res, variant, 'inference')} | {speed_cell(res, variant, 'train')} |"
            )
    w("")
    return lines


def depth_memory_section(records: Records, numbers: Numbers, settings: Settings) -> list[str]:
    """Peak training memory at the released depth (the ``memory_depth`` study)."""
    lines: list[str] = []
    w = lines.append
    w(f"### Peak training memory at the released depth ({settings.long_seq} tokens)\n")
    w(
        "The same step as above (attention dropout 0, one fresh process per variant, memory "
        "only) with every layer of the released base model: at 2 layers the largest gradient, "
        "the word embeddings', can set the step's peak and hide what the rewrites save in "
        "activations (`--studies memory_depth`).\n"
    )
    w("| model | layers | original | all rules | paper rules only |")
    w("|---|---|---|---|---|")
    mib = 1 << 20
    for m in TRANSFORMERS:
        record = records.get(("memory_depth", m))
        if record is None:
            continue
        if "error" in record:
            w(f"| {m} | failed: {record['error'][:200]} | | | |")
            continue
        base = record.get("variants", {}).get("original", {}).get("peak_bytes")
        w(
            f"| {m} | {record.get('layers', '?')} | "
            + (f"{base / mib:,.0f} MiB" if base else "-")
            + f" | {depth_cell(record, depth_ratio(record, 'patched'), 'patched')} | "
            f"{depth_cell(record, numbers.depth_memory_paper.get(m), PAPER_GROUP)} |"
        )
    w("")
    return lines


def only_faster_section(records: Records) -> list[str]:
    """What ``apply --only-faster`` keeps per model, and that rewrite timed."""
    lines: list[str] = []
    w = lines.append
    w("## After `apply --only-faster`\n")
    w(
        "`adopter apply --only-faster` keeps a rule's patches only where a short interleaved run "
        "on this machine shows them reliably faster: the rule alone against the original, "
        "configured dropout, inference and training; kept when its interval clears 1.00× in "
        "one mode and reaches 1.00× in the other. A rule that run leaves undecided (not kept, "
        "not reliably slower, point estimate above 1) gets more rounds, pooled with the first "
        "ones, before it is judged; the numbers below are over all its rounds. The kept "
        "rewrite is then timed against the "
        "original like the runs above, with the configured dropout. A model where no rule is "
        "reliably faster is left as it is.\n"
    )
    w("| model | kept | dropped | inference | training, configured dropout |")
    w("|---|---|---|---|---|")
    for m in ALL_MODELS:
        record = records.get(("only_faster", m))
        if record is None:
            continue
        if "error" in record:
            w(f"| {m} | failed: {record['error'][:100]} | | | |")
            continue
        reasons = record.get("reasons", {})
        kept = ", ".join(record.get("kept", [])) or "nothing"
        judged = {rule: Judgement.from_reason(why) for rule, why in reasons.items()}
        dropped = "; ".join(
            f"{rule}: {judgement.explanation}"
            for rule, judgement in judged.items()
            if judgement.dropped
        )
        result = result_of(record)
        if result is None:
            w(f"| {m} | {kept} | {dropped or '-'} | 1.00× (unchanged) | 1.00× (unchanged) |")
            continue
        w(
            f"| {m} | {kept} | {dropped or '-'} | {speed_cell(result, 'patched', 'inference')} "
            f"| {speed_cell(result, 'patched', 'train')} |"
        )
    w("")
    return lines


def short_section(records: Records, settings: Settings) -> list[str]:
    """The short-sequence run of the text models."""
    lines: list[str] = []
    w = lines.append
    w(f"## {settings.short_seq} tokens\n")
    w(f"{settings.short_batch} × {settings.short_seq} tokens, training with attention dropout 0.\n")
    w(
        "| model | inference | training | median step ms, original → patched (inference / training) |"
    )
    w("|---|---|---|---|")
    for m in TRANSFORMERS:
        record = records.get(("short", m))
        if record is None:
            continue
        if "error" in record:
            w(f"| {m} | failed: {record['error'][:200]} | | |")
            continue
        res = result_of(record)
        w(
            f"| {m} | {speed_cell(res, 'patched', 'inference')} | "
            f"{speed_cell(res, 'patched', 'train')} | {ms(res, 'original', 'inference')} → "
            f"{ms(res, 'patched', 'inference')} / {ms(res, 'original', 'train')} → "
            f"{ms(res, 'patched', 'train')} |"
        )
    w("")
    return lines


def compile_section(records: Records, settings: Settings) -> list[str]:
    """BERT and ResNet inference with ``torch.compile`` on both sides."""
    lines: list[str] = []
    w = lines.append
    w("## With `torch.compile` on both sides\n")
    w(
        "Inductor compiles slowly on this 2-core CPU, so this is bounded to inference for BERT "
        f"({settings.short_batch} × {settings.short_seq} tokens) and ResNet "
        f"({SPECS['resnet'].image_batch} × {settings.image_size} px): does the rewrite still pay "
        "off once the compiler fuses what it can by itself? (The seconds include compilation; "
        "Inductor's on-disk cache may have been warm from earlier runs.)\n"
    )
    w(
        "| model | inference, compiled original → compiled patched | median ms | seconds incl. compilation |"
    )
    w("|---|---|---|---|")
    for m in ("bert", "resnet"):
        record = records.get(("compile", m))
        if record is None:
            w(f"| {m} | not run | | |")
        elif "error" in record or "skipped" in record:
            w(f"| {m} | {record.get('error') or record.get('skipped')} | | |")
        else:
            res = result_of(record)
            w(
                f"| {m} | {speed_cell(res, 'patched', 'inference')} | "
                f"{ms(res, 'original', 'inference')} → {ms(res, 'patched', 'inference')} | "
                f"{record['seconds']:.0f} |"
            )
    w("")
    return lines


def profile_section(records: Records, settings: Settings) -> list[str]:
    """The op-group tables of the BERT and ResNet profiles."""
    lines: list[str] = []
    w = lines.append
    w("## Where the time goes (torch.profiler)\n")
    bert = records.get(("profile", "bert"))
    steps = (bert or {}).get("steps", settings.profile_steps)
    w(
        f"Self CPU time per op, averaged over {steps} profiled steps and summed into groups "
        "(the profiler's own overhead inflates small ops a little). The variants are profiled "
        "one after the other, not interleaved, so absolute milliseconds move with the machine's "
        "load; the shares are what the explanations above use. BERT: "
        f"{settings.long_batch} × {settings.long_seq} tokens, attention dropout 0.\n"
    )
    lines.extend(profile_table(bert, PROFILES["bert"]))
    w(
        f"ResNet inference ({SPECS['resnet'].image_batch} × {settings.image_size} px; "
        f"{settings.layers} blocks per stage):\n"
    )
    lines.extend(profile_table(records.get(("profile", "resnet")), PROFILES["resnet"]))
    return lines


def rewritten_section(long: LongResults) -> list[str]:
    """What the rules rewrote in each model, with the sites of the ``long`` run."""
    lines: list[str] = []
    w = lines.append
    w("## What was rewritten in each model\n")
    for m in ALL_MODELS:
        res = long[m]
        w(f"* **{m}** ({sites(res)}): {MODEL_NOTES[m]}")
    w("")
    return lines


def failures_section(records: Records) -> list[str]:
    """Every study that failed, with its error."""
    lines: list[str] = []
    w = lines.append
    failed = [(key, record) for key, record in records.items() if "error" in record]
    w("## Failures\n")
    if failed:
        for (study, model), record in failed:
            w(f"* `{study}` / **{model}**: {record['error']}")
    else:
        w("None: every model built, loaded the original's weights and ran in every study.")
    w("")
    return lines


def plot_long(long: LongResults, png: Path, settings: Settings) -> None:
    """The chart of the ``long`` run: original and patched of every model that ran."""
    plotted = {}
    for m in ALL_MODELS:
        res = long[m]
        if res is not None:
            keep = {k: v for k, v in res.variants.items() if k in ("original", "patched")}
            plotted[m] = BenchResult(res.baseline, res.modes, keep, res.settings, res.environment)
    if plotted:
        title = (
            f"Patched vs. original, {settings.long_seq} tokens / {settings.image_size} px, "
            "attention dropout 0 (CPU, 95% CI)"
        )
        plot(plotted, png, title=title)


def render(cache: Path, out: Path, png: Path, settings: Settings) -> None:
    """Write the Markdown report (and the PNG) from the saved records, section by section."""
    records = load_records(cache)
    meta_path = cache / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    numbers = collect(records)
    long = {m: result_of(records.get(("long", m))) for m in ALL_MODELS}
    sections = [
        header_section(settings, meta),
        targets_section(numbers, settings),
        why_section(records, numbers),
        method_section(records, meta, settings),
        long_section(records, long, settings, png),
        ablation_section(long, settings),
        depth_memory_section(records, numbers, settings),
        only_faster_section(records),
        short_section(records, settings),
        compile_section(records, settings),
        profile_section(records, settings),
        rewritten_section(long),
        failures_section(records),
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        "\n".join(line for section in sections for line in section) + "\n", encoding="utf-8"
    )
    plot_long(long, png, settings)


# ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny configurations (pipeline test)")
    parser.add_argument("--models", default=",".join(ALL_MODELS), help="comma-separated subset")
    parser.add_argument(
        "--studies", default="long,long_dropout,short,compile,profile,only_faster,memory_depth"
    )
    parser.add_argument("--render-only", action="store_true", help="only re-render the Markdown")
    parser.add_argument("--out", type=Path, default=None, help="Markdown file to write")
    parser.add_argument(
        "--rule-set", default="all", help="built-in rule set to rewrite with (default: all)"
    )
    parser.add_argument(
        "--budget-min",
        type=float,
        default=45.0,
        help="skip compile / profile runs that would start past this many minutes",
    )
    args = parser.parse_args(argv)
    settings = Settings.make(args.quick, args.rule_set)
    cache = ROOT / ".cache" / ("perf-quick" if args.quick else "perf")
    cache.mkdir(parents=True, exist_ok=True)
    default = Path("/tmp/performance-quick.md") if args.quick else ROOT / "docs" / "performance.md"
    out = args.out or default
    png = out.with_suffix(".png")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(ALL_MODELS))
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    all_studies = "long,long_dropout,short,compile,profile,only_faster,memory_depth".split(",")
    studies = [s.strip() for s in args.studies.split(",") if s.strip()]

    def say(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    if not args.render_only:
        import transformers

        started = time.perf_counter()
        load_start = f"{os.getloadavg()[0]:.1f}"
        for job in jobs_for(settings, models):
            if job.study not in studies:
                continue
            elapsed = (time.perf_counter() - started) / 60
            if job.study == "compile" and elapsed > args.budget_min - 4:
                record = {"skipped": f"time budget: {elapsed:.0f} min already spent", "seconds": 0}
                (cache / f"compile__{job.model}.json").write_text(json.dumps(record))
                say(f"compile/{job.model}: skipped (budget)")
                continue
            say(f"{job.study}/{job.model}: start ({elapsed:.1f} min elapsed)")
            run_job(job, settings, cache, say)
        if "memory_depth" in studies:
            for name in TRANSFORMERS:
                if name in models:
                    say(f"memory_depth/{name}: start")
                    memory_depth_job(name, settings, cache, say)
        if "profile" in studies:
            for name in PROFILES:
                if name in models and (time.perf_counter() - started) / 60 < args.budget_min:
                    profile_job(name, settings, cache, say)
        wall = f"{(time.perf_counter() - started) / 60:.1f}"
        meta_path = cache / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        if studies == all_studies and models == list(ALL_MODELS):
            meta = {
                "date": time.strftime("%Y-%m-%d"),
                "load_start": load_start,
                "load_end": f"{os.getloadavg()[0]:.1f}",
                "wall_min": wall,
                "transformers": transformers.__version__,
                "rule_set": settings.rule_set,
            }
        else:  # a partial re-run: say so next to the main run's numbers
            meta.setdefault("extra_runs", []).append(
                f"re-ran {','.join(studies)} for {','.join(models)} separately ({wall} min)"
            )
        meta_path.write_text(json.dumps(meta), encoding="utf-8")
    render(cache, out, png, settings)
    say(f"wrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
