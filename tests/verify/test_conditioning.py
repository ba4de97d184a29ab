"""The weights a proof runs with: constants redrawn, batch-norm statistics calibrated."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from adopter.models.interface import Subject
from adopter.verify import VerifyOptions
from adopter.verify.conditioning import conditioned_state
from adopter.verify.differential import snapshot_state
from adopter.verify.prove import prove


class _ConvNorm(nn.Module):
    """conv -> batch norm -> ReLU -> head, with a weight the library would tie elsewhere."""

    def __init__(self, fold: str | None = None) -> None:
        super().__init__()
        self.fold = fold
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.gate = nn.Parameter(torch.zeros(1))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fold is not None and not self.training and not torch.is_grad_enabled():
            bn = self.bn
            mean = torch.zeros_like(bn.running_mean) if self.fold == "no mean" else bn.running_mean
            scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
            bias = torch.zeros_like(bn.bias) if self.fold == "no norm bias" else bn.bias
            weight = self.conv.weight * scale.view(-1, 1, 1, 1)
            y = F.conv2d(x, weight, (self.conv.bias - mean) * scale + bias, padding=1)
        else:
            y = self.bn(self.conv(x))
        pooled = y.relu().mean(dim=(2, 3))
        return self.head(pooled) * (1 + self.gate)


def _subject(fold: str) -> Subject:
    def build(patched_fold: str | None) -> nn.Module:
        torch.manual_seed(0)
        return _ConvNorm(patched_fold)

    inputs = ((torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1)) * 3 + 2),)
    return Subject("_ConvNorm", "", lambda: build(None), lambda: build(fold), inputs=inputs)


def test_a_fold_that_ignores_the_running_mean_or_the_norm_s_bias_is_refuted() -> None:
    """Fresh from its initialiser a batch norm has mean 0, variance 1 and bias 0: a fold that
    skips the mean or the bias would match there. With statistics calibrated on the inputs and
    the constant bias redrawn it does not."""
    options = VerifyOptions(modes=("eval",))
    assert prove(_subject("correct"), None, options).status == "verified"
    for mutant in ("no mean", "no norm bias"):
        wrong = prove(_subject(mutant), None, options)
        assert wrong.status == "refuted", (mutant, wrong.reason)


def test_constant_parameters_are_redrawn_around_their_value_and_ties_kept() -> None:
    def tied() -> nn.Module:
        model = _ConvNorm()
        model.second_head = nn.Linear(4, 2)
        model.second_head.bias = model.head.bias = nn.Parameter(torch.zeros(2))
        return model

    state = snapshot_state(tied())
    conditioned = conditioned_state(state, tied, None, seed=0)
    assert torch.equal(conditioned["head.bias"], conditioned["second_head.bias"])
    weight = conditioned["bn.weight"]
    assert not torch.equal(weight, state["bn.weight"])
    assert bool(((weight >= 0.5) & (weight < 1.5)).all())
    assert conditioned["bn.bias"].abs().max() > 0  # zeros get a small spread
    assert torch.equal(conditioned["conv.weight"], state["conv.weight"])  # already varied
    assert conditioned_state(state, lambda: _ConvNorm(), None, seed=0).keys() == state.keys()


def test_batch_norm_statistics_are_those_of_what_reaches_it() -> None:
    model = _ConvNorm()
    x = torch.randn(2, 3, 6, 6) * 3 + 2
    conditioned = conditioned_state(snapshot_state(model), lambda: _ConvNorm(), (x,), seed=0)
    fresh = _ConvNorm()
    fresh.load_state_dict(conditioned)
    reached = fresh.conv(x).detach()
    assert torch.allclose(conditioned["bn.running_mean"], reached.mean(dim=(0, 2, 3)), atol=1e-5)
    expected = reached.var(dim=(0, 2, 3), unbiased=False).clamp_min(1e-2)
    assert torch.allclose(conditioned["bn.running_var"], expected, atol=1e-5)


def test_a_model_that_fails_to_run_keeps_its_statistics() -> None:
    model = _ConvNorm()
    state = snapshot_state(model)
    wrong_shape = (torch.randn(2, 5, 6, 6),)
    conditioned = conditioned_state(state, lambda: _ConvNorm(), wrong_shape, seed=0)
    assert torch.equal(conditioned["bn.running_mean"], state["bn.running_mean"])
    assert torch.equal(conditioned["bn.running_var"], state["bn.running_var"])
