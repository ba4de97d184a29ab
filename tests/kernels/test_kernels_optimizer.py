"""``fused_optimizer`` and ``fused_training_optimizer`` (the ``train`` rule set's kernels): fused
where torch accepts it, exactly the written construction everywhere else, and the same
parameters after training as the optimizer the user wrote (``adopter.verify.optimizer``)."""

from __future__ import annotations

import sys

import pytest
import torch

from adopter.kernels import fused_optimizer, fused_training_optimizer
from adopter.rules import load_rule_set
from adopter.verify.optimizer import prove_optimizer_rewrite

TRAIN = load_rule_set("train")


def _fused(optimizer: torch.optim.Optimizer) -> list[object]:
    return [group.get("fused") for group in optimizer.param_groups]


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD])
def test_float_parameters_on_the_cpu_get_the_fused_kernel(cls):
    model = torch.nn.Linear(4, 4)
    optimizer = fused_optimizer(cls, model.parameters(), lr=0.1)
    assert type(optimizer) is cls
    assert _fused(optimizer) == [True]
    assert len(optimizer.param_groups[0]["params"]) == 2  # the generator was read once


def test_parameter_groups_and_params_by_keyword_are_kept():
    model = torch.nn.Linear(4, 4)
    groups = [{"params": model.weight}, {"params": [model.bias], "weight_decay": 0.0}]
    optimizer = fused_optimizer(torch.optim.AdamW, params=groups, lr=1e-3, weight_decay=0.1)
    assert _fused(optimizer) == [True, True]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]


def test_named_parameters_are_accepted():
    model = torch.nn.Linear(4, 4)
    optimizer = fused_optimizer(torch.optim.Adam, model.named_parameters())
    assert _fused(optimizer) == [True]


@pytest.mark.parametrize(
    "kwargs", [{"fused": False}, {"foreach": True}, {"differentiable": True}, {"capturable": True}]
)
def test_a_call_that_chose_its_implementation_is_built_as_written(kwargs):
    model = torch.nn.Linear(4, 4)
    optimizer = fused_optimizer(torch.optim.Adam, model.parameters(), **kwargs)
    assert optimizer.param_groups[0]["fused"] in (None, False)
    for key, value in kwargs.items():
        assert optimizer.param_groups[0][key] is value


def test_parameters_the_fused_kernel_refuses_fall_back():
    complex_parameter = torch.nn.Parameter(torch.ones(3, dtype=torch.complex64))
    optimizer = fused_optimizer(torch.optim.AdamW, [complex_parameter])
    assert optimizer.param_groups[0]["fused"] in (None, False)
    plain_fused = torch.optim.AdamW([complex_parameter], fused=True)
    complex_parameter.abs().sum().backward()
    optimizer.step()  # the fallback steps
    with pytest.raises(RuntimeError, match="fused"):  # where fused=True written out would fail
        plain_fused.step()


def test_a_subclass_is_built_as_written():
    class Mine(torch.optim.AdamW):
        pass

    optimizer = fused_optimizer(Mine, torch.nn.Linear(2, 2).parameters())
    assert type(optimizer) is Mine and optimizer.param_groups[0]["fused"] in (None, False)


def test_sgd_with_a_sparse_gradient_steps_unfused_and_matches_sgd():
    torch.manual_seed(0)
    original = torch.nn.Embedding(10, 4, sparse=True)
    rewritten = torch.nn.Embedding(10, 4, sparse=True)
    rewritten.load_state_dict(original.state_dict())
    plain = torch.optim.SGD(original.parameters(), lr=0.1)
    fused = fused_optimizer(torch.optim.SGD, rewritten.parameters(), lr=0.1)
    assert _fused(fused) == [True]
    for module, optimizer in ((original, plain), (rewritten, fused)):
        module(torch.tensor([1, 2, 2])).sum().backward()
        optimizer.step()
    assert _fused(fused) == [False]
    torch.testing.assert_close(rewritten.weight, original.weight, rtol=0, atol=0)


def test_training_arguments_get_the_fused_adamw_on_the_cpu(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_xla", raising=False)
    assert fused_training_optimizer("adamw_torch") == "adamw_torch_fused"
    assert fused_training_optimizer("adafactor") == "adafactor"
    monkeypatch.setitem(sys.modules, "torch_xla", object())
    assert fused_training_optimizer("adamw_torch") == "adamw_torch"


@pytest.mark.parametrize(
    "call",
    [
        "torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)",
        "torch.optim.Adam(params, lr=1e-2, amsgrad=True)",
        "torch.optim.Adam(params, lr=1e-2, maximize=True, weight_decay=0.01)",
        "torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True)",
        "torch.optim.SGD(params, lr=0.1, weight_decay=1e-4)",
    ],
)
def test_the_rewrite_trains_to_the_same_parameters(call):
    proof = prove_optimizer_rewrite(call, TRAIN, steps=10)
    assert proof.proven, proof.verdict
    assert proof.patched_call.startswith("fused_optimizer(torch.optim.")


def test_the_proof_can_fail_and_cannot_pass_without_a_rewrite():
    exact = prove_optimizer_rewrite("torch.optim.AdamW(params, lr=1e-2)", TRAIN, rtol=0, atol=0)
    assert exact.max_abs_diff > 0 and not exact.proven and exact.verdict.startswith("refuted")
    left = prove_optimizer_rewrite("torch.optim.AdamW(params, fused=False)", TRAIN)
    assert not left.proven and left.verdict.startswith("not exercised")
