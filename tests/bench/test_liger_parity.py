"""``benchmarks/liger_parity.py``'s classification, on a made-up ``models`` folder.

Two toy model types written here (no third-party source): one whose RMSNorm, rotary, a gated
MLP and LM head + loss are the stock spellings, next to an MLP with a fused ``gate_up_proj``
with a multiplier inside its activation (a miss); and a second type with a gated MLP and an
RMSNorm that divides by ``sqrt`` instead of multiplying by ``rsqrt`` (another miss). One apply and one explained scan, no network.
"""

from __future__ import annotations

import textwrap

import pytest

from benchmarks import liger_parity as lp

TOY = """
import torch
from torch import nn

from ...activations import ACT2FN
from ..other.modeling_other import OtherRMSNorm


class ToyRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class ToyVisionRMSNorm(ToyRMSNorm):
    pass


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


class ToyMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class ToyFusedMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.activation_fn = ACT2FN[config.hidden_act]
        self.gate_multiplier = config.gate_multiplier

    def forward(self, hidden_states):
        up_states = self.gate_up_proj(hidden_states)
        gate, up_states = up_states.chunk(2, dim=-1)
        up_states = up_states * self.activation_fn(gate * self.gate_multiplier)
        return self.down_proj(up_states)


class ToyForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, hidden_states, labels=None, **kwargs):
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return logits, loss
"""

OTHER = """
import torch
from torch import nn


class OtherRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states / torch.sqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


class OtherMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(8, 16, bias=False)
        self.up_proj = nn.Linear(8, 16, bias=False)
        self.down_proj = nn.Linear(16, 8, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
"""

VERIFY_REPORT = """
| file | verdict | checks verified | refuted | not checkable | sites exercised | sites not exercised | first reason (not verified) |
|---|---|---|---|---|---|---|---|
| modeling_toy.py | not exercised | 2 | 0 | 0 | 4 | 1 | 1 of 5 patched site(s) never ran in a check that matched: gated_mlp at line 80 (ToyMLP.forward): never ran |
| modeling_other.py | verified | 1 | 0 | 0 | 1 | 0 |  |

After the table.
"""

LIGER = lp.LigerList(
    commit="0" * 40,
    date="2026-01-01",
    source="monkey_patch.py",
    models=[
        lp.LigerModel(
            name="toy",
            directory="toy",
            cells={
                "rope": ["apply_rotary_pos_emb"],
                "rms_norm": ["ToyRMSNorm", "ToyRenamedRMSNorm"],
                "swiglu": ["ToyMLP", "ToyFusedMLP"],
                "fused_linear_cross_entropy": ["ToyForCausalLM"],
                "layer_norm": ["nn.LayerNorm"],
            },
        ),
        # a second function on the same file: its RMSNorm target inherits its forward, its MLP
        # target is the fused one and its loss target a class the file does not define
        lp.LigerModel(
            name="toy_vision",
            directory="toy",
            cells={
                "rms_norm": ["ToyVisionRMSNorm"],
                "swiglu": ["ToyFusedMLP"],
                "fused_linear_cross_entropy": ["ToyGoneForCausalLM"],
            },
        ),
        lp.LigerModel(name="other", directory="other", cells={"rms_norm": ["OtherRMSNorm"]}),
        # a name the file imports from another type's file: there, not here, is its code
        lp.LigerModel(name="toy_import", directory="toy", cells={"rms_norm": ["OtherRMSNorm"]}),
    ],
)


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory) -> lp.Parity:
    models = tmp_path_factory.mktemp("transformers") / "models"
    for kind, source in (("toy", TOY), ("other", OTHER)):
        (models / kind).mkdir(parents=True)
        (models / kind / f"modeling_{kind}.py").write_text(textwrap.dedent(source), "utf-8")
    (models / "tokenizer_only").mkdir()
    (models / "tokenizer_only" / "tokenization_tokenizer_only.py").write_text("", "utf-8")
    gaps = {
        "toy_vision.swiglu": lp.Gap("fused gate_up", "`ToyFusedMLP.forward`: chunk"),
        "toy.rope": lp.Gap("stale", "the rotary used to be missed"),
    }
    report = lp.parse_verification_text(VERIFY_REPORT)
    patterns = {"fused gate_up": r"up_states\.chunk\(2, dim=-1\)", "absent": "no such text"}
    return lp.assess(
        models, LIGER, gaps, report, version="0.0", report_name="v.md", patterns=patterns, jobs=1
    )


def cells(parity: lp.Parity) -> dict[str, lp.CellResult]:
    return {f"{c.model.name}.{c.cell}": c for c in parity.cells}


def test_each_cell_is_judged_at_liger_s_target(parity: lp.Parity) -> None:
    found = cells(parity)
    assert found["toy.rope"].status == lp.PATCHED
    assert found["toy.rope"].where.startswith("apply_rotary_pos_emb:")
    assert found["toy.rms_norm"].status == lp.PATCHED
    assert found["toy.rms_norm"].absent == ["ToyRenamedRMSNorm"]  # a name 5.x renamed
    assert found["toy.swiglu"].status == lp.PARTIAL  # ToyMLP yes, ToyFusedMLP no
    assert found["toy.fused_linear_cross_entropy"].status == lp.PATCHED
    assert found["toy.layer_norm"].status == lp.NO_RULE
    # the subclass without a forward of its own runs its base's patched code
    assert found["toy_vision.rms_norm"].status == lp.PATCHED
    # the rule writes a site in the file, not in the class Liger replaces
    assert found["toy_vision.swiglu"].status == lp.ELSEWHERE
    assert found["toy_vision.swiglu"].file_status == lp.PATCHED
    assert "ToyFusedMLP" in found["toy_vision.swiglu"].detail  # explain's stopping step
    # no Liger name exists in the file: the file as a whole is judged, and Liger does nothing
    gone = found["toy_vision.fused_linear_cross_entropy"]
    assert gone.status == lp.PATCHED and gone.targets == [] and gone.liger_noop
    # a division by sqrt instead of a product with rsqrt: no modern.1 site in that file at all
    assert found["other.rms_norm"].status == lp.MISSING
    assert found["other.rms_norm"].file_status == lp.MISSING
    imported = found["toy_import.rms_norm"]
    assert imported.inherited == ["OtherRMSNorm from ..other.modeling_other"]
    assert imported.status == lp.PATCHED and not imported.liger_noop  # the file's ToyRMSNorm


def test_gaps_attach_to_missed_cells_and_stale_ones_are_listed(parity: lp.Parity) -> None:
    found = cells(parity)
    assert found["toy_vision.swiglu"].gap == lp.Gap("fused gate_up", "`ToyFusedMLP.forward`: chunk")
    assert found["other.rms_norm"].gap is None
    assert parity.stale_gaps == ["toy.rope"]


def test_verified_column_reads_the_file_verdict(parity: lp.Parity) -> None:
    found = cells(parity)
    assert found["toy.rope"].verified == "file not exercised"
    assert found["toy.swiglu"].verified == "not exercised (this kernel's site named)"
    assert found["other.rms_norm"].verified == ""  # nothing patched there
    assert found["toy_vision.swiglu"].verified == ""  # patched, but not where Liger is


def test_coverage_counts_model_types(parity: lp.Parity) -> None:
    assert parity.types == ["other", "toy"]
    assert parity.no_modeling == ["tokenizer_only"]
    assert parity.coverage["modern.2"] == {"adopter": {"other", "toy"}, "liger": {"toy"}}
    assert parity.coverage["modern.3"]["adopter"] == {"toy"}
    assert parity.coverage["modern.1"] == {"adopter": {"toy"}, "liger": {"other", "toy"}}


def test_headline_and_document(parity: lp.Parity) -> None:
    figures = lp.headline(parity)
    assert figures["ruled"] == 9 and figures["no_rule"] == 1
    assert figures["patched"] == 6 and figures["file_patched"] == 8
    text = lp.render(parity, command="cmd", today="2026-01-01", adopter_commit="abc")
    assert "Patched at Liger's target: **6/9 = 67%**" in text
    assert "imported from another model type's file" in text
    assert "### fused gate_up (1)" in text
    assert parity.spellings == {"fused gate_up": 1, "absent": 0}
    assert "The spelling is in the modeling files of 1 model types" in text
    assert "### not written down yet (2)" in text
    assert "`toy.rope`" in text  # the stale note


def test_the_liger_list_loads() -> None:
    liger = lp.load_liger()
    assert liger.commit and len(liger.models) >= 40
    names = [m.name for m in liger.models]
    assert len(names) == len(set(names))
    assert all(cell in lp.CELL_RULE for m in liger.models for cell in m.cells)
    gaps = lp.load_gaps()
    assert all(key.split(".")[0] in names for key in gaps)
    causes = {gap.cause for gap in gaps.values()}
    assert set(lp.load_patterns()) <= causes  # a pattern for a cause no gap names is a typo
