"""A patched site that no whole-model check runs is checked in its part on its own.

A multimodal model's projector runs only when the model is given images; a pooler may be a
class no model builds. ``parts/modeling_parts.py`` is our own small model with both shapes and
with a part only token ids can drive. The part checks must verify a correct patch, refute a
wrong one (a check that cannot fail would be a defect) and say why a part could not be driven.
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from adopter.models.interface import PART_SUFFIX, BuildSettings, Subject
from adopter.models.parts import (
    MainOutput,
    constructed_subject,
    input_candidates,
    part_classes,
    part_paths,
    part_subject,
    runnable_inputs,
)
from adopter.verify import FileVerification, VerifyOptions
from adopter.verify.prove import prove
from tests.verify.fixture_files import rewritten_by, verdicts_of

FIXTURE = Path(__file__).with_name("parts") / "modeling_parts.py"
PIPELINE_ONLY = Path(__file__).with_name("parts") / "modeling_pipeline_only.py"
SETTINGS = BuildSettings(seed=0, dtype="float32")


class _Projector(nn.Module):
    def __init__(self, gelu: bool = True) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 4)
        self.act = nn.GELU() if gelu else nn.ReLU()

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        hidden = self.act(self.linear(features))
        return hidden if mask is None else hidden * mask


class _Model(nn.Module):
    def __init__(self, gelu: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.projector = _Projector(gelu)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids)


def test_part_paths_name_the_class_where_the_model_holds_it() -> None:
    model = _Model()
    assert part_paths(model, "_Projector", __name__) == ["projector"]
    assert part_paths(model, "_Projector", "elsewhere") == []  # another file's class of that name


class _Processor:  # no module: the attention module that holds it hands it the work
    def __call__(self, attention: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return attention.to_out(hidden)


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.to_out = nn.Linear(4, 4)
        self.processor = _Processor()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.processor(self, hidden)


def test_a_class_that_is_no_module_is_checked_in_the_module_holding_its_object() -> None:
    model = nn.Sequential(nn.Linear(4, 4), _Attention())
    assert part_paths(model, "_Processor", __name__) == ["1"]


def test_a_group_norm_suggests_an_image_a_signal_and_a_video() -> None:
    norm = nn.Sequential(nn.GroupNorm(2, 4))
    shapes = [shape for shape, _ in input_candidates(norm, SETTINGS)]
    assert shapes == ["2x4x8x8", "2x4x16", "2x4x4x8x8"]


def test_candidates_take_their_width_from_the_part_s_first_layers() -> None:
    candidates = dict(input_candidates(_Projector(), SETTINGS))
    # every required argument a tensor, then the further ones left out
    assert list(candidates)[:2] == ["2x5x6", "2x5x6, mask=None"]
    assert all(len(inputs) == 2 for inputs in candidates.values())
    conv = nn.Sequential(nn.Conv2d(3, 4, 1))
    assert [shape for shape, _ in input_candidates(conv, SETTINGS)] == ["2x3x8x8"]


def test_runnable_inputs_are_the_first_the_original_part_takes() -> None:
    shape, inputs = runnable_inputs(_Projector(), SETTINGS) or ("", None)
    # a mask as wide as the input does not fit the output: the next candidate leaves it out
    assert shape == "2x5x6, mask=None"
    assert inputs[0].shape == (2, 5, 6) and inputs[1] is None
    assert runnable_inputs(nn.Embedding(10, 4), SETTINGS) is None  # no float input drives it


class _Norm(nn.Module):
    """A hand-written norm: a weight of its own, no layers, built from a width."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def test_a_part_with_only_a_weight_of_its_own_takes_that_weight_s_width() -> None:
    assert [shape for shape, _ in input_candidates(_Norm(7), SETTINGS)] == ["2x5x7"]


def test_a_class_no_model_builds_is_built_from_its_configuration_s_values_by_name() -> None:
    text = types.SimpleNamespace(hidden_size=7)
    config = types.SimpleNamespace(vocab_size=3, text_config=text)  # the width sits one down
    whole = Subject("Model", "", nn.Identity, nn.Identity, inputs=None)
    found = constructed_subject(whole, config, (_Norm, _Norm), SETTINGS)
    assert isinstance(found, Subject), found
    assert found.label == "built from Model's configuration, input 2x5x7"
    assert isinstance(found.build_patched(), MainOutput)
    missing = constructed_subject(whole, types.SimpleNamespace(), (_Norm, _Norm), SETTINGS)
    assert "raised TypeError" in getattr(missing, "reason", "")


class _AudioAttention(nn.Module):
    """A part built as ``cls(audio_config, layer_idx)``: its width is the audio configuration's."""

    def __init__(self, config: types.SimpleNamespace, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.proj = nn.Linear(config.audio_width, config.audio_width)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden)


def test_a_part_is_built_from_the_configuration_it_needs_at_layer_0() -> None:
    """A multimodal model's audio part takes the audio configuration its model holds, and the
    number of its layer: the model's own configuration is tried first, then those it holds."""
    audio = types.SimpleNamespace(audio_width=6)
    config = types.SimpleNamespace(hidden_size=4, audio_config=audio)
    whole = Subject("Model", "", nn.Identity, nn.Identity, inputs=None)
    found = constructed_subject(whole, config, (_AudioAttention, _AudioAttention), SETTINGS)
    assert isinstance(found, Subject), found
    assert found.label == "built from Model's configuration, input 2x5x6"
    assert found.build_original().part.layer_idx == 0


class _RotaryAttention(nn.Module):
    """transformers 5's attention signature: the (cos, sin) to rotate by are an argument."""

    def __init__(self) -> None:
        super().__init__()
        self.head_dim = 4
        self.q_proj = nn.Linear(8, 8)

    def forward(self, hidden_states, position_embeddings, attention_mask):  # noqa: ANN001, ANN201
        cos, sin = position_embeddings
        query = self.q_proj(hidden_states).view(2, 5, 2, self.head_dim).transpose(1, 2)
        halves = torch.cat((-query[..., 2:], query[..., :2]), dim=-1)
        return (query * cos.unsqueeze(1) + halves * sin.unsqueeze(1)).sum(1), None


def test_an_attention_part_is_given_cos_and_sin_of_its_head_width() -> None:
    shape, inputs = runnable_inputs(_RotaryAttention(), SETTINGS)
    assert shape == "2x5x8, position_embeddings=(cos, sin) of width 4"
    cos, sin = inputs["position_embeddings"]
    assert cos.shape == sin.shape == (2, 5, 4) and inputs["attention_mask"] is None
    assert torch.allclose(cos**2 + sin**2, torch.ones(2, 5, 4))


def test_part_classes_are_a_site_s_own_class_or_the_classes_that_call_its_function() -> None:
    own = types.SimpleNamespace(cls="Projector", key="10:4")
    in_function = types.SimpleNamespace(cls=None, key="20:8")
    hosts = {"20:8": ["VisionAttention", "VisionModel", "Projector"]}
    wanted = part_classes([own, in_function], hosts, models=["VisionModel"])
    assert wanted == {"Projector": {"10:4", "20:8"}, "VisionAttention": {"20:8"}}


def test_part_classes_come_nearest_first_across_sites() -> None:
    processor = types.SimpleNamespace(cls="AttnProcessor", key="10:4")
    mlp = types.SimpleNamespace(cls="SwiGLU", key="30:8")
    hosts = {"10:4": ["AttnProcessor", "Attention", "Block"], "30:8": ["SwiGLU", "Block"]}
    wanted = part_classes([processor, mlp], hosts, models=[])
    # the block reaches both sites, but each site's nearer class is tried before it
    assert list(wanted) == ["AttnProcessor", "SwiGLU", "Attention", "Block"]
    assert wanted["Block"] == {"10:4", "30:8"}


def test_a_part_s_first_output_alone_is_compared() -> None:
    class Attention(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
            return x * 2, None  # the probabilities left out, as a fused kernel does

    assert torch.equal(MainOutput(Attention())(torch.ones(2)), torch.full((2,), 2.0))


def _subject(patched_gelu: bool) -> Subject:
    def build(gelu: bool) -> nn.Module:
        torch.manual_seed(0)
        return _Model(gelu)

    whole = Subject("_Model", "", lambda: build(True), lambda: build(patched_gelu), inputs=None)
    _shape, inputs = runnable_inputs(build(True).projector, SETTINGS) or ("", None)
    return part_subject(whole, "_Model", "_Projector", "projector", ("2x5x6", inputs))


def test_a_part_check_verifies_a_part_that_matches_and_refutes_one_that_does_not() -> None:
    options = VerifyOptions(modes=("eval", "train"))
    same = prove(_subject(patched_gelu=True), None, options)
    assert same.status == "verified", same.reason
    assert same.cls == "_Projector" + PART_SUFFIX
    different = prove(_subject(patched_gelu=False), None, options)
    assert different.status == "refuted", different.reason


# -- end to end on the fixture: the worker checks parts while sites have not run -----------------


def _patched() -> str:
    patched = rewritten_by(FIXTURE, "paper.6").patched
    assert patched.count("linear_bias_activation(") == 3
    return patched


@pytest.fixture(scope="module")
def verdicts() -> dict[str, FileVerification]:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers")
    patched = _patched()
    cases = {
        "correct": patched,
        # the projector's patch uses another activation: only its part check runs it
        "wrong-projector": patched.replace(
            "linear_bias_activation(image_features, self.linear_in, self.act)",
            "linear_bias_activation(image_features, self.linear_in, torch.tanh)",
        ),
    }
    return verdicts_of(FIXTURE, cases, VerifyOptions(modes=("eval", "train"), timeout=240))


@pytest.mark.slow
def test_parts_no_whole_model_runs_are_checked_on_their_own(
    verdicts: dict[str, FileVerification],
) -> None:
    verification = verdicts["correct"]
    by_class = {entry.site.cls: entry for entry in verification.sites}
    assert set(by_class["PartsProjector"].matched_in) == {
        "PartsProjector (part) [PartsModel.projector, input 2x5x6]: eval",
        "PartsProjector (part) [PartsModel.projector, input 2x5x6]: train",
    }
    # the pooler no model builds: built from the checked model's configuration
    assert all(
        "built from PartsModel's configuration" in k for k in by_class["PartsPooler"].matched_in
    )
    assert by_class["PartsPooler"].matched_in
    # token ids drive the mixer: no float input runs it, so its site stays not exercised
    assert verification.status == "not exercised", verification.summary()
    (missing,) = verification.not_exercised
    assert missing.site.cls == "PartsTokenMixer"
    mixer = next(c for c in verification.classes if c.cls == "PartsTokenMixer" + PART_SUFFIX)
    assert mixer.status == "not checkable"
    assert "runs on none of the input shapes tried" in mixer.reason


@pytest.mark.slow
def test_a_wrong_patch_in_a_part_is_refuted_by_its_part_check(
    verdicts: dict[str, FileVerification],
) -> None:
    verification = verdicts["wrong-projector"]
    assert verification.status == "refuted", verification.summary()
    refuted = [c.label for c in verification.classes if c.status == "refuted"]
    assert refuted == ["PartsProjector (part) [PartsModel.projector, input 2x5x6]"]


class _AttentionAdapter(nn.Module):
    """Built only when an option is set, and then of that width (HuBERT's attention adapter,
    ``adapter_attn_dim``): the option is ``None`` in the configuration the model was built from."""

    def __init__(self, config: types.SimpleNamespace) -> None:
        super().__init__()
        self.down = nn.Linear(config.hidden_size, config.adapter_dim)
        self.up = nn.Linear(config.adapter_dim, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.up(torch.relu(self.down(hidden)))


def test_a_part_switched_on_by_an_unset_size_is_built_with_the_model_s_width() -> None:
    config = types.SimpleNamespace(hidden_size=6, adapter_dim=None)
    whole = Subject("Model", "", nn.Identity, nn.Identity, inputs=None)
    found = constructed_subject(whole, config, (_AttentionAdapter, _AttentionAdapter), SETTINGS)
    assert isinstance(found, Subject), found
    assert found.label == "built from Model's configuration, input 2x5x6"
    assert found.build_patched().part.down.out_features == 6
    assert config.adapter_dim is None  # the model's configuration is left as it was
    lacking = types.SimpleNamespace(hidden_size=6)  # HuBERT's: the file kept the class only
    found = constructed_subject(whole, lacking, (_AttentionAdapter, _AttentionAdapter), SETTINGS)
    assert isinstance(found, Subject), found


@pytest.mark.slow
def test_a_model_no_inputs_run_is_verified_through_its_parts_and_refuted_through_them() -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers")
    patched = rewritten_by(PIPELINE_ONLY, "paper.6").patched
    assert patched.count("linear_bias_activation(") == 1
    cases = {"correct": patched, "wrong": patched.replace("self.act)", "nn.functional.silu)")}
    verdicts = verdicts_of(PIPELINE_ONLY, cases, VerifyOptions(modes=("eval", "train")))
    correct = verdicts["correct"]
    whole = next(c for c in correct.classes if c.cls == "PipelineOnlyModel")
    assert whole.status == "not checkable" and "runs only inside its pipeline" in whole.reason
    # built small without running it whole, its projector is proven on its own
    assert correct.status == "verified", correct.summary()
    (part,) = [c for c in correct.classes if c.cls.endswith(PART_SUFFIX)]
    assert part.label == "PipelineOnlyProjector (part) [PipelineOnlyModel.projector, input 2x5x6]"
    assert verdicts["wrong"].status == "refuted", verdicts["wrong"].summary()


# -- a processor no model sets: checked standing in for the one an attention module holds --------

PROCESSORS = """
import torch
from torch import nn


class DefaultProcessor:
    def __call__(self, attn, hidden_states, encoder_hidden_states=None):
        return attn.to_out(hidden_states)


class JointProcessor:  # a variant the user installs: it needs the encoder states
    def __call__(self, attn, hidden_states, encoder_hidden_states, scale=1.0):
        return attn.to_out(hidden_states + encoder_hidden_states) * ACTIVATION(scale)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.to_out = nn.Linear(4, 4)
        self.processor = DefaultProcessor()

    def forward(self, hidden_states, encoder_hidden_states=None):
        return self.processor(self, hidden_states, encoder_hidden_states)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()

    def forward(self, hidden_states):
        return self.attn(hidden_states)
"""


def _processors_module(name: str, activation: str) -> types.ModuleType:
    module = types.ModuleType(name)
    text = PROCESSORS.replace("ACTIVATION(scale)", f"{activation}(torch.tensor(scale))")
    exec(compile(text, f"{name}.py", "exec"), module.__dict__)  # noqa: S102 - our own fixture
    for value in vars(module).values():
        if isinstance(value, type):
            value.__module__ = name
    return module


def _stand_in_check(patched_activation: str) -> Subject:
    from adopter.models.parts import parts_to_check

    original = _processors_module("processors_original", "torch.sigmoid")
    patched = _processors_module("processors_patched", patched_activation)

    def build(module: types.ModuleType) -> nn.Module:
        torch.manual_seed(0)
        return module.Model()

    def whole() -> Subject:
        inputs = torch.randn(2, 5, 4)
        return Subject("Model", "", lambda: build(original), lambda: build(patched), inputs)

    found = list(
        parts_to_check(
            [("Model", whole)], ["JointProcessor"], lambda cls: True, (original, patched), SETTINGS
        )
    )
    ((cls, subject),) = found
    assert cls == "JointProcessor"
    assert isinstance(subject, Subject), subject
    return subject


def test_a_processor_no_model_sets_is_checked_in_place_of_the_one_a_module_holds() -> None:
    subject = _stand_in_check("torch.sigmoid")
    assert subject.name == "JointProcessor" + PART_SUFFIX
    # the module that calls a processor, the variant in its place, both tensors it requires
    assert subject.label == (
        "Model.attn with JointProcessor() as its processor, "
        "input 2x5x4 as hidden_states, encoder_hidden_states"
    )
    options = VerifyOptions(modes=("eval", "train"))
    assert prove(subject, None, options).status == "verified"
    wrong = prove(_stand_in_check("torch.tanh"), None, options)
    assert wrong.status == "refuted", wrong.reason


class _SelfOrCrossAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(4, 4)

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: torch.Tensor
    ):
        assert key is query and value is query, "the fused path: taken only with one tensor"
        return self.q_proj(query) * scale


def test_an_attention_part_is_given_one_tensor_as_query_key_and_value_first() -> None:
    shape, inputs = runnable_inputs(_SelfOrCrossAttention(), SETTINGS) or ("", None)
    assert shape == "2x5x4, one tensor as query, key, value"
    query, key, value, scale = inputs
    assert key is query and value is query and scale is not query


class _PixelShuffleProjector(nn.Module):
    """Folds each 2 x 2 block of a square grid of tokens into one token four times as wide."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.linear = nn.Linear(32, 4)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = features.shape
        side = int(tokens**0.5)
        grid = features.reshape(batch, side // 2, 2, side // 2, 2, width).permute(0, 1, 3, 2, 4, 5)
        return self.linear(self.norm(grid.reshape(batch, -1, 4 * width)))


def test_a_pixel_shuffle_projector_is_given_a_square_grid_of_narrower_tokens() -> None:
    shape, inputs = runnable_inputs(_PixelShuffleProjector(), SETTINGS) or ("", None)
    assert shape == "2x16x8"  # a 4 x 4 grid of tokens a quarter of the first layer's width
