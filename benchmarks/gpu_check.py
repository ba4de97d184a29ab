"""Check and time the modern kernels on a CUDA GPU (the Triton paths and the SDPA / chunked ones).

1. Correctness: every kernel on CUDA against the original composite code - outputs and input /
   parameter gradients, float32 and bfloat16, with the tolerances of the unit tests
   (``tests/kernels/conftest.py``) - and, for the Triton paths, against the same kernel with
   Triton switched off (``ADOPTER_KERNELS_TRITON=0``). It also asserts that the Triton kernels
   ran and none failed.
2. Timing: forward+backward of the original and the kernel at GPU-sized shapes (CUDA events,
   medians of interleaved runs) and the peak CUDA memory of one step.

    python benchmarks/gpu_check.py                # prints a table, writes $OUT/gpu_check.json
    python benchmarks/gpu_check.py --quick        # correctness only

Exits 1 when a check fails. Takes a few minutes on one H200.
"""

# ruff: noqa: B023 - every check's lambdas are called within their own loop iteration

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from adopter import kernels  # noqa: E402
from adopter.kernels import _triton_modern  # noqa: E402
from adopter.kernels.attention_function import attention_function_reference  # noqa: E402
from adopter.kernels.cross_entropy import causal_lm_loss_reference  # noqa: E402
from adopter.kernels.rms_norm import rms_norm_reference  # noqa: E402
from adopter.kernels.rotary import apply_rotary_complex_reference, rotary_reference  # noqa: E402
from tests.kernels.conftest import assert_same_function  # noqa: E402

DEVICE = torch.device("cuda")
TRITON_CALLS: list[str] = []


def _spy_on_triton() -> None:
    for name in ("rms_forward", "rms_backward", "gate_forward", "gate_backward", "rotary"):
        original = getattr(_triton_modern, name)

        def spy(*args: Any, _original: Any = original, _name: str = name, **kw: Any) -> Any:
            TRITON_CALLS.append(_name)
            return _original(*args, **kw)

        setattr(_triton_modern, name, spy)


class _TritonOff:
    def __enter__(self) -> None:
        self.saved = os.environ.get("ADOPTER_KERNELS_TRITON")
        os.environ["ADOPTER_KERNELS_TRITON"] = "0"

    def __exit__(self, *exc: object) -> None:
        if self.saved is None:
            os.environ.pop("ADOPTER_KERNELS_TRITON", None)
        else:
            os.environ["ADOPTER_KERNELS_TRITON"] = self.saved


def _check(
    name: str,
    kernel: Callable[..., Any],
    original: Callable[..., Any],
    inputs: list[torch.Tensor | None],
    results: list[dict[str, Any]],
    scale: float = 4.0,
    triton: bool = False,
) -> None:
    entry: dict[str, Any] = {"check": name}
    try:
        before = len(TRITON_CALLS)
        assert_same_function(kernel, original, inputs, scale=scale)
        if triton:
            assert len(TRITON_CALLS) > before, "the Triton kernels did not run"
            with _TritonOff():
                assert_same_function(kernel, original, inputs, scale=scale)
        entry["ok"] = True
    except Exception as exc:  # reported, not raised: every check runs
        entry["ok"] = False
        entry["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    results.append(entry)
    print(
        ("PASS " if entry["ok"] else "FAIL ")
        + name
        + ("" if entry["ok"] else f"  {entry['error']}")
    )


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(dtype)


def correctness() -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []

    def check(*args: Any, **options: Any) -> None:
        _check(*args, results=results, **options)

    for dtype in (torch.float32, torch.bfloat16):
        tag = str(dtype).removeprefix("torch.")
        for cast, offset in (("before_weight", 0.0), ("after_weight", 1.0), ("weight_dtype", 0.0)):
            x, w = _randn(4, 256, 1024, dtype=dtype), _randn(1024, dtype=dtype)
            check(
                f"rms_norm {cast} {tag}",
                lambda x, w, c=cast, o=offset: kernels.rms_norm(x, w, 1e-6, offset=o, cast=c),
                lambda x, w, c=cast, o=offset: rms_norm_reference(x, w, 1e-6, offset=o, cast=c),
                [x, w],
                triton=cast != "weight_dtype",
            )
        for act in (nn.SiLU(), nn.GELU(approximate="tanh"), nn.GELU(), nn.ReLU()):
            torch.manual_seed(0)
            gate = nn.Linear(512, 1376, bias=False).to(DEVICE, dtype)
            up = nn.Linear(512, 1376, bias=False).to(DEVICE, dtype)
            down = nn.Linear(1376, 512, bias=False).to(DEVICE, dtype)
            check(
                f"gated_mlp {act} {tag}",
                lambda x, a=act, g=gate, u=up, d=down: kernels.gated_mlp(x, g, u, d, a),
                lambda x, a=act, g=gate, u=up, d=down: d(copy.deepcopy(a)(g(x)) * u(x)),
                [_randn(2, 128, 512, dtype=dtype)],
                triton=True,
            )
        q, k = _randn(2, 16, 256, 128, dtype=dtype), _randn(2, 4, 256, 128, dtype=dtype)
        for interleaved, width, upcast in (
            (False, 128, False),
            (True, 128, True),
            (False, 64, False),
        ):
            cos, sin = _randn(2, 256, width, dtype=dtype), _randn(2, 256, width, dtype=dtype)
            options = {"interleaved": interleaved, "upcast": upcast, "partial": width < 128}
            check(
                f"apply_rotary {options} {tag}",
                lambda q, k, c=cos, s=sin, o=options: kernels.apply_rotary(q, k, c, s, **o),
                lambda q, k, c=cos, s=sin, o=options: tuple(
                    rotary_reference(t, c.unsqueeze(1), s.unsqueeze(1), **o) for t in (q, k)
                ),
                [q, k],
                triton=True,
            )
        angles = torch.randn(2, 256, 1, 64, device=DEVICE)
        freqs = torch.polar(torch.ones_like(angles), angles)
        qq, kk = _randn(2, 256, 16, 128, dtype=dtype), _randn(2, 256, 4, 128, dtype=dtype)
        check(
            f"apply_rotary_complex {tag}",
            lambda q, k: kernels.apply_rotary_complex(q, k, freqs),
            lambda q, k: apply_rotary_complex_reference(q, k, freqs),
            [qq, kk],
            triton=True,
        )
        module = nn.Module()
        module.num_key_value_groups = 4
        mask = torch.full((256, 256), torch.finfo(dtype).min, device=DEVICE).triu(1).to(dtype)
        mask = mask[None, None].expand(2, 1, -1, -1)
        v = _randn(2, 4, 256, 128, dtype=dtype)
        check(
            f"attention_function {tag}",
            lambda q, k, v: kernels.attention_function(module, q, k, v, mask, 0.088)[0],
            lambda q, k, v: attention_function_reference(module, q, k, v, mask, 0.088)[0],
            [q, k, v],
            scale=8,
        )
        torch.manual_seed(0)
        lm_head = nn.Linear(512, 32000, bias=False).to(DEVICE, dtype)
        labels = torch.randint(0, 32000, (2, 256), device=DEVICE)
        labels[:, :10] = -100
        check(
            f"causal_lm_loss {tag}",
            lambda h: kernels.causal_lm_loss(h, lm_head, labels, 32000),
            lambda h: causal_lm_loss_reference(h, lm_head, labels, 32000),
            [_randn(2, 256, 512, dtype=dtype)],
            scale=50 if dtype == torch.bfloat16 else 4,
        )
    norm = nn.GroupNorm(32, 320).to(DEVICE).eval()
    with torch.no_grad():
        x = _randn(2, 320, 32, 32)
        ok = torch.equal(kernels.group_norm_activation(x, norm, nn.SiLU()), F.silu(norm(x)))
        results.append({"check": "group_norm_activation inference", "ok": ok})
        conv = nn.Conv2d(64, 64, 3, padding=1, bias=False).to(DEVICE).eval()
        bn = nn.BatchNorm2d(64).to(DEVICE).eval()
        x = _randn(2, 64, 56, 56)
        # TF32 convolutions round the folded and the unfolded weights differently (1e-3):
        # the fold itself is checked in full float32.
        tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            got, want = kernels.conv_bn_act(x, conv, bn, nn.ReLU()), F.relu(bn(conv(x)))
        finally:
            torch.backends.cudnn.allow_tf32 = tf32
        ok = bool(torch.allclose(got, want, rtol=1e-4, atol=1e-4))
        difference = float((got - want).abs().max())
        results.append({"check": "conv_bn_act inference", "ok": ok, "max_abs_diff": difference})
    for entry in results[-2:]:
        print(("PASS " if entry["ok"] else "FAIL ") + entry["check"])
    results.append({"check": "no Triton failure", "ok": not _triton_modern._FAILURES})
    return results


# --------------------------------------------------------------------------------------------
# Timing


def _time(step: Callable[[], None], reps: int) -> tuple[float, int]:
    """Median milliseconds of ``step`` and the peak memory of one step above the start."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return statistics.median(times), torch.cuda.max_memory_allocated() - base


def _train_step(
    fn: Callable[..., Any], inputs: list[torch.Tensor], params: list[torch.Tensor]
) -> Callable[[], None]:
    """Forward, backward (a loss as it is, other outputs through their mean squares), and the
    gradients dropped again (inputs and ``params``)."""
    leaves = [t.detach().requires_grad_() for t in inputs]

    def step() -> None:
        out = fn(*leaves)
        outs = out if isinstance(out, tuple) else (out,)
        if len(outs) == 1 and outs[0].dim() == 0:
            outs[0].backward()
        else:
            sum(o.float().square().mean() for o in outs).backward()
        for t in [*leaves, *params]:
            t.grad = None

    return step


def timing(reps: int) -> list[dict[str, Any]]:
    bf16 = torch.bfloat16
    cases: list[tuple[str, Callable[..., Any], Callable[..., Any], list[torch.Tensor]]] = []
    w = _randn(4096, dtype=bf16).requires_grad_()
    cases.append(
        (
            "rms_norm 4x2048x4096 bf16",
            lambda x: kernels.rms_norm(x, w, 1e-6),
            lambda x: rms_norm_reference(x, w, 1e-6),
            [_randn(4, 2048, 4096, dtype=bf16)],
        )
    )
    gate = nn.Linear(4096, 11008, bias=False).to(DEVICE, bf16)
    up = nn.Linear(4096, 11008, bias=False).to(DEVICE, bf16)
    down = nn.Linear(11008, 4096, bias=False).to(DEVICE, bf16)
    act = nn.SiLU()
    cases.append(
        (
            "gated_mlp 4x2048x4096 -> 11008 bf16",
            lambda x: kernels.gated_mlp(x, gate, up, down, act),
            lambda x: down(act(gate(x)) * up(x)),
            [_randn(4, 2048, 4096, dtype=bf16)],
        )
    )
    cos, sin = _randn(4, 2048, 128, dtype=bf16), _randn(4, 2048, 128, dtype=bf16)
    cases.append(
        (
            "apply_rotary q 4x32x2048x128, k 8 heads bf16",
            lambda q, k: kernels.apply_rotary(q, k, cos, sin),
            lambda q, k: tuple(
                rotary_reference(t, cos.unsqueeze(1), sin.unsqueeze(1)) for t in (q, k)
            ),
            [_randn(4, 32, 2048, 128, dtype=bf16), _randn(4, 8, 2048, 128, dtype=bf16)],
        )
    )
    lm_head = nn.Linear(4096, 128256, bias=False).to(DEVICE, bf16)
    labels = torch.randint(0, 128256, (2, 2048), device=DEVICE)
    cases.append(
        (
            "causal_lm_loss 2x2048x4096, vocab 128256 bf16",
            lambda h: kernels.causal_lm_loss(h, lm_head, labels, 128256),
            lambda h: causal_lm_loss_reference(h, lm_head, labels, 128256),
            [_randn(2, 2048, 4096, dtype=bf16)],
        )
    )
    rows = []
    params = [w, *gate.parameters(), *up.parameters(), *down.parameters(), *lm_head.parameters()]
    for name, kernel, original, inputs in cases:
        step_o = _train_step(original, inputs, params)
        step_k = _train_step(kernel, inputs, params)
        time_o, mem_o = _time(step_o, reps)
        time_k, mem_k = _time(step_k, reps)
        time_o2, _ = _time(step_o, reps)  # the original again: drift shows as a difference
        row = {
            "case": name,
            "original_ms": min(time_o, time_o2),
            "kernel_ms": time_k,
            "speedup": min(time_o, time_o2) / time_k,
            "original_peak_mib": mem_o / 2**20,
            "kernel_peak_mib": mem_k / 2**20,
        }
        rows.append(row)
        print(
            f"{name}: original {row['original_ms']:.2f} ms, kernel {time_k:.2f} ms "
            f"({row['speedup']:.2f}x); peak {row['original_peak_mib']:.0f} -> "
            f"{row['kernel_peak_mib']:.0f} MiB"
        )
        del step_o, step_k
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="correctness only")
    parser.add_argument("--reps", type=int, default=20)
    default_out = Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None
    parser.add_argument("--output", type=Path, default=default_out)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    started = time.perf_counter()
    _spy_on_triton()
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": kernels.describe_backends("cuda").get("triton"),
        "correctness": correctness(),
    }
    if not args.quick:
        report["timing"] = timing(args.reps)
    report["seconds"] = time.perf_counter() - started
    report["triton_calls"] = sorted(set(TRITON_CALLS))
    failed = [c["check"] for c in report["correctness"] if not c["ok"]]
    report["failed"] = failed
    print(json.dumps({k: v for k, v in report.items() if k != "correctness"}, indent=1))
    print(f"{len(report['correctness']) - len(failed)} checks passed, {len(failed)} failed")
    if args.output is not None:
        args.output.write_text(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
