"""``bench`` narrows wide configurations; sizes fixed for the full width are repaired from the
first forward pass's error, as ``verify`` repairs its tiny models (Qwen2-VL's RoPE sections)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adopter.bench.command import _size_repairs, bench_config

transformers = pytest.importorskip("transformers")


class SectionsConfig(transformers.PretrainedConfig):
    model_type = "adopter-sections"

    def __init__(self, hidden_size: int = 128, sections: list[int] | None = None, **kwargs):
        self.hidden_size = hidden_size
        self.sections = sections if sections is not None else [16, 24, 24]  # half of 128
        super().__init__(**kwargs)


class SplitsHalfTheWidth(nn.Module):
    """Splits half of its input's width into the configured sections, as multimodal RoPE
    splits half a head."""

    def __init__(self, config: SectionsConfig) -> None:
        super().__init__()
        self.config = config
        self.linear = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = self.linear(x)[..., : self.config.hidden_size // 2]
        return torch.cat([part * 2 for part in half.split(self.config.sections, dim=-1)], -1)


def test_sections_of_the_full_width_are_rescaled_to_the_narrowed_one() -> None:
    config = SectionsConfig(hidden_size=64)  # narrowed: half is 32, the sections sum to 64
    model = SplitsHalfTheWidth(config)
    model.train()
    asked = _size_repairs(model, config, {"x": torch.randn(2, 64)})
    assert asked == {"sections": [8, 12, 12]}
    assert model.training  # the probe leaves the model's mode as it was
    repaired = bench_config(SectionsConfig, layers=None, overrides={"hidden_size": 64},
                            repairs=asked)  # fmt: skip
    assert repaired.sections == [8, 12, 12]
    assert _size_repairs(SplitsHalfTheWidth(repaired), repaired, {"x": torch.randn(2, 64)}) == {}


def test_a_failure_no_repair_knows_is_left_to_the_timed_steps() -> None:
    config = SectionsConfig(hidden_size=64)
    model = SplitsHalfTheWidth(config)
    assert _size_repairs(model, config, {"x": torch.randn(2, 63)}) == {}


def test_a_narrowed_sub_configuration_keeps_its_cut_depth() -> None:
    # BLIP-2's vision tower (1,408 wide, 39 layers) and Q-Former (12 layers): narrowing the
    # tower used to put back its full depth, so a "2-layer" benchmark held 39 vision layers.
    config = bench_config(transformers.Blip2Config, layers=2)
    assert config.vision_config.hidden_size == 768
    assert config.vision_config.num_hidden_layers == 2
    assert config.qformer_config.num_hidden_layers == 2
    assert config.text_config.num_hidden_layers == 2


def test_the_second_variant_takes_the_first_ones_repairs(monkeypatch) -> None:
    from adopter.bench import command

    probes: list[str] = []

    def probe(model, config, inputs):  # noqa: ANN001, ANN202
        probes.append(type(model).__name__)
        return {} if len(probes) > 1 else {"intermediate_size": 40}

    monkeypatch.setattr(command, "_size_repairs", probe)
    monkeypatch.setattr(command, "_REPAIRS", {})
    tiny = (("hidden_size", 32), ("num_attention_heads", 2), ("intermediate_size", 37))
    spec = command.TransformersBuild(
        "transformers.models.bert.modeling_bert", None, "original", overrides=tiny, seq_len=8
    )
    first, _ = command.build_transformers(spec)
    second, _ = command.build_transformers(command.replace(spec, tag="patched"))
    assert len(probes) == 2  # the first build probed twice (asked, then satisfied), no more
    assert first.config.intermediate_size == second.config.intermediate_size == 40
