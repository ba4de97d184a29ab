"""CONTRIBUTING.md names real files: every repository path it mentions exists (placeholders such
as ``<what>`` and the worked example ``my_fusion`` aside), so the steps cannot go stale silently."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH = re.compile(r"(?<![\w/.])((?:adopter|tests|benchmarks|docs)/[\w./-]*\w)(?![\w./-]*<)")


def test_every_path_in_contributing_exists():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    named = {m.group(1) for m in PATH.finditer(text)}
    real = {path for path in named if "my_fusion" not in path}
    assert len(real) > 15, sorted(named)  # the steps do name their files
    missing = sorted(path for path in real if not (ROOT / path).exists())
    assert not missing, f"CONTRIBUTING.md names paths that do not exist: {missing}"
