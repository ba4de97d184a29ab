"""Rows for ``adopter verify``'s table and JSON: one per file, per check and per patched site.

Each row has ``kind`` (``file``, ``class`` or ``site``), ``path``, ``class``, ``status`` and
``reason``; class rows add ``max_abs_diff``, ``where``, ``modes``, ``setting``, ``runs`` and
``referee`` (per mode, the float64 referee's figures where it judged one; ``settled`` where it
verified the mode), site rows ``line`` (in the original file), ``kernel``, ``function`` and the
checks it ran and matched in. The file row carries the verdict that counts: ``verified`` only
when every patched site ran and matched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .results import ClassVerification, FileVerification

__all__ = ["class_row", "unchanged_row", "verification_rows"]


def _row(kind: str, path: str | Path, label: str, status: str, reason: str, **more: Any) -> dict:
    """A row with the keys every row has (``max_abs_diff`` and ``where`` ``None`` unless
    ``more`` sets them), then ``more``."""
    return {
        "kind": kind,
        "path": str(path),
        "class": label,
        "status": status,
        "reason": reason,
        "max_abs_diff": None,
        "where": None,
        **more,
    }


def class_row(path: str | Path, verdict: ClassVerification) -> dict[str, Any]:
    return _row(
        "class",
        path,
        verdict.label,
        verdict.status,
        verdict.reason,
        max_abs_diff=verdict.max_abs_diff,
        where=verdict.where,
        modes=dict(verdict.modes),
        setting=verdict.setting,
        runs={mode: dict(counts) for mode, counts in verdict.runs.items()},
        referee={mode: dict(figures) for mode, figures in verdict.referee.items()},
        backends={mode: dict(per_site) for mode, per_site in verdict.backends.items()},
    )


def unchanged_row(path: str | Path) -> dict[str, Any]:
    """The row of a file no rule changes: nothing to verify."""
    return _row("file", path, "-", "unchanged", "no site to patch")


def verification_rows(path: str | Path, verification: FileVerification) -> list[dict[str, Any]]:
    """The file's verdict, then each check, then each patched site."""
    status, reason = verification.status, verification.reason()
    rows = [_row("file", path, "(file)", status, reason)]
    rows += [class_row(path, verdict) for verdict in verification.classes]
    for entry in verification.sites:
        site = entry.site
        where = ", ".join(entry.matched_in) if entry.exercised else entry.reason
        rows.append(
            _row(
                "site",
                path,
                f"site: {site.describe()}",
                entry.status,
                f"ran and matched in {where}" if entry.exercised else where,
                line=site.original_line or site.line,
                kernel=site.kernel,
                function=site.function,
                guards=list(site.guards),
                matched_in=dict(entry.matched_in),
                ran_in=dict(entry.ran_in),
            )
        )
    return rows
