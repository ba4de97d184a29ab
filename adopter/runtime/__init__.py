"""Adopt kernels without editing files: patch imported modules in memory.

``adopter.patch(target)`` rewrites a module, a package (its imported submodules now, the rest
as they are imported) or the classes of a built model with the same static pipeline as
``adopter apply``, and swaps the patched code into the live functions; ``adopter.unpatch``
restores them. ``import adopter.auto`` and ``adopter run -- python train.py`` install an import
hook for transformers, timm and diffusers. Rewrites (and verdicts, with ``verify=True``) are
cached per user, keyed by source, rules, Adopter, torch and Python.

This stage sits after ``rules`` in the pipeline and before ``cli``; no earlier stage imports it.
Importing it does not import torch (only a patch that uses a kernel does).
"""

from .cache import cache_dir, clear_cache
from .hook import DEFAULT_PACKAGES, hooked_packages
from .patching import (
    ModuleOutcome,
    PatchReport,
    install_from_environment,
    patch,
    patch_module,
    patched_modules,
    unpatch,
)

__all__ = [
    "DEFAULT_PACKAGES",
    "ModuleOutcome",
    "PatchReport",
    "cache_dir",
    "clear_cache",
    "hooked_packages",
    "install_from_environment",
    "patch",
    "patch_module",
    "patched_modules",
    "unpatch",
]
