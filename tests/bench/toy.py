"""Tiny models for the benchmark tests: an original, a kernel-patched twin, a broken twin.

Module-level factories so that the memory probe can pickle them by reference and rebuild the
model in a fresh interpreter (it inherits ``sys.path``, where pytest put the repository root).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from adopter.kernels import dropout_add_layer_norm, linear_bias_activation


class Block(nn.Module):
    """Post-LN MLP block written the unfused way a model repository writes it."""

    def __init__(self, hidden: int, ffn: int, p: float = 0.1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn, hidden)
        self.dropout = nn.Dropout(p)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        h = self.fc2(h)
        return self.norm(self.dropout(h) + x)


class FusedBlock(Block):
    """The same block as the rewriter would patch it: same modules, same state_dict keys."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = linear_bias_activation(x, self.fc1, self.act)
        h = self.fc2(h)
        return dropout_add_layer_norm(h, x, self.dropout, self.norm)


class ToyMLP(nn.Module):
    def __init__(self, hidden: int = 32, ffn: int = 64, layers: int = 2, fused: bool = False):
        super().__init__()
        cls = FusedBlock if fused else Block
        self.layers = nn.ModuleList(cls(hidden, ffn) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class RenamedBlock(Block):
    """A botched rewrite: renames a submodule, so checkpoints no longer load."""

    def __init__(self, hidden: int, ffn: int, p: float = 0.1) -> None:
        super().__init__(hidden, ffn, p)
        self.up = self.fc1
        del self.fc1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.dropout(self.fc2(self.act(self.up(x)))) + x)


def original(batch: int = 4, seq: int = 8, hidden: int = 32, ffn: int = 64):
    return ToyMLP(hidden, ffn), (torch.randn(batch, seq, hidden),)


def patched(batch: int = 4, seq: int = 8, hidden: int = 32, ffn: int = 64):
    return ToyMLP(hidden, ffn, fused=True), (torch.randn(batch, seq, hidden),)


def renamed(batch: int = 4, seq: int = 8, hidden: int = 32, ffn: int = 64):
    model = ToyMLP(hidden, ffn)
    model.layers[0] = RenamedBlock(hidden, ffn)
    return model, (torch.randn(batch, seq, hidden),)


def wide(batch: int = 64, hidden: int = 256, ffn: int = 4096):
    """One wide block whose activation (batch x ffn floats) dominates the step's memory."""
    return ToyMLP(hidden, ffn, layers=1), (torch.randn(batch, hidden),)


def broken(batch: int = 4, seq: int = 8, hidden: int = 32, ffn: int = 64):
    """Checkpoint-compatible but crashes in forward (stands in for a bad patch)."""
    model = ToyMLP(hidden, ffn)
    model.layers[0].act = _Explode()
    return model, (torch.randn(batch, seq, hidden),)


class _Explode(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("kaboom")


@dataclass
class Output:
    """Stands in for a transformers ``ModelOutput`` with an optional loss."""

    last_hidden_state: torch.Tensor
    loss: torch.Tensor | None = None


class KeywordModel(nn.Module):
    """Takes keyword inputs (ids and a float mask) like a transformers model."""

    def __init__(self, vocab: int = 50, hidden: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels=None):
        h = self.proj(self.embed(input_ids)) * attention_mask.unsqueeze(-1)
        loss = None if labels is None else (h.mean(-1) - labels).pow(2).mean()
        return Output(h, loss)


def keyword(batch: int = 3, seq: int = 5):
    inputs = {
        "input_ids": torch.randint(0, 50, (batch, seq)),
        "attention_mask": torch.ones(batch, seq),
    }
    return KeywordModel(), inputs
