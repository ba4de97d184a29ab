"""Proof of an optimizer rewrite (the ``train`` rule set): the construction as written and as
``apply`` rewrites it train two copies of one small model for N steps on the same batches, and
the parameters must agree within a tolerance, with the rewritten optimizer actually fused.

The rewrite is the real one: the construction's source goes through scan and apply with the
given rules, and the patched text runs (it imports ``adopter.kernels`` itself, as a user's
rewritten script does). A rewrite that left the call alone, or whose optimizer did not take the
fused path, is reported as not exercised, never as proven.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from ..dsl.syntax import Rule
from ..match.matcher import Matcher
from ..rewrite.driver import rewrite_text

# Fused and per-tensor updates round differently (fused AdamW computes the step in one pass);
# after a few steps in float32 the parameters of the model below differ by ~1e-7.
DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-6


@dataclass(frozen=True)
class OptimizerProof:
    call: str  # the construction as written, over ``params``
    patched_call: str  # as apply rewrote it ("" when apply left it alone)
    fused: bool  # every parameter group of the rewritten optimizer ran fused
    steps: int
    max_abs_diff: float  # over every parameter after the last step
    matched: bool  # within tolerance

    @property
    def proven(self) -> bool:
        return bool(self.patched_call) and self.fused and self.matched

    @property
    def verdict(self) -> str:
        if not self.patched_call:
            return "not exercised: apply left the construction as written"
        if not self.fused:
            return "not exercised: the rewritten optimizer did not run fused"
        if not self.matched:
            differ = f"parameters differ by up to {self.max_abs_diff:.3g}"
            return f"refuted: {differ} after {self.steps} steps"
        return f"verified: {self.steps} steps, parameters within {self.max_abs_diff:.3g}"


def prove_optimizer_rewrite(
    call: str,
    rules: Sequence[Rule],
    *,
    steps: int = 10,
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
) -> OptimizerProof:
    """Prove the rewrite of ``call``, an optimizer construction over a name ``params`` (e.g.
    ``"torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)"``), by ``rules`` on the CPU."""
    import torch

    original_source = f"import torch\noptimizer = {call}\n"
    rewrite = rewrite_text(original_source, "<optimizer>", Matcher(list(rules)))
    patched_source = rewrite.patched if rewrite.changed else ""
    patched_call = (
        patched_source.splitlines()[-1].removeprefix("optimizer = ") if patched_source else ""
    )
    torch.manual_seed(seed)
    model = _small_model(torch)
    batches = [(torch.randint(0, 32, (4, 6)), torch.randn(4, 6, 16)) for _ in range(steps)]
    trained = [
        _train(copy.deepcopy(model), source, batches, torch)
        for source in (original_source, patched_source or original_source)
    ]
    (original, _), (patched, optimizer) = trained
    fused = bool(patched_source) and all(
        group.get("fused") is True for group in optimizer.param_groups
    )
    differences = [(a - b).abs().max().item() for a, b in zip(original, patched, strict=True)]
    matched = all(
        torch.allclose(a, b, rtol=rtol, atol=atol) for a, b in zip(original, patched, strict=True)
    )
    return OptimizerProof(call, patched_call, fused, steps, max(differences), matched)


def _small_model(torch):  # noqa: ANN001, ANN202 - torch is imported by the caller, lazily
    return torch.nn.ModuleDict(
        {
            "embedding": torch.nn.Embedding(32, 16),
            "norm": torch.nn.LayerNorm(16),
            "projection": torch.nn.Linear(16, 16),
        }
    )


def _train(model, source: str, batches, torch):  # noqa: ANN001, ANN202
    namespace: dict[str, object] = {"params": model.parameters()}
    exec(compile(source, "<optimizer>", "exec"), namespace)  # noqa: S102 - our own snippet
    optimizer = namespace["optimizer"]
    for tokens, target in batches:
        optimizer.zero_grad()
        hidden = model["embedding"](tokens)
        out = model["projection"](model["norm"](hidden))
        torch.nn.functional.mse_loss(out, target).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()], optimizer
