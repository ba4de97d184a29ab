import torch
from torch import nn
from adopter.kernels import add_rms_norm


class TinyRMSNorm(nn.Module):
    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class DecoderLayer(nn.Module):
    """A pre-norm decoder layer: the attention half's residual add, then the MLP's norm."""

    def __init__(self, width):
        super().__init__()
        self.input_layernorm = TinyRMSNorm(width)
        self.attn = nn.Linear(width, width)
        self.post_attention_layernorm = TinyRMSNorm(width)
        self.mlp = nn.Linear(width, width)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.attn(hidden_states)
        hidden_states, residual = add_rms_norm(residual, hidden_states, self.post_attention_layernorm)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states
