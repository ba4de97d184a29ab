"""The measurement machinery on a tiny model. Checks structure and bookkeeping, never speed."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from adopter.bench import (
    CheckpointMismatchError,
    ModelVariant,
    VariantBuildError,
    benchmark_variants,
    derive_loss,
    environment_info,
    to_json,
)
from adopter.bench.measure import (
    RSS_RESOLUTION,
    MemoryStats,
    _summarise,
    make_step,
    prepare_variant,
    resolve_factory,
)
from tests.bench import toy

FAST = {"warmup": 1, "repeats": 2, "threads": 1}


def test_result_has_both_variants_with_statistics(toy_result):
    assert toy_result.baseline == "original"
    assert toy_result.names == ["original", "patched"]
    assert toy_result.modes == ("inference", "train")
    for name in toy_result.names:
        for mode in toy_result.modes:
            res = toy_result.get(name, mode)
            assert res.ok, res.error
            timing = res.timing
            assert len(timing.times_s) == 3
            assert all(t > 0 for t in timing.times_s)
            assert timing.min_s <= timing.q1_s <= timing.median_s <= timing.q3_s <= timing.max_s
            assert timing.batch_size == 4
            assert timing.throughput == pytest.approx(4 / timing.median_s)
            sp = res.speedup
            assert sp is not None and sp.method == "paired" and sp.confidence == 0.95
            assert 0 < sp.ci_low <= sp.ci_high
    base = toy_result.get("original", "train").speedup
    assert (base.ratio, base.ci_low, base.ci_high) == (1.0, 1.0, 1.0)
    patched = toy_result.get("patched", "train")
    assert patched.speedup.ratio == pytest.approx(
        toy_result.get("original", "train").timing.median_s / patched.timing.median_s
    )


def test_profiler_memory_is_recorded_with_ratio(toy_result):
    for mode in toy_result.modes:
        base = toy_result.get("original", mode).memory
        patched = toy_result.get("patched", mode).memory
        assert base.method == patched.method == "profiler"
        assert base.peak_bytes > 0 and patched.peak_bytes > 0
        assert base.ratio is None
        assert patched.ratio == pytest.approx(patched.peak_bytes / base.peak_bytes)
    # Training keeps activations for backward and allocates gradients: more than inference.
    train = toy_result.get("original", "train").memory.peak_bytes
    assert train > toy_result.get("original", "inference").memory.peak_bytes


def test_settings_and_environment_are_recorded(toy_result):
    cfg, env = toy_result.settings, toy_result.environment
    assert cfg["device"] == "cpu" and cfg["dtype"] == "float32"
    assert cfg["threads"] == 1 and cfg["memory"] == "profiler" and cfg["compile"] is False
    assert cfg["input_shapes"] == {"args[0]": [4, 8, 32]}
    assert env["torch"] == torch.__version__
    assert env["threads"] == 1 and env["device"] == "cpu" and env["cpu"]
    assert "linear_bias_activation" in env["kernels"]


def test_threads_are_restored():
    before = torch.get_num_threads()
    benchmark_variants(
        [ModelVariant("original", toy.original)],
        baseline="original",
        modes=("inference",),
        warmup=0,
        repeats=1,
        threads=1,
    )
    assert torch.get_num_threads() == before


def test_variants_share_baseline_weights_and_inputs():
    built: dict[str, tuple[torch.nn.Module, tuple]] = {}

    def recording(name, factory):
        def build():
            model, inputs = factory()
            built[name] = (model, inputs)
            return model, inputs

        return build

    benchmark_variants(
        [
            ModelVariant("original", recording("original", toy.original)),
            ModelVariant("patched", recording("patched", toy.patched)),
        ],
        baseline="original",
        modes=("inference",),
        **FAST,
    )
    base_state = built["original"][0].state_dict()
    patched_state = built["patched"][0].state_dict()
    assert base_state.keys() == patched_state.keys()
    for key, value in base_state.items():
        assert torch.equal(value, patched_state[key]), key
    # Same weights and same input: in eval mode the patched model computes the same output.
    x = built["original"][1][0]
    with torch.no_grad():
        torch.testing.assert_close(built["patched"][0].eval()(x), built["original"][0].eval()(x))


def test_checkpoint_incompatible_variant_fails_clearly():
    with pytest.raises(CheckpointMismatchError) as info:
        benchmark_variants(
            [ModelVariant("original", toy.original), ModelVariant("renamed", toy.renamed)],
            baseline="original",
            **FAST,
        )
    message = str(info.value)
    assert "'renamed'" in message and "'original'" in message
    assert "layers.0.fc1.weight" in message and "layers.0.up.weight" in message


def test_shape_mismatch_is_reported():
    wider = functools.partial(toy.original, ffn=128)
    with pytest.raises(CheckpointMismatchError, match=r"different shapes: layers\.0\.fc1\.weight"):
        benchmark_variants(
            [ModelVariant("original", toy.original), ModelVariant("wider", wider)],
            baseline="original",
            **FAST,
        )


def test_failing_step_is_reported_per_variant():
    result = benchmark_variants(
        [ModelVariant("original", toy.original), ModelVariant("broken", toy.broken)],
        baseline="original",
        **FAST,
    )
    for mode in result.modes:
        assert result.get("original", mode).ok
        broken = result.get("broken", mode)
        assert not broken.ok and broken.timing is None and broken.speedup is None
        assert broken.error == "step failed: RuntimeError: kaboom"


def _refusing_backend(graph_module, example_inputs):
    raise RuntimeError("backend refuses")


def test_compile_failure_is_reported_not_raised():
    result = benchmark_variants(
        [ModelVariant("original", toy.original), ModelVariant("patched", toy.patched)],
        baseline="original",
        modes=("inference",),
        compile=True,
        compile_backend=_refusing_backend,
        **FAST,
    )
    for name in result.names:
        error = result.get(name, "inference").error
        assert error.startswith("torch.compile failed: BackendCompilerFailed")
        assert "backend refuses" in error
    assert result.settings["compile_backend"] == "_refusing_backend"
    json.dumps(to_json(result))  # a callable backend still serialises (by name)


def test_compile_with_working_backend_times_both():
    result = benchmark_variants(
        [ModelVariant("original", toy.original), ModelVariant("patched", toy.patched)],
        baseline="original",
        modes=("inference",),
        compile=True,
        compile_backend="eager",
        warmup=0,  # raised to one: the first call compiles and is never timed
        repeats=2,
        threads=1,
    )
    assert result.settings["compile"] is True and result.settings["compile_backend"] == "eager"
    assert all(result.get(name, "inference").ok for name in result.names)


def test_keyword_inputs_and_model_loss():
    result = benchmark_variants(
        [ModelVariant("original", toy.keyword)],
        baseline="original",
        modes=("train",),
        batch_size=6,
        **FAST,
    )
    assert result.get("original", "train").timing.batch_size == 6
    assert result.settings["input_shapes"] == {"input_ids": [3, 5], "attention_mask": [3, 5]}


def test_float_inputs_follow_dtype_but_ids_do_not():
    variant = ModelVariant("k", toy.keyword)
    model, args, kwargs = prepare_variant(variant, torch.device("cpu"), torch.float64, seed=0)
    assert args == ()
    assert kwargs["input_ids"].dtype == torch.int64
    assert kwargs["attention_mask"].dtype == torch.float64
    assert model.proj.weight.dtype == torch.float64
    # Factories run under a fixed seed: a rebuild (e.g. in the memory probe) sees the same data.
    _, _, again = prepare_variant(variant, torch.device("cpu"), torch.float64, seed=0)
    assert torch.equal(kwargs["input_ids"], again["input_ids"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"baseline": "nope"}, "baseline 'nope'"),
        ({"baseline": "original", "modes": ("serve",)}, "unknown mode"),
        ({"baseline": "original", "repeats": 0}, "repeats >= 1"),
        ({"baseline": "original", "memory": "cuda"}, "needs a CUDA device"),
        ({"baseline": "original", "memory": "vibes"}, "unknown memory method"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        benchmark_variants([ModelVariant("original", toy.original)], **kwargs)


def test_duplicate_names_rejected():
    with pytest.raises(ValueError, match="unique"):
        benchmark_variants(
            [ModelVariant("a", toy.original), ModelVariant("a", toy.patched)], baseline="a"
        )


def test_factory_errors_name_the_variant():
    def bad():
        return "not a model"

    with pytest.raises(VariantBuildError, match="'odd'.*must return"):
        ModelVariant("odd", bad).build()
    with pytest.raises(VariantBuildError, match="'boom'.*factory raised"):
        ModelVariant("boom", functools.partial(toy.original, batch="x")).build()


def test_factory_strings_are_imported():
    model, inputs = ModelVariant("s", "tests.bench.toy:original").build()
    assert isinstance(model, toy.ToyMLP) and inputs[0].shape == (4, 8, 32)
    assert resolve_factory("tests.bench.toy:ToyMLP") is toy.ToyMLP
    with pytest.raises(ValueError, match="module:function or path/to/file.py:function"):
        resolve_factory("tests.bench.toy.original")


def test_derive_loss_covers_common_outputs():
    t = torch.tensor([1.0, 3.0], requires_grad=True)
    assert derive_loss(t).item() == pytest.approx(5.0)
    assert derive_loss((torch.tensor([0, 1]), t)).item() == pytest.approx(5.0)
    assert derive_loss({"loss": torch.tensor(2.0), "logits": t}).item() == 2.0
    assert derive_loss(toy.Output(t, loss=None)).item() == pytest.approx(5.0)
    assert derive_loss(toy.Output(t, loss=torch.tensor([1.0, 2.0]))).item() == 1.5
    with pytest.raises(TypeError, match="cannot derive a loss"):
        derive_loss((torch.tensor([1, 2]), None))


def test_train_step_updates_weights():
    model, (x,) = toy.original()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.layers[0].fc1.weight.detach().clone()
    model.train()
    make_step(model, (x,), {}, "train", optimizer)()
    assert not torch.equal(before, model.layers[0].fc1.weight)
    with pytest.raises(ValueError, match="needs an optimizer"):
        make_step(model, (x,), {}, "train")


def test_environment_info_without_benchmark():
    env = environment_info("cpu")
    assert env["device"] == "cpu" and env["gpu"] is None and env["cpu_count"] >= 1


def test_variants_must_build_the_same_inputs():
    bigger_batch = functools.partial(toy.patched, batch=8)
    with pytest.raises(ValueError, match="builds different inputs"):
        benchmark_variants(
            [ModelVariant("original", toy.original), ModelVariant("patched", bigger_batch)],
            baseline="original",
            **FAST,
        )


def test_rss_ratios_are_withheld_below_resolution():
    times = {"original": {"train": [1.0, 1.0]}, "patched": {"train": [0.5, 0.5]}}
    errors = {"original": {}, "patched": {}}

    def summarise(base_peak: int, patched_peak: int):
        memories = {
            "original": {"train": MemoryStats("rss_subprocess", base_peak, 1 << 30)},
            "patched": {"train": MemoryStats("rss_subprocess", patched_peak, 1 << 30)},
        }
        out = _summarise(
            ["original", "patched"], ("train",), "original", times, errors, memories, 4,
            confidence=0.95, resamples=100, seed=0,
        )  # fmt: skip
        return out["patched"]["train"]

    tiny = summarise(64 << 10, 0)
    assert tiny.memory.ratio is None and "below the 4 MiB" in tiny.memory_error
    big = summarise(RSS_RESOLUTION * 4, RSS_RESOLUTION * 2)
    assert big.memory.ratio == 0.5 and big.memory_error is None
    assert big.speedup.ratio == 2.0 and big.timing.throughput == 8.0
