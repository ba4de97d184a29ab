"""A transformers-style model whose patched parts never run in a whole-model check.

Reproduces the shape of a multimodal model's projector (LLaVA's ``multi_modal_projector``: it
runs only when the model is given images, and verify's whole-model checks give the main input
alone), of a pooler no model class builds (a class kept in the file for checkpoints of another
layout), and of a part whose input is token ids (no float tensor can drive it). Used by
tests/verify/test_parts.py; the rules patch each ``act(linear(x))``.
"""

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel


class PartsConfig(PretrainedConfig):
    model_type = "parts-test"

    def __init__(self, vocab_size=20, hidden_size=8, vision_size=6, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.vision_size = vision_size
        super().__init__(**kwargs)


class PartsProjector(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.linear_in = nn.Linear(config.vision_size, config.hidden_size)
        self.act = nn.GELU()
        self.linear_out = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, image_features):
        hidden = self.linear_in(image_features)
        hidden = self.act(hidden)
        return self.linear_out(hidden)


class PartsPooler(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states):
        pooled = self.dense(hidden_states[:, 0])
        pooled = self.activation(pooled)
        return pooled


class PartsTokenMixer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = nn.ReLU()

    def forward(self, token_ids, positions):
        hidden = self.embed(token_ids + positions)
        hidden = self.dense(hidden)
        return self.act(hidden)


class PartsPreTrainedModel(PreTrainedModel):
    config_class = PartsConfig
    base_model_prefix = "parts"
    main_input_name = "input_ids"

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(0.0, 0.5)
            module.bias.data.normal_(0.0, 0.5)


class PartsModel(PartsPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.projector = PartsProjector(config)
        self.mixer = PartsTokenMixer(config)
        self.post_init()

    def forward(self, input_ids, pixel_features=None, mixed_ids=None):
        hidden = self.embed(input_ids)
        if pixel_features is not None:
            hidden = torch.cat([self.projector(pixel_features), hidden], dim=1)
        if mixed_ids is not None:
            hidden = hidden + self.mixer(mixed_ids, torch.zeros_like(mixed_ids))
        return (hidden,)
