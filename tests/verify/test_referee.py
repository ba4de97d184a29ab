"""The float64 referee of float32 refutations, on a tiny ill-conditioned module of our own.

``OnePassNorm`` normalises activations that sit far from zero (an offset of 100) with the
one-pass variance E[h^2] - E[h]^2: the subtraction cancels about four of float32's seven
digits, so rounding that a correct rewrite reorders moves outputs and gradients by ~100x the
float32 tolerance. The two-pass variance (centre first, then square) is the same mathematics
and far more accurate; a changed or dropped epsilon is a real change of similar size.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from adopter.verify import ClassVerification, FileVerification, differential
from adopter.verify.compare import compare_values, referee_value, tolerance_for
from adopter.verify.differential import (
    ModeOutcome,
    check_mode,
    conclude,
    load_strictly,
    pristine_copies,
    snapshot_state,
)
from adopter.verify.report import class_row

F32 = tolerance_for(torch.float32)


class OnePassNorm(nn.Module):
    offset = 100.0
    eps = 1e-2

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)
        self.weight = nn.Parameter(torch.ones(32))

    def variance(self, h: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return (h * h).mean(-1, keepdim=True) - mean * mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x) + self.offset
        mean = h.mean(-1, keepdim=True)
        return (h - mean) / torch.sqrt(self.variance(h, mean) + self.eps) * self.weight


class TwoPass(OnePassNorm):
    """A correct rewrite: the same variance, summed in another order."""

    def variance(self, h: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return (h - mean).pow(2).mean(-1, keepdim=True)


class ChangedEps(TwoPass):
    eps = 2e-2


class DroppedEps(TwoPass):
    eps = 0.0


class DetachedWeight(TwoPass):
    """Correct numbers, but the scale gets no gradient: a structural mismatch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x) + self.offset
        mean = h.mean(-1, keepdim=True)
        return (h - mean) / torch.sqrt(self.variance(h, mean) + self.eps) * self.weight.detach()


class Float32Only(OnePassNorm):
    """Keeps a float32 tensor outside its parameters and buffers, so that in float64 its
    matrix product fails: a model that cannot be run in float64."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = torch.eye(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) @ self.mix


class Float32OnlyTwoPass(Float32Only, TwoPass):
    pass


class Noisy(OnePassNorm):
    """Draws noise in training, as dropout does: a float64 run draws other numbers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out + 1e-3 * torch.randn_like(out) if self.training else out


class NoisyTwoPass(Noisy, TwoPass):
    pass


def judge(
    original: type[nn.Module], patched: type[nn.Module], seed: int = 0, training: bool = False
) -> ModeOutcome:
    torch.manual_seed(seed)
    first, second = original(), patched()
    state = snapshot_state(first)
    assert load_strictly(second, state) is None
    inputs = (torch.randn(16, 32, generator=torch.Generator().manual_seed(1)),)
    return check_mode(
        pristine_copies(first),
        pristine_copies(second),
        state,
        inputs,
        training=training,
        seed=0,
        tol=F32,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_correct_rewrite_beyond_the_float32_tolerance_is_verified_by_the_referee(
    seed: int,
) -> None:
    outcome = judge(OnePassNorm, TwoPass, seed)
    assert outcome.status == "verified", outcome.detail
    failing = [d for d in outcome.differences if not d.ok]
    assert failing and max(d.excess for d in failing) > 10  # far beyond the tolerance
    assert outcome.referee is not None and outcome.referee["settled"] is True
    assert outcome.referee["values"] == len(failing)
    assert outcome.referee["patched_error"] < outcome.referee["original_error"]
    assert "float32 results differ beyond the tolerance" in outcome.detail
    assert "rounding the model amplifies" in outcome.detail


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("wrong", [ChangedEps, DroppedEps])
def test_a_wrong_rewrite_in_the_same_model_stays_refuted(wrong: type, seed: int) -> None:
    outcome = judge(OnePassNorm, wrong, seed)
    assert outcome.status == "refuted"
    assert outcome.referee is not None and outcome.referee["settled"] is False
    figures = outcome.referee
    assert figures["patched_error"] > 5 * (figures["original_error"] + figures["allowance"])
    assert "float64 referee: against a float64 run of the original" in outcome.detail


def test_structural_mismatches_never_reach_the_referee(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_referee(*args: object, **kwargs: object) -> None:
        raise AssertionError("the referee must not run")

    monkeypatch.setattr(differential, "referee_value", no_referee)
    # numbers beyond the tolerance plus a gradient missing on one side
    missing = judge(OnePassNorm, DetachedWeight)
    assert missing.status == "refuted" and missing.referee is None
    assert "present only in the original run" in missing.detail
    assert "float64" not in missing.detail
    # a NaN pattern, an integer value or a shape is a structural difference too
    nan = torch.tensor([float("nan"), 1.0])
    assert not compare_values("v", nan, torch.tensor([1.0, 1.0]), F32).numeric
    assert not compare_values("v", torch.tensor([1, 2]), torch.tensor([1, 3]), F32).numeric
    assert not compare_values("v", torch.zeros(2), torch.zeros(3), F32).numeric
    assert compare_values("v", torch.zeros(2), torch.ones(2), F32).numeric


def test_a_float64_mode_gets_no_referee() -> None:
    torch.manual_seed(0)
    first, second = OnePassNorm().double(), ChangedEps().double()
    state = snapshot_state(first)
    inputs = (torch.randn(16, 32, generator=torch.Generator().manual_seed(1)).double(),)
    outcome = check_mode(
        pristine_copies(first),
        pristine_copies(second),
        state,
        inputs,
        training=False,
        seed=0,
        tol=tolerance_for(torch.float64),
    )
    assert outcome.status == "refuted" and outcome.referee is None


def test_an_original_that_refuses_float64_stays_refuted_with_the_reason() -> None:
    outcome = judge(Float32Only, Float32OnlyTwoPass)
    assert outcome.status == "refuted"
    assert "no float64 referee: the original model in float64 raised RuntimeError" in outcome.detail
    assert outcome.referee is not None and outcome.referee["settled"] is False


def test_a_reference_that_draws_random_numbers_is_not_trusted() -> None:
    outcome = judge(Noisy, NoisyTwoPass, training=True)
    assert outcome.status == "refuted"
    assert "draws other random numbers" in outcome.detail
    assert judge(Noisy, NoisyTwoPass, training=False).status == "verified"  # no draws in eval


def test_referee_value_judges_the_largest_error_per_tensor() -> None:
    reference = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    original = torch.tensor([1.01, 2.0, 3.0])  # off by 0.01 in one element
    closer = torch.tensor([1.0, 2.005, 3.005])  # off by 0.005 in two others: passes
    farther = torch.tensor([1.0, 2.0, 3.03])
    assert referee_value("v", original, closer, reference, F32).passes
    figures = referee_value("v", original, farther, reference, F32)
    assert not figures.passes and figures.patched_error == pytest.approx(0.03, rel=1e-5)
    assert figures.allowance == pytest.approx(3e-5)
    nan_here = torch.tensor([float("nan"), 2.0, 3.0])
    assert not referee_value("v", nan_here, nan_here, reference, F32).passes


def test_verdicts_count_the_modes_the_referee_settled() -> None:
    settled = judge(OnePassNorm, TwoPass)
    plain = judge(TwoPass, TwoPass)
    assert plain.status == "verified" and plain.referee is None
    verdict = conclude("OnePassNorm", {"eval": plain, "train": settled})
    assert verdict.status == "verified" and verdict.settled_by_referee == ["train"]
    assert "in train only after the float64 referee" in verdict.reason
    assert ClassVerification.from_json(verdict.to_json()) == verdict
    assert class_row("m.py", verdict)["referee"]["train"]["settled"] is True
    assert "settled by the float64 referee in OnePassNorm (train)" in (
        FileVerification(Path("m.py"), [verdict]).reason()
    )
    refuted = conclude("OnePassNorm", {"eval": judge(OnePassNorm, ChangedEps)})
    assert refuted.status == "refuted" and refuted.settled_by_referee == []
    assert refuted.referee["eval"]["settled"] is False


class Cancelled(nn.Module):
    """Outputs whose true value is exactly zero (each row's deviations from its mean, summed):
    in float32 they are all rounding, as the gradient of a bias feeding a train-mode batch norm
    is all cancellation."""

    extra = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 512)

    def rows(self, h: torch.Tensor) -> torch.Tensor:
        return (h - h.mean(-1, keepdim=True)).sum(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rows(self.linear(x) * 1e4 + 1e4) + self.extra


class CancelledOtherOrder(Cancelled):
    """The same zeros, summed before subtracting: other (larger) float32 rounding."""

    def rows(self, h: torch.Tensor) -> torch.Tensor:
        return h.sum(-1) - h.shape[-1] * h.mean(-1)


class CancelledWrong(CancelledOtherOrder):
    extra = 0.5


@pytest.mark.parametrize("seed", [0, 1])
def test_a_value_that_is_all_rounding_is_judged_in_float64(seed: int) -> None:
    outcome = judge(Cancelled, CancelledOtherOrder, seed)
    assert outcome.status == "verified", outcome.detail
    assert outcome.referee is not None and outcome.referee["settled"]
    wrong = judge(Cancelled, CancelledWrong, seed)
    assert wrong.status == "refuted"
    assert "in float64 does not agree" in wrong.detail


def test_a_noise_value_needs_the_patched_float64_run_to_agree() -> None:
    reference = torch.tensor([1e-19, -1e-19], dtype=torch.float64)
    original = torch.tensor([0.1, -0.05])
    patched = torch.tensor([-0.3, 0.2])
    figures = referee_value("grad bias", original, patched, reference, F32)
    assert figures.is_noise and not figures.passes  # nothing known about float64 yet
    closer = referee_value("grad bias", original, original * 0.5, reference, F32)
    assert closer.is_noise and not closer.passes  # closer noise says nothing either
    assert replace(figures, agrees_in_float64=True).passes
    assert not replace(figures, agrees_in_float64=False).passes
    signal = referee_value(
        "v", torch.tensor([1.01]), torch.tensor([1.05]), torch.tensor([1.0]).double(), F32
    )
    assert not signal.is_noise  # a value with a true magnitude keeps the plain rule
    assert not replace(signal, agrees_in_float64=True).passes


class Chaotic(nn.Module):
    """Outputs rounding moves far: the sine of 10^4 times a linear layer, so the layer's
    float32 rounding (~1e-7) moves them by ~1e-3, a hundred times the tolerance, and which of two
    float32 runs lands nearer the float64 one is chance."""

    gain = 1e4
    shift = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.gain * self.project(x)) + self.shift


class ChaoticOtherOrder(Chaotic):
    """The same layer, summed in another order: a correct rewrite."""

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return (x.unsqueeze(-1) * self.linear.weight.t()).sum(-2) + self.linear.bias


class ChaoticShifted(ChaoticOtherOrder):
    shift = 0.5


def test_a_near_miss_needs_the_patched_float64_run_to_agree() -> None:
    reference = torch.tensor([1.0, -2.0], dtype=torch.float64)
    original = torch.tensor([1.001, -2.0])
    within_twice = referee_value("v", original, torch.tensor([1.0018, -2.0]), reference, F32)
    assert within_twice.near_miss and not within_twice.passes  # float64 not run yet
    assert replace(within_twice, agrees_in_float64=True).passes
    assert not replace(within_twice, agrees_in_float64=False).passes
    beyond = referee_value("v", original, torch.tensor([1.003, -2.0]), reference, F32)
    assert not beyond.near_miss and not replace(beyond, agrees_in_float64=True).passes
    closer = referee_value("v", original, torch.tensor([1.0005, -2.0]), reference, F32)
    assert closer.passes and not closer.near_miss  # the plain rule settles it alone


def test_a_correct_reordering_that_rounds_worse_by_chance_is_verified_in_float64() -> None:
    # at this seed the correct rewrite lands up to 1.5x farther from the float64 run than the
    # original: the referee's plain rule refutes it, its float64 run agrees to nine digits
    outcome = judge(Chaotic, ChaoticOtherOrder, 4)
    assert outcome.status == "verified", outcome.detail
    assert "within twice: the patched model in float64 agrees" in outcome.detail


class ChaoticOtherOrderFloat32Only(ChaoticOtherOrder):
    """The correct rewrite as a kernel without float64 (many GPU kernels): its float64 run
    fails, so a near miss cannot be settled there."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = torch.eye(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) @ self.mix


@pytest.mark.parametrize("seed", [3, 4])
def test_an_ill_conditioned_comparison_is_not_checkable_rather_than_refuted(seed: int) -> None:
    # at these seeds the correct rewrite lands farther from the float64 run than the original,
    # its own float64 run fails (the referee refutes it), and weights one rounding unit apart
    # move the original as far
    outcome = judge(Chaotic, ChaoticOtherOrderFloat32Only, seed)
    assert outcome.status == "not checkable", outcome.detail
    assert "float64 referee: against a float64 run of the original" in outcome.detail
    assert "ill-conditioned here" in outcome.detail
    # a change larger than what rounding moves stays refuted in the same model
    wrong = judge(Chaotic, ChaoticShifted, seed)
    assert wrong.status == "refuted" and "ill-conditioned" not in wrong.detail


def test_weights_one_rounding_unit_apart() -> None:
    state = {"w": torch.ones(1000), "steps": torch.tensor([3])}
    moved = differential.one_ulp_apart(state, seed=0)
    step = (moved["w"] - 1).abs()
    assert torch.all(step == torch.finfo(torch.float32).eps)
    assert 300 < int((moved["w"] > 1).sum()) < 700  # up or down at random
    assert torch.equal(moved["steps"], state["steps"])  # integers untouched


class ExactlyZero(nn.Module):
    """Outputs that are exactly zero in any precision as written: a sum minus the same sum.
    The original's float32 run hits zero exactly, the float64 run too, so no float32 error of
    the original's can say how much rounding the value carries."""

    extra = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 512)

    def difference(self, h: torch.Tensor) -> torch.Tensor:
        return h.sum(-1) - h.sum(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.difference(self.linear(x) * 1e4 + 1e4) + self.extra


class ExactlyZeroInHalves(ExactlyZero):
    """The same zero, the first sum taken in two halves: float32 rounding is left over."""

    def difference(self, h: torch.Tensor) -> torch.Tensor:
        half = h.shape[-1] // 2
        return (h[..., :half].sum(-1) + h[..., half:].sum(-1)) - h.sum(-1)


class ExactlyZeroWrong(ExactlyZeroInHalves):
    extra = 1e-3


def test_a_value_exactly_zero_in_float64_is_judged_in_float64() -> None:
    outcome = judge(ExactlyZero, ExactlyZeroInHalves)
    assert outcome.status == "verified", outcome.detail
    assert outcome.referee is not None and outcome.referee["settled"]
    assert outcome.referee["original_error"] == 0.0
    wrong = judge(ExactlyZero, ExactlyZeroWrong)
    assert wrong.status == "refuted"
    assert "in float64 does not agree" in wrong.detail
    zero = referee_value(
        "v", torch.zeros(3), torch.full((3,), 2e-5), torch.zeros(3, dtype=torch.float64), F32
    )
    assert zero.exact_zero and zero.is_noise and not zero.passes
    assert replace(zero, agrees_in_float64=True).passes


class UpcastSoftmax(nn.Module):
    """Eager attention's habit: the softmax computed in float32 whatever the input's dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.linear(x)
        probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(x.dtype)
        return probs * scores.float() + torch.ones(32)


def test_the_referee_run_carries_no_float32_rounding() -> None:
    torch.manual_seed(0)
    model = UpcastSoftmax().to(torch.float64)
    x = torch.randn(4, 32, dtype=torch.float64)
    with torch.no_grad():
        scores = model.linear(x)
        exact = torch.softmax(scores, dim=-1) * scores + 1
        with differential.Float64Throughout():
            raised = model(x)
        plain = model(x)
    assert raised.dtype == torch.float64 and torch.equal(raised, exact)
    assert not torch.equal(plain, exact)  # as written, the softmax keeps float32's rounding
    assert torch.get_default_dtype() == torch.float32


class _CastingSquare(torch.autograd.Function):
    """A kernel's own backward that computes in float32, as the fused kernels do."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        (x,) = ctx.saved_tensors
        return (2 * grad.to(torch.float32) * x.to(torch.float32)).to(x.dtype)


def test_the_referee_run_widens_a_kernel_s_own_backward_too() -> None:
    x = (torch.rand(64, dtype=torch.float64) + 1) / 3  # thirds: not exact in float32
    exact = 2 * x
    with differential.Float64Throughout():
        widened = x.clone().requires_grad_()
        _CastingSquare.apply(widened).sum().backward()
    assert widened.grad is not None and torch.equal(widened.grad, exact)
    plain = x.clone().requires_grad_()
    _CastingSquare.apply(plain).sum().backward()
    assert plain.grad is not None and not torch.equal(plain.grad, exact)
