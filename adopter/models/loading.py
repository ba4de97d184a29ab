"""Load a source text as a sibling module of an installed package (for both sides of a check).

A patched file (or a different original text) runs as ``<package>.<prefix><name>`` beside the
module it came from, so its relative imports (``from ...modeling_utils import
PreTrainedModel``) resolve to the very objects the original uses and only the classes the file
defines differ. Used by verify's worker and by bench's measuring process.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["load_sibling"]


def load_sibling(module_name: str, prefix: str, file_path: Path) -> ModuleType:
    """Execute ``file_path`` as module ``<package>.<prefix><name>`` next to ``module_name``.

    Registered in ``sys.modules`` before execution (``@dataclass`` and pickling look the module
    up there) and removed again if execution fails.
    """
    package, _, base = module_name.rpartition(".")
    name = f"{package}.{prefix}{base}" if package else f"{prefix}{base}"
    if package:
        importlib.import_module(package)
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
