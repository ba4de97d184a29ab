"""Per-operation benchmark of the modern kernels: the original computation beside the kernel.

Each case is one operation at the sizes of issue 14 (Llama-style width 768, 512 tokens, batch 2,
float32; vocab 32,000 and 128,256 for the LM head + cross-entropy), written twice as a tiny
``nn.Module``: once as the model files spell it, once calling the kernel. The operation's inputs
are parameters of the module, so a training step computes every input gradient, as in a model.
Both run through :func:`adopter.bench.benchmark_variants`: interleaved rounds, one torch thread,
training step (forward, backward, SGD step) and inference step (``no_grad`` forward), medians with
paired-bootstrap intervals, peak memory of one step from the profiler's allocation events
(tensors only, above the level before the step: activations, gradients, temporaries).

    python benchmarks/kernel_bench.py                      # every case, writes docs/kernels.md
    python benchmarks/kernel_bench.py --cases rms_norm apply_rotary --repeats 5 --output /tmp/k.md
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from machine import describe_machine  # noqa: E402
from torch import nn  # noqa: E402

from adopter import kernels  # noqa: E402
from adopter.bench import ModelVariant, benchmark_variants  # noqa: E402

BATCH, TOKENS, WIDTH, HEADS, KV_HEADS, HEAD_DIM, INNER = 2, 512, 768, 12, 4, 64, 2048
MiB = 1 << 20


class Op(nn.Module):
    """An operation whose training step backpropagates the sum of its outputs' mean squares
    (the same scalar for both variants); inference returns the outputs as they are, so that
    its memory is the operation's own."""

    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.fused = fused

    def finish(self, *outputs: torch.Tensor) -> Any:
        if not self.training:
            return outputs
        return {"loss": sum(o.float().pow(2).mean() for o in outputs)}


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape))


# --------------------------------------------------------------------------------------------
# The operations, as the model files write them and through the kernels


class RMSNormOp(Op):
    def __init__(self, fused: bool) -> None:
        super().__init__(fused)
        self.x = _param(BATCH, TOKENS, WIDTH)
        self.weight = nn.Parameter(torch.ones(WIDTH))

    def forward(self, _batch: torch.Tensor) -> Any:
        if self.fused:
            return self.finish(kernels.rms_norm(self.x, self.weight, 1e-6))
        hidden = self.x.to(torch.float32)  # LlamaRMSNorm.forward
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + 1e-6)
        return self.finish(self.weight * hidden.to(self.x.dtype))


class LlamaRMSNorm(nn.Module):
    """The RMSNorm module of the transformers Llama family, as its ``forward`` spells it (the
    spelling :func:`adopter.kernels.add_rms_norm` recognises)."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class AddRMSNormOp(Op):
    """A decoder layer's residual add and post-attention norm; both results are used (the sum
    is the next residual)."""

    def __init__(self, fused: bool) -> None:
        super().__init__(fused)
        self.x = _param(BATCH, TOKENS, WIDTH)
        self.residual = _param(BATCH, TOKENS, WIDTH)
        self.norm = LlamaRMSNorm(WIDTH)

    def forward(self, _batch: torch.Tensor) -> Any:
        if self.fused:
            hidden, residual = kernels.add_rms_norm(self.residual, self.x, self.norm)
            return self.finish(hidden, residual)
        hidden = self.residual + self.x  # LlamaDecoderLayer.forward
        residual = hidden
        hidden = self.norm(hidden)
        return self.finish(hidden, residual)


class GatedMLPOp(Op):
    def __init__(self, fused: bool) -> None:
        super().__init__(fused)
        self.x = _param(BATCH, TOKENS, WIDTH)
        self.gate_proj = nn.Linear(WIDTH, INNER, bias=False)
        self.up_proj = nn.Linear(WIDTH, INNER, bias=False)
        self.down_proj = nn.Linear(INNER, WIDTH, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, _batch: torch.Tensor) -> Any:
        if self.fused:
            out = kernels.gated_mlp(
                self.x, self.gate_proj, self.up_proj, self.down_proj, self.act_fn
            )
        else:  # LlamaMLP.forward
            out = self.down_proj(self.act_fn(self.gate_proj(self.x)) * self.up_proj(self.x))
        return self.finish(out)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _cos_sin() -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float) / HEAD_DIM))
    freqs = torch.arange(TOKENS, dtype=torch.float)[None, :, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1).expand(BATCH, -1, -1)
    return emb.cos(), emb.sin()


class RotaryOp(Op):
    def __init__(self, fused: bool) -> None:
        super().__init__(fused)
        self.q = _param(BATCH, HEADS, TOKENS, HEAD_DIM)
        self.k = _param(BATCH, KV_HEADS, TOKENS, HEAD_DIM)
        cos, sin = _cos_sin()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, _batch: torch.Tensor) -> Any:
        if self.fused:
            return self.finish(*kernels.apply_rotary(self.q, self.k, self.cos, self.sin))
        cos, sin = self.cos.unsqueeze(1), self.sin.unsqueeze(1)  # apply_rotary_pos_emb
        q_embed = (self.q * cos) + (_rotate_half(self.q) * sin)
        k_embed = (self.k * cos) + (_rotate_half(self.k) * sin)
        return self.finish(q_embed, k_embed)


def _repeat_kv(hidden: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, kv_heads, length, dim = hidden.shape
    hidden = hidden[:, :, None, :, :].expand(batch, kv_heads, n_rep, length, dim)
    return hidden.reshape(batch, kv_heads * n_rep, length, dim)


class AttentionOp(Op):
    def __init__(self, fused: bool) -> None:
        super().__init__(fused)
        self.num_key_value_groups = HEADS // KV_HEADS
        self.q = _param(BATCH, HEADS, TOKENS, HEAD_DIM)
        self.k = _param(BATCH, KV_HEADS, TOKENS, HEAD_DIM)
        self.v = _param(BATCH, KV_HEADS, TOKENS, HEAD_DIM)
        causal = torch.full((TOKENS, TOKENS), torch.finfo(torch.float32).min).triu(1)
        self.register_buffer("mask", causal[None, None].expand(BATCH, 1, -1, -1), persistent=False)

    def forward(self, _batch: torch.Tensor) -> Any:
        scaling = HEAD_DIM**-0.5
        if self.fused:
            out, _ = kernels.attention_function(self, self.q, self.k, self.v, self.mask, scaling)
            return self.finish(out)
        key = _repeat_kv(self.k, self.num_key_value_groups)  # eager_attention_forward
        value = _repeat_kv(self.v, self.num_key_value_groups)
        weights = torch.matmul(self.q, key.transpose(2, 3)) * scaling + self.mask
        weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(self.q.dtype)
        weights = F.dropout(weights, p=0.0, training=self.training)
        out = torch.matmul(weights, value).transpose(1, 2).contiguous()
        return self.finish(out)


class GroupNormSiLUOp(Op):
    def __init__(self, fused: bool) -> None:
        super().__init__(fused)
        self.x = _param(BATCH, 320, 32, 32)
        self.norm1 = nn.GroupNorm(32, 320, eps=1e-5)
        self.nonlinearity = nn.SiLU()

    def forward(self, _batch: torch.Tensor) -> Any:
        if self.fused:
            return self.finish(kernels.group_norm_activation(self.x, self.norm1, self.nonlinearity))
        return self.finish(self.nonlinearity(self.norm1(self.x)))  # ResnetBlock2D


class ConvBNActOp(Op):
    def __init__(self, fused: bool) -> None:
        super().__init__(fused)
        self.x = _param(BATCH, 64, 56, 56)
        self.conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(64)
        self.act = nn.ReLU(inplace=True)
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, _batch: torch.Tensor) -> Any:
        if self.fused:
            return self.finish(kernels.conv_bn_act(self.x, self.conv, self.bn, self.act))
        return self.finish(self.act(self.bn(self.conv(self.x))))  # ResNet / ConvNormAct


def _for_causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, vocab: int) -> torch.Tensor:
    """transformers 5 ``ForCausalLMLoss`` (mean reduction)."""
    logits = logits.float()
    labels = F.pad(labels, (0, 1), value=-100)
    shift_labels = labels[..., 1:].contiguous()
    return F.cross_entropy(logits.view(-1, vocab), shift_labels.view(-1), ignore_index=-100)


class LinearCrossEntropyOp(nn.Module):
    def __init__(self, fused: bool, vocab: int) -> None:
        super().__init__()
        self.fused = fused
        self.vocab = vocab
        self.hidden = _param(BATCH, TOKENS, WIDTH)
        self.lm_head = nn.Linear(WIDTH, vocab, bias=False)

    def forward(self, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.fused:
            return {"loss": kernels.causal_lm_loss(self.hidden, self.lm_head, labels, self.vocab)}
        logits = self.lm_head(self.hidden)
        return {"loss": _for_causal_lm_loss(logits, labels, self.vocab)}


# --------------------------------------------------------------------------------------------
# Cases


def _build(op: Callable[[bool], nn.Module], fused: bool, labels_vocab: int | None) -> Any:
    torch.manual_seed(0)
    module = op(fused)
    if labels_vocab is None:
        return module, (torch.zeros(BATCH),)
    labels = torch.randint(0, labels_vocab, (BATCH, TOKENS))
    return module, (labels,)


@dataclass(frozen=True)
class Case:
    name: str
    sizes: str
    op: Callable[[bool], nn.Module]
    labels_vocab: int | None = None
    number: int = 1  # steps per timed sample: enough that one sample outlasts scheduler noise
    note: str = ""

    def variants(self) -> list[ModelVariant]:
        return [
            ModelVariant(label, functools.partial(_build, self.op, fused, self.labels_vocab))
            for label, fused in (("original", False), ("kernel", True))
        ]


def _ce(vocab: int) -> Callable[[bool], nn.Module]:
    return functools.partial(LinearCrossEntropyOp, vocab=vocab)


CASES = {
    case.name: case
    for case in (
        Case(
            "rms_norm",
            f"x {BATCH}x{TOKENS}x{WIDTH}",
            RMSNormOp,
            number=10,
            note="keeps the input and one inverse RMS per row instead of the input and the"
            " normalised activation",
        ),
        Case(
            "add_rms_norm",
            f"x, residual {BATCH}x{TOKENS}x{WIDTH}",
            AddRMSNormOp,
            number=10,
            note="keeps the sum and one inverse RMS per row instead of the sum and the"
            " normalised activation; the residual's gradient is added in place",
        ),
        Case(
            "gated_mlp",
            f"x {BATCH}x{TOKENS}x{WIDTH}, inner {INNER}, SiLU",
            GatedMLPOp,
            number=2,
            note="keeps gate and up (2 intermediate tensors) instead of gate, act(gate), up and"
            " the product (4); the step's peak is in backward, where both hold about as many"
            " temporaries, so a model of many layers gains more than this single layer shows",
        ),
        Case(
            "apply_rotary",
            f"q {BATCH}x{HEADS}x{TOKENS}x{HEAD_DIM}, k {KV_HEADS} heads",
            RotaryOp,
            number=10,
            note="the original keeps only cos/sin for backward too; the gain is the rotate_half"
            " temporaries (inference) and fewer passes",
        ),
        Case(
            "attention_function",
            f"q {BATCH}x{HEADS}x{TOKENS}x{HEAD_DIM}, {KV_HEADS} kv heads, causal mask",
            AttentionOp,
            number=2,
            note="SDPA's flash kernel never materialises the 12x512x512 scores and probabilities",
        ),
        Case(
            "group_norm_activation",
            f"x {BATCH}x320x32x32, 32 groups, SiLU",
            GroupNormSiLUOp,
            number=10,
            note="inference: SiLU in place on the group-norm output; training runs the original",
        ),
        Case(
            "conv_bn_act",
            f"x {BATCH}x64x56x56, conv 3x3 64->64, BN, ReLU",
            ConvBNActOp,
            number=10,
            note="inference: BatchNorm folded into the convolution (cached), ReLU in place;"
            " training runs the original",
        ),
        Case(
            "causal_lm_loss_32k",
            f"hidden {BATCH}x{TOKENS}x{WIDTH}, vocab 32000",
            _ce(32000),
            32000,
            note="the train peak is the weight gradient (94 MiB, needed by any implementation)"
            " plus one chunk of logits (384 tokens, 47 MiB: half the weight, which each chunk"
            " reads again)",
        ),
        Case(
            "causal_lm_loss_128k",
            f"hidden {BATCH}x{TOKENS}x{WIDTH}, vocab 128256",
            _ce(128256),
            128256,
            note="the train peak is the weight gradient (376 MiB) plus one chunk of logits"
            " (384 tokens, 188 MiB)",
        ),
    )
}


def run_case(case: Case, repeats: int, warmup: int) -> dict[str, Any]:
    started = time.perf_counter()
    result = benchmark_variants(
        case.variants(),
        baseline="original",
        warmup=warmup,
        repeats=repeats,
        number=case.number,
        threads=1,
        memory="profiler",
        optimizer="sgd",
    )
    rows = {}
    for mode in result.modes:
        original = result.variants["original"][mode]
        kernel = result.variants["kernel"][mode]
        if original.error or kernel.error:
            rows[mode] = {"error": original.error or kernel.error}
            continue
        rows[mode] = {
            "original_s": original.timing.median_s,
            "kernel_s": kernel.timing.median_s,
            "speedup": kernel.speedup.ratio,
            "ci": [kernel.speedup.ci_low, kernel.speedup.ci_high],
            "original_peak_bytes": original.memory.peak_bytes if original.memory else None,
            "kernel_peak_bytes": kernel.memory.peak_bytes if kernel.memory else None,
        }
    return {
        "sizes": case.sizes,
        "note": case.note,
        "number": case.number,
        "modes": rows,
        "seconds": time.perf_counter() - started,
    }


# --------------------------------------------------------------------------------------------
# Report


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}" if seconds < 10 else f"{seconds * 1e3:.0f}"


def _memory(original: int | None, kernel: int | None) -> tuple[str, str, str]:
    if original is None or kernel is None:
        return "-", "-", "-"
    change = "-" if original == 0 else f"{(kernel / original - 1) * 100:+.0f}%"
    return f"{original / MiB:.1f}", f"{kernel / MiB:.1f}", change


START, END = "<!-- kernel-bench:start -->", "<!-- kernel-bench:end -->"


def write_report(path: Path, results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> None:
    """Write the measured section between the markers of ``path`` (the rest of the document is
    written by hand), or the whole file when it has no markers yet."""
    section = f"{START}\n{render(results, meta)}{END}\n"
    text = path.read_text() if path.exists() else ""
    if START in text and END in text:
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        section = head + section + ("\n" + tail if tail else "")
    path.write_text(section)


def render(results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "## Measurements",
        "",
        "Each operation as the model files write it (original) beside the `adopter.kernels` call",
        "(kernel), at the sizes of issue 14, float32, one torch thread. *train*: forward, backward",
        "and an SGD step with every input gradient (the operation's inputs are parameters);",
        "*inference*: forward under `no_grad`. Time: median of interleaved rounds; speedup =",
        "original / kernel with a 95% paired-bootstrap interval. Memory: peak of one step's live",
        "tensors above the level before the step (profiler allocation events): activations kept",
        "for backward, gradients, temporaries.",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Machine: {meta['machine']}; torch {meta['torch']}. Load average (1 min) before / after",
        f"the run: {meta['load_before']:.1f} / {meta['load_after']:.1f} on {meta['cores']} cores"
        + (
            " - the machine was shared with other jobs, so times carry that noise (the"
            " interleaving puts it on both sides of each ratio)."
            if max(meta["load_before"], meta["load_after"]) > 1.5
            else "."
        ),
        f"Rounds: {meta['repeats']} timed after {meta['warmup']} warm-up per variant and mode.",
        "",
        "| operation | sizes | mode | original ms | kernel ms | speedup [95% CI] |"
        " original peak MiB | kernel peak MiB | memory |",
        "|---|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for name, result in results.items():
        for mode, row in result["modes"].items():
            if "error" in row:
                lines.append(f"| {name} | {result['sizes']} | {mode} | error: {row['error']} |||||")
                continue
            low, high = row["ci"]
            mem = _memory(row["original_peak_bytes"], row["kernel_peak_bytes"])
            lines.append(
                f"| `{name}` | {result['sizes']} | {mode} | {_ms(row['original_s'])} |"
                f" {_ms(row['kernel_s'])} | {row['speedup']:.2f}x [{low:.2f}, {high:.2f}] |"
                f" {mem[0]} | {mem[1]} | {mem[2]} |"
            )
    lines += ["", "What each kernel changes:", ""]
    for name, result in results.items():
        if result.get("note"):
            lines.append(f"* `{name}`: {result['note']}.")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--large-repeats",
        type=int,
        default=5,
        help="rounds for the vocab-128,256 case (one training step takes seconds)",
    )
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "kernels.md")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw figures")
    parser.add_argument(
        "--render", type=Path, default=None, help="only render the report from a --json file"
    )
    args = parser.parse_args(argv)
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        write_report(args.output, saved["results"], saved["meta"])
        print(f"wrote {args.output}")
        return 0

    load_before = os.getloadavg()[0]
    results = {}
    for name in args.cases:
        repeats = args.large_repeats if name.endswith("128k") else args.repeats
        print(f"{name} ...", flush=True)
        results[name] = run_case(CASES[name], repeats, args.warmup)
        print(json.dumps(results[name]["modes"], indent=1), flush=True)
    command = "python benchmarks/kernel_bench.py" + (
        "" if argv is None and len(sys.argv) == 1 else " " + " ".join(sys.argv[1:])
    )
    meta = {
        "command": command,
        "machine": describe_machine(),
        "torch": torch.__version__,
        "cores": os.cpu_count(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "repeats": f"{args.repeats} ({args.large_repeats} for vocab 128,256)",
        "warmup": args.warmup,
    }
    write_report(args.output, results, meta)
    if args.json is not None:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
