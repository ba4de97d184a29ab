import torch
from torch import nn
from adopter.kernels import gated_activation


class GatedUnit(nn.Module):
    """A gated linear unit's element-wise half: the activated gate times the up projection."""

    def __init__(self):
        super().__init__()
        self.act = nn.SiLU()

    def forward(self, gate, up):
        return gated_activation(gate, up, self.act)
