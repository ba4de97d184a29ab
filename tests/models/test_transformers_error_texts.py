"""Each pattern the transformers adapter reads off an exception matches the text the installed
torch raises today: every error is triggered here (tiny tensors, milliseconds)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from adopter.models.transformers import repairs


def _message(trigger: Callable[[], Any]) -> str:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the text is what is under test
        trigger()
    return str(caught.value)


def test_a_batch_norm_of_another_width_names_both_sizes() -> None:
    norm = nn.BatchNorm1d(6).eval()
    text = _message(lambda: norm(torch.randn(2, 4)))
    match = repairs._SIZE_PAIRS[0].search(text)
    assert match is not None and {match.group(1), match.group(2)} == {"6", "4"}


def test_a_convolution_of_another_width_names_both_channel_counts() -> None:
    conv = nn.Conv2d(3, 4, 1)
    text = _message(lambda: conv(torch.randn(1, 5, 4, 4)))
    match = repairs._SIZE_PAIRS[1].search(text)
    assert match is not None and (match.group(1), match.group(2)) == ("3", "5")
    assert repairs._SHAPE_ERROR.search(text)


def test_a_group_norm_whose_groups_do_not_divide_the_width() -> None:
    text = _message(lambda: nn.GroupNorm(4, 6))
    match = repairs._GROUPS_DIVIDE.search(text)
    assert match is not None and (match.group(1), match.group(2)) == ("6", "4")


def test_a_linear_layer_of_another_width() -> None:
    linear = nn.Linear(3, 2)
    assert repairs._SHAPE_ERROR.search(_message(lambda: linear(torch.randn(2, 5))))


def test_a_stack_that_runs_out_of_pixels() -> None:
    pool = nn.AdaptiveMaxPool2d((2, 2))
    small = _message(lambda: nn.MaxPool2d(3)(torch.randn(1, 1, 2, 2)))
    kernel = _message(lambda: nn.Conv2d(1, 1, 5)(torch.randn(1, 1, 2, 2)))
    assert repairs._TOO_SMALL.search(small), small
    assert repairs._TOO_SMALL.search(kernel), kernel
    pool(torch.randn(1, 1, 2, 2))  # (what still runs: no false alarm to read)


def test_a_waveform_without_its_channel_dimension() -> None:
    conv = nn.Conv1d(1, 2, 3)
    text = _message(lambda: conv(torch.randn(2, 8000)))
    match = repairs._CONV_CHANNELS.search(text)
    assert match is not None and match.groups() == ("2", "8000", "1")
    assert repairs.layout_fix(text, {"input_values": torch.randn(2, 8000)}) == (
        "input_values",
        "channel",
    )


def test_split_sizes_that_do_not_reach_the_total() -> None:
    text = _message(lambda: torch.randn(2, 10).split([4, 8], dim=-1))
    match = repairs._SPLIT.search(text)
    assert match is not None and match.group(1) == "10" and match.group(2) == "4, 8"


def test_an_optional_input_used_as_if_given_is_named() -> None:
    class Model(nn.Module):
        def forward(self, input_ids: Any = None, bbox: Any = None) -> Any:
            return bbox[:, 0]

    model = Model()
    with pytest.raises(TypeError) as caught:
        model(input_ids=torch.zeros(1))
    assert repairs.named_parameters(caught.value, model, {"input_ids": None}) == ("bbox",)


def test_a_shape_spelled_out_by_the_installed_transformers() -> None:
    """Image-pair models (SuperGlue, LightGlue) spell the shape they want; the text is read from
    the installed package's source (raising it would need the model built)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("transformers is not installed")
    root = Path(spec.submodule_search_locations[0]) / "models"
    texts = [
        line
        for name in ("superglue", "lightglue")
        for path in (root / name).glob("modeling_*.py")
        for line in path.read_text(encoding="utf-8").splitlines()
        if "tensor of shape" in line
    ]
    if not texts:
        pytest.skip("this transformers has no image-pair model")
    assert any(repairs._SPELLED_SHAPE.search(line) for line in texts), texts
