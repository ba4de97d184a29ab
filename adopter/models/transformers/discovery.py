"""Which classes of a transformers modeling file are models a check can start from.

Worker side only: imports torch and transformers.
"""

from __future__ import annotations

import inspect
import re
import sys
from types import ModuleType

import torch

from ..loading import sibling_stem

__all__ = ["find_model_classes", "select_classes"]


def _pretrained_base() -> type:
    from transformers.modeling_utils import PreTrainedModel

    return PreTrainedModel


_MODEL_NAME = re.compile(r"(Model|For[A-Z]\w*|Backbone)$")


def _exported_names(module: ModuleType) -> set[str] | None:
    """The names the package exports from this file, where it says (lazy ``_import_structure``).

    transformers packages list their public model classes per file; internal building blocks
    that are also ``PreTrainedModel`` subclasses (``T5Stack``) are not listed there.
    """
    package = sys.modules.get(module.__name__.rpartition(".")[0])
    structure = getattr(package, "_import_structure", None)
    if not isinstance(structure, dict):
        return None
    stem = sibling_stem(module.__name__.rpartition(".")[2])
    names = structure.get(stem)
    return set(names) if isinstance(names, (list, tuple, set)) else None


def find_model_classes(module: ModuleType) -> list[type]:
    """Public, concrete ``PreTrainedModel`` subclasses defined in ``module``, in file order.

    Left out: family base classes (``BertPreTrainedModel``, any capitalisation, or any class
    without a ``forward`` of its own), which only carry shared settings; classes without a
    ``config_class``, which there is no configuration to build from; and internal blocks -
    classes the package does not export or, where it does not say, whose names do not read like
    a model (``...Model``, ``...For...``, ``...Backbone``).
    """
    base = _pretrained_base()
    exported = _exported_names(module)
    found = []
    for name, obj in vars(module).items():
        if not (isinstance(obj, type) and issubclass(obj, base) and obj is not base):
            continue
        if obj.__module__ != module.__name__ or name.lower().endswith("pretrainedmodel"):
            continue
        if obj.forward is torch.nn.Module.forward:  # no forward of its own: a base class
            continue
        if getattr(obj, "config_class", None) is None or inspect.isabstract(obj):
            continue
        if exported is not None and name not in exported:
            continue
        if exported is None and not _MODEL_NAME.search(name):
            continue
        found.append(obj)
    return found


def select_classes(classes: list[type], max_heads: int = 2) -> list[type]:
    """The base model (``XModel``) plus up to ``max_heads`` head classes, to bound the time.

    The base model is the one named after the configuration (``BertConfig`` -> ``BertModel``),
    else the first ``...Model`` class without ``For`` in its name. Heads follow in file order.
    """
    if not classes:
        return []
    base = None
    for cls in classes:
        config_name = getattr(cls.config_class, "__name__", "")
        if (
            config_name.endswith("Config")
            and cls.__name__ == config_name[: -len("Config")] + "Model"
        ):
            base = cls
            break
    if base is None:
        plain = [c for c in classes if c.__name__.endswith("Model") and "For" not in c.__name__]
        base = plain[0] if plain else classes[0]
    heads = [c for c in classes if c is not base][:max_heads]
    return [base, *heads]
