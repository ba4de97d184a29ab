"""``adopter bench`` and ``adopter apply --only-faster``: original vs. rewritten model, measured.

This module connects the rewriter to the measurement harness. Given a *target* - a transformers
model (``bert``), its modeling file, or a ``module:function`` factory of plain ``nn.Module``
code - it

1. rewrites the model's source text with the selected rules (nothing is written next to the
   source: the patched text goes to a content-addressed scratch file, see
   :func:`patched_source_file`);
2. loads the patched text as a *sibling module* of the original (``transformers.models.bert.
   _adopter_bench_<tag>_modeling_bert``), so its relative imports resolve to the very objects
   the original uses and only the classes defined in the file differ;
3. builds the original and the patched model from the *same* configuration (the model's
   default configuration with fewer layers, default widths) and the same seeded inputs, and
   hands them to :func:`~adopter.bench.measure.benchmark_variants`, which loads the original's
   ``state_dict`` into every variant strictly and times them interleaved.

Factories are picklable (``functools.partial`` of module-level builders over frozen specs), so
the CPU memory probe can rebuild each variant in a fresh interpreter.

Per-rule ablation is "one more variant per rule": the source rewritten with that rule alone
(``paper.5 only``). :func:`only_faster_rules` runs exactly that, briefly, and keeps the rules
that pay off on this machine.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import re
import shutil
import tempfile
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ..dsl.syntax import Rule
from ..match.matcher import Matcher
from ..models.common import module_sources
from ..models.config_names import (
    ATTENTION_DROPOUT_NAME,
    DROPOUT_NAME,
    SHARED_DROPOUT_NAMES,
    STACK_DEPTH_LIST_NAMES,
    STACK_DEPTH_NAMES,
    is_sub_config,
)
from ..models.factories import make_importable, parse_factory
from ..models.loading import load_sibling
from ..models.transformers.config import sub_attr
from ..models.transformers.patch_grid import grid_parameter, patch_grid
from ..models.transformers.repairs import size_fixes, split_fixes
from ..models.transformers.shrink import fill_expert_counts, keep_layer_structures
from ..models.transformers.tokens import image_token, placeholder_layout
from ..rewrite import ApplyResult, FileRewrite, SiteStatus, rewrite_text
from .measure import (
    RSS_RESOLUTION,
    Factory,
    ModelVariant,
    TrainOnly,
    _resolve_memory_method,
    benchmark_variants,
    run_memory_probe,
    speedup_of,
)
from .options import DROPOUT_MODES, BenchOptions
from .report import plot, to_json
from .results import BenchResult, MemoryStats, TimingStats
from .selection import Judgement, Outcome, judge_variant

__all__ = [
    "DROPOUT_MODES",
    "FASTER_OPTIONS",
    "BenchOptions",
    "BenchTargetError",
    "FactoryBuild",
    "NoSiteError",
    "TransformersBuild",
    "TransformersTarget",
    "VariantPlan",
    "base_model_class",
    "bench_config",
    "judge_variant",
    "build_from_factory",
    "build_transformers",
    "make_bench_inputs",
    "only_faster_rules",
    "parse_config_overrides",
    "patch_text",
    "patched_source_file",
    "plan_variants",
    "resolve_transformers_target",
    "run_bench",
]

BASELINE = "original"
PATCHED = "patched"
_SIBLING_PREFIX = "_adopter_bench_"
_SCRATCH: Path | None = None  # see _scratch_dir
_SCRATCH_LOCK = threading.Lock()


class BenchTargetError(ValueError):
    """The target cannot be benchmarked (unknown model, nothing patched, bad factory)."""


class NoSiteError(BenchTargetError):
    """No selected rule patches anything in the target: there is nothing to compare."""


# ----------------------------------------------------------------------------------------------
# rewriting


def _rule_ids(rules: Sequence[Rule]) -> list[str]:
    return [rule.id for rule in rules]


def patch_text(text: str, path: str, rules: Sequence[Rule]) -> tuple[str, Counter[str]]:
    """The text rewritten with ``rules``, and the number of patched sites per rule id.

    Sites a larger fused site already contains (status ``covered``) and refused sites
    (``skipped``) are not counted: only what changed the code is.
    """
    if not rules:
        return text, Counter()
    rewrite = rewrite_text(text, path, Matcher(list(rules)))
    if rewrite.error:
        raise BenchTargetError(f"rewriting {path} failed: {rewrite.error}")
    patched = Counter(r.site.rule.id for r in rewrite.with_status(SiteStatus.PATCHED))
    return (rewrite.patched if patched else text), patched


def _scratch_dir() -> Path:
    """This process's private scratch folder (created 0700 under a random name, removed at
    exit). The patched copies in it are imported, that is executed: a predictable folder in
    the shared temporary folder would let another user plant the code that runs."""
    global _SCRATCH
    with _SCRATCH_LOCK:
        if _SCRATCH is None:
            _SCRATCH = Path(tempfile.mkdtemp(prefix="adopter-bench-"))
            atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
        return _SCRATCH


def patched_source_file(text: str, name: str) -> Path:
    """Write ``text`` to a scratch file named by its content hash; return the path.

    Content-addressed so that variants stay valid after :func:`run_bench` returns (the memory
    probe subprocess and later profiling read the file again), repeated runs in this process
    reuse the file, and two different patches of one model never collide. Files are a few
    hundred KiB at most; the folder is private to this process (:func:`_scratch_dir`).
    """
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]
    folder = _scratch_dir() / digest
    path = folder / name
    if not path.exists():
        folder.mkdir(mode=0o700, exist_ok=True)
        scratch = folder / f".{name}.{threading.get_ident()}.tmp"
        scratch.write_text(text, encoding="utf-8")
        scratch.replace(path)
    return path


# ----------------------------------------------------------------------------------------------
# loading modules


_LOADED: dict[tuple[str, str], ModuleType] = {}
_LOAD_LOCK = threading.Lock()


def _load_sibling(module_name: str, tag: str, path: Path) -> ModuleType:
    """Execute ``path`` as ``<package>._adopter_bench_<tag>_<name>`` next to ``module_name``.

    A sibling in the same package, so relative imports in the file resolve to the objects the
    original module uses (same configuration class, same ``PreTrainedModel``). Loaded once per
    name and process: the tag carries the content hash, so the same name is the same text.
    """
    prefix = f"{_SIBLING_PREFIX}{tag}_"
    with _LOAD_LOCK:
        if (module_name, prefix) not in _LOADED:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _LOADED[module_name, prefix] = load_sibling(module_name, prefix, path)
        return _LOADED[module_name, prefix]


def _tag(label: str, text: str) -> str:
    safe = re.sub(r"\W+", "_", label).strip("_") or "v"
    return f"{safe}_{hashlib.sha1(text.encode('utf-8')).hexdigest()[:10]}"


def _import_quietly(module_name: str) -> ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(module_name)


# ----------------------------------------------------------------------------------------------
# transformers targets


@dataclass(frozen=True)
class TransformersTarget:
    """A resolved transformers target: which module, which source text, loaded how."""

    module_name: str
    path: Path
    text: str
    installed: bool
    """Whether the installed module has exactly this text (then it is imported as is)."""


def _module_name_from_path(path: Path) -> str | None:
    """``.../transformers/models/bert/modeling_bert.py`` -> its dotted module name."""
    parts = path.with_suffix("").parts
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] == "transformers" and index < len(parts) - 1:
            return ".".join(parts[index:])
    return None


def resolve_transformers_target(target: str) -> TransformersTarget:
    """Turn ``bert`` / ``transformers.models.bert.modeling_bert`` / a path into a target.

    A path may point into any copy of the transformers tree (the installed package, an unpacked
    wheel under ``.cache/corpus``, a fork): the module name is taken from the path below its
    last ``transformers`` folder. When that text differs from the installed module's, the given
    text runs as a sibling module inside the installed package, so the benchmark measures the
    source it was asked about.
    """
    given: Path | None = None
    candidate = Path(target)
    if candidate.suffix == ".py" or candidate.exists():
        given = candidate / f"modeling_{candidate.name}.py" if candidate.is_dir() else candidate
        if not given.is_file():
            raise BenchTargetError(f"{target}: no such modeling file ({given})")
        module_name = _module_name_from_path(given.resolve()) or _module_name_from_path(given)
        if module_name is None:
            raise BenchTargetError(
                f"{target}: not inside a transformers package tree; for other code use "
                "--factory module:function"
            )
    elif re.fullmatch(r"[A-Za-z_][\w.]*", target):
        module_name = target if "." in target else f"transformers.models.{target}.modeling_{target}"
    else:
        raise BenchTargetError(f"{target!r} is neither a model name nor a modeling file")
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:
        raise BenchTargetError(f"{target}: cannot import {module_name}: {exc}") from exc
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        raise BenchTargetError(
            f"{target}: {module_name} is not importable here; its package must be installed"
        )
    installed = Path(spec.origin)
    path = given if given is not None else installed
    text = path.read_text(encoding="utf-8")
    same = installed.resolve() == path.resolve() or installed.read_text(encoding="utf-8") == text
    return TransformersTarget(module_name, path, text, same)


def base_model_class(module: ModuleType, class_name: str | None) -> type:
    """The class to benchmark: ``class_name``, else the base model named after the config.

    The base model (``BertModel`` for ``BertConfig``) is the part the rules rewrite; task
    heads add layers (often a vocabulary-sized projection) that no rule touches and that would
    only dilute the measured difference.
    """
    if class_name:
        cls = getattr(module, class_name, None)
        if not isinstance(cls, type) or not issubclass(cls, nn.Module):
            raise BenchTargetError(f"{module.__name__} has no nn.Module class {class_name!r}")
        return cls
    candidates = [
        obj
        for name, obj in vars(module).items()
        if isinstance(obj, type)
        and issubclass(obj, nn.Module)
        and obj.__module__ == module.__name__
        and getattr(obj, "config_class", None) is not None
        and not name.endswith("PreTrainedModel")
    ]
    named = [
        cls
        for cls in candidates
        if cls.config_class.__name__.endswith("Config")
        and cls.__name__ == cls.config_class.__name__[:-6] + "Model"
    ]
    if named:  # GroupViTModel, not its towers GroupViTTextModel / GroupViTVisionModel
        return min(named, key=lambda cls: len(cls.__name__))
    plain = [c for c in candidates if c.__name__.endswith("Model")]
    if plain:
        return plain[0]
    raise BenchTargetError(
        f"{module.__name__} defines no model class with a config_class; pass model_class"
    )


def _reduce_layers(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """Overrides that cut every layer count in ``config`` (and its sub-configs) to ``layers``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if is_sub_config(key, value):
            nested = _reduce_layers(value, layers)
            if nested:
                out[key] = {**value, **nested}
        elif key in STACK_DEPTH_NAMES and isinstance(value, int) and not isinstance(value, bool):
            if value > layers:
                out[key] = layers
        elif key in STACK_DEPTH_LIST_NAMES and isinstance(value, list):
            if all(isinstance(v, int) for v in value) and any(v > layers for v in value):
                out[key] = [min(v, layers) for v in value]
    # Staged models (GroupViT's vision tower) also state the total depth; keep it the sum.
    if "depths" in out and isinstance(config.get("num_hidden_layers"), int):
        out["num_hidden_layers"] = sum(out["depths"])
    # Per-layer lists (``layer_types``, index lists, repeat patterns) follow the cut depth as
    # verify's shrink keeps them (Qwen2-VL's text ``layer_types`` has one entry per layer).
    keep_layer_structures(config, out)
    # GPT-Neo keeps a per-layer attention pattern whose length must equal the layer count.
    if "attention_types" in config and isinstance(config.get("attention_layers"), list):
        count = out.get("num_layers", config.get("num_layers"))
        kinds = list(config["attention_layers"])[: int(count or len(config["attention_layers"]))]
        if len(kinds) != len(config["attention_layers"]):
            out["attention_types"] = [[[kind], 1] for kind in kinds]
    return out


def _dropout_overrides(config: dict[str, Any], mode: str) -> dict[str, Any]:
    """Overrides that set the dropout probabilities ``mode`` asks for to 0 (recursively)."""
    if mode == "config":
        return {}
    if mode not in DROPOUT_MODES:
        raise ValueError(f"unknown dropout mode {mode!r} (use {', '.join(DROPOUT_MODES)})")
    out: dict[str, Any] = {}
    own_attention_key = any(ATTENTION_DROPOUT_NAME.match(k) for k in config if isinstance(k, str))
    for key, value in config.items():
        if is_sub_config(key, value):
            nested = _dropout_overrides(value, mode)
            if nested:
                out[key] = {**value, **nested}
            continue
        if not isinstance(value, float) or value == 0.0:
            continue
        if mode == "none" and DROPOUT_NAME.search(key):
            out[key] = 0.0
        elif mode == "no-attention" and (
            ATTENTION_DROPOUT_NAME.match(key)
            or (not own_attention_key and key in SHARED_DROPOUT_NAMES)
        ):
            out[key] = 0.0
    return out


def _set_dotted(overrides: dict[str, Any], defaults: dict[str, Any], key: str, value: Any) -> None:
    """Apply ``text_config.hidden_size=...``-style keys to nested sub-configuration dicts."""
    head, dot, rest = key.partition(".")
    if not dot:
        overrides[head] = value
        return
    current = overrides.get(head, defaults.get(head))
    if not isinstance(current, dict):
        raise BenchTargetError(f"config override {key!r}: {head!r} is not a sub-configuration")
    nested = dict(current)
    _set_dotted(nested, current, rest, value)
    overrides[head] = nested


def bench_config(
    config_class: type,
    *,
    layers: int | None = 2,
    overrides: Mapping[str, Any] | None = None,
    dropout: str = "config",
    image_size: int | None = None,
    full_size: bool = False,
    repairs: Mapping[str, Any] | None = None,
) -> Any:
    """The benchmark configuration: defaults, ``layers`` layers, explicit overrides, dropout;
    unless ``full_size``, a model wider than :data:`BENCH_WIDTH` is narrowed to it; expert
    counts the defaults leave unset get small ones (:func:`fill_expert_counts`); ``repairs``
    (entries a first forward pass asked for, see :func:`build_transformers`) last.

    Widths, heads and vocabulary stay at the defaults (the sizes people run); only depth is cut,
    because every layer does the same work and the speedup per layer is what a rewrite changes.
    Overrides go through the configuration's constructor, so derived attributes (head sizes,
    T5's decoder depth) are recomputed. ``image_size`` is set where the configuration has one,
    so position tables match the images the inputs carry.
    """
    defaults = config_class().to_dict()
    changes: dict[str, Any] = {}
    if layers is not None:
        changes.update(_reduce_layers(defaults, layers))
    if not full_size:
        _merge_changes(changes, defaults, _bench_widths(defaults))
    fill_expert_counts(defaults, changes)  # counts only checkpoints set (DeepSeek-V2, Dots1)
    if image_size is not None:
        for key, value in defaults.items():
            if key == "image_size" and isinstance(value, int):
                changes[key] = image_size
            elif key.endswith("config") and isinstance(value, dict) and "image_size" in value:
                _merge_changes(changes, defaults, {key: {"image_size": image_size}})
    for key, value in (overrides or {}).items():
        _set_dotted(changes, defaults, key, value)
    merged = {**defaults, **changes}
    _merge_changes(changes, defaults, _dropout_overrides(merged, dropout))
    _merge_changes(changes, defaults, repairs or {})
    return config_class(**changes)


def _merge_changes(
    changes: dict[str, Any], defaults: dict[str, Any], new: Mapping[str, Any]
) -> None:
    """Add ``new`` to ``changes``; a sub-configuration's entries merge with the changes made to
    it already (so a narrowed vision tower keeps its cut depth)."""
    for key, value in new.items():
        base = defaults.get(key)
        if isinstance(value, dict) and isinstance(base, dict) and is_sub_config(key, base):
            changes[key] = {**changes.get(key, base), **value}
        else:
            changes[key] = value


BENCH_WIDTH = 768
BENCH_HEADS = 12
BENCH_INTERMEDIATE = 2048
"""The widths ``bench`` narrows a wider default configuration to (issue 14's workload): a
7-billion-parameter default (Llama's 4096 wide) would hold tens of GB; ``--full-size`` keeps it."""


def _bench_widths(defaults: dict[str, Any]) -> dict[str, Any]:
    """Overrides that narrow a configuration, and each of its sub-configurations (a
    multimodal model's text and vision towers), wider than :data:`BENCH_WIDTH`; a size
    elsewhere in the configuration that named a narrowed width (a vision tower's
    ``out_hidden_size``, which must equal the text model's width) follows it. A
    sub-configuration's entry holds only its changed entries (see :func:`_merge_changes`)."""
    out = _narrowed(defaults)
    narrowed = {defaults["hidden_size"]: BENCH_WIDTH} if out else {}
    for key, value in defaults.items():
        if is_sub_config(key, value):
            nested = _narrowed(value)
            if nested:
                narrowed[value["hidden_size"]] = BENCH_WIDTH
                out[key] = nested
    for key, value in defaults.items():
        if is_sub_config(key, value):
            follow = {
                name: narrowed[size]
                for name, size in value.items()
                if name.endswith("hidden_size") and name != "hidden_size" and size in narrowed
            }
            if follow:
                out[key] = {**out.get(key, {}), **follow}
    return out


def _narrowed(defaults: dict[str, Any]) -> dict[str, Any]:
    """Overrides that narrow one level of a configuration wider than :data:`BENCH_WIDTH`."""
    hidden = defaults.get("hidden_size")
    if not isinstance(hidden, int) or hidden <= BENCH_WIDTH:
        return {}
    out: dict[str, Any] = {"hidden_size": BENCH_WIDTH}
    if isinstance(defaults.get("num_attention_heads"), int):
        out["num_attention_heads"] = BENCH_HEADS
    kv = defaults.get("num_key_value_heads")
    if isinstance(kv, int):
        out["num_key_value_heads"] = (
            kv if kv < BENCH_HEADS and BENCH_HEADS % kv == 0 else BENCH_HEADS
        )
    if isinstance(defaults.get("head_dim"), int):
        out["head_dim"] = BENCH_WIDTH // BENCH_HEADS
    for key, value in defaults.items():  # the MLP's, the experts', the shared expert's
        if key.endswith("intermediate_size") and isinstance(value, int) and value > 0:
            # a multiple of 8: grouped matrix products need 16-byte strides (DeepSeek-V2's
            # experts are 1,407 wide by default, which no float32 grouped product accepts)
            out[key] = -(-min(value, BENCH_INTERMEDIATE) // 8) * 8
    return out


def _sub_config(config: Any, attribute: str) -> Any:
    for name in ("text_config", "vision_config"):
        inner = getattr(config, name, None)
        if inner is not None and getattr(inner, attribute, None) is not None:
            return inner
    return config


def make_bench_inputs(
    model: nn.Module,
    config: Any,
    *,
    batch_size: int,
    seq_len: int,
    image_size: int,
    decoder_seq_len: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Realistic, seeded inputs for ``model.forward``: full-length token ids and images.

    Token ids (``batch_size x seq_len``) with an all-ones attention mask - the common case of
    packed or equal-length batches; images ``batch_size x C x image_size x image_size``;
    encoder-decoders get ``decoder_input_ids`` of ``decoder_seq_len`` (default ``seq_len``).
    A text tower of a multimodal model (GroupViT, CLIP) gets at most its own context length
    (77 tokens). ``use_cache=False`` where accepted (training does not keep a KV cache),
    ``return_loss=True`` for contrastive models (their real training loss), and for a model with
    a language-model head that takes ``labels``, the token ids as labels of the training step
    only (:class:`~adopter.bench.measure.TrainOnly`): a training step computes the model's own
    loss, which is where a causal LM's step peaks and the only step in which a kernel that
    replaces the head and loss runs.

    Deliberately not :func:`adopter.models.transformers.hf.make_inputs`: that one builds a
    *test* for a shrunk model - 7 tokens, the second sequence's last two masked out so that mask
    handling runs, special tokens kept out of the ids, every input modality the signature accepts,
    audio and video inputs, ``output_hidden_states=True`` so that a difference can be traced to a
    layer.
    A benchmark needs the *workload* instead: the sizes asked for, no padding, only the inputs a
    training or inference step takes (every layer's hidden states would add time and memory
    that no real step spends) and the model's own loss. Both draw from a seeded generator.
    """
    params = inspect.signature(model.forward).parameters
    gen = torch.Generator().manual_seed(seed)
    inputs: dict[str, Any] = {}
    if "input_ids" in params:
        text = _sub_config(config, "vocab_size")
        vocab = int(getattr(text, "vocab_size", 1000))
        limit = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
        length = seq_len
        if limit is not None and seq_len > int(limit):
            if text is config:
                raise BenchTargetError(f"seq_len {seq_len} exceeds the model's {limit} positions")
            length = int(limit)
        inputs["input_ids"] = torch.randint(0, vocab, (batch_size, length), generator=gen)
        if "attention_mask" in params:
            inputs["attention_mask"] = torch.ones((batch_size, length), dtype=torch.long)
    if "pixel_values" in params:
        _add_images(inputs, params, config, (batch_size, image_size), gen)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        vocab = int(getattr(config, "vocab_size", 1000))
        length = decoder_seq_len or seq_len
        inputs["decoder_input_ids"] = torch.randint(0, vocab, (batch_size, length), generator=gen)
    if not inputs:
        raise BenchTargetError(
            f"cannot make inputs for {type(model).__name__}: it takes neither input_ids nor "
            "pixel_values; use --factory"
        )
    if "labels" in params and _predicts_tokens(model):
        targets = inputs.get("decoder_input_ids", inputs.get("input_ids"))
        if targets is not None:
            inputs["labels"] = TrainOnly(targets.clone())
    if "use_cache" in params:
        inputs["use_cache"] = False
    if "return_loss" in params:
        inputs["return_loss"] = True
    return inputs


def _add_images(
    inputs: dict[str, Any], params: Any, config: Any, sizes: tuple[int, int], gen: torch.Generator
) -> None:
    """One ``image_size`` image per batch row, in the layout the model takes.

    A model that takes flattened patches and their grid (Qwen2-VL's descendants) gets the
    patches of an ``image_size`` image and one image placeholder per merged token at the start
    of each row's text. A model that places image features at placeholder tokens any other way
    (NeoMME's flattened patches, LLaVA's tower outputs: how many features an image gives is the
    model's own business) runs on its text alone when its images are optional. Other models get
    ``batch x channels x image_size x image_size`` images.
    """
    batch_size, image_size = sizes
    grid_name = grid_parameter(params)
    ids = inputs.get("input_ids")
    vocab = int(getattr(_sub_config(config, "vocab_size"), "vocab_size", 1000))
    if grid_name is not None:
        grid = patch_grid(
            functools.partial(sub_attr, config), batch_size, gen, image_size=image_size
        )
        layout = placeholder_layout(config, vocab, grid) if grid is not None else None
        if grid is not None and layout is not None and ids is not None:
            if ids.shape[-1] < len(layout[0]) + 2:
                raise BenchTargetError(
                    f"seq_len {ids.shape[-1]} cannot hold the {len(layout[0])} image tokens of a "
                    f"{image_size}-pixel image; raise --seq-len or lower --image-size"
                )
            ids[..., 1 : 1 + len(layout[0])] = torch.tensor(layout[0])
            inputs["pixel_values"], inputs[grid_name] = grid.patches, grid.grid
            if "mm_token_type_ids" in params:
                types = torch.zeros_like(ids)
                types[..., 1 : 1 + len(layout[0])] = torch.tensor(layout[1])
                inputs["mm_token_type_ids"] = types
            return
    optional = params["pixel_values"].default is None
    if ids is not None and optional and image_token(config, vocab) is not None:
        return  # image features go to placeholder tokens in a layout only the model knows
    channels = int(getattr(_sub_config(config, "num_channels"), "num_channels", 3))
    shape = (batch_size, channels, image_size, image_size)
    inputs["pixel_values"] = torch.randn(shape, generator=gen)


def _predicts_tokens(model: nn.Module) -> bool:
    """Whether ``model`` has a language-model head (its ``labels`` are token ids of the input).

    transformers' ``get_output_embeddings()`` returns the head that maps hidden states to the
    vocabulary, and ``None`` for classification, detection and other heads whose labels are
    something else.
    """
    get_head = getattr(model, "get_output_embeddings", None)
    try:
        return callable(get_head) and get_head() is not None
    except (AttributeError, NotImplementedError, TypeError):
        return False


@dataclass(frozen=True)
class TransformersBuild:
    """Everything needed to build one transformers variant; picklable for the memory probe."""

    module_name: str
    source: str | None
    """A file to run as a sibling module, or ``None`` for the installed module itself."""
    tag: str
    class_name: str | None = None
    overrides: tuple[tuple[str, Any], ...] = ()
    layers: int | None = 2
    dropout: str = "config"
    batch_size: int = 2
    seq_len: int = 128
    image_size: int = 224
    decoder_seq_len: int | None = None
    seed: int = 0
    full_size: bool = False

    def module(self) -> ModuleType:
        """The module defining this variant's classes."""
        if self.source is None:
            return _import_quietly(self.module_name)
        return _load_sibling(self.module_name, self.tag, Path(self.source))


def build_transformers(spec: TransformersBuild) -> tuple[nn.Module, dict[str, Any]]:
    """Build model and inputs for ``spec`` (a :class:`~adopter.bench.measure.Factory`).

    The model class is looked up in the original module and taken by the same name from the
    variant's module, so original and patched are the same architecture from the same
    configuration.
    """
    original = _import_quietly(spec.module_name)
    reference = base_model_class(original, spec.class_name)
    cls = getattr(spec.module(), reference.__name__, None)
    if not isinstance(cls, type):
        raise BenchTargetError(f"the {spec.tag} source does not define {reference.__name__}")
    variant_free = repr(replace(spec, source=None, tag=""))
    known = _REPAIRS.get(variant_free)
    repairs = dict(known or {})
    while True:
        config = bench_config(
            reference.config_class,
            layers=spec.layers,
            overrides=dict(spec.overrides),
            dropout=spec.dropout,
            image_size=spec.image_size,
            full_size=spec.full_size,
            repairs=repairs,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = cls(config)
        inputs = make_bench_inputs(
            model,
            config,
            batch_size=spec.batch_size,
            seq_len=spec.seq_len,
            image_size=spec.image_size,
            decoder_seq_len=spec.decoder_seq_len,
            seed=spec.seed,
        )
        if known is not None:
            return model, inputs
        asked = _size_repairs(model, config, inputs)
        if not asked or len(repairs) >= _MAX_REPAIRS or asked.items() <= repairs.items():
            _REPAIRS[variant_free] = repairs
            return model, inputs
        repairs = {**repairs, **asked}


_MAX_REPAIRS = 4
_REPAIRS: dict[str, dict[str, Any]] = {}
"""The repairs each build needed, by its spec less the variant (source and tag): the variant
built next (the patched one) takes the configuration the first one's forward pass asked for,
so both sides share it and the probe runs once per process."""


def _size_repairs(model: nn.Module, config: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Configuration entries a forward pass of the narrowed model asks to change, if any.

    Narrowing widths shrinks the head size, and sizes the configuration (or the model's code,
    as a default) fixes for the full model no longer fit: Qwen2-VL's multimodal RoPE splits
    half a head into ``[16, 24, 24]`` sections. The adapter's repairs (the ones ``verify``
    uses on its tiny models) rescale them; any other failure is left to the timed steps to
    report."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model(**inputs)
    except Exception as exc:
        sources = "\n".join(module_sources(model, []))
        return size_fixes(config, str(exc)) or split_fixes(config, str(exc), sources)
    finally:
        model.train(was_training)
    return {}


# ----------------------------------------------------------------------------------------------
# factory targets


@dataclass(frozen=True)
class FactoryBuild:
    """A user factory, from its own module or from a patched copy of that module's source."""

    module_name: str
    function: str
    source: str | None = None
    """A file to run as a sibling of ``module_name`` (a patched copy), or ``None``."""
    tag: str = ""

    def module(self) -> ModuleType:
        """The module the factory function is taken from."""
        if self.source is None:
            return importlib.import_module(self.module_name)
        return _load_sibling(self.module_name, self.tag, Path(self.source))


def build_from_factory(spec: FactoryBuild) -> tuple[nn.Module, Any]:
    """Call the factory function of ``spec`` (a :class:`~adopter.bench.measure.Factory`)."""
    obj: Any = spec.module()
    for part in spec.function.split("."):
        obj = getattr(obj, part)
    return obj()


def _factory_target(spec: str) -> tuple[FactoryBuild, Path]:
    """What builds the original from a factory spec, and the file holding the factory.

    The syntax is :func:`adopter.models.factories.parse_factory`'s (shared with ``verify``).
    A module name is imported with the current folder on ``sys.path``; a file is run under a
    name of its own (so ``code.py:build`` never picks up the standard library's ``code``), with
    its folder on ``sys.path`` for its own imports (the memory-probe child, which inherits
    ``sys.path``, finds them too).
    """
    try:
        ref = parse_factory(spec)
    except ValueError as exc:
        raise BenchTargetError(str(exc)) from None
    make_importable(ref)
    if ref.path is not None:
        path = Path(ref.path)
        text = path.read_text(encoding="utf-8")
        return FactoryBuild(path.stem, ref.function, str(path), _tag("original", text)), path
    module = ref.module or ""
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        raise BenchTargetError(f"cannot import the factory module {module!r}: {exc}") from exc
    if found is None or not found.origin or not Path(found.origin).is_file():
        raise BenchTargetError(f"cannot find the source of the factory module {module!r}")
    return FactoryBuild(module, ref.function), Path(found.origin)


# ----------------------------------------------------------------------------------------------
# library targets (timm, diffusers): a model by the name its library gives it


@dataclass(frozen=True)
class LibraryBuild:
    """A model of a library with an adapter, built the library's way and small unless
    ``full_size``; ``patches`` are ``(module, patched file, tag)``: each module's classes in
    the built model get the patched file's (none: the original)."""

    library: str
    name: str
    full_size: bool = False
    seed: int = 0
    patches: tuple[tuple[str, str, str], ...] = ()


def build_library(spec: LibraryBuild) -> tuple[nn.Module, Any]:
    """Build ``spec`` (a :class:`~adopter.bench.measure.Factory`)."""
    from ..models.base import adopt_patched_classes
    from ..models.registry import adapter_for

    adapter = adapter_for(spec.library)
    built = adapter.build(spec.name, seed=spec.seed, full_size=spec.full_size)
    for module_name, file, tag in spec.patches:
        with adapter.keeping_registries():
            sibling = _load_sibling(module_name, tag, Path(file))
        adopt_patched_classes(built.model, module_name, sibling)
    return built.model, built.inputs


def _library_adapter(target: str) -> Any:
    """The adapter whose library names a model ``target`` (``resnet50``), where ``target`` is
    neither a file nor a transformers model; ``None`` otherwise."""
    from ..models.registry import adapter_for_model

    if Path(target).suffix == ".py" or Path(target).exists() or "." in target:
        return None
    try:
        if importlib.util.find_spec(f"transformers.models.{target}.modeling_{target}"):
            return None
    except (ImportError, ValueError):
        pass
    return adapter_for_model(target)


def _plan_library(
    adapter: Any, name: str, rules: Sequence[Rule], *, full_size: bool, seed: int, ablation: bool
) -> VariantPlan:
    """Original, all rules and (with ``ablation``) each rule alone, for a library model: every
    library file defining a class the model builds is rewritten."""
    from ..models.base import built_modules

    modules = built_modules(adapter, name, full_size=full_size, seed=seed)
    base = LibraryBuild(adapter.library, name, full_size, seed)
    variants = [ModelVariant(BASELINE, functools.partial(build_library, base))]
    sites: dict[str, dict[str, int]] = {}
    groups = [(PATCHED, list(rules))]
    if ablation:
        groups += [(_ablation_name(rule.id), [rule]) for rule in rules]
    for label, chosen in groups:
        patches, counted = _library_patches(modules, chosen, label)
        if counted:
            spec = replace(base, patches=tuple(patches))
            variants.append(ModelVariant(label, functools.partial(build_library, spec)))
            sites[label] = dict(counted)
    if PATCHED not in sites:
        raise NoSiteError(f"no rule patches anything in the files {name} uses: nothing to compare")
    info = {"target": name, "kind": adapter.library, "modules": modules, "patched_sites": sites,
            "full_size": full_size, "rules": _rule_ids(rules)}  # fmt: skip
    return VariantPlan(variants, info=info)


def _library_patches(
    modules: Sequence[str], rules: Sequence[Rule], label: str
) -> tuple[list[tuple[str, str, str]], Counter[str]]:
    patches, counted = [], Counter()
    for module_name in modules:
        spec = importlib.util.find_spec(module_name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        path = Path(spec.origin)
        text = path.read_text(encoding="utf-8")
        patched, sites = patch_text(text, str(path), rules)
        if sites:
            file = patched_source_file(patched, path.name)
            patches.append((module_name, str(file), _tag(label, patched)))
            counted.update(sites)
    return patches, counted


# ----------------------------------------------------------------------------------------------
# planning the variants


@dataclass
class VariantPlan:
    """The variants of one benchmark and what each of them is."""

    variants: list[ModelVariant]
    baseline: str = BASELINE
    info: dict[str, Any] = field(default_factory=dict)
    """Target, module, model class, configuration, rules and patched sites per variant."""
    no_site: list[str] = field(default_factory=list)
    """Rule ids that patch nothing in the target when applied alone."""


def _ablation_name(rule_id: str) -> str:
    return f"{rule_id} only"


def plan_variants(
    target: str | None = None,
    options: BenchOptions | None = None,
    *,
    rules: Sequence[Rule] | None = None,
    combined: bool = True,
    rule_groups: Mapping[str, Sequence[Rule]] | None = None,
) -> VariantPlan:
    """The :class:`ModelVariant` list for :func:`run_bench` (see there for the arguments; of
    ``options`` only what to build is used here).

    ``combined=False`` leaves out the all-rules ``patched`` variant (used by
    :func:`only_faster_rules`, which judges rules one by one). Raises
    :class:`BenchTargetError` when nothing would be compared.
    """
    opts = options or BenchOptions()
    if rules is None:
        from ..rules import load_rule_set

        rules = load_rule_set()
    rules = list(rules)
    if opts.patched_factory is not None:
        per_rule = opts.ablation or not combined
        return _plan_two_factories(opts.factory, opts.patched_factory, per_rule=per_rule)
    adapter = _library_adapter(target) if opts.factory is None and target is not None else None
    if adapter is not None:
        return _plan_library(
            adapter, target, rules, full_size=opts.full_size, seed=opts.seed, ablation=opts.ablation
        )
    if opts.factory is not None:
        source = _factory_source(opts.factory)
    elif target is None:
        raise BenchTargetError("give a target (model name or modeling file) or --factory")
    else:
        build = _transformers_build(opts)
        source = _transformers_source(target, build, dict(opts.config_overrides))
    plan = _RewritePlan(source)
    combined_text, combined_sites = plan.patch(rules)
    if combined:
        plan.add_combined(combined_text, combined_sites, rules)
    same_as = combined_text if combined else None
    no_site = plan.add_solo_rules(rules, same_as) if opts.ablation or not combined else []
    if not combined and len(plan.variants) == 1:
        raise NoSiteError(f"no rule patches anything in {source.path}: nothing to compare")
    plan.add_rule_groups(rule_groups or {}, same_as)
    info = {
        **source.info,
        "rules": _rule_ids(rules),
        "patched_sites": plan.sites,
        "no_site": no_site,
        "notes": plan.notes,
        "model_class": opts.model_class,
    }
    return VariantPlan(plan.variants, info=info, no_site=no_site)


def _transformers_build(opts: BenchOptions) -> TransformersBuild:
    """The configuration and inputs every transformers variant is built with; each variant
    sets its module, source and tag."""
    return TransformersBuild(
        module_name="",
        source=None,
        tag="",
        class_name=opts.model_class,
        overrides=tuple(sorted(opts.config_overrides.items())),
        layers=opts.layers,
        dropout=opts.dropout,
        batch_size=opts.batch_size,
        seq_len=opts.seq_len,
        image_size=opts.image_size,
        decoder_seq_len=opts.decoder_seq_len,
        seed=opts.seed,
        full_size=opts.full_size,
    )


def _plan_two_factories(factory: str | None, patched_factory: str, per_rule: bool) -> VariantPlan:
    """Original and patched model each from a factory of its own: nothing to rewrite."""
    if factory is None:
        raise BenchTargetError("--patched-factory needs --factory (the original)")
    if per_rule:
        raise BenchTargetError(
            "per-rule variants need the rules applied to source: give --factory without "
            "--patched-factory"
        )
    variants = [
        ModelVariant(name, functools.partial(build_from_factory, _factory_target(spec)[0]))
        for name, spec in ((BASELINE, factory), (PATCHED, patched_factory))
    ]
    info = {"target": factory, "kind": "factories", "patched_factory": patched_factory}
    return VariantPlan(variants, info=info)


@dataclass(frozen=True)
class _Source:
    """The source text the variants are rewritten from, and how to build a variant of it."""

    path: Path
    text: str
    make: Callable[[str, str | None], Factory]
    """``make(label, patched_text)``: the factory of a variant (``None``: the original)."""
    info: dict[str, Any]
    """What the target is, for :attr:`VariantPlan.info`."""


def _factory_source(factory: str) -> _Source:
    """A ``module:function`` factory: its module's source is rewritten, and the factory
    function of the patched copy builds the patched model."""
    original, path = _factory_target(factory)

    def make(label: str, patched: str | None) -> Factory:
        if patched is None:
            return functools.partial(build_from_factory, original)
        file = patched_source_file(patched, path.name)
        spec = FactoryBuild(
            original.module_name, original.function, str(file), _tag(label, patched)
        )
        return functools.partial(build_from_factory, spec)

    text = path.read_text(encoding="utf-8")
    info: dict[str, Any] = {"target": factory, "kind": "factory", "source": str(path)}
    return _Source(path, text, make, info)


def _transformers_source(
    target: str, build: TransformersBuild, config_overrides: dict[str, Any]
) -> _Source:
    """A transformers modeling file: every variant is ``build`` (configuration and inputs)
    with that variant's module."""
    resolved = resolve_transformers_target(target)

    def make(label: str, patched: str | None) -> Factory:
        if patched is None:
            source = None if resolved.installed else str(resolved.path)
            tag = "original" if resolved.installed else _tag("original", resolved.text)
        else:
            source = str(patched_source_file(patched, resolved.path.name))
            tag = _tag(label, patched)
        spec = replace(build, module_name=resolved.module_name, source=source, tag=tag)
        return functools.partial(build_transformers, spec)

    info = {
        "target": target,
        "kind": "transformers",
        "module": resolved.module_name,
        "source": str(resolved.path),
        "installed_source": resolved.installed,
        "layers": build.layers,
        "dropout": build.dropout,
        "config_overrides": config_overrides,
        "batch_size": build.batch_size,
        "seq_len": build.seq_len,
        "image_size": build.image_size,
        "decoder_seq_len": build.decoder_seq_len or build.seq_len,
    }
    return _Source(resolved.path, resolved.text, make, info)


class _RewritePlan:
    """The variants of one source as they are added: the original first, then one per rewrite
    that changes something and differs from the others, with the sites each one patches."""

    def __init__(self, source: _Source) -> None:
        self.source = source
        self.variants = [ModelVariant(BASELINE, source.make(BASELINE, None))]
        self.sites: dict[str, dict[str, int]] = {}
        self.notes: list[str] = []

    def patch(self, rules: Sequence[Rule]) -> tuple[str, Counter[str]]:
        """The source rewritten with ``rules``, and the patched sites per rule id."""
        return patch_text(self.source.text, str(self.source.path), rules)

    def add(self, name: str, text: str, sites: Counter[str]) -> None:
        self.variants.append(ModelVariant(name, self.source.make(name, text)))
        self.sites[name] = dict(sites)

    def add_combined(self, text: str, sites: Counter[str], rules: Sequence[Rule]) -> None:
        """The ``patched`` variant: every rule at once (it must patch something)."""
        if not sites:
            raise NoSiteError(
                f"no rule of {', '.join(_rule_ids(rules)) or '(none)'} patches anything in "
                f"{self.source.path}: nothing to compare"
            )
        self.add(PATCHED, text, sites)

    def add_solo_rules(self, rules: Sequence[Rule], same_as: str | None) -> list[str]:
        """One variant per rule that patches something alone, unless its rewrite is
        ``same_as`` (the combined one); returns the ids of the rules that patch nothing."""
        no_site: list[str] = []
        for rule in rules:
            text, sites = self.patch([rule])
            name = _ablation_name(rule.id)
            if not sites:
                no_site.append(rule.id)
            elif text == same_as:
                self.notes.append(f"{name} is the same source as {PATCHED!r}")
            else:
                self.add(name, text, sites)
        return no_site

    def add_rule_groups(
        self, rule_groups: Mapping[str, Sequence[Rule]], same_as: str | None
    ) -> None:
        """One variant per named group of rules, unless it patches nothing or its rewrite is
        ``same_as`` (the combined one)."""
        for group, group_rules in rule_groups.items():
            text, sites = self.patch(list(group_rules))
            if not sites:
                self.notes.append(f"{group!r} patches nothing here")
            elif text == same_as:
                self.notes.append(f"{group!r} is the same source as {PATCHED!r}")
            elif any(group == variant.name for variant in self.variants):
                raise ValueError(f"rule group {group!r} has the name of another variant")
            else:
                self.add(group, text, sites)


def _describe_model(plan: VariantPlan) -> dict[str, Any]:
    """Class name, parameter count and key widths of the baseline model, for the report."""
    model, _ = plan.variants[0].build()
    described: dict[str, Any] = {
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    config = getattr(model, "config", None)
    if config is not None:
        keep = ("hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head", "num_heads")
        described["config"] = {
            k: getattr(config, k) for k in keep if isinstance(getattr(config, k, None), int)
        }
    del model
    return described


# ----------------------------------------------------------------------------------------------
# memory of a subset


def _probe_subset(
    result: BenchResult,
    plan: VariantPlan,
    *,
    names: Sequence[str],
    modes: Sequence[str],
    opts: BenchOptions,
    progress: Callable[[str], None],
) -> None:
    """Fresh-process RSS probes for ``names`` x ``modes`` only, ratios against the baseline.

    The subset exists because a probe costs an interpreter start plus two steps per variant; a
    report over many models and settings measures memory where it is asked about (training at
    the long sequence) and times everything else.
    """
    by_name = {v.name: v for v in plan.variants}
    wanted = [plan.baseline, *[n for n in names if n != plan.baseline and n in by_name]]
    for name in wanted:
        ok_modes = [m for m in modes if m in result.modes and result.get(name, m).error is None]
        if not ok_modes:
            continue
        progress(f"memory: {name}")
        variant = by_name[name]
        measured = run_memory_probe(
            variant,
            modes=ok_modes,
            dtype=opts.dtype,
            compile=opts.compile if variant.compiled is None else variant.compiled,
            threads=opts.threads if opts.threads is not None else torch.get_num_threads(),
            optimizer=opts.optimizer,
            seed=opts.seed,
        )
        for mode, value in measured.items():
            res = result.get(name, mode)
            if isinstance(value, MemoryStats):
                res.memory = value
            else:
                res.memory_error = value
    for mode in modes:
        base = result.get(plan.baseline, mode).memory
        for name in wanted[1:]:
            res = result.get(name, mode)
            if base is None or res.memory is None:
                continue
            if base.peak_bytes < RSS_RESOLUTION:
                res.memory_error = "no memory ratio: the baseline's step peak is below 1 MiB"
            else:
                res.memory = MemoryStats(
                    res.memory.method,
                    res.memory.peak_bytes,
                    res.memory.absolute_bytes,
                    res.memory.peak_bytes / base.peak_bytes,
                )
    result.settings["memory"] = "rss_subprocess"
    result.settings["memory_subset"] = {"variants": wanted, "modes": list(modes)}


# ----------------------------------------------------------------------------------------------
# eager and compiled in one run (bench --compile)

COMPILED = " + compile"


def eager_and_compiled(variants: Sequence[ModelVariant]) -> list[ModelVariant]:
    """Each variant eager, then each under ``torch.compile`` (named ``<name> + compile``): one
    interleaved run times all of them, so every ratio between them is taken under one load."""
    return [replace(v, compiled=False) for v in variants] + [
        replace(v, name=f"{v.name}{COMPILED}", compiled=True) for v in variants
    ]


def against_compiled(result: BenchResult) -> dict[str, dict[str, dict[str, float | None]]]:
    """Each compiled variant against the compiled baseline (``patched + compile`` against
    ``original + compile``), per mode: the speed-up with its bootstrap interval and the peak
    memory ratio. Ratios against the eager baseline are the result's own."""
    base_name = f"{result.baseline}{COMPILED}"
    confidence = float(result.settings.get("confidence", 0.95))
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for name in result.names:
        if not name.endswith(COMPILED) or name == base_name:
            continue
        out[name] = {}
        for mode in result.modes:
            base, own = result.get(base_name, mode), result.get(name, mode)
            if not (base.ok and own.ok):
                continue
            assert base.timing is not None and own.timing is not None
            speedup = speedup_of(base.timing, own.timing, confidence=confidence)
            memory = None
            if base.memory is not None and own.memory is not None and base.memory.peak_bytes:
                memory = own.memory.peak_bytes / base.memory.peak_bytes
            out[name][mode] = {
                "against": base_name,  # type: ignore[dict-item]
                "speedup": speedup.ratio,
                "ci_low": speedup.ci_low,
                "ci_high": speedup.ci_high,
                "memory_ratio": memory,
            }
    return out


# ----------------------------------------------------------------------------------------------
# the commands


def run_bench(
    target: str | None = None,
    options: BenchOptions | None = None,
    *,
    rules: Sequence[Rule] | None = None,
    rule_groups: Mapping[str, Sequence[Rule]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> BenchResult:
    """Benchmark the original model against its rewrite (and per-rule rewrites).

    Args:
        target: a transformers model name (``bert``, ``gpt_neo``), dotted module name, or path
            to a modeling file or model folder of any transformers tree; a model name another
            library gives it (``resnet50``). Ignored with ``options.factory``.
        options: what to build, how to measure and where to write (:class:`BenchOptions`;
            default: its defaults). With ``ablation`` a rule whose solo rewrite equals the
            combined one is not repeated.
        rules: the rules to apply (default: the default rule set).
        rule_groups: named subsets of ``rules`` measured as variants of their own (``{"paper
            rules": load_rule_set("paper")}`` next to the ``all`` set); a group that patches
            nothing, or the same source as all the rules, is noted instead.
        progress: called with short status messages.

    Returns:
        The :class:`BenchResult`; ``settings["target"]`` says what was compared (module, class,
        parameters, configuration, rules and patched sites per variant).

    Raises:
        BenchTargetError: unknown target, nothing patched, unusable factory.
        CheckpointMismatchError: a rewrite changed parameter names or shapes.
    """
    opts = options or BenchOptions()
    say = progress or (lambda _message: None)
    plan = plan_variants(target, opts, rules=rules, rule_groups=rule_groups)
    say(_comparing(plan))
    if opts.compile:  # all four: original and patched, eager and compiled, in one interleaved run
        plan = replace(plan, variants=eager_and_compiled(plan.variants))
    result = _measure_plan(plan, opts, say)
    if opts.compile:
        result.settings["against_compiled"] = against_compiled(result)
    info = dict(plan.info)
    try:
        info["model"] = _describe_model(plan)
    except Exception as exc:  # description only; the benchmark itself already succeeded
        info["model"] = {"error": repr(exc)}
    result.settings["target"] = info
    _write_outputs(result, opts, str(info.get("target") or "model"))
    return result


def _comparing(plan: VariantPlan) -> str:
    """The sites each variant patches, said before the run starts (a site in a class the run
    does not build, such as a causal LM's loss when the base model is built, never runs)."""
    sites = plan.info.get("patched_sites") or {}
    patched = "; ".join(
        f"{name}: " + ", ".join(f"{rule} x{count}" for rule, count in sorted(per_rule.items()))
        for name, per_rule in sites.items()
    )
    built = plan.info.get("model_class")
    return f"{built + ': ' if built else ''}sites patched per variant: {patched or 'none listed'}"


def _measure_plan(plan: VariantPlan, opts: BenchOptions, say: Callable[[str], None]) -> BenchResult:
    """Time every variant of ``plan``; memory in the same run, or (RSS probes of a subset of
    modes or variants) probed afterwards for that subset only."""
    method = _resolve_memory_method(opts.memory, torch.device(opts.device))
    subset = method == "rss_subprocess" and (
        opts.memory_modes is not None or opts.memory_variants is not None
    )
    result = benchmark_variants(
        plan.variants,
        baseline=plan.baseline,
        compile=opts.compile,
        memory=None if subset else method,
        progress=say,
        **opts.measurement(),
    )
    if not subset:
        return result
    previous = torch.get_num_threads()
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    try:
        _probe_subset(
            result,
            plan,
            names=list(result.names if opts.memory_variants is None else opts.memory_variants),
            modes=list(result.modes if opts.memory_modes is None else opts.memory_modes),
            opts=opts,
            progress=say,
        )
    finally:
        torch.set_num_threads(previous)
    return result


def _write_outputs(result: BenchResult, opts: BenchOptions, label: str) -> None:
    """The JSON result and the chart, where ``opts`` asks for them."""
    if opts.json_out is not None:
        out = Path(opts.json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(to_json(result), indent=1, default=str), encoding="utf-8")
    if opts.plot_path is not None:
        plot({Path(label).stem if label.endswith(".py") else label: result}, opts.plot_path)


FASTER_OPTIONS = BenchOptions(warmup=1, repeats=5)
"""The short run :func:`only_faster_rules` makes by default (``apply --only-faster``)."""


def only_faster_rules(
    target: str | None,
    rules: Sequence[Rule],
    options: BenchOptions = FASTER_OPTIONS,
    *,
    max_repeats: int = 12,
    threshold: float = 1.0,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[Rule], dict[str, str]]:
    """The rules worth applying to ``target`` on this machine, and why each was kept or not.

    Every rule that patches something alone becomes a variant (the source rewritten with that
    rule only), timed against the original in one short interleaved run. A rule is **kept**
    when it is reliably faster (CI lower bound ``>= threshold``) in at least one mode and
    reliably slower in none (:func:`~adopter.bench.selection.judge_variant`): "faster in
    inference" alone would drop rules that only pay off in training (dropout + residual +
    layer norm), "faster in every mode" would drop eval-only folds (conv + batch-norm is the
    original in training and exactly as fast there). Otherwise it is **dropped** with the
    numbers (noise-level gains are not worth a rewrite) or the error of its variant;
    ``no site`` when it patches nothing.

    The short default run (:data:`FASTER_OPTIONS`) keeps ``apply --only-faster`` quick, and its
    intervals are wide: a rule it leaves undecided gets more rounds (:func:`_more_rounds`).

    Args:
        target, options: what to build, as for :func:`run_bench`, and how to time it; every
            rule is a variant of its own, and there is no ``patched_factory``, ``compile``,
            ``memory`` or output here.
        rules: the candidate rules (e.g. what ``apply`` would use).
        threshold: the CI lower bound a rule must reach in some mode.
        max_repeats: rounds an undecided rule may get in all (``repeats`` or less: none).
        progress: called with short status messages.

    Returns:
        ``(kept, reasons)``: the kept rules in their given order, and a one-line reason for
        every rule id (``"no site"``, ``"kept: faster in train (...)"``, ``"dropped: ..."``).

    Raises:
        BenchTargetError: the target cannot be built (not a transformers file, bad factory).
        ValueError: ``options`` asks for what this run does not do.
    """
    _check_faster_options(options)
    say = progress or (lambda _message: None)
    rules = list(rules)
    try:
        plan = plan_variants(target, options, rules=rules, combined=False)
    except NoSiteError:
        return [], dict.fromkeys(_rule_ids(rules), Judgement(Outcome.NO_SITE).reason)
    reasons = dict.fromkeys(plan.no_site, Judgement(Outcome.NO_SITE).reason)
    measure = functools.partial(
        benchmark_variants, baseline=plan.baseline, progress=say, **options.measurement()
    )
    result = measure(plan.variants)
    extra = max_repeats - options.repeats
    _more_rounds(result, plan, measure, extra, threshold=threshold, seed=options.seed, say=say)
    return _judge_rules(rules, result, reasons, threshold), reasons


def _judge_rules(
    rules: Sequence[Rule], result: BenchResult, reasons: dict[str, str], threshold: float
) -> list[Rule]:
    """The rules whose variant ``result`` shows worth keeping, in their given order; each
    rule's reason is added to ``reasons`` (a rule already there, with no site, is skipped)."""
    kept: list[Rule] = []
    for rule in rules:
        if rule.id in reasons:
            continue
        judgement = judge_variant(result, _ablation_name(rule.id), threshold)
        reasons[rule.id] = judgement.reason
        if judgement.keep:
            kept.append(rule)
    return kept


def _more_rounds(
    result: BenchResult,
    plan: VariantPlan,
    measure: Callable[..., BenchResult],
    extra: int,
    *,
    threshold: float,
    seed: int,
    say: Callable[[str], None],
) -> None:
    """Give the rules ``result`` leaves undecided - not kept, not reliably slower, but with a
    point estimate above ``threshold`` in some mode - ``extra`` more rounds against the
    original (those variants only), pooled into ``result``: a real but modest gain is then not
    dropped for want of samples, and is still held to the same interval criterion."""
    undecided = [v for v in plan.variants[1:] if _undecided(result, v.name, threshold)]
    if not undecided or extra <= 0:
        return
    say(f"{len(undecided)} rule(s) undecided: {extra} more rounds")
    more = measure([plan.variants[0], *undecided], repeats=extra)
    _pool_rounds(result, more, [v.name for v in undecided], seed)


def _check_faster_options(options: BenchOptions) -> None:
    """Reject the options :func:`only_faster_rules` would otherwise ignore without a word."""
    unused = {
        "patched_factory": options.patched_factory is not None,
        "compile": options.compile,
        "memory": options.memory is not None,
        "plot_path": options.plot_path is not None,
        "json_out": options.json_out is not None,
    }
    given = [name for name, set_ in unused.items() if set_]
    if given:
        raise ValueError(f"choosing the faster rules does not use {', '.join(given)}")


def keep_faster_rules(
    result: ApplyResult, rules: list[Rule], say: Callable[[str], None]
) -> ApplyResult:
    """``apply --only-faster``: re-patch each changed file with only the rules that a benchmark
    of its model shows help on this machine (a file that cannot be benchmarked stays unpatched);
    ``say`` each rule's verdict."""
    files = []
    for rewrite in result.files:
        if rewrite.error is not None or not rewrite.changed:
            files.append(rewrite)
            continue
        unpatched = FileRewrite(rewrite.path, rewrite.original, rewrite.original)
        try:
            kept, reasons = only_faster_rules(rewrite.path, rules)
        except (BenchTargetError, ValueError, RuntimeError) as error:
            say(f"{rewrite.path}: not benchmarked ({error}); left unpatched")
            files.append(unpatched)
            continue
        for rule_id, reason in sorted(reasons.items()):
            say(f"{rewrite.path}: {rule_id}: {reason}")
        files.append(
            rewrite_text(rewrite.original, rewrite.path, Matcher(kept)) if kept else unpatched
        )
    result.files = files
    return result


def _undecided(result: BenchResult, name: str, threshold: float) -> bool:
    """Neither kept nor reliably slower, yet faster than ``threshold`` on the point estimate
    in some mode: more rounds could decide it."""
    if judge_variant(result, name, threshold).outcome is not Outcome.NOT_RELIABLY_FASTER:
        return False
    return any(
        (res := result.get(name, mode)).speedup is not None and res.speedup.ratio > threshold
        for mode in result.modes
    )


def _pool_rounds(result: BenchResult, more: BenchResult, names: Sequence[str], seed: int) -> None:
    """Add the rounds of ``more`` to ``result`` for ``names`` and recompute their speedups.

    Both runs interleave the baseline with each variant round by round, so round ``i`` of a
    variant still pairs with round ``i`` of the baseline after the two runs are concatenated.
    """
    for mode in result.modes:
        first_base, extra_base = result.get(result.baseline, mode), more.get(more.baseline, mode)
        if first_base.timing is None or extra_base.timing is None:
            continue
        base = TimingStats.from_times(
            first_base.timing.times_s + extra_base.timing.times_s, first_base.timing.batch_size
        )
        for name in names:
            first, extra = result.get(name, mode), more.get(name, mode)
            if first.timing is None or extra.timing is None or extra.error:
                continue
            first.timing = TimingStats.from_times(
                first.timing.times_s + extra.timing.times_s, first.timing.batch_size
            )
            confidence = first.speedup.confidence if first.speedup else 0.95
            first.speedup = speedup_of(base, first.timing, confidence=confidence, seed=seed)


def parse_config_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["hidden_size=256", "text_config.num_hidden_layers=1"]`` -> overrides dict.

    Values are read as JSON where they parse (numbers, ``true``, lists), else kept as strings,
    so ``--config hidden_act=gelu`` and ``--config hidden_size=256`` both do what they say.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise BenchTargetError(f"config override must look like key=value, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = value
    return out
