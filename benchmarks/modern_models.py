"""Factories for the modern verification and benchmarks (``benchmarks/perf_modern.py``): timm,
diffusers and transformers 5.x models, original and patched, built side by side in one process.

    adopter verify --factory benchmarks/modern_models.py:resnet50 \\
                   --patched-factory benchmarks/modern_models.py:resnet50__all
    adopter bench  --factory benchmarks/modern_models.py:unet \\
                   --patched-factory benchmarks/modern_models.py:unet__modern_5

``<model>`` builds the original from the installed package; ``<model>__<rules>`` builds the same
model and patches it with a built-in rule set (``all``, ``modern``, ``paper``...) or one rule of
``all`` (``modern_6`` is ``modern.6``). Both take no arguments and return ``(model, inputs)``,
the factory form ``verify`` and ``bench`` take.

Why not a plain ``--factory`` with the rules applied to its own file: a library model's sites
are in the library's files (timm's ``resnet.py``, diffusers' ``resnet.py`` and
``unet_2d_condition.py``), often several, and the original must stay importable next to the
patch. So each library file that defines a class the model uses is rewritten with the rules
(as ``adopter apply`` would, nothing written next to the source), the rewrite is loaded as a
sibling module of the original (its relative imports resolve to the same objects), and each
object of the built model whose class that file defines gets the rewritten class: a subclass of
the rewritten class and the original one, so ``isinstance`` checks against the original still
hold and parameters, buffers and ``state_dict`` keys are untouched. Construction runs the
original code in both cases; only the methods differ, which is what the rules change.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from adopter.bench.command import patch_text, patched_source_file  # noqa: E402
from adopter.models.loading import load_sibling  # noqa: E402
from adopter.rules import RULE_SETS, load_rule_set  # noqa: E402

PACKAGES = ("timm", "diffusers", "transformers")
"""Library code the rules rewrite; everything else (torch, adopter) is left alone."""
SEED = 0
BATCH = 2
_SIBLING = "_adopter_vision_"
"""The name prefix of the rewritten copies of library modules."""


# ----------------------------------------------------------------------------------------------
# the models


def _image(size: int = 224) -> tuple[torch.Tensor]:
    return (torch.randn(BATCH, 3, size, size),)


def _timm(module: str, name: str) -> Callable[[], tuple[nn.Module, Any]]:
    """``timm.models.<module>.<name>()``, called on the module itself, not through
    ``timm.create_model``: loading a rewritten copy of the module runs its ``@register_model``
    decorators, which point timm's registry at the copy's functions, so ``create_model`` would
    build the patched classes for the original too."""

    def build() -> tuple[nn.Module, Any]:
        original = importlib.import_module(f"timm.models.{module}")
        torch.manual_seed(SEED)
        return getattr(original, name)(pretrained=False), _image()

    return build


def _unet() -> tuple[nn.Module, Any]:
    """A small Stable-Diffusion-style UNet: two resolutions, cross-attention in the outer one,
    GroupNorm(32) + SiLU in every ResNet block and at the output."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(SEED)
    model = UNet2DConditionModel(
        sample_size=32,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(64, 128),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=64,
        attention_head_dim=8,
        norm_num_groups=32,
    )
    inputs = {
        "sample": torch.randn(BATCH, 4, 32, 32),
        "timestep": torch.tensor([10, 500]),
        "encoder_hidden_states": torch.randn(BATCH, 16, 64),
    }
    return model, inputs


def _causal_lm(family: str, vocab: int) -> Callable[[], tuple[nn.Module, Any]]:
    """issue 14's training workload: 4 layers of width 768, 512 tokens, batch 2, with labels
    (the model computes its own loss), the library's default attention implementation."""

    def build() -> tuple[nn.Module, Any]:
        import transformers

        config_class = getattr(transformers, f"{family}Config")
        model_class = getattr(transformers, f"{family}ForCausalLM")
        config = config_class(
            vocab_size=vocab,
            hidden_size=768,
            intermediate_size=2048,
            num_hidden_layers=4,
            num_attention_heads=12,
            num_key_value_heads=12,
            max_position_embeddings=1024,
            tie_word_embeddings=False,
        )
        torch.manual_seed(SEED)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = model_class(config)
        ids = torch.randint(0, vocab, (BATCH, 512), generator=torch.Generator().manual_seed(SEED))
        return model, {"input_ids": ids, "labels": ids.clone(), "use_cache": False}

    return build


MODELS: dict[str, Callable[[], tuple[nn.Module, Any]]] = {
    "resnet50": _timm("resnet", "resnet50"),
    "convnext_tiny": _timm("convnext", "convnext_tiny"),
    "vit_small_patch16_224": _timm("vision_transformer", "vit_small_patch16_224"),
    "unet": _unet,
    "llama_32k": _causal_lm("Llama", 32_000),
    "llama_128k": _causal_lm("Llama", 128_256),
    "qwen2_32k": _causal_lm("Qwen2", 32_000),
    "qwen2_128k": _causal_lm("Qwen2", 128_256),
}


# ----------------------------------------------------------------------------------------------
# patching a built model


def rules_named(name: str) -> list:
    """A built-in rule set (``all``) or one rule of ``all`` (``modern_6`` -> ``modern.6``)."""
    if name in RULE_SETS:
        return load_rule_set(name)
    wanted = name.replace("_", ".", 1)
    chosen = [rule for rule in load_rule_set("all") if rule.id == wanted]
    if not chosen:
        raise AttributeError(f"no rule set or rule {name!r} ({wanted})")
    return chosen


def _objects(model: nn.Module) -> Iterator[Any]:
    """Every submodule, and the plain objects they hold (diffusers' attention processors)."""
    for module in model.modules():
        yield module
        for value in vars(module).values():
            if not isinstance(value, (nn.Module, torch.Tensor, dict, list, tuple, str)):
                if type(value).__module__.split(".")[0] in PACKAGES:
                    yield value


_SIBLINGS: dict[tuple[str, str], ModuleType | None] = {}
_CLASSES: dict[tuple[type, int], type] = {}


def _rewritten(module_name: str, rules_key: str, rules: list) -> ModuleType | None:
    """The module rewritten with ``rules`` and loaded beside the original; ``None`` when the
    rules change nothing in it."""
    key = (module_name, rules_key)
    if key not in _SIBLINGS:
        module = sys.modules[module_name]
        path = Path(inspect.getfile(module))
        text = path.read_text(encoding="utf-8")
        patched, sites = patch_text(text, str(path), rules)
        if not sites:
            _SIBLINGS[key] = None
        else:
            digest = hashlib.sha1(patched.encode("utf-8")).hexdigest()[:10]
            file = patched_source_file(patched, path.name)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _SIBLINGS[key] = load_sibling(module_name, f"{_SIBLING}{digest}_", file)
    return _SIBLINGS[key]


def _patched_class(cls: type, sibling: ModuleType) -> type | None:
    rewritten = getattr(sibling, cls.__qualname__, None) if "." not in cls.__qualname__ else None
    if not isinstance(rewritten, type) or rewritten is cls:
        return None
    key = (cls, id(sibling))
    if key not in _CLASSES:
        # Rewritten methods first, the original class behind them for isinstance checks.
        _CLASSES[key] = type(cls.__name__, (rewritten, cls), {"__module__": sibling.__name__})
    return _CLASSES[key]


def patch_built(model: nn.Module, rules_key: str, rules: list) -> nn.Module:
    """Give every object of ``model`` whose class a rewritten library file defines the
    rewritten class (see the module docstring)."""
    for obj in list(_objects(model)):
        cls = type(obj)
        if cls.__module__.split(".")[0] not in PACKAGES:
            continue
        sibling = _rewritten(cls.__module__, rules_key, rules)
        if sibling is None:
            continue
        patched = _patched_class(cls, sibling)
        if patched is not None:
            obj.__class__ = patched
    return model


def patched_files(model_name: str, rules_key: str) -> dict[str, dict[str, int]]:
    """``{library file: {rule id: sites}}`` that ``<model>__<rules>`` patches (for reports)."""
    model, _ = MODELS[model_name]()
    rules = rules_named(rules_key)
    found: dict[str, dict[str, int]] = {}
    modules = {type(obj).__module__ for obj in _objects(model)}
    for name in sorted(m for m in modules if m.split(".")[0] in PACKAGES):
        path = Path(inspect.getfile(sys.modules[name]))
        _, sites = patch_text(path.read_text(encoding="utf-8"), str(path), rules)
        if sites:
            found[name] = dict(sites)
    return found


def _original(model_name: str) -> tuple[nn.Module, Any]:
    """The original model, checked to hold none of the rewritten classes (a library registry
    that a rewritten copy re-registered into would hand them out)."""
    model, inputs = MODELS[model_name]()
    rewritten = {type(m).__module__ for m in _objects(model) if _SIBLING in type(m).__module__}
    if rewritten:
        raise RuntimeError(f"{model_name}: the original build holds rewritten classes {rewritten}")
    return model, inputs


def factory(model_name: str, rules_key: str | None = None) -> Callable[[], tuple[nn.Module, Any]]:
    """The zero-argument factory of ``model_name``, original or patched with ``rules_key``."""
    build = functools.partial(_original, model_name)
    if rules_key is None:
        return build
    rules = rules_named(rules_key)
    # Load the rewritten modules now, not at the first build: ``verify`` looks for the modules
    # that call ``adopter.kernels`` (the sites it watches) right after taking the factory.
    patch_built(build()[0], rules_key, rules)

    def patched() -> tuple[nn.Module, Any]:
        model, inputs = build()
        return patch_built(model, rules_key, rules), inputs

    return patched


def __getattr__(name: str) -> Callable[[], tuple[nn.Module, Any]]:
    model_name, _, rules_key = name.partition("__")
    if model_name not in MODELS:
        raise AttributeError(name)
    return factory(model_name, rules_key or None)
