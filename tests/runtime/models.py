"""Model sources the runtime tests patch (written to files, imported from there)."""

# paper.5 (dropout + add + layer norm) in Output.forward, paper.4 (softmax) in Scores.forward.
BLOCKS = """
import torch.nn.functional as F
from torch import nn


class Output(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(0.1)
        self.LayerNorm = nn.LayerNorm(hidden)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
        return hidden_states


class Scores(nn.Module):
    def forward(self, scores):
        return F.softmax(scores, dim=-1)


class Model(nn.Module):
    def __init__(self, hidden=8):
        super().__init__()
        self.out = Output(hidden)
        self.scores = Scores()

    def forward(self, x):
        return self.scores(self.out(x, x))
"""

# A second module of the same package, imported only later (through the hook).
LATER = """
from torch import nn


class Probabilities(nn.Module):
    def forward(self, logits):
        return nn.functional.softmax(logits, dim=-1)
"""

# The paper.1 site: a BertSelfAttention (transformers 4.34's) built in __init__.
BERT_LIKE = """
from torch import nn
from transformers.models.bert.modeling_bert import BertSelfAttention


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = BertSelfAttention(config, position_embedding_type=None)

    def forward(self, hidden_states):
        return self.self(hidden_states)[0]


class Encoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = Attention(config)

    def forward(self, hidden_states):
        return self.attention(hidden_states)
"""

# A transformers-style model that `adopter verify` can build from its config.
VERIFIABLE = """
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel


class TinyConfig(PretrainedConfig):
    model_type = "tiny-runtime-fixture"

    def __init__(self, hidden_size=16, vocab_size=32, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size


class TinyScores(nn.Module):
    def forward(self, scores):
        return nn.functional.softmax(scores, dim=-1)


class TinyModel(PreTrainedModel):
    config_class = TinyConfig
    base_model_prefix = "tiny"

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.scores = TinyScores()

    def forward(self, input_ids):
        hidden = self.proj(self.embed(input_ids))
        return (self.scores(hidden @ hidden.transpose(-1, -2)) @ hidden,)
"""

# softmax -> log_softmax: a deliberately wrong rule that verify must refute.
WRONG_RULE = """
rule wrong.1 {
    name: "softmax-to-log-softmax"
    description: "a wrong rewrite, for testing verify"
    kernel: "torch.nn.functional.log_softmax"
    forward {
        torch.nn.functional.softmax($x, dim=-1) -> $y
    } => {
        torch.nn.functional.log_softmax($x, dim=-1) -> $y
    }
}
"""
