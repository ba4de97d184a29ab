"""Model source written for the write-safety tests: a BERT-like file with one site of each of
the paper's rules 4-8, and comments, strings and a docstring around them (our own text)."""

from __future__ import annotations

BERT_LIKE = '''\
"""A small BERT-like encoder: self-output, intermediate, attention scores, a conv stem."""
import math

import torch
from torch import nn
import torch.nn.functional as F

ACT2FN = {"gelu": nn.GELU(), "relu": nn.ReLU()}
GREETING = "d\u00e9j\u00e0 vu, na\u00efve caf\u00e9"


class BertSelfOutput(nn.Module):
    """Projection, then dropout, residual add and layer norm."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=1e-12)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        # regularise before the residual
        hidden_states = self.dropout(hidden_states)  # page break
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
        return hidden_states


class BertIntermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.intermediate_act_fn(hidden_states)  # "gelu" by default
        return hidden_states


class BertScores(nn.Module):
    def forward(self, query, key, mask=None):
        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(query.size(-1))
        if mask is not None:
            scores = scores + mask  # additive mask
        probabilities = F.softmax(scores, dim=-1)
        return probabilities


class ConvStem(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, pixels):
        label = "stem: conv then norm"
        features = self.conv(pixels)
        features = self.bn(features)
        return features


class Projector(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x):
        return self.norm(self.fc(x))  # folded in eval
'''

# Each rule's site in BERT_LIKE, and a fragment of its patched line.
PATCHED_FRAGMENTS = {
    "paper.4": "probabilities = softmax(scores, dim=-1)",
    "paper.5": "dropout_add_layer_norm(hidden_states, input_tensor, self.dropout, self.LayerNorm)",
    "paper.6": "linear_bias_activation(hidden_states, self.dense, self.intermediate_act_fn)",
    "paper.7": "conv_batch_norm(pixels, self.conv, self.bn)",
    "paper.8": "linear_batch_norm(x, self.fc, self.norm)",
}

# Characters :meth:`str.splitlines` breaks lines at that Python's tokenizer does not (it breaks at
# ``\\n``, ``\\r\\n`` and ``\\r`` only): they may sit in comments and strings, and ``\\f`` also
# between tokens.
EXTRA_LINE_BREAKS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
