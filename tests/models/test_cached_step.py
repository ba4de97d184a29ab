"""A cached step of generation: two calls of a model, the second with the first's cache."""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2Model

from adopter.models.common import Continued, call_model, cast_inputs
from adopter.models.transformers.inputs import continued_inputs


def _gpt2() -> tuple[GPT2Model, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=20, n_positions=16)
    ids = torch.randint(0, 20, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, -2:] = 0
    return GPT2Model(config).eval(), {"input_ids": ids, "attention_mask": mask}


def test_the_second_call_steps_one_token_with_the_first_call_s_cache() -> None:
    model, inputs = _gpt2()
    steps = continued_inputs(GPT2Model, inputs)
    assert isinstance(steps, Continued)
    assert steps.first["use_cache"] is True
    assert steps.second["input_ids"].shape == (2, 1)
    assert steps.second["attention_mask"].shape == (2, 6)
    assert steps.second["attention_mask"][:, -1].tolist() == [1, 1]
    first, second = call_model(model, steps)
    assert second.last_hidden_state.shape == (2, 1, 8)
    # the step equals the last position of one call over the six tokens
    whole = model(
        input_ids=torch.cat([inputs["input_ids"], inputs["input_ids"][:, -1:]], dim=1),
        attention_mask=steps.second["attention_mask"],
    ).last_hidden_state[:, -1:]
    assert torch.allclose(second.last_hidden_state, whole, atol=1e-5)
    assert first.last_hidden_state.shape == (2, 5, 8)


def test_a_model_without_a_cache_gets_no_cached_step_and_a_first_call_alone_stays_alone() -> None:
    class NoCache(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return input_ids.float()

    assert continued_inputs(NoCache, {"input_ids": torch.zeros(1, 3, dtype=torch.long)}) is None
    steps = Continued({"input_ids": torch.ones(1, 2)}, {}, lambda output: None)
    assert call_model(NoCache(), steps)[0].shape == (1, 2)
    assert len(call_model(NoCache(), steps)) == 1
    half = cast_inputs(steps, torch.float16)
    assert isinstance(half, Continued) and half.first["input_ids"].dtype == torch.float16
