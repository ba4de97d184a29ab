"""The settings of a benchmark, checked once: ``BenchOptions``.

What to build (factory, class, configuration, sizes, dropout, per-rule variants), how to
measure it (device, dtype, compile, modes, rounds, memory, threads, optimizer, seed) and where
the result goes (JSON, chart) travel together in one frozen object, checked when it is made:
a bad value fails with a clear ``ValueError`` before any model is built or timed, wherever
it came from (the command line, a benchmark script, a job sent to another machine).

The target (a model name or file) and the rules are not options: they are what is compared,
given next to the options to :func:`~adopter.bench.command.run_bench`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .measure import MODES, _as_dtype, _resolve_memory_method, check_optimizer, check_rounds

__all__ = ["DROPOUT_MODES", "BenchOptions"]

DROPOUT_MODES = ("config", "no-attention", "none")
"""How the training step treats dropout.

``config``: as configured. ``no-attention``: attention-probability dropout set to 0 (the
fused-attention kernels then take their fast path in training too; other dropout stays). Where
a configuration has no separate attention-dropout setting (T5's ``dropout_rate`` covers every
dropout) that shared rate is set to 0. ``none``: every dropout probability set to 0, drop path
and LayerDrop included (the names :data:`adopter.models.config_names.DROPOUT_NAME` matches):
a step that skips a random set of layers does a different amount of work in every variant.
"""


@dataclass(frozen=True)
class BenchOptions:
    """How to benchmark a target.

    What to build:
        factory: ``module:function`` or ``file.py:function`` returning ``(model, inputs)``
            for plain ``nn.Module`` code. Without ``patched_factory`` the function's own module
            source is rewritten and the function is called from the patched copy; with it,
            the two factories are compared as given (no per-rule variants).
        patched_factory: the rewritten model's factory, same form.
        model_class: transformers class to build (default: the base model, ``BertModel``).
        config_overrides: configuration values to set (``{"hidden_size": 256}``; dotted keys
            reach sub-configurations: ``text_config.hidden_size``).
        batch_size, seq_len, image_size, decoder_seq_len: input sizes for transformers
            targets (decoder length defaults to ``seq_len``; a multimodal text tower gets at
            most its own context length).
        layers: layer count of every stack (``None``: the default depth); widths stay default.
        dropout: ``config``, ``no-attention`` or ``none`` (see :data:`DROPOUT_MODES`).
        full_size: keep the library's full width (default: narrowed, see ``bench_config``).
        ablation: add one variant per rule that patches something alone (``paper.5 only``).

    How to measure (see :func:`~adopter.bench.measure.benchmark_variants`):
        device, dtype, compile, modes, warmup, repeats, threads, optimizer, seed.
        memory: ``None``, ``auto``, ``rss``, ``profiler`` or ``cuda``.
        memory_modes, memory_variants: with RSS probing (``auto`` on CPU), only these modes /
            variants (the baseline always) are probed; other methods measure everything.

    Where the result goes:
        plot_path, json_out: also write a PNG chart / the JSON result here.
    """

    factory: str | None = None
    patched_factory: str | None = None
    model_class: str | None = None
    config_overrides: Mapping[str, Any] = field(default_factory=dict)
    batch_size: int = 2
    seq_len: int = 128
    image_size: int = 224
    decoder_seq_len: int | None = None
    layers: int | None = 2
    dropout: str = "config"
    full_size: bool = False
    ablation: bool = False

    device: str = "cpu"
    dtype: str = "float32"
    compile: bool = False
    modes: Sequence[str] = MODES
    warmup: int = 2
    repeats: int = 10
    memory: str | None = None
    memory_modes: Sequence[str] | None = None
    memory_variants: Sequence[str] | None = None
    threads: int | None = None
    optimizer: str = "adamw"
    seed: int = 0

    plot_path: str | Path | None = None
    json_out: str | Path | None = None

    def __post_init__(self) -> None:
        self._check_sizes()
        if self.dropout not in DROPOUT_MODES:
            raise ValueError(
                f"unknown dropout mode {self.dropout!r} (use {', '.join(DROPOUT_MODES)})"
            )
        modes = check_rounds(self.modes, warmup=self.warmup, repeats=self.repeats)
        if self.memory_modes is not None:
            object.__setattr__(self, "memory_modes", check_rounds(self.memory_modes, **_ONCE))
        if self.memory_variants is not None:
            object.__setattr__(self, "memory_variants", tuple(self.memory_variants))
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"unknown device {self.device!r}: {exc}") from None
        _as_dtype(self.dtype)
        _resolve_memory_method(self.memory, device)
        check_optimizer(self.optimizer)
        object.__setattr__(self, "modes", modes)
        # A copy: a caller's dict changed later must not change what this run measures.
        object.__setattr__(self, "config_overrides", dict(self.config_overrides or {}))

    def _check_sizes(self) -> None:
        for name in ("batch_size", "seq_len", "image_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("decoder_seq_len", "layers", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or None), got {value}")

    def measurement(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~adopter.bench.measure.benchmark_variants` that
        these options set (``memory`` and ``compile`` are the caller's: a run may probe memory
        apart, and a plan may compile some variants only)."""
        return {
            "modes": self.modes,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "device": self.device,
            "dtype": self.dtype,
            "threads": self.threads,
            "optimizer": self.optimizer,
            "seed": self.seed,
        }


_ONCE = {"warmup": 0, "repeats": 1}
"""Round counts that always pass: ``memory_modes`` are checked as modes only."""
