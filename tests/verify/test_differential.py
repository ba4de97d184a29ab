"""The per-mode judgement on tiny in-process modules (no worker: these are our own modules)."""

from __future__ import annotations

import os

import torch
from torch import nn

from adopter.verify.compare import tolerance_for
from adopter.verify.differential import (
    SKIPPED,
    ModeOutcome,
    check_mode,
    conclude,
    load_strictly,
    pristine_copies,
    snapshot_state,
)

F32 = tolerance_for(torch.float32)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.linear(x))


class FrozenStats(Net):
    """Normalises with batch statistics but forgets to update the running ones."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return nn.functional.batch_norm(h, None, None, self.bn.weight, self.bn.bias, True)


class DetachedBias(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.linear.weight.T + self.linear.bias.detach()
        return self.bn(h)


class Raising(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("kernel not available")


class Unseeded(Net):
    """Draws noise from the OS, which no seed controls."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = int.from_bytes(os.urandom(2), "little") / 65536
        return super().forward(x) + noise


def judge(original: nn.Module, patched: nn.Module, training: bool) -> ModeOutcome:
    torch.manual_seed(0)
    state = snapshot_state(original)
    assert load_strictly(patched, state) is None
    inputs = (torch.randn(3, 4, generator=torch.Generator().manual_seed(1)),)
    return check_mode(
        pristine_copies(original),
        pristine_copies(patched),
        state,
        inputs,
        training=training,
        seed=0,
        tol=F32,
    )


def test_identical_modules_verify() -> None:
    outcome = judge(Net(), Net(), training=True)
    assert outcome.status == "verified", outcome.detail


def test_missing_running_stat_update_is_refuted_through_buffers() -> None:
    outcome = judge(Net(), FrozenStats(), training=True)
    assert outcome.status == "refuted"
    failing = {d.name for d in outcome.differences if not d.ok}
    assert failing == {
        "buffer bn.running_mean",
        "buffer bn.running_var",
        "buffer bn.num_batches_tracked",
    }
    assert judge(Net(), FrozenStats(), training=False).status == "refuted"  # eval: batch stats


def test_gradient_missing_on_one_side_is_refuted() -> None:
    outcome = judge(Net(), DetachedBias(), training=False)
    assert outcome.status == "refuted"
    assert "grad linear.bias: present only in the original run" in outcome.detail


def test_patched_exception_is_refuted_and_original_noise_not_checkable() -> None:
    raised = judge(Net(), Raising(), training=False)
    assert raised.status == "refuted" and "kernel not available" in raised.detail
    noisy = judge(Unseeded(), Net(), training=False)
    assert noisy.status == "not checkable" and "reproduce" in noisy.detail


class GrowingTable(Net):
    """Keeps state between calls, as sinusoidal position tables and bias caches do."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x) * self.calls


def test_every_run_gets_a_model_that_never_ran() -> None:
    # Re-running one model would make its second run differ from its first (and from the
    # patched model's only run); fresh copies all start at calls == 0.
    outcome = judge(GrowingTable(), GrowingTable(), training=False)
    assert outcome.status == "verified", outcome.detail


def test_strict_load_reports_shape_changes() -> None:
    wider = Net()
    wider.linear = nn.Linear(4, 5)
    problem = load_strictly(wider, snapshot_state(Net()))
    assert problem is not None and "size mismatch" in problem


def test_conclude_folds_modes() -> None:
    ok = judge(Net(), Net(), training=False)
    skipped = ModeOutcome(SKIPPED, "the model has no active dropout")
    verdict = conclude("Net", {"eval": ok, "train": ok, "train-dropout": skipped})
    assert verdict.status == "verified" and "skipped train-dropout" in verdict.reason
    bad = judge(Net(), DetachedBias(), training=False)
    verdict = conclude("Net", {"eval": ok, "train": bad})
    assert verdict.status == "refuted" and verdict.where == "grad linear.bias"
    assert verdict.reason.startswith("train:")
    blocked = ModeOutcome("not checkable", "the original model raised X")
    assert conclude("Net", {"eval": ok, "train": blocked}).status == "not checkable"


class LossModel(nn.Module):
    """A head and a loss, returning both unless told to return only the loss (as a model whose
    loss kernel skips the logits does)."""

    def __init__(self, skip_logits: bool = False, scale: float = 1.0) -> None:
        super().__init__()
        self.head = nn.Linear(4, 5)
        self.skip_logits, self.scale = skip_logits, scale

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor | None]:
        logits = self.head(x)
        loss = nn.functional.cross_entropy(logits, labels) * self.scale
        return {"loss": loss, "logits": None if self.skip_logits else logits}


def test_objective_compares_the_loss_and_its_gradients_only() -> None:
    def judged(patched: nn.Module) -> ModeOutcome:
        original = LossModel()
        state = snapshot_state(original)
        assert load_strictly(patched, state) is None
        inputs = {"x": torch.randn(3, 4), "labels": torch.tensor([0, 4, 2])}
        return check_mode(
            pristine_copies(original),
            pristine_copies(patched),
            state,
            inputs,
            training=True,
            seed=0,
            tol=F32,
            objective="loss",
        )

    agreed = judged(LossModel(skip_logits=True))
    assert agreed.status == "verified", agreed.detail
    assert {d.name for d in agreed.differences} >= {"output loss", "grad head.weight"}
    wrong = judged(LossModel(skip_logits=True, scale=1.5))
    assert wrong.status == "refuted"
    assert {d.name for d in wrong.differences if not d.ok} >= {"output loss", "grad head.bias"}


class SelfAttentionOnly(nn.Module):
    """Runs only when its query, key and value are one tensor (a fused path behind an identity
    test, as `apply` writes it for one input spelled several ways)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        if not (key is query and value is query):
            raise RuntimeError("called with three tensors")
        return self.linear(query)


def test_a_tensor_given_twice_is_one_tensor_in_every_run() -> None:
    torch.manual_seed(0)
    original, patched = SelfAttentionOnly(), SelfAttentionOnly()
    state = snapshot_state(original)
    assert load_strictly(patched, state) is None
    x = torch.randn(3, 4)
    for training in (False, True):
        outcome = check_mode(
            pristine_copies(original),
            pristine_copies(patched),
            state,
            (x, x, x),
            training=training,
            seed=0,
            tol=F32,
        )
        assert outcome.status == "verified", outcome.detail
