"""Where a model keeps its dropout, for any library: modules, attributes and configurations.

A train-mode comparison with dropout off must switch off every dropout a model draws - torch's
dropout modules, and the probabilities model code keeps outside them (T5's ``self.dropout =
config.dropout_rate``, passed to ``F.dropout`` in ``forward``) - and a comparison with the
configured dropout is only worth making where some dropout is active. The names that mean a
dropout probability are :data:`~adopter.models.config_names.DROPOUT_NAME`. Worker side only.
"""

from __future__ import annotations

from typing import Any

from .config_names import DROPOUT_NAME, zero_dropout_dict

__all__ = ["has_dropout", "zero_dropout_modules"]


def _dropout_module(module: Any) -> bool:
    from torch import nn

    return isinstance(module, nn.modules.dropout._DropoutNd)  # every torch dropout module's base


def zero_dropout_modules(model: Any) -> None:
    """Switch off every dropout in ``model``, including ones hard-coded outside the config.

    Dropout modules get ``p = 0``; float attributes with dropout-like names become 0.
    """
    for module in model.modules():
        if _dropout_module(module):
            module.p = 0.0
            continue
        for name, value in list(vars(module).items()):
            if isinstance(value, float) and value != 0.0 and DROPOUT_NAME.search(name):
                setattr(module, name, 0.0)


def has_dropout(model: Any) -> bool:
    """Whether training draws dropout masks: a dropout module with ``p > 0``, or a non-zero
    dropout-like configuration value (many models call ``F.dropout(x, p=self.dropout)``)."""
    if any(_dropout_module(module) and module.p > 0 for module in model.modules()):
        return True
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    return bool(callable(to_dict) and zero_dropout_dict(to_dict()))
