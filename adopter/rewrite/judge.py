"""What ``scan`` says about rewriting: each site ``apply`` would skip, marked with the reason.

``scan`` and ``apply`` must never disagree silently. The CLI's scan hands every file's sites to
:func:`mark_unwritable`, which runs the static half of the rewrite (:func:`.apply.plan_sites`:
the same planner and the same named checks as ``apply``, on the ``ast`` only; nothing imported,
executed or rendered) and marks each site a check refuses as not rewritable, with the check's
reason, which is the reason ``apply`` prints when it skips the site.
"""

from __future__ import annotations

from ..extract.source import parse_source
from ..match.matcher import Site
from .apply import plan_sites
from .outcome import SiteStatus


def mark_unwritable(text: str, path: str, sites: list[Site], modular: bool = False) -> None:
    """Mark the applicable ``sites`` of ``text`` that ``apply`` would skip (``modular``: under
    apply's ``--modular`` policy)."""
    if not any(site.applicable for site in sites):
        return
    planned = plan_sites(text, path, sites, parse_source(text, path), modular=modular)
    if planned is None:
        return
    _, _, results = planned
    for result in results:
        if result.status is SiteStatus.SKIPPED:
            result.site.rewritable = False
            result.site.rewrite_reason = result.reason
