"""Every kernel traces: ``torch.fx`` and ``torch.jit.trace`` record the original computation.

Exporters, quantisers and pipeline-parallel tools consume models through ``torch.fx``
(transformers' ``symbolic_trace``) and ``torch.jit.trace``. A kernel that picks its path from
grad mode, parameter values or a data-dependent check records a different graph in every trace
(``torch.jit.trace``'s check re-traces under ``no_grad``) or fails on a symbolic value, so while
a tracer records, every kernel runs the code it replaces (``adopter.kernels._util.tracing``).

Each case below is a small module that calls one kernel next to the module with the original
code (the same submodules): the traced graphs of the two must be the same, the traced module must
compute what the eager one does, and ``torch.jit.trace(check_trace=True)`` must pass with
parameters that need a gradient (where the kernels would otherwise take another path than under
the check's ``no_grad``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import adopter.kernels as kernels
from adopter.kernels import attention as attention_module
from adopter.kernels import (
    conv_batch_norm,
    dropout_add_layer_norm,
    linear_batch_norm,
    linear_bias_activation,
    qkv_projection,
    registry,
    softmax,
)
from adopter.kernels._util import tracing
from adopter.kernels.attention_function import (
    attention_function_reference,
    scaled_attention_reference,
)
from adopter.kernels.cross_entropy import (
    causal_lm_loss_reference,
    linear_cross_entropy_reference,
)
from adopter.kernels.rms_norm import rms_norm_reference
from adopter.kernels.rotary import (
    apply_rotary_complex_reference,
    rotary_complex_reference,
    rotary_reference,
)

# From the registry: the public names that are not kernels a model calls (``fused_loss_applies``
# is the run-time test of the cross-entropy rewrite; it answers False under a tracer; the
# optimizers are built by training code, not traced with a model), and the
# attention factories, traced on the real transformers classes below.
NOT_KERNELS = set(registry.names(registry.Role.HELPER, registry.Role.OPTIMIZER))
ATTENTION_FACTORIES = set(registry.names(registry.Role.ATTENTION_FACTORY))


class Calls(nn.Module):
    """A module whose forward is ``compute(self, x)``, over the given submodules."""

    def __init__(self, compute: Callable[..., Any], **modules: nn.Module) -> None:
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)
        self.compute = compute

    def forward(self, x: torch.Tensor) -> Any:
        return self.compute(self, x)


class Calls2(Calls):
    """``compute(self, x, y)``: torch.fx needs each input named in the signature."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:  # type: ignore[override]
        return self.compute(self, x, y)


@dataclass
class Case:
    kernel: str
    fused: Callable[..., Any]
    original: Callable[..., Any]
    modules: Callable[[], dict[str, nn.Module]]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    train: bool = False
    deterministic: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    # False where the spelling the kernel replaces cannot be fx-traced either (it unpacks or
    # star-expands a tensor's shape or chunks): then neither can the kernel.
    fx: bool = True

    def pair(self) -> tuple[nn.Module, nn.Module]:
        kind = Calls2 if len(self.inputs()) == 2 else Calls
        torch.manual_seed(0)
        modules = self.modules()
        fused = kind(self.fused, **modules).train(self.train)
        original = kind(self.original, **modules).train(self.train)
        return fused, original


def _x(*shape: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (torch.randn(*shape),)


def _eval_bn(bn: nn.modules.batchnorm._BatchNorm) -> nn.Module:
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 2)
        bn.bias.uniform_(-1, 1)
    return bn


CASES = [
    Case(
        "softmax",
        lambda m, x: softmax(x, dim=-1),
        lambda m, x: F.softmax(x, dim=-1),
        dict,
        _x(2, 3, 5),
    ),
    Case(
        "softmax",
        lambda m, x: softmax(x, dim=-1, dtype=torch.float64),
        lambda m, x: F.softmax(x, dim=-1, dtype=torch.float64),
        dict,
        _x(2, 5),
    ),
    Case(
        "dropout_add_layer_norm",
        lambda m, h, r: dropout_add_layer_norm(h, r, m.dropout, m.norm),
        lambda m, h, r: m.norm(m.dropout(h) + r),
        lambda: {"dropout": nn.Dropout(0.1), "norm": nn.LayerNorm(8)},
        lambda: (torch.randn(2, 3, 8), torch.randn(2, 3, 8)),
    ),
    Case(
        "dropout_add_layer_norm",
        lambda m, h, r: dropout_add_layer_norm(h, r, m.dropout, m.norm),
        lambda m, h, r: m.norm(m.dropout(h) + r),
        lambda: {"dropout": nn.Dropout(0.1), "norm": nn.LayerNorm(8)},
        lambda: (torch.randn(2, 3, 8), torch.randn(2, 3, 8)),
        train=True,
        deterministic=False,
    ),
    Case(
        "dropout_add_layer_norm",
        lambda m, h, r: dropout_add_layer_norm(h, r, 0.25, m.norm),
        lambda m, h, r: m.norm(F.dropout(h, 0.25, training=m.norm.training) + r),
        lambda: {"norm": nn.LayerNorm(8)},
        lambda: (torch.randn(2, 8), torch.randn(2, 8)),
    ),
    Case(
        "linear_bias_activation",
        lambda m, x: linear_bias_activation(x, m.linear, m.act),
        lambda m, x: m.act(m.linear(x)),
        lambda: {"linear": nn.Linear(8, 16), "act": nn.ReLU()},  # cuBLASLt path without autograd
        _x(2, 3, 8),
    ),
    Case(
        "linear_bias_activation",
        lambda m, x: linear_bias_activation(x, m.linear, m.act),
        lambda m, x: m.act(m.linear(x)),
        lambda: {"linear": nn.Linear(8, 16), "act": nn.GELU(approximate="tanh")},  # in place
        _x(2, 3, 8),
    ),
    Case(
        "conv_batch_norm",
        lambda m, x: conv_batch_norm(x, m.conv, m.bn),
        lambda m, x: m.bn(m.conv(x)),
        lambda: {"conv": nn.Conv2d(3, 4, 3, padding=1), "bn": _eval_bn(nn.BatchNorm2d(4)).eval()},
        _x(2, 3, 6, 6),
    ),
    Case(
        "conv_batch_norm",
        lambda m, x: conv_batch_norm(x, m.conv, m.bn),
        lambda m, x: m.bn(m.conv(x)),
        lambda: {"conv": nn.Conv2d(3, 4, 3), "bn": nn.BatchNorm2d(4)},
        _x(2, 3, 6, 6),
        train=True,
    ),
    Case(
        "linear_batch_norm",
        lambda m, x: linear_batch_norm(x, m.linear, m.bn),
        lambda m, x: m.bn(m.linear(x)),
        lambda: {"linear": nn.Linear(8, 6), "bn": _eval_bn(nn.BatchNorm1d(6)).eval()},
        _x(4, 8),
    ),
    Case(
        "qkv_projection",
        lambda m, x: qkv_projection(x, m.q, m.k, m.v),
        lambda m, x: (m.q(x), m.k(x), m.v(x)),
        lambda: {"q": nn.Linear(8, 8), "k": nn.Linear(8, 8), "v": nn.Linear(8, 4, bias=False)},
        _x(2, 3, 8),
    ),
]

# The modern kernels (issue 14): under a tracer each runs its ``*_reference`` composite code or
# the model's own modules, the same graph as the spelling it replaces.
ANGLES = torch.randn(5, 8)
COS, SIN = ANGLES.cos(), ANGLES.sin()
FREQS = torch.polar(torch.ones(5, 4), torch.randn(5, 4))[None, None]
TARGETS = torch.tensor([1, 4, -100, 0, 7, 2])
LABELS = torch.tensor([[1, 4, -100], [0, 7, 2]])


def _gated_halves(m, x):
    """diffusers' GEGLU: ``hidden_states, gate = proj(x).chunk(2, dim=-1)``."""
    hidden, gate = m.proj(x).chunk(2, dim=-1)
    return m.act(gate) * hidden


def _rotate_both(q, k, cos, sin):
    return rotary_reference(q, cos, sin), rotary_reference(k, cos, sin)


class _Heads(nn.Module):
    """What ``eager_attention_forward`` reads from its module."""

    num_key_value_groups = 2


class _Scores(nn.Module):
    """A diffusers-style attention module: ``get_attention_scores`` and its settings."""

    scale = 0.5
    upcast_attention = False
    upcast_softmax = False

    def get_attention_scores(self, query, key, attention_mask=None):
        return (torch.bmm(query, key.transpose(-1, -2)) * self.scale).softmax(dim=-1)


class _LlamaNorm(nn.Module):
    """A transformers Llama RMSNorm: the spelling add_rms_norm computes fused."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width))
        self.variance_epsilon = 1e-6

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def _add_norm(m, x, y):
    """A decoder layer's residual add and post-attention norm, both results used."""
    hidden = m.proj(x) + y
    residual = hidden
    return m.norm(hidden), residual


MODERN_CASES = [
    Case(
        "add_rms_norm",
        lambda m, x, y: kernels.add_rms_norm(m.proj(x), y, m.norm),
        _add_norm,
        lambda: {"proj": nn.Linear(8, 8), "norm": _LlamaNorm(8)},
        lambda: (torch.randn(2, 3, 8), torch.randn(2, 3, 8)),
    ),
    Case(
        "add_rms_norm",
        lambda m, x, y: kernels.add_rms_norm(m.proj(x), y, m.norm),
        _add_norm,
        lambda: {"proj": nn.Linear(8, 8), "norm": nn.RMSNorm(8)},
        lambda: (torch.randn(2, 3, 8), torch.randn(2, 3, 8)),
    ),
    Case(
        "rms_norm",
        lambda m, x: kernels.rms_norm(x, m.norm.weight, 1e-6),
        lambda m, x: rms_norm_reference(x, m.norm.weight, 1e-6),
        lambda: {"norm": nn.LayerNorm(8)},
        _x(2, 3, 8),
    ),
    Case(
        "rms_norm",
        lambda m, x: kernels.rms_norm(
            x, m.norm.weight, 1e-6, cast="after_weight", weight_promoted=True, input_promoted=True
        ),
        lambda m, x: rms_norm_reference(
            x, m.norm.weight, 1e-6, cast="after_weight", weight_promoted=True, input_promoted=True
        ),
        lambda: {"norm": nn.LayerNorm(8)},
        _x(2, 3, 8),
    ),
    Case(
        "gated_mlp",
        lambda m, x: kernels.gated_mlp(x, m.gate, m.up, m.down, m.act),
        lambda m, x: m.down(m.act(m.gate(x)) * m.up(x)),
        lambda: {
            "gate": nn.Linear(8, 16),
            "up": nn.Linear(8, 16),
            "down": nn.Linear(16, 8),
            "act": nn.SiLU(),
        },
        _x(2, 3, 8),
    ),
    Case(
        "gated_activation",
        lambda m, g, u: kernels.gated_activation(g, u, m.act),
        lambda m, g, u: m.act(g) * u,
        lambda: {"act": nn.GELU(approximate="tanh")},
        lambda: (torch.randn(2, 8), torch.randn(2, 8)),
    ),
    Case(
        "gated_activation_chunked",
        lambda m, x: kernels.gated_activation_chunked(m.proj(x), m.act),
        _gated_halves,
        lambda: {"proj": nn.Linear(8, 16), "act": nn.GELU()},
        _x(2, 3, 8),
    ),
    Case(
        "rotary",
        lambda m, x: kernels.rotary(m.proj(x), COS, SIN),
        lambda m, x: rotary_reference(m.proj(x), COS, SIN),
        lambda: {"proj": nn.Linear(8, 8)},
        _x(2, 5, 8),
    ),
    Case(
        "rotary",
        lambda m, x: kernels.rotary(
            m.proj(x),
            COS[..., :4],
            SIN[..., :4],
            interleaved=True,
            per_pair=True,
            deinterleave=True,
        ),
        lambda m, x: rotary_reference(
            m.proj(x),
            COS[..., :4],
            SIN[..., :4],
            interleaved=True,
            per_pair=True,
            deinterleave=True,
        ),
        lambda: {"proj": nn.Linear(8, 8)},
        _x(2, 5, 8),
    ),
    Case(
        "rotary",
        lambda m, x: kernels.rotary(m.proj(x), COS, SIN, upcast=True, cast_back=False),
        lambda m, x: rotary_reference(m.proj(x), COS, SIN, upcast=True, cast_back=False),
        lambda: {"proj": nn.Linear(8, 8)},
        _x(2, 5, 8),
    ),
    Case(
        "apply_rotary",
        lambda m, q, k: kernels.apply_rotary(m.q(q), m.k(k), COS, SIN, unsqueeze_dim=0),
        lambda m, q, k: _rotate_both(m.q(q), m.k(k), COS.unsqueeze(0), SIN.unsqueeze(0)),
        lambda: {"q": nn.Linear(8, 8), "k": nn.Linear(8, 8)},
        lambda: (torch.randn(2, 5, 8), torch.randn(2, 5, 8)),
    ),
    Case(
        "apply_rotary_complex",
        lambda m, q, k: kernels.apply_rotary_complex(m.q(q), m.k(k), FREQS),
        lambda m, q, k: apply_rotary_complex_reference(m.q(q), m.k(k), FREQS),
        lambda: {"q": nn.Linear(8, 8), "k": nn.Linear(8, 8)},
        lambda: (torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)),
        fx=False,  # `x.reshape(*x.shape[:-1], -1, 2)` star-expands a shape
    ),
    Case(
        "rotary_complex",
        lambda m, x: kernels.rotary_complex(m.q(x), FREQS),
        lambda m, x: rotary_complex_reference(m.q(x), FREQS),
        lambda: {"q": nn.Linear(8, 8)},
        lambda: (torch.randn(1, 2, 5, 8),),
        fx=False,  # as apply_rotary_complex
    ),
    Case(
        "rotary",  # the complex form through rotary (the rule's spelling)
        lambda m, x: kernels.rotary(m.q(x), FREQS, complex_pairs=True),
        lambda m, x: rotary_complex_reference(m.q(x), FREQS),
        lambda: {"q": nn.Linear(8, 8)},
        lambda: (torch.randn(1, 2, 5, 8),),
        fx=False,  # as apply_rotary_complex
    ),
    Case(
        "attention_function",
        lambda m, q, kv: kernels.attention_function(m.heads, m.q(q), kv, kv, None, 0.5)[0],
        lambda m, q, kv: attention_function_reference(m.heads, m.q(q), kv, kv, None, 0.5)[0],
        lambda: {"heads": _Heads(), "q": nn.Linear(4, 4)},
        lambda: (torch.randn(1, 4, 5, 4), torch.randn(1, 2, 5, 4)),
    ),
    Case(
        "scaled_attention",
        lambda m, q, k: kernels.scaled_attention(m.q(q), k, k, scale=0.5),
        lambda m, q, k: scaled_attention_reference(m.q(q), k, k, scale=0.5),
        lambda: {"q": nn.Linear(4, 4)},
        lambda: (torch.randn(2, 5, 4), torch.randn(2, 5, 4)),
    ),
    Case(
        "attention_function",
        lambda m, q, k: kernels.attention_function(
            m.heads, m.q(q), k, k, None, 1.0, repeat_kv=False, softmax_dtype=None, position_bias=k
        )[0],
        lambda m, q, k: attention_function_reference(
            m.heads, m.q(q), k, k, None, 1.0, repeat_kv=False, softmax_dtype=None, position_bias=k
        )[0],
        lambda: {"heads": _Heads(), "q": nn.Linear(4, 4)},
        lambda: (torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4)),
    ),
    Case(
        "scaled_attention",
        lambda m, q, k: kernels.scaled_attention(m.q(q), k, k, scores_of=m.attn),
        lambda m, q, k: torch.bmm(m.attn.get_attention_scores(m.q(q), k), k),
        lambda: {"q": nn.Linear(4, 4), "attn": _Scores()},
        lambda: (torch.randn(2, 5, 4), torch.randn(2, 5, 4)),
    ),
    Case(
        "group_norm_activation",
        lambda m, x: kernels.group_norm_activation(x, m.norm, m.act),
        lambda m, x: m.act(m.norm(x)),
        lambda: {"norm": nn.GroupNorm(2, 4), "act": nn.SiLU()},
        _x(2, 4, 3, 3),
    ),
    Case(
        "conv_bn_act",
        lambda m, x: kernels.conv_bn_act(x, m.conv, m.bn, m.act),
        lambda m, x: m.act(m.bn(m.conv(x))),
        lambda: {
            "conv": nn.Conv2d(3, 4, 3, padding=1),
            "bn": _eval_bn(nn.BatchNorm2d(4)).eval(),
            "act": nn.ReLU(),
        },
        _x(2, 3, 6, 6),
    ),
    Case(
        "linear_cross_entropy",
        lambda m, h: kernels.linear_cross_entropy(h, m.head.weight, m.head.bias, TARGETS),
        lambda m, h: linear_cross_entropy_reference(h, m.head.weight, m.head.bias, TARGETS),
        lambda: {"head": nn.Linear(8, 10)},
        _x(6, 8),
    ),
    Case(
        "causal_lm_loss",
        lambda m, h: kernels.causal_lm_loss(h, m.head, LABELS, 10),
        lambda m, h: causal_lm_loss_reference(h, m.head, LABELS, 10),
        lambda: {"head": nn.Linear(8, 10, bias=False)},
        _x(2, 3, 8),
    ),
]
CASES += MODERN_CASES

CASE_IDS = [f"{case.kernel}-{index}" for index, case in enumerate(CASES)]


def _run(module: nn.Module, inputs: tuple[torch.Tensor, ...], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return module(*inputs)


def _assert_outputs_equal(got: Any, want: Any) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    else:
        torch.testing.assert_close(got, want)


def _node_kinds(traced: torch.jit.ScriptModule) -> list[str]:
    return [node.kind() for node in traced.inlined_graph.nodes()]


def test_every_kernel_has_a_tracing_case():
    """A kernel added to ``adopter.kernels`` without a case here is reported by name."""
    covered = {case.kernel for case in CASES} | ATTENTION_FACTORIES
    missing = sorted(set(kernels.__all__) - NOT_KERNELS - covered)
    assert not missing, f"add a tracing case for {missing} (and make them follow tracing())"


def test_tracing_is_false_in_eager_code_and_true_under_both_tracers():
    seen: list[bool] = []

    def probe(x: torch.Tensor) -> torch.Tensor:
        seen.append(tracing())
        return x + 1

    probe(torch.ones(1))
    torch.fx.symbolic_trace(Calls(lambda m, x: probe(x)))
    torch.jit.trace(Calls(lambda m, x: probe(x)), (torch.ones(1),), check_trace=False)
    assert seen == [False, True, True]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fx_records_the_original_graph(case: Case):
    fused, original = case.pair()
    if not case.fx:  # fails on the kernel exactly as on the spelling it replaces
        for module in (original, fused):
            with pytest.raises(torch.fx.proxy.TraceError, match="Proxy object cannot be iterated"):
                torch.fx.symbolic_trace(module)
        return
    graph = torch.fx.symbolic_trace(fused)
    assert str(graph.graph) == str(torch.fx.symbolic_trace(original).graph)
    inputs = case.inputs()
    with torch.no_grad():
        if case.deterministic:
            _assert_outputs_equal(graph(*inputs), fused(*inputs))
        else:  # dropout: the same draws in the same order
            _assert_outputs_equal(_run(graph, inputs), _run(original, inputs))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_jit_trace_passes_its_no_grad_check_and_records_the_original(case: Case):
    fused, original = case.pair()
    inputs = case.inputs()
    assert any(p.requires_grad for p in fused.parameters()) or not list(fused.parameters())
    # check_trace re-traces under no_grad: a kernel that chose its path from grad mode fails.
    traced = torch.jit.trace(fused, inputs, check_trace=case.deterministic)
    reference = torch.jit.trace(original, inputs, check_trace=case.deterministic)
    assert _node_kinds(traced) == _node_kinds(reference)
    with torch.no_grad():
        traced_again = torch.jit.trace(fused, inputs, check_trace=False)
    assert _node_kinds(traced_again) == _node_kinds(traced)
    if case.deterministic:
        with torch.no_grad():
            _assert_outputs_equal(traced(*inputs), fused(*inputs))


# ---------------------------------------------------------------------------------------------
# The attention factories on the real transformers 4.34 classes
# ---------------------------------------------------------------------------------------------

HIDDEN, HEADS, BATCH, SEQ = 32, 4, 2, 5


def _attention_cases() -> dict[str, tuple[str, Callable[[], tuple[type, tuple]], Callable]]:
    """factory name -> (attention class, constructor args, inputs) for the factory."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.albert import modeling_albert
    from transformers.models.bert import modeling_bert
    from transformers.models.distilbert import modeling_distilbert
    from transformers.models.gpt2 import modeling_gpt2
    from transformers.models.gpt_neo import modeling_gpt_neo
    from transformers.models.t5 import modeling_t5

    def additive_mask() -> torch.Tensor:
        mask = torch.zeros(BATCH, 1, 1, SEQ)
        mask[1, ..., -2:] = torch.finfo(torch.float32).min
        return mask

    hidden = (lambda: torch.randn(BATCH, SEQ, HIDDEN),)
    bert = transformers.BertConfig(
        hidden_size=HIDDEN, num_attention_heads=HEADS, attention_probs_dropout_prob=0.0
    )
    albert = transformers.AlbertConfig(
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        intermediate_size=2 * HIDDEN,
        embedding_size=16,
        attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
    )
    distilbert = transformers.DistilBertConfig(dim=HIDDEN, n_heads=HEADS, attention_dropout=0.0)
    gpt2 = transformers.GPT2Config(n_embd=HIDDEN, n_head=HEADS, n_positions=16, attn_pdrop=0.0)
    gpt_neo = transformers.GPTNeoConfig(
        hidden_size=HIDDEN,
        num_heads=HEADS,
        num_layers=2,
        attention_types=[[["global", "local"], 1]],
        window_size=3,
        max_position_embeddings=16,
        attention_dropout=0.0,
    )
    t5 = transformers.T5Config(d_model=HIDDEN, d_kv=8, num_heads=HEADS, dropout_rate=0.0)

    def padding() -> torch.Tensor:
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[1, -2:] = 0
        return mask

    return {
        "fused_bert_self_attention": (
            modeling_bert.BertSelfAttention,
            (bert,),
            lambda: (hidden[0](), additive_mask()),
        ),
        "fused_albert_attention": (
            modeling_albert.AlbertAttention,
            (albert,),
            lambda: (hidden[0](), additive_mask()),
        ),
        "fused_distilbert_attention": (
            modeling_distilbert.MultiHeadSelfAttention,
            (distilbert,),
            lambda: (lambda x: (x, x, x, padding()))(hidden[0]()),
        ),
        "fused_gpt2_attention": (
            modeling_gpt2.GPT2Attention,
            (gpt2,),
            lambda: (hidden[0](),),
        ),
        "fused_gpt_neo_self_attention": (
            modeling_gpt_neo.GPTNeoSelfAttention,
            (gpt_neo, "global"),
            lambda: (hidden[0](), additive_mask()),
        ),
        "fused_t5_attention": (
            modeling_t5.T5Attention,
            (t5,),
            lambda: (hidden[0](), additive_mask()),
        ),
    }


class First(nn.Module):
    """The attention output alone (``torch.jit.trace`` cannot return the ``None`` cache)."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.attention(*inputs)[0]


@pytest.fixture(autouse=True)
def fused_path_even_on_cpu(monkeypatch):
    """The fused attention math runs on this CPU too, as in the attention kernels' tests."""
    monkeypatch.setattr(attention_module, "ORIGINAL_WHEN_UNFUSED_ON_CPU", False)


@pytest.mark.parametrize("factory_name", sorted(ATTENTION_FACTORIES))
def test_attention_jit_trace_passes_its_check_and_records_the_original(factory_name: str):
    cls, args, inputs = _attention_cases()[factory_name]
    factory = getattr(kernels, factory_name)
    torch.manual_seed(0)
    if factory_name == "fused_t5_attention":
        original = cls(*args, has_relative_attention_bias=True)
        fused = factory(cls)(*args, has_relative_attention_bias=True)
    else:
        original = cls(*args)
        fused = factory(cls)(*args)
    fused.load_state_dict(original.state_dict(), strict=True)
    assert type(fused) is not cls  # the factory did not refuse the class
    fused, original = First(fused).eval(), First(original).eval()
    example = inputs()
    traced = torch.jit.trace(fused, example, check_trace=True, strict=False)
    reference = torch.jit.trace(original, example, check_trace=True, strict=False)
    assert _node_kinds(traced) == _node_kinds(reference)
    with torch.no_grad():
        torch.testing.assert_close(traced(*example), fused(*example))
        # Outside the tracer the fused path still runs (and agrees).
        torch.testing.assert_close(fused(*example), original(*example))
