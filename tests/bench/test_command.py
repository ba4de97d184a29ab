"""``run_bench`` / ``only_faster_rules``: the machinery on tiny models, never the speed.

Timings on a shared CI machine are noise at this size, so the tests check what was compared
(variants, patched sites, configurations, weights, outputs written), not which one won. The
``--only-faster`` criterion itself is tested on hand-made results.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from adopter.bench import from_json
from adopter.bench.command import (
    BenchOptions,
    BenchTargetError,
    NoSiteError,
    _pool_rounds,
    _undecided,
    bench_config,
    judge_variant,
    only_faster_rules,
    parse_config_overrides,
    plan_variants,
    resolve_transformers_target,
    run_bench,
)
from adopter.rules import load_rule_set
from tests.bench.synthetic import make_result

pytest.importorskip("transformers")

TINY_BERT = {
    "hidden_size": 32,
    "num_attention_heads": 2,
    "intermediate_size": 37,
    "vocab_size": 99,
}
QUICK = {"warmup": 1, "repeats": 3, "threads": 1}


def quick(**settings) -> BenchOptions:
    """A short run on one thread, with ``settings`` on top."""
    return BenchOptions(**{**QUICK, **settings})


def paper(*ids: str):
    """A subset of the paper rules, by id."""
    return [rule for rule in load_rule_set("paper") if rule.id in ids]


@pytest.mark.slow  # a whole BERT benchmarked three ways
def test_run_bench_bert_original_patched_and_ablation(tmp_path: Path) -> None:
    json_out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    result = run_bench(
        "bert",
        quick(
            config_overrides=TINY_BERT,
            layers=1,
            seq_len=16,
            batch_size=2,
            ablation=True,
            json_out=json_out,
            plot_path=png,
        ),
        rules=load_rule_set("paper"),  # the paper's rules: what the figures below count
    )
    assert result.baseline == "original"
    assert result.names == [
        "original",
        "patched",
        "paper.1 only",
        "paper.4 only",
        "paper.5 only",
        "paper.6 only",
        "paper.9 only",
    ]
    for name in result.names:
        for mode in ("inference", "train"):
            res = result.get(name, mode)
            assert res.ok, (name, mode, res.error)
            assert len(res.timing.times_s) == 3
            assert res.speedup is not None
    target = result.settings["target"]
    # paper.4 is inside the attention paper.1 replaces: covered in the combined rewrite.
    # paper.6: the intermediate dense + GELU twice and the pooler dense + tanh
    assert target["patched_sites"]["patched"] == {"paper.1": 1, "paper.5": 2, "paper.6": 3}
    assert target["patched_sites"]["paper.4 only"] == {"paper.4": 1}
    # BERT's q, k and v sit in different arms (cross-attention or not): alone, paper.9 fuses
    # them by the Figure-4 move; combined, paper.1 replaces the whole attention instead.
    assert target["patched_sites"]["paper.9 only"] == {"paper.9": 1}
    assert set(target["no_site"]) == {"paper.2", "paper.3", "paper.7", "paper.8"}
    assert target["model"]["class"] == "BertModel"
    assert target["model"]["config"]["hidden_size"] == 32
    assert result.settings["input_shapes"]["input_ids"] == [2, 16]
    assert from_json(json.loads(json_out.read_text())).names == result.names
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_same_weights_and_outputs_original_vs_patched() -> None:
    """Both sides come from one configuration; the patched loads the original's weights."""
    import torch

    plan = plan_variants("bert", BenchOptions(config_overrides=TINY_BERT, layers=1, seq_len=16))
    (original, inputs), (patched, _) = (v.build() for v in plan.variants)
    assert type(original).__module__ == "transformers.models.bert.modeling_bert"
    assert "_adopter_bench_patched_" in type(patched).__module__
    patched.load_state_dict(original.state_dict(), strict=True)
    original.eval(), patched.eval()
    with torch.no_grad():
        expected = original(**inputs).last_hidden_state
        actual = patched(**inputs).last_hidden_state
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_only_faster_rules_reasons_for_every_rule() -> None:
    rules = paper("paper.2", "paper.5", "paper.6")
    kept, reasons = only_faster_rules(
        "bert", rules, quick(config_overrides=TINY_BERT, layers=1, seq_len=16)
    )
    assert set(reasons) == {"paper.2", "paper.5", "paper.6"}
    assert reasons["paper.2"] == "no site"
    for rule_id in ("paper.5", "paper.6"):
        assert reasons[rule_id].startswith(("kept: ", "dropped: ")), reasons[rule_id]
        assert "inference" in reasons[rule_id] and "train" in reasons[rule_id]
    assert {rule.id for rule in kept} == {r for r, why in reasons.items() if why.startswith("kept")}


def test_only_faster_rules_without_any_site() -> None:
    kept, reasons = only_faster_rules("resnet", paper("paper.1", "paper.2"), quick())
    assert kept == []
    assert reasons == {"paper.1": "no site", "paper.2": "no site"}


@pytest.mark.parametrize(
    ("entries", "keep", "start"),
    [
        ({"inference": (1.3, 1.1, 1.5), "train": (1.0, 0.95, 1.05)}, True, "kept: faster in inf"),
        ({"inference": (1.0, 0.9, 1.1), "train": (1.2, 1.05, 1.3)}, True, "kept: faster in train"),
        ({"inference": (1.3, 1.1, 1.5), "train": (0.9, 0.85, 0.95)}, False, "dropped: slower"),
        ({"inference": (1.05, 0.9, 1.2), "train": (1.0, 0.9, 1.1)}, False, "dropped: not reli"),
        ({"inference": "step failed: boom", "train": (1.2, 1.1, 1.3)}, False, "dropped: inference"),
    ],
)
def test_only_faster_criterion(entries, keep: bool, start: str) -> None:
    result = make_result({"paper.5 only": entries})
    decided, reason = judge_variant(result, "paper.5 only")
    assert decided is keep
    assert reason.startswith(start), reason


@pytest.mark.parametrize(
    ("entries", "undecided"),
    [
        ({"inference": (1.05, 0.9, 1.2), "train": (0.99, 0.9, 1.1)}, True),
        ({"inference": (0.98, 0.9, 1.05), "train": (0.99, 0.9, 1.1)}, False),  # no sign of a gain
        ({"inference": (1.3, 1.1, 1.5), "train": (1.0, 0.95, 1.05)}, False),  # already kept
        ({"inference": (1.3, 0.9, 1.5), "train": (0.9, 0.85, 0.95)}, False),  # reliably slower
    ],
)
def test_only_faster_extends_only_undecided_rules(entries, undecided: bool) -> None:
    assert _undecided(make_result({"paper.5 only": entries}), "paper.5 only", 1.0) is undecided


def test_extra_rounds_are_pooled_pairwise_with_the_baseline() -> None:
    from adopter.bench import Speedup, TimingStats
    from adopter.bench.stats import bootstrap_ratio_ci

    def with_times(base: list[float], own: list[float]):
        result = make_result({"paper.5 only": {"inference": (1.0, 0.9, 1.1)}}, modes=("inference",))
        result.get("original", "inference").timing = TimingStats.from_times(base, 8)
        result.get("paper.5 only", "inference").timing = TimingStats.from_times(own, 8)
        result.get("paper.5 only", "inference").speedup = Speedup(1.0, 0.9, 1.1, 0.95, "paired")
        return result

    first = with_times([10.0, 12.0, 11.0], [9.0, 12.5, 10.0])
    more = with_times([10.0, 11.0, 13.0, 10.5], [9.5, 10.0, 12.0, 10.0])
    _pool_rounds(first, more, ["paper.5 only"], seed=0)
    pooled = first.get("paper.5 only", "inference")
    base = [10.0, 12.0, 11.0, 10.0, 11.0, 13.0, 10.5]
    own = [9.0, 12.5, 10.0, 9.5, 10.0, 12.0, 10.0]
    assert pooled.timing.times_s == tuple(own)
    assert pooled.speedup.method == "paired"
    assert (pooled.speedup.ci_low, pooled.speedup.ci_high) == bootstrap_ratio_ci(
        base, own, paired=True, seed=0
    )
    assert pooled.speedup.ratio == pytest.approx(11.0 / 10.0)


def test_only_faster_gives_undecided_rules_more_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule the short run cannot decide is measured again, alone with the baseline, and
    judged on all its rounds; a rule already decided is not measured again."""
    import adopter.bench.command as command
    from adopter.bench import TimingStats

    calls: list[tuple[list[str], int]] = []

    def fake_benchmark(variants, *, repeats, **_options):
        names = [v.name for v in variants]
        calls.append((names, repeats))
        if len(calls) == 1:  # paper.5: 1.05x but a wide interval; paper.6: clearly faster
            entries = {
                "paper.5 only": {"inference": (1.05, 0.9, 1.2), "train": (1.0, 0.9, 1.1)},
                "paper.6 only": {"inference": (1.3, 1.1, 1.5), "train": (1.0, 0.95, 1.05)},
            }
        else:
            entries = {"paper.5 only": {"inference": (1.05, 1.0, 1.1), "train": (1.0, 0.9, 1.1)}}
        result = make_result(entries)
        base = [0.010 * (1 + 0.01 * i) for i in range(repeats)]
        for mode in result.modes:  # a steady 5% gain in every round
            result.get("original", mode).timing = TimingStats.from_times(base, 8)
            result.get("paper.5 only", mode).timing = TimingStats.from_times(
                [t / 1.05 for t in base], 8
            )
        return result

    monkeypatch.setattr(command, "benchmark_variants", fake_benchmark)
    kept, reasons = only_faster_rules(
        "bert",
        paper("paper.5", "paper.6"),
        BenchOptions(config_overrides=TINY_BERT, layers=1, seq_len=16, repeats=5),
        max_repeats=12,
    )
    assert calls == [
        (["original", "paper.5 only", "paper.6 only"], 5),
        (["original", "paper.5 only"], 7),
    ]
    assert [rule.id for rule in kept] == ["paper.5", "paper.6"]
    assert reasons["paper.5"].startswith("kept: faster in inference, train")


def test_factory_source_is_rewritten(tmp_path: Path) -> None:
    """Plain nn.Module code: the factory's module is patched and the factory called from it."""
    result = run_bench(
        options=quick(factory="tests.bench.plain_model:build", ablation=True, modes=("inference",)),
        rules=paper("paper.5", "paper.7"),
    )
    assert result.names == ["original", "patched", "paper.5 only", "paper.7 only"]
    sites = result.settings["target"]["patched_sites"]
    assert sites["patched"] == {"paper.5": 1, "paper.7": 1}
    assert all(result.get(name, "inference").ok for name in result.names)


def test_rule_groups_are_variants_of_their_own() -> None:
    """A named rule subset is measured next to all rules, unless it adds nothing new."""
    plan = plan_variants(
        options=BenchOptions(factory="tests.bench.plain_model:build"),
        rules=paper("paper.5", "paper.7"),
        rule_groups={"norm rules": paper("paper.5"), "same": paper("paper.5", "paper.7")},
    )
    assert [v.name for v in plan.variants] == ["original", "patched", "norm rules"]
    assert plan.info["patched_sites"]["norm rules"] == {"paper.5": 1}
    assert "'same' is the same source as 'patched'" in plan.info["notes"]
    plan = plan_variants(
        options=BenchOptions(factory="tests.bench.plain_model:build"),
        rules=paper("paper.5"),
        rule_groups={"attention": paper("paper.1")},
    )
    assert [v.name for v in plan.variants] == ["original", "patched"]
    assert "'attention' patches nothing here" in plan.info["notes"]


def test_factory_pair_with_memory_subset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two factories as given; memory probed only for the requested modes, ratios computed.

    The probe itself (a fresh interpreter per variant) is tested in test_memory.py; here it is
    replaced so that only the subset bookkeeping is checked, in milliseconds.
    """
    from adopter.bench import MemoryStats, command

    probed: list[tuple[str, tuple[str, ...]]] = []
    peaks = {"original": 8 << 20, "patched": 6 << 20}

    def fake_probe(variant, *, modes, **_options):
        probed.append((variant.name, tuple(modes)))
        return {mode: MemoryStats("rss_subprocess", peaks[variant.name]) for mode in modes}

    monkeypatch.setattr(command, "run_memory_probe", fake_probe)
    result = run_bench(
        options=quick(
            factory="tests.bench.toy:original",
            patched_factory="tests.bench.toy:patched",
            modes=("inference", "train"),
            memory="auto",
            memory_modes=("train",),
        )
    )
    assert result.names == ["original", "patched"]
    assert probed == [("original", ("train",)), ("patched", ("train",))]
    assert result.settings["memory_subset"] == {
        "variants": ["original", "patched"],
        "modes": ["train"],
    }
    assert result.get("patched", "inference").memory is None
    assert result.get("patched", "train").memory.ratio == pytest.approx(0.75)
    assert result.get("original", "train").memory.ratio is None


def test_factory_errors() -> None:
    with pytest.raises(BenchTargetError, match="module:function"):
        plan_variants(options=BenchOptions(factory="no_colon"))
    with pytest.raises(BenchTargetError, match="ablation|per-rule"):
        plan_variants(options=BenchOptions(factory="a:b", patched_factory="c:d", ablation=True))
    with pytest.raises(NoSiteError):
        plan_variants(
            options=BenchOptions(factory="tests.bench.plain_model:build"), rules=paper("paper.1")
        )


def test_targets_resolve_from_names_paths_and_copies(tmp_path: Path) -> None:
    by_name = resolve_transformers_target("bert")
    assert by_name.module_name == "transformers.models.bert.modeling_bert"
    assert by_name.installed
    by_folder = resolve_transformers_target(str(by_name.path.parent))
    assert by_folder.path == by_name.path and by_folder.installed
    copy = tmp_path / "transformers" / "models" / "bert" / "modeling_bert.py"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(by_name.path, copy)
    assert resolve_transformers_target(str(copy)).installed  # same text: the installed module
    copy.write_text(by_name.text + "\n# edited\n", encoding="utf-8")
    edited = resolve_transformers_target(str(copy))
    assert edited.module_name == by_name.module_name and not edited.installed
    with pytest.raises(BenchTargetError):
        resolve_transformers_target("no_such_model_xyz")
    stray = tmp_path / "model.py"
    stray.write_text("x = 1\n", encoding="utf-8")
    with pytest.raises(BenchTargetError, match="transformers package"):
        resolve_transformers_target(str(stray))


def test_bench_config_layers_and_dropout() -> None:
    from transformers import BertConfig, GPTNeoConfig, GroupViTConfig, T5Config

    bert = bench_config(BertConfig, layers=2, dropout="no-attention")
    assert (bert.num_hidden_layers, bert.hidden_size) == (2, 768)  # widths stay default
    assert bert.attention_probs_dropout_prob == 0.0 and bert.hidden_dropout_prob == 0.1
    assert bench_config(BertConfig, dropout="none").hidden_dropout_prob == 0.0
    assert bench_config(BertConfig).attention_probs_dropout_prob == 0.1

    neo = bench_config(GPTNeoConfig, layers=2)
    assert neo.num_layers == 2 and neo.attention_layers == ["global", "local"]

    t5 = bench_config(T5Config, layers=2, dropout="no-attention")  # one shared rate
    assert (t5.num_layers, t5.num_decoder_layers, t5.dropout_rate) == (2, 2, 0.0)

    vit = bench_config(
        GroupViTConfig, layers=2, overrides={"text_config.hidden_size": 64}, image_size=64
    )
    assert vit.vision_config.depths == [2, 2, 2]
    assert vit.vision_config.num_hidden_layers == 6
    assert vit.text_config.num_hidden_layers == 2
    assert vit.text_config.hidden_size == 64
    assert vit.vision_config.image_size == 64
    with pytest.raises(ValueError, match="dropout"):
        bench_config(BertConfig, dropout="some")


def test_parse_config_overrides() -> None:
    assert parse_config_overrides(["hidden_size=256", "hidden_act=gelu", "x.y=[1, 2]"]) == {
        "hidden_size": 256,
        "hidden_act": "gelu",
        "x.y": [1, 2],
    }
    with pytest.raises(BenchTargetError):
        parse_config_overrides(["novalue"])


def test_language_model_heads_train_with_their_labels_and_infer_without() -> None:
    """A masked/causal LM's training step computes its own loss from labels (the step a loss
    kernel takes over); its inference step gets no labels; a base model gets none at all."""
    import torch

    from adopter.bench.measure import TrainOnly, make_step

    plan = plan_variants(
        "bert",
        BenchOptions(
            config_overrides=TINY_BERT, layers=1, seq_len=16, model_class="BertForMaskedLM"
        ),
    )
    model, inputs = plan.variants[0].build()
    assert isinstance(inputs["labels"], TrainOnly)
    assert torch.equal(inputs["labels"].value, inputs["input_ids"])
    seen: list[dict] = []

    def runner(**kwargs):
        seen.append(kwargs)
        return model(**kwargs)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    make_step(runner, (), inputs, "train", optimizer)()
    make_step(runner, (), inputs, "inference")()
    assert torch.equal(seen[0]["labels"], inputs["input_ids"])
    assert "labels" not in seen[1]
    base = plan_variants("bert", BenchOptions(config_overrides=TINY_BERT, layers=1, seq_len=16))
    assert "labels" not in base.variants[0].build()[1]


def test_bench_config_sets_expert_counts_only_checkpoints_set() -> None:
    class CheckpointCounts:  # transformers 5.24's DeepSeek-V2: the per-token count is left unset
        def __init__(self, **changes: object) -> None:
            self.values = {"hidden_size": 64, "n_routed_experts": 8, "num_experts_per_tok": None}
            self.values.update(changes)

        def to_dict(self) -> dict[str, object]:
            return dict(self.values)

    assert bench_config(CheckpointCounts, layers=None).values["num_experts_per_tok"] == 2
    given = bench_config(CheckpointCounts, layers=None, overrides={"num_experts_per_tok": 3})
    assert given.values["num_experts_per_tok"] == 3  # an explicit override wins


class _DictConfig:
    """A configuration class as bench reads one: defaults from ``to_dict``, changes kept."""

    defaults: dict[str, object] = {}

    def __init__(self, **changes: object) -> None:
        self.values = {**self.defaults, **changes}

    def to_dict(self) -> dict[str, object]:
        return dict(self.defaults)


def test_narrowed_widths_keep_grouped_products_and_towers_consistent() -> None:
    """A narrowed configuration keeps every intermediate size a multiple of 8 (DeepSeek-V2's
    1,407-wide experts failed the float32 grouped product: "strides should be multiple of 16
    bytes"), narrows a multimodal model's text tower too, and the vision tower's output width
    follows the text width it has to match (Qwen2-VL)."""

    class Experts(_DictConfig):
        defaults = {"hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1407}

    class Multimodal(_DictConfig):
        defaults = {
            "text_config": {
                "hidden_size": 3584,
                "num_attention_heads": 28,
                "intermediate_size": 18944,
            },
            "vision_config": {"hidden_size": 3584, "embed_dim": 1280, "out_hidden_size": 3584},
        }

    experts = bench_config(Experts, layers=None).values
    assert (experts["intermediate_size"], experts["moe_intermediate_size"]) == (2048, 1408)
    both = bench_config(Multimodal, layers=None).values
    assert both["text_config"]["hidden_size"] == 768
    assert both["text_config"]["num_attention_heads"] == 12
    assert both["vision_config"]["out_hidden_size"] == 768
    assert bench_config(Multimodal, layers=None, full_size=True).values == Multimodal.defaults


def test_layer_cut_keeps_per_layer_lists_and_vision_depth() -> None:
    """Cutting the depth cuts the lists with one entry per layer (Qwen2-VL's text
    ``layer_types``, whose length its configuration checks) and a vision tower's ``depth``."""

    class Tower(_DictConfig):
        defaults = {
            "text_config": {"num_hidden_layers": 28, "layer_types": ["full_attention"] * 28},
            "vision_config": {"depth": 32},
        }

    values = bench_config(Tower, layers=2).values
    assert values["text_config"]["num_hidden_layers"] == 2
    assert values["text_config"]["layer_types"] == ["full_attention"] * 2
    assert values["vision_config"]["depth"] == 2


def test_images_in_the_layout_the_model_takes() -> None:
    """Plain images for a vision model; flattened patches, their grid and one placeholder per
    merged token for a patch-grid model; text alone for a model that scatters image features
    into placeholders any other way, when its images are optional."""
    import types

    from torch import nn

    from adopter.bench.command import make_bench_inputs

    class Vision(nn.Module):
        def forward(self, pixel_values): ...

    class Grid(nn.Module):
        def forward(self, input_ids, pixel_values=None, image_grid_thw=None): ...

    class Scatter(nn.Module):
        def forward(self, input_ids, pixel_values=None): ...

    sizes = {"batch_size": 2, "seq_len": 32, "image_size": 56}
    plain = make_bench_inputs(Vision(), types.SimpleNamespace(num_channels=3), **sizes)
    assert plain["pixel_values"].shape == (2, 3, 56, 56)
    grid_config = types.SimpleNamespace(
        vocab_size=100, image_token_id=7, patch_size=14, spatial_merge_size=2, temporal_patch_size=2
    )
    grid = make_bench_inputs(Grid(), grid_config, **sizes)
    assert grid["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]  # 56 px / 14 px patches
    assert grid["pixel_values"].shape == (2 * 16, 3 * 2 * 14 * 14)
    assert (grid["input_ids"] == 7).sum(dim=1).tolist() == [4, 4]  # 2 x 2 merged tokens each
    scatter = make_bench_inputs(
        Scatter(), types.SimpleNamespace(vocab_size=100, image_token_id=7), **sizes
    )
    assert set(scatter) == {"input_ids"}
    with pytest.raises(BenchTargetError, match="image tokens"):
        make_bench_inputs(Grid(), grid_config, batch_size=2, seq_len=4, image_size=112)
