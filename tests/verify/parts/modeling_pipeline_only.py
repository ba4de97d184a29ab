"""A transformers-style model that runs only inside its pipeline: its ``forward`` refuses the
inputs verify makes, whatever the configuration, yet it builds small, and its projector takes
plain features. Used by tests/verify/test_parts.py; the rules patch ``act(linear(x))``."""

from torch import nn
from transformers import PretrainedConfig, PreTrainedModel


class PipelineOnlyConfig(PretrainedConfig):
    model_type = "pipeline-only-test"

    def __init__(self, vocab_size=20, hidden_size=8, vision_size=6, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.vision_size = vision_size
        super().__init__(**kwargs)


class PipelineOnlyProjector(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.linear_in = nn.Linear(config.vision_size, config.hidden_size)
        self.act = nn.GELU()

    def forward(self, image_features):
        hidden = self.linear_in(image_features)
        return self.act(hidden)


class PipelineOnlyPreTrainedModel(PreTrainedModel):
    config_class = PipelineOnlyConfig
    base_model_prefix = "pipeline_only"
    main_input_name = "input_ids"

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(0.0, 0.5)
            module.bias.data.normal_(0.0, 0.5)


class PipelineOnlyModel(PipelineOnlyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.projector = PipelineOnlyProjector(config)
        self.post_init()

    def forward(self, input_ids, pipeline_state=None):
        if pipeline_state is None:
            raise ValueError("this model runs only inside its pipeline")
        return (self.embed(input_ids) + self.projector(pipeline_state),)
