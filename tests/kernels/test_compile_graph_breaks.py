"""Every kernel compiles like the code it replaces: no added graph break, the same values.

``torch.compile`` (every mode, ``fullgraph=True``, the compiled forward ``generate`` uses) runs
Dynamo over the patched model. A kernel whose fused eager path Dynamo cannot capture (a
non-contiguous ``out=``, ``torch.result_type``, storage pointers, a data-dependent check) breaks
the graph there, and ``fullgraph=True`` fails. Under Dynamo every kernel runs code Dynamo
captures (``adopter.kernels._util.runs_original``), so for each public kernel of the registry:

* ``torch.compile(fullgraph=True)`` of the kernel's call compiles, with and without autograd
  recording, and gives the original's outputs and gradients (backend ``eager`` / ``aot_eager``:
  Dynamo and AOT autograd are what can break; Inductor's code generation is not what this
  checks, and would cost CPU minutes). ``fullgraph=True`` fails on any graph break, so the
  kernel's call has none: no more than the original computation it replaces. (A separate
  ``torch._dynamo.explain`` count of both checked that again and cost as much CPU as this test;
  explain now runs only when the compile fails, to name the breaks.)

The cases are those of the tracing test (one or more per kernel) plus the spellings whose fused
path differs (RMSNorm casts, rotary layouts, the gated MLP without a down bias). A kernel of the
registry with no case here fails ``test_every_kernel_has_a_compile_case`` by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch._dynamo as dynamo
from torch import nn

import adopter.kernels as kernels
from adopter.kernels import registry
from adopter.kernels._util import compiling, runs_original, tracing
from adopter.kernels.cross_entropy import causal_lm_loss_reference
from adopter.kernels.rms_norm import rms_norm_reference
from adopter.kernels.rotary import rotary_reference
from tests.kernels.conftest import assert_close
from tests.kernels.test_kernels_tracing import CASES as TRACING_CASES
from tests.kernels.test_kernels_tracing import Case, _x

ANGLES = torch.randn(5, 8)
COS, SIN = ANGLES.cos(), ANGLES.sin()
PARTIAL_COS, PARTIAL_SIN = COS[:, :4].contiguous(), SIN[:, :4].contiguous()
BF16_COS, BF16_SIN = COS.bfloat16(), SIN.bfloat16()


def _weighted(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A parameter-free norm input whose gradient reaches the norm (``x`` is a plain input)."""
    return m.proj(x)


UNSHIFTED = torch.tensor([[1, 4, -100], [0, 7, 2]])  # targets as they are (no label shift)

EXTRA_CASES = [
    Case(
        "rms_norm",  # Gemma: (1 + weight) in float32 after normalising
        lambda m, x: kernels.rms_norm(
            _weighted(m, x), m.norm.weight, 1e-6, offset=1.0, cast="after_weight"
        ),
        lambda m, x: rms_norm_reference(
            _weighted(m, x), m.norm.weight, 1e-6, offset=1.0, cast="after_weight"
        ),
        lambda: {"proj": nn.Linear(8, 8), "norm": nn.LayerNorm(8)},
        _x(2, 3, 8),
    ),
    Case(
        "rms_norm",  # T5: the weight's dtype
        lambda m, x: kernels.rms_norm(_weighted(m, x), m.norm.weight, 1e-6, cast="weight_dtype"),
        lambda m, x: rms_norm_reference(_weighted(m, x), m.norm.weight, 1e-6, cast="weight_dtype"),
        lambda: {"proj": nn.Linear(8, 8), "norm": nn.LayerNorm(8)},
        _x(2, 3, 8),
    ),
    Case(
        "rms_norm",  # bfloat16 activations, no weight
        lambda m, x: kernels.rms_norm(_weighted(m, x).bfloat16(), None, 1e-6),
        lambda m, x: rms_norm_reference(_weighted(m, x).bfloat16(), None, 1e-6),
        lambda: {"proj": nn.Linear(8, 8)},
        _x(2, 3, 8),
    ),
    Case(
        "rotary",  # GPT-J's interleaved pairs
        lambda m, x: kernels.rotary(m.proj(x), COS, SIN, interleaved=True),
        lambda m, x: rotary_reference(m.proj(x), COS, SIN, interleaved=True),
        lambda: {"proj": nn.Linear(8, 8)},
        _x(2, 5, 8),
    ),
    Case(
        "rotary",  # Phi / GPT-NeoX: half the head rotated
        lambda m, x: kernels.rotary(m.proj(x), PARTIAL_COS, PARTIAL_SIN, partial=True),
        lambda m, x: rotary_reference(m.proj(x), PARTIAL_COS, PARTIAL_SIN, partial=True),
        lambda: {"proj": nn.Linear(8, 8)},
        _x(2, 5, 8),
    ),
    Case(
        "rotary",  # Cohere: bfloat16 computed in float32
        lambda m, x: kernels.rotary(m.proj(x).bfloat16(), BF16_COS, BF16_SIN, upcast=True),
        lambda m, x: rotary_reference(m.proj(x).bfloat16(), BF16_COS, BF16_SIN, upcast=True),
        lambda: {"proj": nn.Linear(8, 8)},
        _x(2, 5, 8),
    ),
    Case(
        "gated_mlp",  # Llama: no biases
        lambda m, x: kernels.gated_mlp(x, m.gate, m.up, m.down, m.act),
        lambda m, x: m.down(m.act(m.gate(x)) * m.up(x)),
        lambda: {
            "gate": nn.Linear(8, 16, bias=False),
            "up": nn.Linear(8, 16, bias=False),
            "down": nn.Linear(16, 8, bias=False),
            "act": nn.SiLU(),
        },
        _x(2, 3, 8),
    ),
    Case(
        "gated_mlp",  # Falcon-H1: the gate projection scaled before the activation
        lambda m, x: kernels.gated_mlp(x, m.gate, m.up, m.down, m.act, gate_scale=0.5),
        lambda m, x: m.down(m.up(x) * m.act(m.gate(x) * 0.5)),
        lambda: {
            "gate": nn.Linear(8, 16),
            "up": nn.Linear(8, 16),
            "down": nn.Linear(16, 8),
            "act": nn.SiLU(),
        },
        _x(2, 3, 8),
    ),
    Case(
        "gated_mlp",  # Phi-3: one gate/up projection, chunked, the gate first
        lambda m, x: kernels.gated_mlp(m.proj(x), None, None, m.down, m.act, halves="first"),
        lambda m, x: m.down(m.proj(x).chunk(2, dim=-1)[1] * m.act(m.proj(x).chunk(2, dim=-1)[0])),
        lambda: {"proj": nn.Linear(8, 32), "down": nn.Linear(16, 8), "act": nn.SiLU()},
        _x(2, 3, 8),
    ),
    Case(
        "causal_lm_loss",  # BART: a logit bias, CrossEntropyLoss() without the label shift
        lambda m, h: kernels.causal_lm_loss(
            h, m.head, UNSHIFTED, 10, logit_bias=m.bias.weight, shift=False, upcast=False
        ),
        lambda m, h: nn.CrossEntropyLoss()(
            (m.head(h) + m.bias.weight).view(-1, 10), UNSHIFTED.view(-1)
        ),
        lambda: {"head": nn.Linear(8, 10, bias=False), "bias": nn.Linear(10, 1, bias=False)},
        _x(2, 3, 8),
    ),
    Case(
        "causal_lm_loss",  # Granite: the logits divided by logits_scaling
        lambda m, h: kernels.causal_lm_loss(h, m.head, UNSHIFTED, 10, logit_divisor=8.0),
        lambda m, h: causal_lm_loss_reference(h, m.head, UNSHIFTED, 10, logit_divisor=8.0),
        lambda: {"head": nn.Linear(8, 10, bias=False)},
        _x(2, 3, 8),
    ),
    Case(
        "gated_mlp",  # T5 / timm SwiGLU: the gated product alone (a dropout follows)
        lambda m, x: kernels.gated_mlp(x, m.gate, m.up, None, m.act),
        lambda m, x: m.act(m.gate(x)) * m.up(x),
        lambda: {"gate": nn.Linear(8, 16), "up": nn.Linear(8, 16), "act": nn.GELU()},
        _x(2, 3, 8),
    ),
]

CASES = TRACING_CASES + EXTRA_CASES
CASE_IDS = [f"{case.kernel}-{index}" for index, case in enumerate(CASES)]
KERNELS = registry.names(registry.Role.KERNEL)


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Each case compiles from scratch (no cache entry, no recompile limit from another)."""
    dynamo.reset()
    yield
    dynamo.reset()


def _breaks(module: nn.Module, inputs: tuple[torch.Tensor, ...], grad: bool) -> tuple[int, list]:
    dynamo.reset()
    torch.manual_seed(0)
    with torch.set_grad_enabled(grad):
        explained = dynamo.explain(module)(*inputs)
    return explained.graph_break_count, [
        str(b.reason).split("\n")[0] for b in explained.break_reasons
    ]


def _outputs(result: Any) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _run(
    fn: Any, module: nn.Module, inputs: tuple[torch.Tensor, ...], grad: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Outputs, then the gradients of the float inputs and of the module's parameters (a
    seeded cotangent per output), for one call of ``fn`` (``module`` or its compiled form)."""
    module.zero_grad(set_to_none=True)
    leaves = [t.detach().clone().requires_grad_(grad and t.is_floating_point()) for t in inputs]
    torch.manual_seed(0)
    with torch.set_grad_enabled(grad):
        outs = _outputs(fn(*leaves))
    grads: list[torch.Tensor | None] = []
    if grad:
        generator = torch.Generator().manual_seed(1)
        pairs = [(o, torch.randn(o.shape, generator=generator).to(o.dtype)) for o in outs]
        pairs = [(o, g) for o, g in pairs if o.requires_grad]
        assert pairs, "a grad case whose outputs need no gradient checks nothing"
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        grads = [t.grad for t in leaves] + [p.grad for p in module.parameters()]
    return [o.detach() for o in outs], grads


def test_every_kernel_has_a_compile_case():
    """A kernel added to the registry without a case here is named (the list is derived)."""
    missing = sorted(set(KERNELS) - {case.kernel for case in CASES})
    assert not missing, f"add a compile case for {missing} (and keep it compile-clean)"
    assert set(KERNELS) <= set(kernels.__all__)


def test_tracing_does_not_fire_under_dynamo_but_the_kernels_run_the_original():
    seen: dict[str, bool] = {}

    def probe(x: torch.Tensor) -> torch.Tensor:
        seen.update(tracing=tracing(x), compiling=compiling(), original=runs_original(x))
        return x + 1

    torch.compile(probe, backend="eager", fullgraph=True)(torch.ones(2))
    assert seen == {"tracing": False, "compiling": True, "original": True}
    probe(torch.ones(2))
    assert seen == {"tracing": False, "compiling": False, "original": False}


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_kernel_compiles_fullgraph_without_a_graph_break_to_the_original_values(
    case: Case, grad: bool
):
    fused, original = case.pair()
    inputs = case.inputs()
    # aot_eager traces the backward as well (AOT autograd); eager is enough without autograd.
    compiled = torch.compile(fused, backend="aot_eager" if grad else "eager", fullgraph=True)
    try:
        got_out, got_grads = _run(compiled, fused, inputs, grad)
    except Exception as error:  # a graph break fails fullgraph: name the breaks, and the original's
        kernel_breaks, reasons = _breaks(fused, inputs, grad)
        original_breaks, _ = _breaks(original, inputs, grad)
        pytest.fail(
            f"{case.kernel}: fullgraph compile failed ({error!r}); graph breaks: kernel"
            f" {kernel_breaks} {reasons}, original {original_breaks}"
        )
    if case.deterministic:
        want_out, want_grads = _run(original, original, inputs, grad)
    else:  # dropout: the original compiled under the same seed draws the same mask
        reference = torch.compile(original, backend="aot_eager" if grad else "eager")
        want_out, want_grads = _run(reference, original, inputs, grad)
    assert len(got_out) == len(want_out)
    for a, b in zip(got_out, want_out, strict=True):
        assert_close(a, b)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_close(a, b)
