"""Proof of an optimizer rewrite (the ``train`` rule set): the construction as written and as
``apply`` rewrites it train two copies of one small model for N steps on the same batches, and
the parameters must agree within a tolerance, with the rewritten optimizer actually fused.

The rewrite is the real one: the construction's source goes through scan and apply with the
given rules, and the patched text runs (it imports ``adopter.kernels`` itself, as a user's
rewritten script does). A rewrite that left the call alone, or whose optimizer did not take the
fused path, is reported as not exercised, never as proven.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Sequence
from dataclasses import dataclass

from ..dsl.syntax import Rule
from ..match.matcher import Matcher
from ..models.sites import PatchedSite
from ..rewrite.driver import rewrite_text
from .results import NOT_CHECKABLE, REFUTED, VERIFIED, ClassVerification

OPTIMIZER_KERNEL = "fused_optimizer"  # the train rules' kernel this module proves

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


def optimizer_verdicts(patched: str, sites: Sequence[PatchedSite]) -> list[ClassVerification]:
    """A proof per ``fused_optimizer`` call among ``sites`` of the ``patched`` text: the
    construction it stands for (``torch.optim.X(params, ...)`` with the call's other arguments)
    is rewritten again by the ``train`` rules and both train the small model. A check counts
    the site as run in mode ``train-steps`` when its proof went through; a construction whose
    other arguments are not literals (``lr=args.lr``) cannot be rebuilt and is not checkable."""
    from ..rules import load_rule_set

    wanted = [site for site in sites if site.kernel == OPTIMIZER_KERNEL]
    if not wanted:  # every verified file passes here: no parse, no rule set
        return []
    calls = {
        (node.lineno, node.col_offset): node
        for node in ast.walk(ast.parse(patched))
        if isinstance(node, ast.Call) and _callee(node.func) == OPTIMIZER_KERNEL
    }
    rules = load_rule_set("train")
    verdicts = []
    for site in wanted:
        node = calls.get((site.line, site.column))
        if node is None:
            continue
        call, why_not = _construction(node)
        name = f"optimizer at line {site.original_line or site.line}"
        if call is None:
            verdicts.append(ClassVerification(name, NOT_CHECKABLE, why_not))
            continue
        proof = prove_optimizer_rewrite(call, rules)
        refuted = proof.patched_call and proof.fused and not proof.matched
        status = VERIFIED if proof.proven else REFUTED if refuted else NOT_CHECKABLE
        verdicts.append(
            ClassVerification(
                name,
                status,
                f"{call}: {proof.verdict}",
                max_abs_diff=proof.max_abs_diff,
                where="parameters after training",
                modes={"train-steps": proof.verdict},
                runs={"train-steps": {site.key: proof.steps}} if proof.proven else {},
            )
        )
    return verdicts


def _callee(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _construction(node: ast.Call) -> tuple[str | None, str]:
    """``torch.optim.X(params, ...)`` for ``fused_optimizer(X, <params>, ...)``, or why not."""
    unpacked = any(isinstance(a, ast.Starred) for a in node.args)
    if not node.args or unpacked or any(k.arg is None for k in node.keywords):
        return None, "the call's arguments are unpacked at run time"
    optimizer = _callee(node.args[0])
    arguments = ["params"] if len(node.args) > 1 else []
    rest = [("", a) for a in node.args[2:]]
    rest += [(f"{k.arg}=", k.value) for k in node.keywords if k.arg != "params"]
    if any(k.arg == "params" for k in node.keywords):
        arguments.append("params=params")
    for prefix, value in rest:
        try:
            ast.literal_eval(value)
        except ValueError:
            return None, (
                f"`{prefix}{ast.unparse(value)}` is a run-time value: the proof rebuilds the "
                "construction from literal arguments only"
            )
        arguments.append(prefix + ast.unparse(value))
    return f"torch.optim.{optimizer}({', '.join(arguments)})", ""
