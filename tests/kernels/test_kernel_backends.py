"""The backends behind the kernel ops (``adopter.kernels.backends``).

* Every op's backends are listed once (its module's ``BACKENDS``), its kernels are kernels of
  the registry, and its default orders name backends that exist.
* Every backend that is installed and runs on this machine's devices reproduces the original
  computation on the calls it accepts - values and gradients, on random inputs (hypothesis
  draws the sizes and options). A backend that is not installed (liger, flash-attn) or needs
  CUDA is skipped with the reason; one that is present is tested.
* The choice: a preference, the environment, the measured table (its machine key, an
  ``original`` winner), the safe defaults, and the record of which backend ran.
* Under ``torch.compile(fullgraph=True)`` each op compiles and gives eager's results, and the
  loss runs torch's chunked op there (the memory saving kept in the compiled graph).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo as dynamo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adopter.kernels as kernels
from adopter.kernels import backends, registry
from adopter.kernels.attention_function import AttentionCall
from adopter.kernels.cross_entropy import LossCall, linear_cross_entropy_reference
from adopter.kernels.rms_norm import NormCall, rms_norm_reference
from tests.kernels.conftest import assert_close

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
ALL_BACKENDS = [(o.name, b.name) for o in backends.OPS for b in backends.backends(o.name)]


@pytest.fixture(autouse=True)
def no_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts from the safe defaults (no table of the user's is read)."""
    monkeypatch.setenv(backends.TABLE_ENV, str(tmp_path / "none.json"))
    monkeypatch.delenv(backends.PREFER_ENV, raising=False)
    backends.reload_table()
    yield
    monkeypatch.undo()
    backends.reload_table()


def _backend(op_name: str, name: str, device: str) -> backends.Backend:
    backend = next(b for b in backends.backends(op_name) if b.name == name)
    if not backend.installed():
        pytest.skip(f"{name} is not installed ({backend.requires})")
    if device not in backend.devices:
        pytest.skip(f"{name} does not run on {device}")
    return backend


# --------------------------------------------------------------------------------------------
# The lists


def test_ops_name_registry_kernels_and_known_backends() -> None:
    kernel_names = set(registry.names(registry.Role.KERNEL))
    for o in backends.OPS:
        assert set(o.kernels) <= kernel_names, o
        names = [b.name for b in backends.backends(o.name)]
        assert len(names) == len(set(names)), names
        for order in o.default.values():
            assert set(order) <= set(names), (o.name, order)
        assert backends.ORIGINAL not in names  # the original is the fallback, not a backend


def test_backends_needing_a_package_say_which() -> None:
    for o in backends.OPS:
        for b in backends.backends(o.name):
            if b.name in ("liger", "flash_attn"):
                assert b.requires in ("liger_kernel", "flash_attn")
                assert b.devices == frozenset({"cuda"})
                assert not b.compiles


# --------------------------------------------------------------------------------------------
# Each backend against the original computation


def _grads(fn: Any, inputs: list[torch.Tensor | None]) -> tuple[torch.Tensor, list[Any]]:
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(torch.randn_like(out, generator=torch.Generator().manual_seed(7)))
    return out.detach(), [None if t is None else t.grad for t in leaves]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [n for o, n in ALL_BACKENDS if o == "linear_cross_entropy"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tokens=st.integers(1, 40),
    vocab=st.integers(2, 70),
    width=st.integers(1, 24),
    ignored=st.sampled_from([0.0, 0.3, 1.0]),
    reduction=st.sampled_from(["mean", "sum"]),
    with_bias=st.booleans(),
    divisor=st.sampled_from([None, 3.0]),
    softcap=st.sampled_from([None, 5.0]),
    chunk=st.sampled_from([None, 1, 7]),
    seed=st.integers(0, 2**16),
)
def test_loss_backend_reproduces_the_original(
    device: str,
    name: str,
    tokens: int,
    vocab: int,
    width: int,
    ignored: float,
    reduction: str,
    with_bias: bool,
    divisor: float | None,
    softcap: float | None,
    chunk: int | None,
    seed: int,
) -> None:
    backend = _backend("linear_cross_entropy", name, device)
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, width, generator=g).to(device)
    weight = torch.randn(vocab, width, generator=g).to(device)
    bias = torch.randn(vocab, generator=g).to(device) if with_bias else None
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    targets[torch.rand(tokens, generator=g) < ignored] = -100
    targets = targets.to(device)
    divisor = divisor if reduction == "sum" else None
    options = {"reduction": reduction, "softcap": softcap}

    def make(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> LossCall:
        return LossCall(h, w, b, targets, -100, reduction, divisor, softcap, chunk, None, None)

    if not backend.accepts(make(hidden, weight, bias)):
        return  # handed on to the next backend: nothing to compare
    want, want_grads = _grads(
        lambda h, w, b: linear_cross_entropy_reference(
            h, w, b, targets, divisor=divisor, **options
        ),
        [hidden, weight, bias],
    )
    got, got_grads = _grads(lambda h, w, b: backend.run(make(h, w, b)), [hidden, weight, bias])
    assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_close(a, b)


def test_torch_loss_backend_takes_float32_and_no_softcap_only() -> None:
    backend = _backend("linear_cross_entropy", "torch", "cpu")
    h, w, t = torch.randn(4, 3), torch.randn(5, 3), torch.tensor([0, 1, 2, 3])
    plain = LossCall(h, w, None, t, -100, "mean", None, None, None, None, None)
    assert backend.accepts(plain)
    half = LossCall(h.bfloat16(), w.bfloat16(), None, t, -100, "mean", None, None, None, None, None)
    assert not backend.accepts(half)  # the original rounds the logits to bf16 first
    capped = LossCall(h, w, None, t, -100, "mean", None, 30.0, None, None, None)
    assert not backend.accepts(capped)
    scaled = LossCall(h, w, None, t, -100, "mean", None, None, None, 0.5, None)
    assert not backend.accepts(scaled)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [n for o, n in ALL_BACKENDS if o == "rms_norm"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.sampled_from([(3, 8), (2, 5, 16), (1, 1, 33)]),
    cast=st.sampled_from(["before_weight", "after_weight", "weight_dtype"]),
    offset=st.sampled_from([0.0, 1.0]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    with_weight=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rms_norm_backend_reproduces_the_original(
    device: str,
    name: str,
    shape: tuple[int, ...],
    cast: str,
    offset: float,
    dtype: torch.dtype,
    with_weight: bool,
    seed: int,
) -> None:
    backend = _backend("rms_norm", name, device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(device, dtype)
    weight = torch.randn(shape[-1], generator=g).to(device, dtype) if with_weight else None
    if not backend.accepts(NormCall(x, weight, 1e-6, offset, cast, False)):
        return
    options = {"offset": offset, "cast": cast}
    want, want_grads = _grads(lambda a, w: rms_norm_reference(a, w, 1e-6, **options), [x, weight])
    got, got_grads = _grads(
        lambda a, w: backend.run(NormCall(a, w, 1e-6, offset, cast, False)), [x, weight]
    )
    assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_close(a, b, scale=4.0)  # reductions over the row and the batch reordered


def test_torch_rms_norm_backend_takes_float32_only() -> None:
    backend = _backend("rms_norm", "torch", "cpu")
    x, w = torch.randn(2, 8), torch.randn(8)
    assert backend.accepts(NormCall(x, w, 1e-6, 0.0, "before_weight", False))
    assert backend.accepts(NormCall(x, None, 1e-6, 0.0, "weight_dtype", False))
    bf = x.bfloat16()
    assert not backend.accepts(NormCall(bf, w.bfloat16(), 1e-6, 0.0, "before_weight", False))


def _attention_original(call: AttentionCall) -> torch.Tensor:
    k = call.key.repeat_interleave(call.groups, dim=1)
    v = call.value.repeat_interleave(call.groups, dim=1)
    scores = torch.matmul(call.query, k.transpose(2, 3)) * call.scale
    if call.mask is not None:
        scores = scores + call.mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(call.query.dtype)
    return torch.matmul(probs, v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [n for o, n in ALL_BACKENDS if o == "attention"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kv_heads=st.sampled_from([1, 2]),
    groups=st.sampled_from([1, 3]),
    length=st.integers(1, 9),
    head_dim=st.sampled_from([8, 16]),
    masked=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_attention_backend_reproduces_the_original(
    device: str,
    name: str,
    kv_heads: int,
    groups: int,
    length: int,
    head_dim: int,
    masked: bool,
    seed: int,
) -> None:
    backend = _backend("attention", name, device)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, kv_heads * groups, length, head_dim, generator=g).to(device)
    k = torch.randn(2, kv_heads, length, head_dim, generator=g).to(device)
    v = torch.randn(2, kv_heads, length, head_dim, generator=g).to(device)
    mask = None
    if masked:
        mask = torch.full((length, length), torch.finfo(q.dtype).min).triu(1)[None, None]
        mask = mask.to(device)
    scale = head_dim**-0.5

    def make(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> AttentionCall:
        return AttentionCall(a, b, c, mask, 0.0, scale, groups)

    if not backend.accepts(make(q, k, v)):
        return
    want, want_grads = _grads(lambda a, b, c: _attention_original(make(a, b, c)), [q, k, v])
    got, got_grads = _grads(lambda a, b, c: backend.run(make(a, b, c)), [q, k, v])
    assert_close(got, want, scale=4.0)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_close(a, b, scale=4.0)


# --------------------------------------------------------------------------------------------
# Choosing


def _loss_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(6, 4, generator=g), torch.randn(9, 4, generator=g), torch.arange(6)


def _ran(fn: Any) -> list[tuple[str, str]]:
    with backends.recording() as log:
        fn()
    return log


def test_defaults_on_cpu_and_the_record_of_what_ran() -> None:
    h, w, t = _loss_inputs()
    assert _ran(lambda: kernels.linear_cross_entropy(h, w, None, t)) == [
        ("linear_cross_entropy", "adopter")
    ]
    assert _ran(lambda: kernels.rms_norm(h, None, 1e-6)) == [("rms_norm", "adopter")]
    q = torch.randn(1, 2, 3, 8)
    module = torch.nn.Module()
    assert _ran(lambda: kernels.attention_function(module, q, q, q, None)) == [
        ("attention", "torch")
    ]
    # a tensor subclass: no dispatch, the original runs before it
    assert _ran(lambda: kernels.rms_norm(h.as_subclass(_Sub), None, 1e-6)) == []


class _Sub(torch.Tensor):
    pass


def test_prefer_and_environment_and_original(monkeypatch: pytest.MonkeyPatch) -> None:
    h, w, t = _loss_inputs()
    want = linear_cross_entropy_reference(h, w, None, t)
    with backends.prefer("linear_cross_entropy", "torch"):
        assert _ran(lambda: kernels.linear_cross_entropy(h, w, None, t))[0][1] == "torch"
    # the soft-cap is not torch's: the next backend, ours
    with backends.prefer("linear_cross_entropy", "torch"):
        log = _ran(lambda: kernels.linear_cross_entropy(h, w, None, t, softcap=3.0))
    assert log == [("linear_cross_entropy", "adopter")]
    monkeypatch.setenv(backends.PREFER_ENV, "linear_cross_entropy=original,rms_norm=torch")
    backends.reload_table()
    log = _ran(lambda: assert_close(kernels.linear_cross_entropy(h, w, None, t), want))
    assert log == [("linear_cross_entropy", "original")]
    assert _ran(lambda: kernels.rms_norm(h, None, 1e-6)) == [("rms_norm", "torch")]
    with pytest.raises(KeyError):
        with backends.prefer("no_such_op", "torch"):
            pass


def test_measured_table_is_read_and_keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h, w, t = _loss_inputs()
    call = LossCall(h, w, None, t, -100, "mean", None, None, None, None, None)
    key = backends.table_key("cpu", torch.float32, "train", kernels.cross_entropy.bucket(call))
    path = tmp_path / "table.json"
    backends.write_table({"linear_cross_entropy": {key: "torch"}}, [], path)
    monkeypatch.setenv(backends.TABLE_ENV, str(path))
    backends.reload_table()
    assert _ran(lambda: kernels.linear_cross_entropy(h, w, None, t))[0][1] == "torch"
    # the same call without autograd recording is the inference mode: no entry there, so the
    # CPU's inference default (torch's op, which keeps no gradient buffers)
    with torch.no_grad():
        assert _ran(lambda: kernels.linear_cross_entropy(h, w, None, t))[0][1] == "torch"
    inference = backends.table_key("cpu", torch.float32, "inference", "*")
    backends.write_table({"linear_cross_entropy": {inference: "adopter"}}, [], path)
    with torch.no_grad():
        assert _ran(lambda: kernels.linear_cross_entropy(h, w, None, t))[0][1] == "adopter"
    backends.write_table({"linear_cross_entropy": {}}, [], path)
    assert _ran(lambda: kernels.linear_cross_entropy(h, w, None, t))[0][1] == "adopter"
    # another bucket (a wider vocabulary): the default
    wide = torch.randn(40, 4)
    assert _ran(lambda: kernels.linear_cross_entropy(h, wide, None, t))[0][1] == "adopter"
    # a table of another version is ignored
    path.write_text(json.dumps({"version": 0, "winners": {}}), encoding="utf-8")
    backends.reload_table()
    assert backends.current_table() == {}


def test_table_of_another_machine_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(backends.TABLE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = backends.table_path()
    assert path.parent == tmp_path / "adopter" and backends.machine_key() in path.name
    backends.write_table({"rms_norm": {"cpu/float32/train/*": "torch"}}, [], path)
    assert backends.current_table() == {"rms_norm": {"cpu/float32/train/*": "torch"}}
    data = json.loads(path.read_text(encoding="utf-8"))
    data["machine"]["cpu"] = "another CPU"
    path.write_text(json.dumps(data), encoding="utf-8")
    backends.reload_table()
    assert backends.current_table() == {}


# --------------------------------------------------------------------------------------------
# Under torch.compile


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    dynamo.reset()
    yield
    dynamo.reset()


class _Head(torch.nn.Module):
    """A patched-style causal LM tail: norm, head + loss through the kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.norm_weight = torch.nn.Parameter(torch.randn(8))
        self.lm_head = torch.nn.Linear(8, 50, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = kernels.rms_norm(self.proj(x), self.norm_weight, 1e-6)
        return kernels.causal_lm_loss(h, self.lm_head, labels, 50)


class _Attend(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.num_key_value_groups = 2
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, _ = kernels.attention_function(self, self.proj(q), k, v, None, None)
        return out


def _step(model: torch.nn.Module, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[Any]]:
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    out.sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize(
    ("backend", "graph_op"),
    [("adopter", "adopter.chunked_linear_cross_entropy"), ("torch", "batch_chunked")],
)
def test_patched_head_compiles_fullgraph_like_eager_and_keeps_the_chunked_loss(
    backend: str, graph_op: str
) -> None:
    torch.manual_seed(0)
    model = _Head()
    x, labels = torch.randn(2, 5, 8), torch.randint(0, 50, (2, 5))
    labels[0, 1] = -100
    want, want_grads = _step(model, x, labels)
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    with backends.prefer("linear_cross_entropy", backend):
        got, _ = _step(torch.compile(model, backend=keep, fullgraph=True), x, labels)
        assert_close(got, want)
        targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
        assert any(graph_op in t for t in targets), targets
        dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        got, got_grads = _step(compiled, x, labels)
    assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_close(a, b)


def test_compiled_loss_runs_ours_by_default_on_a_cpu() -> None:
    # Ours as a torch.library op keeps a third of the memory torch's chunked op keeps under
    # compile at vocab 128k (docs/training-memory.md), so it leads the CPU order there too.
    o = backends.op("linear_cross_entropy")
    assert o.default_order("cpu")[0] == "adopter"
    assert _backend("linear_cross_entropy", "adopter", "cpu").compiles


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_our_loss_op_passes_torch_library_opcheck(reduction: str, with_bias: bool) -> None:
    from adopter.kernels.cross_entropy import _chunked_loss_op

    torch.manual_seed(0)
    h = torch.randn(6, 4, requires_grad=True)
    w = torch.randn(9, 4, requires_grad=True)
    b = torch.randn(9, requires_grad=True) if with_bias else None
    t = torch.randint(0, 9, (6,))
    t[2] = -100
    divisor = torch.tensor(4) if reduction == "sum" else None
    args = (h, w, b, t, -100, reduction, divisor, None, None, 3, None, None, True, True, with_bias)
    # Not opcheck's AOT test: it returns every output of the op to the caller, whereas the
    # gradient outputs are private (the kernel drops them and backward scales them in place);
    # the compiled tests here run the op as the kernel calls it, through AOTAutograd.
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(_chunked_loss_op, args, test_utils=checks)


@pytest.mark.usefixtures("fresh_dynamo")
def test_our_compiled_loss_scales_its_gradients_by_the_incoming_one() -> None:
    torch.manual_seed(0)
    h, w = torch.randn(5, 4), torch.randn(7, 4)
    t = torch.randint(0, 7, (5,))
    divisor = torch.tensor(3)

    def loss(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return kernels.linear_cross_entropy(h, w, None, t, reduction="sum", divisor=divisor) * 2.5

    want = _grads(
        lambda h, w: (
            linear_cross_entropy_reference(h, w, None, t, reduction="sum", divisor=divisor) * 2.5
        ),
        [h, w],
    )
    with backends.prefer("linear_cross_entropy", "adopter"):
        got = _grads(torch.compile(loss, backend="aot_eager", fullgraph=True), [h, w])
    assert_close(got[0], want[0])
    for a, b in zip(got[1], want[1], strict=True):
        assert_close(a, b)


@pytest.mark.usefixtures("fresh_dynamo")
def test_attention_compiles_fullgraph_like_eager() -> None:
    torch.manual_seed(0)
    model = _Attend()
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    want, want_grads = _step(model, q, k, v)
    got, got_grads = _step(torch.compile(model, backend="aot_eager", fullgraph=True), q, k, v)
    assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_close(a, b)


def test_mean_over_no_counted_token_is_nan_with_zero_gradients() -> None:
    backend = _backend("linear_cross_entropy", "torch", "cpu")
    h, w = torch.randn(3, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    t = torch.full((3,), -100)
    loss = backend.run(LossCall(h, w, None, t, -100, "mean", None, None, None, None, None))
    assert math.isnan(loss.item())
    loss.backward()
    assert not h.grad.any() and not w.grad.any()


def test_every_op_reads_its_table_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # each kernel hands the dispatcher its bucket function (add_rms_norm once passed a string,
    # which failed only where a table had an entry for the op)
    path = tmp_path / "table.json"
    wildcard = backends.table_key("cpu", torch.float32, "train", "*")
    backends.write_table({o.name: {wildcard: "original"} for o in backends.OPS}, [], path)
    monkeypatch.setenv(backends.TABLE_ENV, str(path))
    backends.reload_table()
    x, residual = torch.randn(2, 3, 8, requires_grad=True), torch.randn(2, 3, 8)
    norm = torch.nn.RMSNorm(8, eps=1e-6)
    assert _ran(lambda: kernels.add_rms_norm(x, residual, norm)) == [("add_rms_norm", "original")]
    assert _ran(lambda: kernels.rms_norm(x, norm.weight, 1e-6)) == [("rms_norm", "original")]
