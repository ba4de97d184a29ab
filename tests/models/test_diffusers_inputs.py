"""The diffusers adapter's inputs, on tiny modules of our own (no diffusers needed): made
from the forward signature and the configuration, then fitted to the layers that take them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adopter.models.diffusers_inputs import LAYOUTS, Layout, fit_inputs, make_inputs


def _call(model, inputs):
    return model(**inputs)


class _Video(nn.Module):
    config = {"in_channels": 3, "sample_size": 8, "pooled_projection_dim": 6}

    def forward(
        self, hidden_states, timestep, encoder_hidden_states, encoder_attention_mask,
        pooled_projections, return_dict=True,
    ):  # fmt: skip
        return hidden_states


class _Flux(nn.Module):
    """A token-sequence model with rotary position ids (optional in its signature)."""

    config = {"in_channels": 6, "axes_dims_rope": (2, 4, 4)}

    def __init__(self):
        super().__init__()
        self.x_embedder = nn.Linear(6, 8)
        self.context_embedder = nn.Linear(12, 8)  # a text width the config does not name

    def forward(self, hidden_states, encoder_hidden_states=None, timestep=None, img_ids=None,
                txt_ids=None, guidance=None):  # fmt: skip
        x = self.x_embedder(hidden_states)
        assert img_ids.shape == (hidden_states.shape[1], 3) and txt_ids.shape[1] == 3
        return x + self.context_embedder(encoder_hidden_states).mean(1, keepdim=True)


class _Conv3d(nn.Module):
    config = {"in_channels": 4, "sample_size": 8}

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 4, 1)

    def forward(self, sample, timestep):
        return self.conv(sample)


class _Unet(nn.Module):
    """Needs a mask it defaults to ``None``."""

    config = {"in_channels": 4, "cross_attention_dim": 5}

    def forward(self, sample, timestep, encoder_hidden_states, encoder_attention_mask=None):
        return sample * encoder_attention_mask.float().mean()


def test_inputs_follow_the_signature_and_the_configuration_in_each_layout():
    inputs = make_inputs(_Video(), 0, Layout("video", 2))
    assert inputs["hidden_states"].shape == (2, 3, 2, 8, 8)
    assert inputs["encoder_attention_mask"].shape == (2, 8)
    assert inputs["encoder_attention_mask"].dtype == torch.bool
    assert inputs["pooled_projections"].shape == (2, 6) and inputs["return_dict"] is False
    assert inputs["timestep"].shape == (2,)
    assert make_inputs(_Video(), 0)["hidden_states"].shape == (2, 3, 8, 8)
    assert make_inputs(_Video(), 0, Layout("tokens"))["hidden_states"].shape == (2, 16, 3)
    per_frame = make_inputs(_Video(), 0, Layout("video", 2, per_frame=True))
    assert per_frame["encoder_hidden_states"].shape[0] == 4  # the text of each frame


def test_the_same_seed_makes_the_same_inputs():
    first, second = make_inputs(_Video(), 3), make_inputs(_Video(), 3)
    assert torch.equal(first["hidden_states"], second["hidden_states"])


def test_a_required_argument_no_role_says_is_named():
    class Odd(nn.Module):
        def forward(self, sample, encodings_and_masks):
            return sample

    with pytest.raises(ValueError, match="encodings_and_masks"):
        make_inputs(Odd(), 0)


def test_widths_and_layouts_are_fitted_to_the_layers_that_take_the_inputs():
    inputs, layout = fit_inputs(_Flux(), 0, LAYOUTS[0], _call)
    assert layout.kind == "tokens"  # the image went into a Linear: a token sequence
    assert inputs["hidden_states"].shape == (2, 16, 6)
    assert inputs["encoder_hidden_states"].shape[-1] == 12  # the first Linear's in_features
    assert inputs["img_ids"].shape == (16, 3)
    _, video = fit_inputs(_Conv3d(), 0, LAYOUTS[0], _call)
    assert video.kind == "video"  # a Conv3d takes a video


def test_optional_arguments_are_given_when_the_model_needs_one_it_defaults_to_none():
    inputs, layout = fit_inputs(_Unet(), 0, LAYOUTS[0], _call)
    assert layout.optional and inputs["encoder_attention_mask"].shape == (2, 8)


class _Padded(nn.Module):
    """Pads its text before the first layer: the hooks do not see it arrive as made."""

    config = {"in_channels": 4}

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(24, 8)

    def forward(self, sample, timestep, encoder_hidden_states):
        return self.proj(torch.cat([encoder_hidden_states, encoder_hidden_states], dim=1))


def test_where_no_layer_saw_an_input_the_width_torch_names_in_its_error_is_used():
    inputs, layout = fit_inputs(_Padded(), 0, LAYOUTS[0], _call)
    assert layout.widths == {"encoder_hidden_states": 24}
    assert inputs["encoder_hidden_states"].shape == (2, 8, 24)


def test_what_does_not_run_raises_the_models_own_error():
    class Broken(nn.Module):
        def forward(self, sample):
            raise RuntimeError("the model's own complaint")

    with pytest.raises(RuntimeError, match="own complaint"):
        fit_inputs(Broken(), 0, LAYOUTS[0], _call)
