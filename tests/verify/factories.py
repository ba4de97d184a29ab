"""Plain ``nn.Module`` models and their hand-patched twins, for ``verify_factory`` tests.

Each ``make_*`` function returns ``(model, example_inputs)`` as ``verify_factory`` expects. The
original block is written the way model code usually is; the patched one keeps the same
``__init__`` (so the same ``state_dict`` keys) and calls ``adopter.kernels`` in ``forward``, as
an automated rewrite would. ``make_wrong`` drops the residual connection - a plausible rewrite
bug that verify must refute.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from adopter.kernels import conv_batch_norm, dropout_add_layer_norm, linear_bias_activation


class Block(nn.Module):
    """conv + batch norm on a feature map, then a post-LN MLP residual block."""

    def __init__(self, width: int = 16, channels: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.up = nn.Linear(width, 2 * width)
        self.act = nn.GELU()
        self.down = nn.Linear(2 * width, width)
        self.dropout = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(width)

    def forward(
        self, image: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.bn(self.conv(image))
        hidden = self.act(self.up(tokens))
        hidden = self.down(hidden)
        hidden = self.dropout(hidden)
        return features, self.norm(hidden + tokens)


class PatchedBlock(Block):
    """The same block through the fused kernels."""

    def forward(
        self, image: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        features = conv_batch_norm(image, self.conv, self.bn)
        hidden = linear_bias_activation(tokens, self.up, self.act)
        hidden = self.down(hidden)
        return features, dropout_add_layer_norm(hidden, tokens, self.dropout, self.norm)


class WrongBlock(Block):
    """A broken rewrite: the residual connection is lost."""

    def forward(
        self, image: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        features = conv_batch_norm(image, self.conv, self.bn)
        hidden = linear_bias_activation(tokens, self.up, self.act)
        hidden = self.down(hidden)
        return features, dropout_add_layer_norm(
            hidden, torch.zeros_like(tokens), self.dropout, self.norm
        )


class RarelyPatchedBlock(Block):
    """A rewrite whose conv + batch-norm kernel only runs for batches over 100: verify never
    reaches it, so the block cannot count as verified."""

    def forward(
        self, image: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if image.shape[0] > 100:
            features = conv_batch_norm(image, self.conv, self.bn)
        else:
            features = self.bn(self.conv(image))
        hidden = self.down(self.act(self.up(tokens)))
        return features, self.norm(self.dropout(hidden) + tokens)


class RenamedBlock(Block):
    """A rewrite that renamed a submodule: checkpoints would no longer load."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_norm = self.norm
        del self.norm

    def forward(
        self, image: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.down(self.act(self.up(tokens)))
        return self.bn(self.conv(image)), self.layer_norm(self.dropout(hidden) + tokens)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 4, 6, 6), torch.randn(2, 5, 16)


def make_original() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    return Block(), _inputs()


def make_patched() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    return PatchedBlock(), _inputs()


def make_wrong() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    return WrongBlock(), _inputs()


def make_renamed() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    return RenamedBlock(), _inputs()


def make_rarely_patched() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    return RarelyPatchedBlock(), _inputs()


def make_slowly() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """A factory that hangs, to exercise the timeout."""
    time.sleep(600)
    return PatchedBlock(), _inputs()


def make_crashing() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """A factory that takes the interpreter down, as a segfaulting extension would."""
    os._exit(3)


def _leave_session(detach: bool) -> None:
    """Start a process that leaves the worker's process group and session (``setsid``) and
    sleeps; with ``detach`` it double-forks so that it is not even the worker's child. Its pid
    goes to the file named by ``ADOPTER_TEST_PIDFILE``."""
    pid_file = os.environ["ADOPTER_TEST_PIDFILE"]
    if os.fork() != 0:
        return
    try:
        os.setsid()
        if detach and os.fork() != 0:
            os._exit(0)
        with open(pid_file, "a", encoding="utf-8") as stream:
            stream.write(f"{os.getpid()}\n")
        time.sleep(600)
    finally:
        os._exit(0)


def make_escaping_then_hanging() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """Leaves a process in a session of its own, then hangs until the timeout."""
    _leave_session(detach=False)
    time.sleep(600)
    return PatchedBlock(), _inputs()


def make_escaping_daemon() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """Leaves a daemon behind (setsid + double fork) and otherwise works."""
    _leave_session(detach=True)
    return PatchedBlock(), _inputs()
