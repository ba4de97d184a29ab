"""Repeated attribute reads of one value are one value where the first read ran on every
path to the second (T5Gemma's ``decoder_config.final_logit_softcapping`` of a configuration an
unknown method returned), and two values otherwise."""

from tests.helpers import extract


def _read_values(source: str, attribute: str) -> list[int]:
    flow = extract(source).classes["Head"].flows["forward"]
    values = []
    for step in flow.steps:
        for operand in step.operands():
            if getattr(operand.node, "attr", None) == attribute:
                values.extend(f.value for f in operand.flows)
    return values


_HEADER = """
import torch
from torch import nn

class Head(nn.Module):
    def forward(self, x):
        cfg = self.get_config().inner
"""


def test_a_read_on_every_path_to_the_next_is_the_same_value():
    values = _read_values(
        _HEADER
        + """
        if cfg.cap is not None:
            x = x / cfg.cap
            x = x * cfg.cap
        return x
""",
        "cap",
    )
    assert len(values) == 3 and len(set(values)) == 1


def test_a_read_in_one_arm_is_not_the_value_of_a_read_after_the_if():
    values = _read_values(
        _HEADER
        + """
        if x.dim() > 2:
            x = x / cfg.cap
        x = x * cfg.cap
        return x
""",
        "cap",
    )
    assert len(values) == 2 and len(set(values)) == 2


def test_a_store_to_the_attribute_forgets_the_earlier_read():
    values = _read_values(
        _HEADER
        + """
        x = x / cfg.cap
        cfg.cap = 2.0
        x = x * cfg.cap
        return x
""",
        "cap",
    )
    assert len(values) == 2 and len(set(values)) == 2


def test_reads_in_a_loop_body_are_not_remembered():
    values = _read_values(
        _HEADER
        + """
        for _ in range(2):
            x = x / cfg.cap
            x = x * cfg.cap
        return x
""",
        "cap",
    )
    assert len(set(values)) == 2
