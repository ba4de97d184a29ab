"""``benchmarks/perf_report.py``'s Markdown, rendered from a synthetic cache: a snapshot test.

The cache under ``data/perf_cache`` (written by ``data/make_perf_cache.py``) holds made-up
numbers in the shape the report saves; the expected Markdown next to it was rendered from it.
Any change to the rendered text shows up as a failure with a diff: review it, then rewrite the
snapshots with ``ADOPTER_UPDATE_SNAPSHOTS=1 pytest tests/bench/test_perf_report_render.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("transformers")

from benchmarks import perf_report  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize(
    ("quick", "rule_set", "snapshot"),
    [(False, "all", "performance_full.md"), (True, "paper", "performance_quick_paper.md")],
)
def test_render_matches_snapshot(tmp_path: Path, quick: bool, rule_set: str, snapshot: str) -> None:
    out = tmp_path / "performance.md"
    settings = perf_report.Settings.make(quick, rule_set)
    perf_report.render(DATA / "perf_cache", out, out.with_suffix(".png"), settings)
    rendered = out.read_text(encoding="utf-8")
    expected_path = DATA / snapshot
    if os.environ.get("ADOPTER_UPDATE_SNAPSHOTS"):
        expected_path.write_text(rendered, encoding="utf-8")
    assert rendered == expected_path.read_text(encoding="utf-8")
    assert out.with_suffix(".png").stat().st_size > 0  # the chart of the `long` study
