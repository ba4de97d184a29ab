"""Backends behind the kernels: each call of an op that has alternatives goes to one of them.

An op (``linear_cross_entropy``, ``rms_norm``, ``add_rms_norm``, ``attention``; :data:`OPS`) is
computed by several implementations - the PyTorch core op (``torch``), Liger-Kernel's Triton kernels
(``liger``, when ``liger_kernel`` is installed and the tensors are on CUDA), flash-attn
(``flash_attn``, CUDA), Adopter's own (``adopter``) - each a :class:`Backend` that says which
calls it accepts (device, dtype, options, shapes) and reproduces the original computation for
those. The module of each op defines its backends next to its code (``BACKENDS``); this
module only lists the ops (:data:`OPS`, the one list) and chooses.

Choosing (:func:`choose`): the backends are tried in an order of preference and the first that
is installed and accepts the call runs; what none accepts runs the original computation (the
op's reference). The order comes from, first to last:

* :func:`prefer` (a context manager, for tests and ``adopter bench --backends``) and the
  environment variable ``ADOPTER_BACKENDS`` (``rms_norm=torch,linear_cross_entropy=adopter``);
* the measured table of this machine (:func:`table_path`), written by ``adopter bench
  --backends``: per op, per ``device/dtype/mode/shape bucket``, the backend that measured
  fastest; the mode is ``train`` when autograd is recording (``torch.is_grad_enabled()``) and
  ``inference`` otherwise, because a backend that wins the forward alone may lose the step with
  its backward (and the other way round);
* the op's safe default (:attr:`Op.default`: correctness first, the maintained op where it is
  known to be at least as good as ours, per device).

Under ``torch.compile`` only backends with ``compiles=True`` are considered (their code is
captured whole, or they are a registered ``torch.library`` op that Inductor treats as opaque);
under ``torch.jit`` / ``torch.fx`` tracing the kernels run the original before dispatching.

The backend that ran is recorded per thread (:func:`recording`), so that ``adopter verify``
can name it in each verdict.

The table is read once per process (:func:`reload_table` reads it again). It lives at
``$ADOPTER_BACKENDS_TABLE`` when that is set, else
``$XDG_CACHE_HOME/adopter/backends-<machine key>.json`` (``~/.cache`` without XDG), the key
naming the CPU model, the torch version and the accelerator (:func:`machine_key`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ._backend import _has_module

__all__ = [
    "OPS",
    "Backend",
    "Op",
    "backends",
    "choose",
    "machine_key",
    "op",
    "prefer",
    "recording",
    "reload_table",
    "run",
    "table_path",
]

TABLE_ENV = "ADOPTER_BACKENDS_TABLE"
PREFER_ENV = "ADOPTER_BACKENDS"
TABLE_VERSION = 2  # 2: keys carry the mode (train / inference)
ORIGINAL = "original"  # the name under which a table or preference asks for the original


@dataclass(frozen=True)
class Backend:
    """One implementation of an op.

    ``accepts(call)`` is true for the calls whose original computation ``run(call)``
    reproduces (to float rounding); it must be cheap and must not look at the data when
    ``torch.compiler.is_compiling()``. ``requires`` names the package it needs (looked up
    with ``find_spec``, imported only by ``run``); ``devices`` the device types it runs on.
    """

    name: str
    accepts: Callable[[Any], bool]
    run: Callable[[Any], Any]
    devices: frozenset[str] = frozenset({"cpu", "cuda"})
    requires: str | None = None
    compiles: bool = False  # Dynamo captures it with fullgraph=True (no graph break)
    summary: str = ""

    def installed(self) -> bool:
        return self.requires is None or _has_module(self.requires)

    def runs_on(self, device: str) -> bool:
        """Whether it can run here on a device of type ``device``: made for it, installed."""
        return device in self.devices and self.installed()


@dataclass(frozen=True)
class Op:
    """An op with backends: the kernels that dispatch it, the module defining its
    ``BACKENDS``, and the safe default order per device type (``"*"``: any other), which a
    ``"device/mode"`` entry overrides for one mode (``"cpu/inference"``)."""

    name: str
    module: str
    kernels: tuple[str, ...]
    default: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The shape bucket of a call: the measured table keeps one winner per bucket.
    bucket: str = "bucket"  # the name of the module's function computing it

    def default_order(self, device: str, mode: str = "train") -> tuple[str, ...]:
        """The safe default order of backends on a device of type ``device`` in ``mode``."""
        for key in (f"{device}/{mode}", device, "*"):
            if key in self.default:
                return self.default[key]
        return ()


OPS: tuple[Op, ...] = (
    Op(
        "linear_cross_entropy",
        "cross_entropy",
        ("linear_cross_entropy", "causal_lm_loss"),
        # CPU: ours measured fastest in a training step, and under torch.compile (where it
        # runs as a torch.library op) it holds a third of torch's chunked op's memory at vocab
        # 128k (docs/training-memory.md). Without autograd, torch's op measured 1.01-1.02x ours
        # with half the memory (it keeps no gradient buffers; docs/kernels.md). CUDA: ours
        # measured 0.82x of the unfused loss on an H200; Liger is the reference there.
        {
            "cpu": ("adopter", "torch"),
            "cpu/inference": ("torch", "adopter"),
            "cuda": ("liger", "torch", "adopter"),
        },
    ),
    Op(
        "rms_norm",
        "rms_norm",
        ("rms_norm",),
        # ours keeps one float per row for backward (the core op keeps what autograd keeps)
        # and has Triton kernels on CUDA (1.90x on an H200).
        {"*": ("adopter", "torch", "liger")},
    ),
    Op(
        "add_rms_norm",
        "add_rms_norm",
        ("add_rms_norm",),
        # ours keeps the sum and one float per row; Liger's is one pass over both on CUDA but
        # has not been measured here, so it is not preferred until a table says so.
        {"*": ("adopter", "torch", "liger")},
    ),
    Op(
        "attention",
        "attention_function",
        ("attention_function", "scaled_attention"),
        {"cuda": ("flash_attn", "torch"), "*": ("torch",)},
    ),
)


def op(name: str) -> Op:
    for candidate in OPS:
        if candidate.name == name:
            return candidate
    raise KeyError(f"no op {name!r} with backends; known: {', '.join(o.name for o in OPS)}")


def _module(o: Op) -> Any:
    return importlib.import_module(f"{__package__}.{o.module}")


def backends(name: str) -> tuple[Backend, ...]:
    """The backends of op ``name`` (installed or not), as its module defines them."""
    return tuple(_module(op(name)).BACKENDS)


def bucket(name: str, call: Any) -> str:
    """The shape bucket of ``call`` for op ``name`` (the table's key below device/dtype)."""
    o = op(name)
    return str(getattr(_module(o), o.bucket)(call))


def pow2(n: int) -> int:
    """``n`` rounded up to a power of two (shape buckets)."""
    return 1 << max(int(n) - 1, 0).bit_length()


# --------------------------------------------------------------------------------------------
# The measured table


def cpu_model() -> str:
    """This machine's CPU model, as ``/proc/cpuinfo`` names it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def _accelerator() -> str:
    """The GPU model, read from the driver's files: asking CUDA would initialise it when
    ``adopter.kernels`` is imported."""
    if not torch.cuda.is_available():
        return "cpu"
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.lower().startswith("model:"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            continue
    return "cuda"


@functools.cache
def _machine() -> tuple[tuple[str, str], ...]:
    return (("cpu", cpu_model()), ("torch", torch.__version__), ("device", _accelerator()))


def machine_description() -> dict[str, str]:
    """The machine a measured table belongs to (read once per process: it does not change)."""
    return dict(_machine())


def machine_key() -> str:
    """A file-name-safe key for this CPU model, torch version and accelerator."""
    described = machine_description()
    readable = re.sub(r"[^A-Za-z0-9]+", "-", f"{described['cpu']}-{described['device']}")
    digest = hashlib.sha1(json.dumps(described, sort_keys=True).encode()).hexdigest()[:10]
    return f"{readable.strip('-')[:48]}-torch{torch.__version__.split('+')[0]}-{digest}"


def table_path() -> Path:
    override = os.environ.get(TABLE_ENV)
    if override:
        return Path(override)
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "adopter" / f"backends-{machine_key()}.json"


def _read_table() -> dict[str, dict[str, str]]:
    """``{op: {"device/dtype/mode/bucket": backend}}`` from the table file; empty when it is
    missing, unreadable, of another version or written on another machine."""
    path = table_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != TABLE_VERSION:
        return {}
    if os.environ.get(TABLE_ENV) is None and data.get("machine") != machine_description():
        return {}
    winners = data.get("winners")
    if not isinstance(winners, dict):
        return {}
    return {
        str(o): {str(k): str(v) for k, v in per.items()}
        for o, per in winners.items()
        if isinstance(per, dict)
    }


def _read_environment() -> dict[str, str]:
    forced = {}
    for item in os.environ.get(PREFER_ENV, "").split(","):
        name, _, backend = item.partition("=")
        if backend.strip():
            forced[name.strip()] = backend.strip()
    return forced


# Read once, when this module is imported (plain dicts: under Dynamo a dispatch only reads them,
# as constants it guards on; a file read there would break the graph).
_STATE: dict[str, Any] = {"table": {}, "environment": {}, "forced": {}}


def _table() -> dict[str, dict[str, str]]:
    return _STATE["table"]


def current_table() -> dict[str, dict[str, str]]:
    """The winners read from the table (a copy)."""
    return {o: dict(per) for o, per in _table().items()}


def reload_table() -> None:
    """Read the table file and ``ADOPTER_BACKENDS`` again (the next dispatch uses them)."""
    _STATE["table"] = _read_table()
    _STATE["environment"] = _read_environment()


def call_mode() -> str:
    """The table's mode of a call made now: ``train`` while autograd records, else
    ``inference`` (``torch.no_grad()`` / ``torch.inference_mode()``)."""
    return "train" if torch.is_grad_enabled() else "inference"


def table_key(device: str, dtype: torch.dtype, mode: str, shape_bucket: str) -> str:
    return f"{device}/{str(dtype).removeprefix('torch.')}/{mode}/{shape_bucket}"


def write_table(winners: dict[str, dict[str, str]], measurements: list[Any], path: Path) -> None:
    """Write the measured winners (and what they were chosen from) for this machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "version": TABLE_VERSION,
        "machine": machine_description(),
        "winners": winners,
        "measurements": measurements,
    }
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    temporary.replace(path)
    reload_table()


# --------------------------------------------------------------------------------------------
# Choosing


_local = threading.local()


@contextlib.contextmanager
def prefer(name: str, backend: str) -> Iterator[None]:
    """Try ``backend`` first for op ``name`` while the block runs (every thread: the
    preference must also hold inside a compiled graph, which cannot read thread state)."""
    op(name)
    forced = _STATE["forced"]
    saved = forced.get(name)
    forced[name] = backend
    try:
        yield
    finally:
        if saved is None:
            forced.pop(name, None)
        else:
            forced[name] = saved


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[str, str]]]:
    """Collect ``(op, backend)`` for every eager dispatch in this thread while the block runs
    (``"original"`` when none accepted the call)."""
    outer = getattr(_local, "log", None)
    log: list[tuple[str, str]] = []
    _local.log = log
    try:
        yield log
    finally:
        _local.log = outer
        if outer is not None:
            outer.extend(log)


def _order(o: Op, device: str, dtype: torch.dtype, shape_bucket: Callable[[], str]) -> list[str]:
    table = _table()
    order: list[str] = []
    for forced in (_STATE["forced"].get(o.name), _STATE["environment"].get(o.name)):
        if forced:
            order.append(forced)
    mode = call_mode()
    measured = table.get(o.name, {})
    if measured:  # the bucket and keys cost a little on every call: only for a table
        for bucket_key in (shape_bucket(), "*"):
            key = table_key(device, dtype, mode, bucket_key)
            if key in measured:
                order.append(measured[key])
    order.extend(o.default_order(device, mode))
    return order


_OPS = {o.name: o for o in OPS}


def choose(
    name: str,
    offered: tuple[Backend, ...],
    bucket_of: Callable[[Any], str],
    call: Any,
    device: str,
    dtype: torch.dtype,
) -> Backend | None:
    """The backend of ``offered`` (op ``name``'s) to run ``call`` on, or ``None``: the
    original computation; ``bucket_of(call)`` is the call's shape bucket, computed only where
    a measured table has entries for the op. Under Dynamo the order is fixed at trace time
    (Dynamo guards on the table's dicts) and only backends that compile are considered."""
    compiling = torch.compiler.is_compiling()
    for backend_name in _order(_OPS[name], device, dtype, lambda: bucket_of(call)):
        if backend_name == ORIGINAL:
            return None  # measured faster than every backend here
        for backend in offered:
            if backend.name != backend_name or (compiling and not backend.compiles):
                continue
            if backend.runs_on(device) and backend.accepts(call):
                return backend
    return None


def note(name: str, backend: str) -> None:
    """Record that op ``name`` ran on ``backend`` (for :func:`recording`)."""
    if torch.compiler.is_compiling():
        return
    log = getattr(_local, "log", None)
    if log is not None:
        log.append((name, backend))


def run(
    name: str,
    offered: tuple[Backend, ...],
    bucket_of: Callable[[Any], str],
    call: Any,
    device: str,
    dtype: torch.dtype,
    original: Callable[[], Any],
) -> Any:
    """Run ``call`` of op ``name`` on the chosen backend, or ``original()`` when none fits."""
    backend = choose(name, offered, bucket_of, call, device, dtype)
    if backend is None:
        note(name, ORIGINAL)
        return original()
    note(name, backend.name)
    return backend.run(call)


def available(name: str, device: str) -> list[str]:
    """The backends of op ``name`` that are installed and run on ``device`` (a type)."""
    return [b.name for b in backends(name) if b.runs_on(device)]


reload_table()
