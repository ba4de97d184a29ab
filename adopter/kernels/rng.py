"""Which ``adopter.kernels`` draw random numbers exactly as the code they replace.

Train mode with the configured dropout can only be compared element-wise when the patched model
draws the same random numbers, in the same order, as the original. That is a property of each
kernel (and of the device and backend it runs on), documented in the kernels' docstrings; this
table records it so that verify skips - with the reason - a comparison that would fail for a
correct patch, instead of reporting it as a refutation.

The categories are the registry's (:class:`~adopter.kernels.registry.RandomDraws`, one per
:class:`~adopter.kernels.registry.Entry`): this module only reads them, for the worker side of
verify (:mod:`adopter.verify.prove`), from the patched sources' text.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable

from .registry import ENTRIES, RandomDraws

__all__ = ["KERNEL_NAMES", "RNG_CATEGORIES", "kernels_used", "rng_mismatch_reason"]

RNG_CATEGORIES: dict[str, frozenset[str]] = {
    draws.value: frozenset(e.name for e in ENTRIES if e.rng is draws) for draws in RandomDraws
}
KERNEL_NAMES = frozenset(e.name for e in ENTRIES)
_OWN_RNG = RNG_CATEGORIES[RandomDraws.SDPA]
_ORIGINAL_DROPOUT_ON_CPU = RNG_CATEGORIES[RandomDraws.ORIGINAL_ON_CPU]
_SAME_RNG_EAGER_CPU = RNG_CATEGORIES[RandomDraws.DROPOUT_EAGER_CPU]

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
