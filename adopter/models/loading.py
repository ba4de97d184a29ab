"""Load a source text as a sibling module of an installed package (for both sides of a check).

A patched file (or a different original text) runs as ``<package>.<prefix><name>`` beside the
module it came from, so its relative imports (``from ...modeling_utils import
PreTrainedModel``) resolve to the very objects the original uses and only the classes the file
defines differ. Used by verify's worker and by bench's measuring process.

The prefixes here are the one definition of how a sibling is named, so code that meets such a
module (transformers' export lists are keyed on the file's own stem) can see through the name.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

__all__ = [
    "ORIGINAL_PREFIX",
    "PATCHED_PREFIX",
    "exec_file",
    "import_original",
    "import_patched",
    "load_sibling",
    "sibling_stem",
]

PATCHED_PREFIX = "_adopter_patched_"
ORIGINAL_PREFIX = "_adopter_original_"
_SIBLING = re.compile(rf"^({re.escape(ORIGINAL_PREFIX)}|{re.escape(PATCHED_PREFIX)})\d+_")


def sibling_stem(base: str) -> str:
    """The file stem a sibling's last name part came from (``_adopter_patched_3_modeling_bert``:
    ``modeling_bert``); other names unchanged."""
    return _SIBLING.sub("", base)


def load_sibling(module_name: str, prefix: str, file_path: Path) -> ModuleType:
    """Execute ``file_path`` as module ``<package>.<prefix><name>`` next to ``module_name``
    (its package imported first, see :func:`exec_file`)."""
    package, _, base = module_name.rpartition(".")
    name = f"{package}.{prefix}{base}" if package else f"{prefix}{base}"
    if package:
        importlib.import_module(package)
    return exec_file(name, file_path)


def exec_file(name: str, file_path: str | Path) -> ModuleType:
    """Execute ``file_path`` as module ``name``, registered in ``sys.modules`` before it runs
    (``@dataclass`` and pickling look a module up there) and removed again if it fails."""
    spec = importlib.util.spec_from_file_location(name, file_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file_path} as {name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def import_patched(module_name: str, patched_path: str | Path, tag: int) -> ModuleType:
    """The patched text executed beside ``module_name`` (job ``tag`` keeps patches apart)."""
    return load_sibling(module_name, f"{PATCHED_PREFIX}{tag}_", Path(patched_path))


def import_original(
    module_name: str, original_path: str | Path, tag: int, note: Callable[[str], None]
) -> ModuleType:
    """The original module: the installed one, or ``original_path``'s text where they differ.

    ``original_path`` may be a copy outside the import path (an unpacked wheel under
    ``.cache/corpus``); the installed module of the same name is used when its text is the
    same, and otherwise the given text is executed inside the installed package, so that the
    patch is always compared against the source it was made from. ``note`` hears which.
    """
    original_path = Path(original_path)
    module = importlib.import_module(module_name)
    installed = Path(getattr(module, "__file__", "") or "")
    if installed.exists() and installed.resolve() == original_path.resolve():
        return module
    original_text = original_path.read_text(encoding="utf-8")
    if installed.exists() and installed.read_text(encoding="utf-8") == original_text:
        note(f"original: the installed {module_name} ({installed}), same text as the given file")
        return module
    note(
        f"original: {original_path} differs from the installed {module_name}; its text runs "
        "inside the installed package"
    )
    return load_sibling(module_name, f"{ORIGINAL_PREFIX}{tag}_", original_path)
