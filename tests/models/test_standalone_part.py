"""A layer class no model builds, built on its own with widths guessed by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adopter.models.interface import BuildSettings
from adopter.models.parts import STANDALONE_WIDTH, MainOutput, standalone_part

SETTINGS = BuildSettings(seed=0, dtype="float32")


class ChannelGate(nn.Module):
    """Channels first, as a convolutional attention layer takes them."""

    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(channels, channels // reduction, 1)
        self.expand = nn.Conv2d(channels // reduction, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.expand(self.squeeze(x.mean((2, 3), keepdim=True)).relu()).sigmoid()


class TokenPool(nn.Module):
    """No layer of its own to read a width from: the guessed widths are tried."""

    def __init__(self, dim: int, scale: float = 1.0) -> None:
        super().__init__()
        self.dim, self.scale = dim, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[-1] == self.dim
        return (x * self.scale).softmax(-1).mean(1)


class NeedsVocabulary(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()


def test_a_layer_is_built_with_its_widths_and_runs_on_the_inputs_its_layers_take() -> None:
    model, (shape, inputs) = standalone_part(ChannelGate, SETTINGS, {"reduction": 8})
    assert isinstance(model, MainOutput) and model.part.squeeze.out_channels == 4
    assert shape == f"2x{STANDALONE_WIDTH}x8x8"
    assert model(*inputs).shape == (2, STANDALONE_WIDTH, 8, 8)


def test_a_layer_without_layers_of_its_own_tries_maps_tokens_and_vectors() -> None:
    model, (shape, _) = standalone_part(TokenPool, SETTINGS, {"scale": 0.5})
    assert shape == f"2x5x{STANDALONE_WIDTH}" and model.part.scale == 0.5


def test_a_required_argument_that_is_no_width_is_not_guessed() -> None:
    with pytest.raises(ValueError, match="requires 'num_classes'"):
        standalone_part(NeedsVocabulary, SETTINGS, {})
