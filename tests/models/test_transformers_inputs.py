"""Input generation by parameter name and size fixes after mismatch errors (``hf``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from adopter.models.transformers.inputs import make_inputs  # noqa: E402
from adopter.models.transformers.repairs import size_fixes, split_fixes  # noqa: E402


class _Forward(torch.nn.Module):
    main_input_name = "input_ids"

    def forward(self, input_ids: Any, bbox: Any, visual_feats: Any = None) -> Any:
        return input_ids


class _Series(torch.nn.Module):
    main_input_name = "past_values"

    def forward(
        self,
        past_values: Any,
        past_time_features: Any,
        past_observed_mask: Any,
        future_values: Any = None,
    ) -> Any:
        return past_values


class _Config(SimpleNamespace):
    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def test_required_boxes_and_named_features_come_from_the_config() -> None:
    config = _Config(vocab_size=50, dim_bbox=8, max_2d_position_embeddings=100, visual_feat_dim=6)
    inputs = make_inputs(_Forward(), config, seed=0)
    bbox = inputs["bbox"]
    assert bbox.shape[-1] == 8 and bbox.dtype == torch.long and int(bbox.max()) < 100
    corners = bbox.reshape(*bbox.shape[:-1], 4, 2)
    assert bool((corners[..., 0, :] <= corners[..., 1, :]).all())  # sorted x0 <= x1, y0 <= y1
    assert "visual_feats" not in inputs  # optional: only generated when an error names it
    inputs = make_inputs(_Forward(), config, seed=0, require=("visual_feats",))
    assert inputs["visual_feats"].shape == (2, inputs["input_ids"].shape[-1], 6)


def test_time_series_inputs_span_context_plus_lags_and_the_horizon() -> None:
    config = _Config(
        prediction_length=4, context_length=None, lags_sequence=[1, 2, 3], num_time_features=2
    )
    inputs = make_inputs(_Series(), config, seed=0)
    assert inputs["past_values"].shape == (2, 4 + 3)
    assert inputs["past_time_features"].shape == (2, 4 + 3, 2)
    assert inputs["future_values"].shape == (2, 4)


def test_size_fixes_take_the_single_attribute_holding_a_mismatched_size() -> None:
    config = _Config(hidden_dim=16, num_labels=3)
    assert size_fixes(config, "running_mean should contain 1280 elements not 16") == {
        "hidden_dim": 1280
    }
    ambiguous = _Config(hidden_dim=16, embed_dim=16)
    assert size_fixes(ambiguous, "running_mean should contain 1280 elements not 16") == {}
    assert size_fixes(config, "some other error") == {}


def test_a_group_count_the_shrunk_width_of_a_sub_configuration_misses_widens_that_width() -> None:
    """Emu3's VQ-VAE builds ``nn.GroupNorm(num_groups=32, ...)`` from ``vq_config.base_channels``:
    shrunk to 8 it does not divide; the sub-configuration's width grows to a multiple of 32."""
    vq = {"model_type": "vq", "base_channels": 8, "embed_dim": 4, "in_channels": 3}
    config = _Config(hidden_size=8, vq_config=vq)
    error = "num_channels (8) must be divisible by num_groups (32)"
    assert size_fixes(config, error) == {
        "hidden_size": 32,
        "vq_config": {**vq, "base_channels": 32},
    }


class _Decoder(torch.nn.Module):
    main_input_name = "input_ids"

    def forward(self, input_ids: Any, encoder_hidden_states: Any = None) -> Any:
        return input_ids


def test_a_decoder_with_cross_attention_gets_encoder_states() -> None:
    """Flipping ``add_cross_attention`` reaches cross-attention only with encoder states."""
    plain = _Config(vocab_size=50, hidden_size=8, add_cross_attention=False)
    assert "encoder_hidden_states" not in make_inputs(_Decoder(), plain, 0)
    crossed = _Config(vocab_size=50, hidden_size=8, add_cross_attention=True)
    states = make_inputs(_Decoder(), crossed, 0)["encoder_hidden_states"]
    assert states.shape[0] == 2 and states.shape[-1] == 8


_SPLIT_ERROR = (
    "split_with_sizes expects split_sizes to sum exactly to 4 (input tensor's size at dimension "
    "-1), but got split_sizes=[16, 24, 24]"
)


def test_split_sizes_the_model_falls_back_to_are_scaled_to_the_shrunk_total() -> None:
    """Multimodal RoPE sections left out of the configuration: the model's source names the
    default it splits by; the sub-configuration holding that dict gets sections summing to 4."""
    text = {"model_type": "t", "rope_parameters": {"rope_theta": 1.0}}
    config = _Config(text_config=text, image_token_id=5)
    source = 'self.sections = config.rope_parameters.get("mrope_section", [16, 24, 24])'
    fixes = split_fixes(config, _SPLIT_ERROR, source)
    sections = fixes["text_config"]["rope_parameters"]["mrope_section"]
    assert sum(sections) == 4 and min(sections) >= 1 and sections[0] <= sections[1]
    assert fixes["text_config"]["model_type"] == "t"
    assert split_fixes(config, _SPLIT_ERROR, "no such default here") == {}


def test_split_sizes_held_in_the_configuration_are_scaled_in_place() -> None:
    config = _Config(sections=[16, 24, 24], other=[1, 2])
    assert split_fixes(config, _SPLIT_ERROR, "") == {"sections": [1, 2, 1]}
    too_small = _SPLIT_ERROR.replace("exactly to 4", "exactly to 2")
    assert split_fixes(config, too_small, "") == {}


class _GridModel(torch.nn.Module):
    main_input_name = "input_ids"

    def forward(
        self,
        input_ids: Any,
        attention_mask: Any = None,
        pixel_values: Any = None,
        image_grid_thw: Any = None,
        mm_token_type_ids: Any = None,
    ) -> Any:
        return input_ids


class _GridTower(torch.nn.Module):
    main_input_name = "pixel_values"

    def forward(self, hidden_states: Any, grid_thw: Any, **kwargs: Any) -> Any:
        return hidden_states


def _grid_config(**extra: Any) -> _Config:
    vision = _Config(patch_size=4, temporal_patch_size=2, in_channels=3, spatial_merge_size=2)
    return _Config(
        vocab_size=None, text_config=_Config(vocab_size=50), vision_config=vision, **extra
    )


def test_a_grid_model_gets_flattened_patches_and_one_placeholder_per_merged_token() -> None:
    config = _grid_config(image_token_id=40, vision_start_token_id=41, video_token_id=42)
    inputs = make_inputs(_GridModel(), config, seed=0)
    grid = inputs["image_grid_thw"]
    assert grid.tolist() == [[1, 4, 4], [1, 4, 4]]  # one image per row, 2 x 2 merged blocks
    assert inputs["pixel_values"].shape == (2 * 16, 3 * 2 * 4 * 4)
    ids = inputs["input_ids"]
    assert ((ids == 40).sum(-1) == 4).all() and ((ids == 41).sum(-1) == 1).all()
    assert not (ids == 42).any()  # other placeholders never appear in random text
    assert inputs["mm_token_type_ids"].sum().item() == 8
    assert inputs["attention_mask"].shape == ids.shape


def test_a_grid_tower_takes_the_patches_as_hidden_states() -> None:
    inputs = make_inputs(_GridTower(), _grid_config(), seed=0)
    assert inputs["hidden_states"].shape == (32, 96) and inputs["grid_thw"].shape == (2, 3)
    assert "pixel_values" not in inputs


def test_placeholder_ids_outside_the_text_vocabulary_get_distinct_spare_ids() -> None:
    from adopter.models.transformers.tokens import token_id_fixes

    text = _Config(vocab_size=50, eos_token_id=49)
    config = _Config(text_config=text, image_token_id=151655, video_token_id=151656, bos=1)
    assert token_id_fixes(config) == {"image_token_id": 48, "video_token_id": 47}
    assert token_id_fixes(_Config(vocab_size=50, image_token_id=151655)) == {}


def test_shape_errors_ask_for_the_other_layout_of_a_feature_or_waveform_input() -> None:
    from adopter.models.transformers.repairs import layout_fix

    features = {"input_features": torch.zeros(2, 80, 20)}
    error = "mat1 and mat2 shapes cannot be multiplied (20x768 and 2560x16)"
    assert layout_fix(error, features) == ("input_features", "swap")
    waveform = {"input_values": torch.zeros(2, 8000), "attention_mask": torch.ones(2, 7)}
    conv = "weight of size [16, 1, 7], expected input[1, 2, 8000] to have 1 channels, but got 2"
    assert layout_fix(conv, waveform) == ("input_values", "channel")
    assert layout_fix("index out of range in self", features) is None


def test_the_requested_layouts_are_applied_to_the_generated_inputs() -> None:
    class _Audio(torch.nn.Module):
        main_input_name = "input_features"

        def forward(self, input_features: Any) -> Any:
            return input_features

    config = _Config(encoder_config=_Config(num_mel_bins=12))  # found in any sub-configuration
    plain = make_inputs(_Audio(), config, seed=0)["input_features"]
    assert plain.shape[:2] == (2, 12)
    swapped = make_inputs(_Audio(), config, 0, layouts=(("input_features", "swap"),))
    assert torch.equal(swapped["input_features"], plain.transpose(-1, -2))


def test_an_error_that_spells_out_a_shape_with_a_literal_size_gets_image_pairs() -> None:
    from adopter.models.transformers.repairs import layout_fix

    images = {"pixel_values": torch.randn(2, 3, 8, 8)}
    error = "Input must be a 5D tensor of shape (batch_size, 2, num_channels, height, width)"
    assert layout_fix(error, images) == ("pixel_values", "stack:1:2")

    class _Matcher(torch.nn.Module):
        main_input_name = "pixel_values"

        def forward(self, pixel_values: Any) -> Any:
            return pixel_values

    pairs = make_inputs(
        _Matcher(), _Config(image_size=8), 0, layouts=(("pixel_values", "stack:1:2"),)
    )
    value = pairs["pixel_values"]
    assert value.shape == (2, 2, 3, 8, 8) and not torch.equal(value[:, 0], value[:, 1])


class _Forecaster(torch.nn.Module):
    main_input_name = "past_values"

    def forward(self, past_values: Any, past_values_padding: Any, freq: Any) -> Any:
        return past_values


def test_forecasters_get_a_horizon_channels_paddings_and_categorical_frequencies() -> None:
    config = _Config(context_length=16, horizon_length=4, freq_size=3, num_input_channels=2)
    inputs = make_inputs(_Forecaster(), config, seed=0)
    assert inputs["past_values"].shape == (2, 16, 2)  # channels kept, even where there is one
    assert not inputs["past_values_padding"].any()
    freq = inputs["freq"]
    assert freq.shape == (2, 1) and freq.dtype == torch.long and int(freq.max()) < 3


def test_an_image_too_small_for_the_downsampling_stack_is_resampled_twice_as_large() -> None:
    from adopter.models.transformers.repairs import layout_fix

    images = {"pixel_values": torch.randn(2, 3, 32, 32)}
    error = (
        "Given input size: (384x1x1). Calculated output size: (384x0x0). Output size is too small"
    )
    assert layout_fix(error, images) == ("pixel_values", "size:64x64")

    class _Reader(torch.nn.Module):
        main_input_name = "pixel_values"

        def forward(self, pixel_values: Any) -> Any:
            return pixel_values

    grown = make_inputs(_Reader(), _Config(), 0, layouts=(("pixel_values", "size:64x64"),))
    assert grown["pixel_values"].shape == (2, 3, 64, 64)


def test_an_optional_input_used_unchecked_is_named_from_the_failing_line() -> None:
    from adopter.models.transformers.repairs import named_parameters

    def centres(bbox: Any, visual_bbox: Any) -> Any:
        return bbox[:, :, 0] + 1

    class _Layout(torch.nn.Module):
        def forward(self, input_ids: Any, bbox: Any = None, visual_bbox: Any = None) -> Any:
            return centres(bbox, visual_bbox)

    model = _Layout()
    try:
        model(input_ids=torch.zeros(2, 3))
    except TypeError as exc:
        # visual_bbox is None as well, but the failing line does not use it
        assert named_parameters(exc, model, {"input_ids": None}) == ("bbox",)
    else:
        raise AssertionError("expected a TypeError")


class _Seq2SeqLM(torch.nn.Module):
    def forward(
        self, input_features: Any, decoder_input_ids: Any = None, labels: Any = None
    ) -> Any:
        return labels


def test_labels_of_an_encoder_decoder_are_the_decoders_ids() -> None:
    """Whisper-style models take audio and decoder ids: their loss runs over the decoder's
    vocabulary and length, so the labelled step's labels are the decoder's ids."""
    from adopter.models.transformers.build import with_labels

    decoder_ids = torch.randint(0, 7, (2, 5))
    inputs = {"input_features": torch.randn(2, 3, 8), "decoder_input_ids": decoder_ids}
    labelled = with_labels(_Seq2SeqLM, inputs)
    assert labelled is not None and torch.equal(labelled["labels"], decoder_ids)
    assert labelled["labels"] is not decoder_ids
    encoder_only = {"input_ids": torch.randint(0, 7, (2, 4))}
    assert torch.equal(with_labels(_Seq2SeqLM, encoder_only)["labels"], encoder_only["input_ids"])
    assert with_labels(_Seq2SeqLM, {"input_features": torch.randn(2, 3, 8)}) is None
    assert with_labels(_Forward, encoder_only) is None  # no labels parameter


def test_labels_name_classes_the_output_head_has() -> None:
    """Apertus 1.5 at the small configuration embeds ids up to its image token (262,355) but
    its shrunk text head scores 128 classes: labels equal to the ids are out of bounds for the
    loss, and the labelled step never ran. Ids the head cannot score are taken modulo its width;
    ids it can are kept."""
    from adopter.models.transformers.build import _logits_width, with_labels

    ids = torch.tensor([[5, 300, 262355], [7, 127, 128]])
    labelled = with_labels(_Seq2SeqLM, {"input_ids": ids}, width=128)
    assert labelled is not None and int(labelled["labels"].max()) < 128
    assert torch.equal(labelled["labels"], ids % 128)
    small = torch.tensor([[1, 2, 3]])
    assert torch.equal(with_labels(_Seq2SeqLM, {"input_ids": small}, width=128)["labels"], small)

    class _LM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm_head = torch.nn.Linear(4, 128)

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.lm_head

    assert _logits_width(_LM()) == 128
    assert _logits_width(torch.nn.Linear(2, 2)) is None


def test_a_mapping_the_configuration_leaves_none_is_given_empty() -> None:
    """Emu3's configuration leaves ``vocabulary_map`` None (a checkpoint's JSON fills it) and
    its model hands it to a class that calls ``.get`` on it: the entry read from the
    configuration object becomes an empty mapping; a None elsewhere is left alone."""
    from adopter.models.transformers.repairs import none_fixes

    class _Mapping:
        def __init__(self, vocab_map: Any) -> None:
            self.image = vocab_map.get("<image>")

    def build(config: Any) -> Any:
        return _Mapping(config.vocabulary_map)

    config = _Config(vocabulary_map=None, hidden_size=8)
    try:
        build(config)
    except AttributeError as exc:
        assert none_fixes(config, exc) == {"vocabulary_map": {}}
    other = _Config(vocabulary_map=None)
    try:
        _Mapping(None)
    except AttributeError as exc:
        assert none_fixes(other, exc) == {}  # no frame read it from the configuration
    assert none_fixes(config, AttributeError("'int' object has no attribute 'get'")) == {}


class _UniversalSegmentation(torch.nn.Module):
    def forward(self, pixel_values: Any, mask_labels: Any = None, class_labels: Any = None) -> Any:
        return mask_labels, class_labels


def test_a_universal_segmentation_model_is_given_masks_and_classes_per_image() -> None:
    """EoMT, Mask2Former, OneFormer...: the loss, and the Hungarian matcher inside it, run only
    with ``mask_labels`` and ``class_labels``: one binary mask per segment, of the image's size,
    and a class the configuration has for each, per image; drawn from the seed alone."""
    from types import SimpleNamespace

    from adopter.models.transformers.build import with_segment_labels

    pixels = torch.randn(2, 3, 8, 6)
    config = SimpleNamespace(num_labels=4)
    labelled = with_segment_labels(_UniversalSegmentation, {"pixel_values": pixels}, config, 0)
    assert labelled is not None and labelled["pixel_values"] is pixels
    masks, classes = labelled["mask_labels"], labelled["class_labels"]
    assert [tuple(m.shape) for m in masks] == [(2, 8, 6), (2, 8, 6)]
    assert all(set(m.unique().tolist()) <= {0.0, 1.0} and m.dtype == pixels.dtype for m in masks)
    assert all(c.dtype == torch.long and 0 <= int(c.min()) and int(c.max()) < 4 for c in classes)
    again = with_segment_labels(_UniversalSegmentation, {"pixel_values": pixels}, config, 0)
    assert again is not None and all(torch.equal(a, b) for a, b in zip(again["mask_labels"], masks))
    assert with_segment_labels(_Forward, {"pixel_values": pixels}, config, 0) is None
    assert with_segment_labels(_UniversalSegmentation, {"input_ids": pixels}, config, 0) is None
    no_classes = SimpleNamespace()
    assert (
        with_segment_labels(_UniversalSegmentation, {"pixel_values": pixels}, no_classes, 0) is None
    )
