"""Adopter: find and patch the places in deep-learning model source where optimized kernels fit.

The package reads left to right as the pipeline: ``dsl`` (rule language), ``extract`` (static
structure extraction), ``match`` (rule matching), ``rewrite`` (source synthesis), ``verify``
(differential testing), ``bench`` (speed and memory), ``kernels`` (the fused implementations the
rewritten code calls), ``rules`` (the built-in rule sets), ``runtime`` (patching imported modules
in memory: ``adopter.patch``, ``adopter.unpatch``, ``import adopter.auto``) and ``cli``.

``patch`` and ``unpatch`` are loaded on first use, so ``import adopter`` stays cheap.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "patch", "unpatch"]


def __getattr__(name: str) -> Any:
    if name in ("patch", "unpatch"):
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'adopter' has no attribute {name!r}")
