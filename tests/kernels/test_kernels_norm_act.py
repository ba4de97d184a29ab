"""adopter.kernels group_norm_activation / conv_bn_act against the original modules."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from adopter.kernels import conv_batch_norm, conv_bn_act, group_norm_activation
from tests.kernels.conftest import assert_close, assert_traces_like_reference


class BatchNormAct2d(nn.BatchNorm2d):
    """Eval/train semantics of timm's ``BatchNormAct2d`` (BatchNorm, dropout slot, activation),
    written for these tests; the kernel recognises the class by name and defining package."""

    def __init__(self, num_features, act=None, drop=None):
        super().__init__(num_features)
        self.drop = drop if drop is not None else nn.Identity()
        self.act = act if act is not None else nn.ReLU(inplace=True)

    def forward(self, x):
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        x = F.batch_norm(
            x,
            self.running_mean if not self.training or self.track_running_stats else None,
            self.running_var if not self.training or self.track_running_stats else None,
            self.weight,
            self.bias,
            bn_training,
            self.momentum,
            self.eps,
        )
        return self.act(self.drop(x))


class GroupNormAct(nn.GroupNorm):
    """timm's ``GroupNormAct`` (fast-norm off), written for these tests."""

    def __init__(self, channels, groups, act=None):
        super().__init__(groups, channels)
        self.drop = nn.Identity()
        self.act = act if act is not None else nn.SiLU(inplace=True)
        self._fast_norm = False

    def forward(self, x):
        return self.act(
            self.drop(F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps))
        )


for _cls in (BatchNormAct2d, GroupNormAct):
    _cls.__module__ = "timm.layers.norm_act"


def randomise(module):
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_floating_point():
                tensor.copy_(torch.rand(tensor.shape, generator=generator) + 0.5)
    return module


def run(module_fn, x, train, grads):
    xx = x.detach().clone().requires_grad_(grads)
    with torch.set_grad_enabled(grads):
        out = module_fn(xx)
    result = [out.detach()]
    if grads:
        out.backward(torch.linspace(-1, 1, out.numel()).view(out.shape))
        result.append(xx.grad)
    return result


# --- GroupNorm -> activation ----------------------------------------------------------------


@pytest.mark.parametrize("act", [nn.SiLU(), F.silu, nn.GELU(), nn.ReLU(inplace=True)])
@pytest.mark.parametrize("train", [False, True])
def test_group_norm_activation(act, train):
    norm = randomise(nn.GroupNorm(4, 8)).train(train)
    x = torch.randn(2, 8, 5, 5)
    for grads in (False, True):
        kernel = run(lambda x: group_norm_activation(x, norm, act), x, train, grads)
        original = run(lambda x: copy.deepcopy(act)(norm(x)), x, train, grads)
        for a, b in zip(kernel, original, strict=True):
            assert torch.equal(a, b)


def test_timm_group_norm_act():
    norm = randomise(GroupNormAct(8, 2)).eval()
    x = torch.randn(2, 8, 3, 3)
    with torch.no_grad():
        assert torch.equal(group_norm_activation(x, norm), norm(x))


def test_group_norm_activation_in_place_saves_a_buffer():
    norm = nn.GroupNorm(2, 4)
    x = torch.randn(1, 4, 8, 8)
    with torch.no_grad():
        out = group_norm_activation(x, norm, nn.SiLU())
    assert out.untyped_storage().nbytes() == x.numel() * 4


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    groups=st.sampled_from([1, 2, 4]),
    per_group=st.integers(1, 3),
    spatial=st.lists(st.integers(1, 5), min_size=0, max_size=2),
    affine=st.booleans(),
)
def test_property_group_norm(batch, groups, per_group, spatial, affine):
    norm = nn.GroupNorm(groups, groups * per_group, affine=affine).eval()
    x = torch.randn(batch, groups * per_group, *spatial)
    with torch.no_grad():
        try:
            expected = F.silu(norm(x))
        except ValueError:  # a single value per group: the kernel raises as the original does
            with pytest.raises(ValueError):
                group_norm_activation(x, norm, nn.SiLU())
            return
        assert torch.equal(group_norm_activation(x, norm, nn.SiLU()), expected)


# --- Conv -> BatchNorm -> activation ---------------------------------------------------------


def conv_pair(act=None, timm=False, bias=False):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1, bias=bias)
    bn = BatchNormAct2d(8, act) if timm else nn.BatchNorm2d(8)
    randomise(bn)
    return conv, bn


@pytest.mark.parametrize("act_name", ["relu", "silu", "gelu", "none"])
@pytest.mark.parametrize("timm", [False, True])
def test_conv_bn_act_eval_folds(act_name, timm):
    act = {"relu": nn.ReLU(inplace=True), "silu": nn.SiLU(), "gelu": nn.GELU(), "none": None}[
        act_name
    ]
    if timm and act is None:
        act = nn.ReLU(inplace=True)
    conv, bn = conv_pair(act if timm else None, timm)
    conv.eval(), bn.eval()
    x = torch.randn(2, 3, 6, 6)
    kernel_act = None if timm else act

    def original(x):
        y = bn(conv(x))
        return y if timm or act is None else copy.deepcopy(act)(y)

    with torch.no_grad():
        out = conv_bn_act(x, conv, bn, kernel_act)
        assert_close(out, original(x))
    # Eval with gradients (frozen statistics, fine-tuning): the original modules run.
    for a, b in zip(
        run(lambda x: conv_bn_act(x, conv, bn, kernel_act), x, False, True),
        run(original, x, False, True),
        strict=True,
    ):
        assert torch.equal(a, b)


@pytest.mark.parametrize("timm", [False, True])
def test_conv_bn_act_training_is_the_original(timm):
    conv, bn = conv_pair(nn.ReLU(), timm)
    conv_o, bn_o = copy.deepcopy(conv), copy.deepcopy(bn)
    x = torch.randn(2, 3, 6, 6)
    act = None if timm else nn.ReLU()
    out = run(lambda x: conv_bn_act(x, conv, bn, act), x, True, True)
    expected = run(lambda x: bn_o(conv_o(x)) if timm else nn.ReLU()(bn_o(conv_o(x))), x, True, True)
    for a, b in zip(out, expected, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(bn.running_mean, bn_o.running_mean)
    assert torch.equal(bn.num_batches_tracked, bn_o.num_batches_tracked)


def test_conv_bn_act_runs_the_original_for_unknown_parts():
    conv, bn = conv_pair()
    bn.eval()
    calls = []
    bn.register_forward_hook(lambda m, i, o: calls.append(1))
    x = torch.randn(1, 3, 4, 4)
    with torch.no_grad():
        assert torch.equal(conv_bn_act(x, conv, bn, nn.ReLU()), F.relu(bn(conv(x))))
    assert calls == [1, 1]

    class Odd(nn.Module):
        def forward(self, x):
            return x * 2

    conv, bn = conv_pair()
    bn.eval()
    with torch.no_grad():
        assert torch.equal(conv_bn_act(x, conv, bn, Odd()), bn(conv(x)) * 2)


@pytest.mark.parametrize("drop_name", ["identity", "eval_dropout"])
def test_conv_bn_act_with_an_inactive_drop_folds(drop_name):
    conv, bn = conv_pair()
    conv.eval(), bn.eval()
    drop = nn.Identity() if drop_name == "identity" else nn.Dropout(0.5).eval()
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        out = conv_bn_act(x, conv, bn, nn.ReLU(), drop=drop)
        assert_close(out, F.relu(drop(bn(conv(x)))))
    for train in (False, True):
        conv.train(train), bn.train(train)
        expected = run(lambda x: F.relu(drop(bn(conv(x)))), x, train, True)
        got = run(lambda x: conv_bn_act(x, conv, bn, nn.ReLU(), drop=drop), x, train, True)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)


def test_conv_bn_act_with_an_active_or_unknown_drop_runs_the_original():
    class DropBlock(nn.Module):  # timm's DropBlock2d is not recognised: the original runs
        def forward(self, x):
            return x * 0.5

    conv, bn = conv_pair()
    conv.eval(), bn.eval()
    x = torch.randn(1, 3, 4, 4)
    with torch.no_grad():
        block = DropBlock()
        assert torch.equal(
            conv_bn_act(x, conv, bn, nn.ReLU(), drop=block), F.relu(block(bn(conv(x))))
        )
        active = nn.Dropout(0.5).train()
        torch.manual_seed(1)
        out = conv_bn_act(x, conv, bn, nn.ReLU(), drop=active)
        torch.manual_seed(1)
        assert torch.equal(out, F.relu(active(bn(conv(x)))))


@pytest.mark.parametrize("act", [nn.ReLU(inplace=True), nn.Identity(), nn.Hardswish()])
def test_conv_batch_norm_folds_timm_batch_norm_act_with_its_activation(act):
    # paper.7 takes timm's BatchNormAct2d too (apply_act=False leaves an nn.Identity)
    conv, bn = conv_pair(act, timm=True)
    conv.eval(), bn.eval()
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        assert_close(conv_batch_norm(x, conv, bn), bn(conv(x)))
    for train in (False, True):
        conv.train(train), bn.train(train)
        expected = run(lambda x: bn(conv(x)), x, train, True)
        for a, b in zip(run(lambda x: conv_batch_norm(x, conv, bn), x, train, True), expected):
            assert torch.equal(a, b)


def test_timm_trainable_norm_with_a_frozen_conv_runs_the_original():
    conv, bn = conv_pair(nn.SiLU(inplace=True), timm=True)
    conv.eval(), bn.eval()
    conv.requires_grad_(False)
    x = torch.randn(1, 3, 4, 4)
    out = conv_bn_act(x, conv, bn)
    out.sum().backward()  # no in-place activation on a tensor autograd still needs
    grad = bn.weight.grad.clone()
    bn.weight.grad = None
    bn(conv(x)).sum().backward()
    assert torch.equal(grad, bn.weight.grad)


def test_timm_active_dropout_is_not_folded():
    conv, bn = conv_pair(nn.ReLU(), timm=True)
    bn.drop = nn.Dropout(0.5)
    bn.eval()
    bn.drop.train()  # an active dropout inside an eval-mode norm: only the original draws it
    torch.manual_seed(0)
    x = torch.randn(1, 3, 4, 4)
    with torch.no_grad():
        torch.manual_seed(1)
        out = conv_bn_act(x, conv, bn)
        torch.manual_seed(1)
        assert torch.equal(out, bn(conv(x)))


def test_traces_record_the_original_operations():
    conv, bn = conv_pair()
    conv.eval(), bn.eval()
    norm = nn.GroupNorm(2, 8).eval()
    x = torch.randn(1, 3, 4, 4)

    class Kernel(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.norm, self.act = conv, bn, norm, nn.ReLU()

        def forward(self, x):
            y = conv_bn_act(x, self.conv, self.bn, self.act)
            return group_norm_activation(y, self.norm, F.silu)

    class Original(Kernel):
        def forward(self, x):
            return F.silu(self.norm(self.act(self.bn(self.conv(x)))))

    with torch.no_grad():
        assert_traces_like_reference(Kernel().eval(), Original().eval(), [x])
