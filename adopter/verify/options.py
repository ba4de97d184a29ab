"""The settings of a verify run, checked once: ``VerifyOptions``.

Everything the worker needs to know about how to check (modes, dtype, seed, heads) and what
the parent needs to run it (timeout, interpreter, memory limit) travels in this one object;
the worker receives it serialised inside each job (:class:`adopter.verify.job.WorkerJob`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["DTYPES", "MODES", "VerifyOptions"]

MODES = ("eval", "train")
DTYPES = ("float32", "float64", "float16", "bfloat16")
_GIB = 1024**3


@dataclass(frozen=True)
class VerifyOptions:
    """How to verify: ``modes`` (``eval`` and/or ``train``; ``train`` compares with every
    dropout probability at 0 and, as ``train-dropout``, with the configured dropout where the
    kernels draw random numbers like the original), ``dtype`` (tolerances follow it), ``seed``
    (weights, inputs, dropout), ``max_heads`` (head classes per file besides the base model),
    ``timeout`` (seconds per file, the worker's start-up included), ``python`` (the worker's
    interpreter; default this one), ``memory_limit`` (bytes the worker and all it started may
    hold resident) and ``sys_path`` (folders added to the worker's import path)."""

    modes: tuple[str, ...] = MODES
    dtype: str = "float32"
    seed: int = 0
    max_heads: int = 2
    timeout: float = 300
    python: str | None = None
    memory_limit: int | None = None
    sys_path: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        modes = tuple(dict.fromkeys(self.modes))
        if not modes or any(m not in MODES for m in modes):
            raise ValueError(f"modes must be a non-empty subset of {MODES}, got {self.modes}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.timeout <= 0:
            raise ValueError("timeout must be positive")
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise ValueError("memory limit must be positive")
        if self.max_heads < 0:
            raise ValueError("max_heads must not be negative")
        object.__setattr__(self, "modes", modes)
        object.__setattr__(self, "sys_path", tuple(str(p) for p in self.sys_path))
        if self.memory_limit is not None:
            object.__setattr__(self, "memory_limit", int(self.memory_limit))

    @classmethod
    def of(
        cls,
        *,
        modes: Sequence[str] = MODES,
        memory_limit_gib: float | None = None,
        **settings: Any,
    ) -> VerifyOptions:
        """Options with the memory limit given in GiB (as the command line takes it)."""
        limit = int(memory_limit_gib * _GIB) if memory_limit_gib else None
        return cls(modes=tuple(modes), memory_limit=limit, **settings)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VerifyOptions:
        return cls(**{**data, "modes": tuple(data["modes"]), "sys_path": tuple(data["sys_path"])})
