"""Size fixes for configuration widths that model code rejects (``hf.size_fixes``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")

from adopter.models.transformers.repairs import size_fixes  # noqa: E402


class _Config(SimpleNamespace):
    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def test_widths_grow_to_a_multiple_of_a_hard_coded_group_count() -> None:
    config = _Config(d_model=16, encoder_hidden_size=16, num_heads=16, vocab_size=99)
    error = "num_channels (16) must be divisible by num_groups (32)"
    assert size_fixes(config, error) == {"d_model": 32, "encoder_hidden_size": 32}
