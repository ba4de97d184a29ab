"""Which ``adopter.kernels`` draw random numbers exactly as the code they replace.

Train mode with the configured dropout can only be compared element-wise when the patched model
draws the same random numbers, in the same order, as the original. That is a property of each
kernel (and of the device and backend it runs on), documented in the kernels' docstrings; this
table records it so that verify skips - with the reason - a comparison that would fail for a
correct patch, instead of reporting it as a refutation.

The kernels come later in the pipeline than verify, so this table is not derived from
``adopter.kernels.registry``; ``tests/kernels/test_kernel_registry.py`` checks that both name
the same kernels in the same categories (:data:`RNG_CATEGORIES`' keys are the registry's
``RandomDraws`` values).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable

__all__ = ["KERNEL_NAMES", "RNG_CATEGORIES", "kernels_used", "rng_mismatch_reason"]

# Kernels without any random draw: replacing code that draws nothing keeps the stream intact.
_NO_RNG = frozenset(
    {
        "softmax",
        "linear_bias_activation",
        "conv_batch_norm",
        "linear_batch_norm",
        "qkv_projection",
        "clear_caches",
        "describe_backends",
        "rms_norm",
        "add_rms_norm",
        "gated_activation",
        "gated_activation_chunked",
        "gated_mlp",
        "rotary",
        "apply_rotary",
        "apply_rotary_complex",
        "group_norm_activation",
        "conv_bn_act",
        "linear_cross_entropy",
        "causal_lm_loss",
        "fused_loss_applies",
        "fused_optimizer",
        "fused_training_optimizer",
    }
)
# Kernels whose dropout mask is drawn like nn.Dropout only in eager mode on the CPU.
_SAME_RNG_EAGER_CPU = frozenset({"dropout_add_layer_norm"})
# Kernels that hand dropout to scaled_dot_product_attention, which draws its own mask.
_OWN_RNG = frozenset(
    {
        "fused_bert_self_attention",
        "fused_t5_attention",
        "fused_gpt2_attention",
        "fused_distilbert_attention",
        "fused_albert_attention",
        "fused_gpt_neo_self_attention",
    }
)

# Kernels that run the original code - and its nn.functional.dropout - whenever dropout is
# active on a CPU, and hand dropout to scaled_dot_product_attention on other devices.
_ORIGINAL_DROPOUT_ON_CPU = frozenset({"attention_function", "scaled_attention"})

RNG_CATEGORIES: dict[str, frozenset[str]] = {
    "none": _NO_RNG,
    "dropout-eager-cpu": _SAME_RNG_EAGER_CPU,
    "sdpa": _OWN_RNG,
    "original-on-cpu": _ORIGINAL_DROPOUT_ON_CPU,
}
KERNEL_NAMES = frozenset().union(*RNG_CATEGORIES.values())

_KERNELS_MODULE = "adopter.kernels"


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attribute reads on a name, else ``None``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _names_in(source: str) -> set[str]:
    """Every ``adopter.kernels`` member a source uses: imported by name or read as attribute.

    Aliases are followed: ``import adopter.kernels as K`` then ``K.softmax``, and
    ``from adopter import kernels`` then ``kernels.softmax``.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    aliases = {_KERNELS_MODULE}
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == _KERNELS_MODULE:
            used.update(alias.name for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.ImportFrom) and node.module == "adopter":
            aliases.update(a.asname or a.name for a in node.names if a.name == "kernels")
        elif isinstance(node, ast.Import):
            aliases.update(a.asname for a in node.names if a.name == _KERNELS_MODULE and a.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _dotted(node.value) in aliases:
            used.add(node.attr)
    return used


def kernels_used(sources: Iterable[str]) -> tuple[set[str], set[str]]:
    """The known and the unknown ``adopter.kernels`` names referenced by ``sources``.

    A name imported from or read on ``adopter.kernels`` that is not in the table is "unknown":
    its random draws are not documented here, so the configured-dropout comparison is skipped.
    """
    used: set[str] = set()
    for source in sources:
        used |= _names_in(source)
    return used & KERNEL_NAMES, used - KERNEL_NAMES


def rng_mismatch_reason(sources: Iterable[str], device_type: str) -> str | None:
    """Why the patched code may draw random numbers differently, or ``None`` if it cannot.

    ``device_type`` is where the models run (``cpu``/``cuda``). ``ADOPTER_KERNELS_COMPILE=1``
    routes dropout through ``torch.compile`` even on the CPU, which draws differently.
    """
    known, unknown = kernels_used(sources)
    if unknown:
        return (
            f"adopter.kernels.{', '.join(sorted(unknown))}: not known to draw random numbers "
            "like the code it replaces"
        )
    own = sorted(known & _OWN_RNG)
    if own:
        return f"{', '.join(own)}: attention dropout is drawn inside scaled_dot_product_attention"
    sdpa_off_cpu = sorted(known & _ORIGINAL_DROPOUT_ON_CPU)
    if sdpa_off_cpu and device_type != "cpu":
        return (
            f"{', '.join(sdpa_off_cpu)}: attention dropout is drawn inside "
            f"scaled_dot_product_attention on {device_type}"
        )
    eager = sorted(known & _SAME_RNG_EAGER_CPU)
    if eager:
        compile_switch = os.environ.get("ADOPTER_KERNELS_COMPILE", "auto").strip().lower()
        if device_type != "cpu":
            names = ", ".join(eager)
            return f"{names}: dropout masks are drawn unlike nn.Dropout's on {device_type}"
        if compile_switch in ("1", "true", "yes", "on"):
            return (
                f"{', '.join(eager)}: runs under torch.compile (ADOPTER_KERNELS_COMPILE), "
                "which draws dropout masks differently"
            )
    return None
