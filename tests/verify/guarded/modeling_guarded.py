"""A transformers-style model whose head pools with a softmax only under a configuration flag.

Reproduces the shape of Whisper's ``WhisperForAudioClassification`` (transformers 5.x): the
patched softmax sits under ``if self.config.use_attention_pool:`` (off by default) in a head
class that a default verify run (base model + first head) does not pick. A second softmax is
guarded by a module constant no configuration reaches. Used by tests/verify/test_site_coverage.py.
"""

from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

_EXPERIMENTAL_POOL = False


class GuardedConfig(PretrainedConfig):
    model_type = "guarded-test"

    def __init__(
        self, vocab_size=20, hidden_size=8, num_labels=2, use_attention_pool=False, **kwargs
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.use_attention_pool = use_attention_pool
        super().__init__(num_labels=num_labels, **kwargs)


class GuardedPreTrainedModel(PreTrainedModel):
    config_class = GuardedConfig
    base_model_prefix = "guarded"
    main_input_name = "input_ids"

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(0.0, 0.5)


class GuardedModel(GuardedPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.post_init()

    def forward(self, input_ids, attention_mask=None):
        hidden = self.dense(self.embed(input_ids))
        scores = hidden @ hidden.transpose(-1, -2)
        probs = nn.functional.softmax(scores, dim=-1)
        return (probs @ hidden,)


class GuardedForSequenceClassification(GuardedPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.guarded = GuardedModel(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None):
        hidden = self.guarded(input_ids)[0]
        return (self.classifier(hidden[:, 0]),)


class GuardedForAudioClassification(GuardedPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.guarded = GuardedModel(config)
        self.pool_query = nn.Linear(config.hidden_size, 1)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None):
        hidden = self.guarded(input_ids)[0]
        if self.config.use_attention_pool:
            weights = nn.functional.softmax(self.pool_query(hidden).squeeze(-1), dim=-1)
            pooled = (weights.unsqueeze(-1) * hidden).sum(1)
        elif _EXPERIMENTAL_POOL:
            weights = nn.functional.softmax(hidden.sum(-1), dim=-1)
            pooled = (weights.unsqueeze(-1) * hidden).sum(1)
        else:
            pooled = hidden.mean(1)
        return (self.classifier(pooled),)
