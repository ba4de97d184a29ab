"""The diffusers adapter's small settings, read from ``__init__`` signatures of our own (no
diffusers needed): one factor for every width, so the sizes a model relates stay related."""

from __future__ import annotations

from adopter.models.diffusers_shrink import (
    classify,
    required_values,
    settings_for,
    width_factor,
)


class _Unet:
    def __init__(
        self,
        sample_size=64,
        in_channels=4,
        block_out_channels=(320, 640, 1280, 1280),
        layers_per_block=2,
        norm_num_groups=32,
        cross_attention_dim=1024,
        attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        use_linear_projection=False,
        dropout=0.0,
    ):
        pass


class _Dit:
    def __init__(
        self,
        patch_size=2,
        in_channels=64,
        num_layers=19,
        num_single_layers=38,
        attention_head_dim=128,
        num_attention_heads=24,
        joint_attention_dim=4096,
        pooled_projection_dim=768,
        axes_dims_rope=(16, 56, 56),
        vace_layers=(0, 5, 10, 15),
    ):
        pass


class _Split:
    def __init__(self, hidden_size=1792, num_heads=28, context_in_dim=2304, depth=16):
        pass


class _Required:
    def __init__(
        self,
        in_channels: int,
        block_out_channels: tuple[int, ...],
        layers_per_block: int,
        spatial_compression_ratio: int,
        scaling_factor: float,
        sample_size: int = 256,
    ):
        pass


def test_names_say_what_an_argument_sizes():
    assert classify("block_out_channels", (320, 640)) == "width"
    assert classify("hidden_size", 3072) == "width"
    assert classify("d_model", 768) == "width"
    assert classify("norm_num_groups", 32) == "width"
    assert classify("num_single_layers", 38) == "depth"
    assert classify("layers_per_block", (3, 3, 4)) == "depth"
    assert classify("vace_layers", (0, 5, 10)) == "indices"
    assert classify("injection_layer_ids", (6, 14)) == "indices"
    assert classify("num_key_value_heads", 8) == "heads"
    assert classify("attention_head_dim", 128) == "head_dim"
    assert classify("axes_dims_rope", (16, 56, 56)) == "rope"
    assert classify("sample_size", 128) == "sample"
    for name, value in (("patch_size", 2), ("vocab_size", 8256), ("rope_theta", 10000),
                        ("num_mel_channels", 64), ("use_linear_projection", False)):  # fmt: skip
        assert classify(name, value) is None, name


def test_one_factor_divides_every_width_and_keeps_rotary_axes_even():
    # 56 / 4 = 14 is even, 56 / 8 = 7 is not: the rotary axes limit the factor to 4
    assert width_factor({"dim": 3072, "axes_dims_rope": (16, 56, 56)}) == 4
    # widths not a multiple of 8 are data sizes (20 audio features) and do not limit it
    assert width_factor({"dim": 3072, "in_audio_dim": 20}) == 32
    # a head dimension keeps at least 4
    assert width_factor({"dim": 3072, "head_dim": 64}) == 16


def test_the_first_setting_divides_widths_and_keeps_relations():
    config = settings_for(_Dit)[0].config
    assert "num_attention_heads" not in config  # heads stay, each narrower
    assert config["attention_head_dim"] == sum(config["axes_dims_rope"]) == 128 // 4
    assert config["joint_attention_dim"] == 4096 // 4 and config["in_channels"] == 64 // 4
    assert config["num_layers"] == 1 and config["num_single_layers"] == 1
    assert config["vace_layers"] == (0,)
    assert "patch_size" not in config


def test_a_unet_keeps_its_head_count_and_norm_groups_dividing_channels():
    config = settings_for(_Unet)[0].config
    assert "attention_head_dim" not in config  # UNets' 8 counts heads: it stays
    assert all(c % config["norm_num_groups"] == 0 for c in config["block_out_channels"])
    assert config["sample_size"] == 16 and config["layers_per_block"] == 1
    assert config["cross_attention_dim"] * 320 == 1024 * config["block_out_channels"][0]
    assert "down_block_types" not in config and "dropout" not in config


def test_later_settings_cut_heads_with_the_widths_that_are_heads_times_head_dim():
    labels = [s.label for s in settings_for(_Split)]
    assert labels[0] == "widths/32" and "2 heads of full width" in labels
    full = next(s for s in settings_for(_Split) if s.label == "2 heads of full width").config
    assert full["num_heads"] == 2 and full["hidden_size"] == 2 * 64  # 64 per head, as before
    assert "context_in_dim" not in full


def test_required_arguments_are_given_small_values_by_name():
    values = required_values(_Required)
    assert values["in_channels"] == 4 and values["block_out_channels"] == (32, 64)
    assert values["layers_per_block"] == 1 and values["spatial_compression_ratio"] == 2
    assert "scaling_factor" not in values  # not a size: the build says it is missing
    assert settings_for(_Required)[0].config["block_out_channels"] == (32, 64)
