"""Canonical spellings: import aliases resolved to dotted names, equivalent functions folded into
one name, and arguments of well-known callees normalised to their parameter names.

Equivalent spellings folded together (the rule files match the canonical name):

* ``nn.functional`` through any import alias: ``F.softmax``, ``nn.functional.softmax`` and
  ``torch.nn.functional.softmax`` are all ``torch.nn.functional.softmax``.
* ``a + b``, ``torch.add(a, b)``, ``a.add(b)`` -> ``add``;
  ``a @ b``, ``torch.matmul`` -> ``matmul``.
* Positional and keyword arguments of the callees in ``SIGNATURES`` are mapped onto parameter
  names (``F.softmax(x, -1)`` has ``dim=-1``), with defaults filled in.

* every softmax spelling: ``torch.softmax``, ``torch.special.softmax`` and the tensor method
  ``x.softmax(...)`` are ``torch.nn.functional.softmax``; extraction also records a call of an
  ``nn.Softmax`` module (an attribute, or built inline: ``nn.Softmax(dim=-1)(x)``) as that
  function with the module's ``dim`` (see :mod:`adopter.extract.flow`).

The 2023 benchmark's hand count covers the ``nn.functional`` spelling only; the other spellings
compute the same thing, so their sites are extra real instances there (docs/benchmark.md).
"""

from __future__ import annotations

import ast
from functools import cache

# Callee -> canonical callee.
FUNCTION_ALIASES: dict[str, str] = {
    "torch.special.softmax": "torch.nn.functional.softmax",
    "torch.softmax": "torch.nn.functional.softmax",
    "Tensor.softmax": "torch.nn.functional.softmax",
    "Tensor.add": "add",
    "torch.add": "add",
    "Tensor.matmul": "matmul",
    "torch.matmul": "matmul",
}

# Parameter names, in order, of callees whose arguments rules look at. A trailing "=value" gives
# the default, filled in when the call leaves the parameter out.
_CONV = (
    "in_channels", "out_channels", "kernel_size", "stride=1", "padding=0", "dilation=1",
    "groups=1", "bias=True", "padding_mode='zeros'", "device=None", "dtype=None",
)  # fmt: skip
_BATCH_NORM = (
    "num_features", "eps=1e-05", "momentum=0.1", "affine=True", "track_running_stats=True",
    "device=None", "dtype=None",
)  # fmt: skip
# timm's batch norm with its activation inside (``apply_act=True`` unless told otherwise), under
# the names a model file imports it by
_BATCH_NORM_ACT = (
    "num_features", "eps=1e-05", "momentum=0.1", "affine=True", "track_running_stats=True",
    "apply_act=True", "act_layer", "act_kwargs=None", "inplace=True", "drop_layer=None",
    "device=None", "dtype=None",
)  # fmt: skip
SIGNATURES: dict[str, tuple[str, ...]] = {
    "torch.nn.functional.softmax": ("input", "dim=None", "_stacklevel=3", "dtype=None"),
    "torch.softmax": ("input", "dim", "dtype=None"),
    "Tensor.softmax": ("input", "dim", "dtype=None"),
    "torch.nn.functional.dropout": ("input", "p=0.5", "training=True", "inplace=False"),
    "torch.nn.Linear": ("in_features", "out_features", "bias=True", "device=None", "dtype=None"),
    "torch.nn.Conv1d": _CONV,
    "torch.nn.Conv2d": _CONV,
    "torch.nn.Conv3d": _CONV,
    "torch.nn.BatchNorm1d": _BATCH_NORM,
    "torch.nn.BatchNorm2d": _BATCH_NORM,
    "torch.nn.BatchNorm3d": _BATCH_NORM,
    "timm.layers.BatchNormAct2d": _BATCH_NORM_ACT,
    "timm.layers.norm_act.BatchNormAct2d": _BATCH_NORM_ACT,
    "torch.nn.LayerNorm": (
        "normalized_shape",
        "eps=1e-05",
        "elementwise_affine=True",
        "bias=True",
        "device=None",
        "dtype=None",
    ),  # fmt: skip
    "torch.nn.Dropout": ("p=0.5", "inplace=False"),
    "torch.nn.CrossEntropyLoss": (
        "weight=None",
        "size_average=None",
        "ignore_index=-100",
        "reduce=None",
        "reduction='mean'",
        "label_smoothing=0.0",
    ),
    "torch.nn.Softmax": ("dim=None",),
    "torch.special.softmax": ("input", "dim", "dtype=None"),
    "add": ("input", "other"),
}


# -- activations ------------------------------------------------------------------------------
# A rule names any activation with the family name ``activation`` (``@activation(...)``): an
# ``ACT2FN[<any expression>]`` lookup, ``get_activation(...)``, an activation module
# (``nn.GELU()``, transformers' ``GELUActivation()``...), a constructor parameter whose default is
# one (``act_layer=nn.GELU``), or an activation function applied in ``forward`` (``F.gelu(h)``).
ACTIVATION = "activation"
_ELEMENTWISE = (
    "GELU", "ReLU", "ReLU6", "SiLU", "Tanh", "Sigmoid", "Mish", "LeakyReLU", "Hardswish",
    "Hardsigmoid", "ELU", "SELU", "CELU", "Softplus", "PReLU", "Hardtanh", "Tanhshrink",
)  # fmt: skip
ACTIVATION_MODULES = frozenset(f"torch.nn.{name}" for name in _ELEMENTWISE)
ACTIVATION_FUNCTIONS = frozenset(
    [
        *(f"torch.nn.functional.{name}" for name in (
            "gelu", "relu", "relu6", "silu", "tanh", "sigmoid", "mish", "leaky_relu",
            "hardswish", "hardsigmoid", "elu", "selu", "celu", "softplus", "hardtanh",
        )),
        "torch.tanh", "torch.sigmoid", "torch.relu", "torch.nn.functional.gelu_new",
    ]
)  # fmt: skip
# Factories that return an activation module, recognised by their last name component:
# ``ACT2FN[...]`` / ``ACT2CLS[...]()`` (transformers, diffusers), ``get_activation(...)``
# (transformers, diffusers), ``create_act_layer(...)`` (timm).
ACTIVATION_FACTORIES = frozenset(["ACT2FN", "ACT2CLS", "get_activation", "create_act_layer"])
# Activation classes that are classes of an ``activations`` module (transformers, diffusers:
# ``GELUActivation``, ``NewGELUActivation``, ``QuickGELUActivation``...).
_ACTIVATION_CLASS_SUFFIX = "Activation"


# -- head splits ------------------------------------------------------------------------------
# A rule names any reshaping of a projection into attention heads with the family name
# ``split_heads``: ``x.view(...)``, ``x.reshape(...)``, ``x.unflatten(...)``,
# ``x.transpose(...)``, ``rearrange``/``einops`` patterns, and helpers that do one
# (``self._split_heads(x)``, inlined, is its ``view``). Each works on a slice of a fused
# projection's output (``.view`` that splits the last dimension, reshapes that copy when needed).
SPLIT_HEADS = "split_heads"
_HEAD_SPLITS = frozenset(
    [
        "Tensor.view", "Tensor.reshape", "torch.reshape", "Tensor.unflatten", "torch.unflatten",
        "Tensor.transpose", "torch.transpose", "einops.rearrange", "rearrange",
    ]
)  # fmt: skip


def step_family(kind: str) -> str | None:
    """The family a rule may name instead of a forward step's kind."""
    return SPLIT_HEADS if kind in _HEAD_SPLITS else None


# A rule names element-wise dropout with the family name ``dropout``: an ``nn.Dropout`` module or
# ``F.dropout(x, p, training)`` in ``forward`` (whose ``p`` and ``training`` a kernel takes).
DROPOUT = "dropout"
DROPOUT_FUNCTION = "torch.nn.functional.dropout"


# A rule names any RMSNorm module with the family name ``rms_norm``: ``nn.RMSNorm`` and every
# class whose name ends in ``RMSNorm`` / ``RmsNorm`` (transformers' per-model ``LlamaRMSNorm``
# copies, diffusers' ``RMSNorm``, timm's ``RmsNorm``). The name says what the class is meant to
# be, not what its forward computes: a kernel handed such a module checks that itself at run
# time (``adopter.kernels.add_rms_norm`` recognises the spellings it fuses and calls any other
# module as it is).
RMS_NORM = "rms_norm"


def construction_family(kind: str) -> str | None:
    """The family a rule may name instead of a construction's kind."""
    if kind in ("torch.nn.Dropout", DROPOUT_FUNCTION):
        return DROPOUT
    if kind.split("[", 1)[0].rsplit(".", 1)[-1].lower().endswith("rmsnorm"):
        return RMS_NORM
    return activation_family(kind)


def activation_family(kind: str) -> str | None:
    """``ACTIVATION`` when a construction of ``kind`` builds an elementwise activation."""
    base = kind.split("[", 1)[0]
    last = base.rsplit(".", 1)[-1]
    if kind in ACTIVATION_MODULES or last in ACTIVATION_FACTORIES:
        return ACTIVATION
    if last.endswith(_ACTIVATION_CLASS_SUFFIX) and ".activations." in f".{base}":
        return ACTIVATION
    return None


@cache
def parameter_names(callee: str) -> tuple[list[str], dict[str, object]]:
    """Parameter names and defaults of a known callee (empty when unknown). Callers must not
    mutate the result: it is shared."""
    names: list[str] = []
    defaults: dict[str, object] = {}
    for entry in SIGNATURES.get(callee, ()):
        name, _, default = entry.partition("=")
        names.append(name)
        if default:
            defaults[name] = ast.literal_eval(default)
    return names, defaults


def canonical_function(name: str) -> str:
    return FUNCTION_ALIASES.get(name, name)


def dotted_suffix_match(pattern: str, kind: str) -> bool:
    """``ACT2FN`` matches ``activations.ACT2FN``; ``torch.nn.Linear`` matches only itself."""
    return kind == pattern or kind.endswith("." + pattern)


class ImportTable:
    """Resolves names of one module to dotted paths through its imports."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        # ``from <level dots><module> import <name> as <local>``: local -> (level, module, name)
        self.origins: dict[str, tuple[int, str, str]] = {}

    def add(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    self.aliases[top] = top
            return
        module = node.module or ""
        for alias in node.names:
            if alias.name == "*":
                continue
            full = f"{module}.{alias.name}" if module else alias.name
            self.aliases[alias.asname or alias.name] = full
            self.origins[alias.asname or alias.name] = (node.level or 0, module, alias.name)

    def resolve(self, node: ast.expr) -> str | None:
        """Dotted name of ``a.b.c`` with its head resolved through the imports."""
        chain = attribute_chain(node)
        if chain is None:
            return None
        return ".".join([self.aliases.get(chain[0], chain[0]), *chain[1:]])


def function_parameters(function: ast.FunctionDef) -> list[tuple[str, ast.expr | None]]:
    """``(name, default)`` of each parameter of ``function`` but ``*args``/``**kwargs``, in
    order (``self`` included), the default ``None`` where there is none."""
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults))
    defaults += arguments.defaults
    pairs = [(p.arg, d) for p, d in zip(positional, defaults, strict=True)]
    pairs += [(p.arg, d) for p, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)]
    return pairs


def attribute_chain(node: ast.expr) -> list[str] | None:
    """``self.config.x`` -> ["self", "config", "x"]; None for anything but a name's attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]
