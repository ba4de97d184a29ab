"""Plain ``nn.Module`` code (no transformers) for ``adopter bench --factory`` tests.

Written the unfused way model repositories write it, so the rules find sites here: a
convolution followed by batch norm (``paper.7``) and a post-LN residual block (``paper.5``).
The factory lives in the same module as the classes, so calling it from a patched copy of the
module builds the patched classes.
"""

from __future__ import annotations

import torch
from torch import nn


class ConvStem(nn.Module):
    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        h = self.bn(h)
        return self.act(h)


class ResidualNorm(nn.Module):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(0.1)
        self.LayerNorm = nn.LayerNorm(hidden)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
        return hidden_states


class TinyNet(nn.Module):
    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.stem = ConvStem(channels)
        self.block = ResidualNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x).mean(dim=(2, 3))
        return self.block(h, h)


def build() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The benchmark factory: a tiny model and a batch of small images."""
    return TinyNet(), (torch.randn(2, 3, 8, 8),)
