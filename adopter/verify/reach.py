"""Further checks while a patched site has not run in a comparison that matched.

The planned checks may leave a site unrun: it sits behind an option, in a class another model
class builds, in a code path a default configuration never takes. The adapter proposes
(class, overrides) checks that may run it (``reach_attempts``); this loop runs them, most
promising first, until every site ran, a check refuted the patch, or the count or the file's
time is used up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..models.interface import BUILD_FAILED, setting_label
from .results import NOT_CHECKABLE, ClassVerification, check_label, site_coverage

__all__ = ["MAX_REACH_CHECKS", "Reach", "may_go_on", "reach", "run_further", "unreached"]

# Checks beyond the planned classes, tried only while a patched site has not run: other
# model classes, and configurations with the options that guard a site flipped. Bounded by
# count and by time (see reach_time_left): a file has one timeout for all its checks.
MAX_REACH_CHECKS = 12
# Start no further check unless the slowest check so far would still end within this share of
# the file's timeout (the first file of a worker also pays for importing torch).
_REACH_TIME_SHARE = 0.7

Check = Callable[[str, dict[str, Any]], dict[str, Any]]


@dataclass
class Reach:
    """What the loop needs to know of a file: the classes checked so far (``names``), every
    model class, whether the caller fixed the classes, the adapter's context and its
    ``attempts(site, checked, available, fixed, context, broken)``, the file's time budget
    (seconds; ``None``: none) and the slowest planned check's seconds."""

    names: list[str]
    available: list[str]
    fixed: bool
    context: Any
    attempts: Callable[..., list[tuple[str, dict[str, Any]]]]
    budget_seconds: float | None = None
    slowest: float = 0.0


def unreached(sites: list[Any], verdicts: list[dict[str, Any]]) -> list[Any]:
    """Sites that have not yet run in a mode whose comparison agreed."""
    classes = [ClassVerification.from_json(v) for v in verdicts]
    return [entry.site for entry in site_coverage(sites, classes) if not entry.exercised]


def reach_time_left(
    started: float, slowest: float, budget: float | None, now: float | None = None
) -> bool:
    """Whether one more check, as slow as the slowest so far, ends within the time share."""
    if budget is None:
        return True
    now = time.perf_counter() if now is None else now
    return now - started + slowest <= _REACH_TIME_SHARE * budget


def _broken(verdicts: list[dict[str, Any]]) -> frozenset[str]:
    """Classes whose model could not be built and run as they are."""
    return frozenset(
        verdict["cls"]
        for verdict in verdicts
        if not verdict.get("setting")
        and verdict.get("status") == NOT_CHECKABLE
        and str(verdict.get("reason", "")).startswith(BUILD_FAILED)
    )


def _next_attempt(
    plan: Reach, sites: list[Any], verdicts: list[dict[str, Any]], done: set[tuple[str, str]]
) -> tuple[str, dict[str, Any]] | None:
    broken = _broken(verdicts)
    for site in unreached(sites, verdicts):
        for name, overrides in plan.attempts(
            site, plan.names, plan.available, plan.fixed, plan.context, broken
        ):
            if (name, setting_label(overrides)) not in done:
                return name, overrides
    return None


def may_go_on(plan: Reach, verdicts: list[dict[str, Any]], writer: Any) -> bool:
    """Whether a further check may start: nothing refuted (reaching more sites cannot change
    that verdict) and, by the slowest check so far, time left within the file's share."""
    if any(verdict.get("status") == "refuted" for verdict in verdicts):
        return False
    if not reach_time_left(writer.started, plan.slowest, plan.budget_seconds):
        writer.note("stopped trying to reach the remaining sites: the file's time is short")
        return False
    return True


def run_further(
    plan: Reach, verdicts: list[dict[str, Any]], writer: Any, label: str, run: Callable[[], Any]
) -> dict[str, Any]:
    """One further check named ``label``: planned and started in ``writer``, timed, and its
    verdict (what ``run`` returns) added to ``verdicts`` and ``writer``."""
    writer.plan([*writer.data["planned"], label])
    writer.start(label)
    began = time.perf_counter()
    verdict = run()
    plan.slowest = max(plan.slowest, time.perf_counter() - began)
    verdicts.append(verdict)
    writer.add(verdict)
    return verdict


def reach(
    plan: Reach, verdicts: list[dict[str, Any]], sites: list[Any], check: Check, writer: Any
) -> None:
    """Further checks while some site has not run and matched: at most MAX_REACH_CHECKS, and
    none that would likely run past _REACH_TIME_SHARE of the file's time budget. Each verdict
    is added to ``verdicts`` and to ``writer`` (a :class:`~adopter.verify.worker.ResultWriter`)."""
    done = {(name, "") for name in plan.names}
    for _ in range(MAX_REACH_CHECKS):
        attempt = (
            _next_attempt(plan, sites, verdicts, done)
            if may_go_on(plan, verdicts, writer)
            else None
        )
        if attempt is None:
            return
        name, overrides = attempt
        done.add((name, setting_label(overrides)))
        label = check_label(name, setting_label(overrides))
        run_further(plan, verdicts, writer, label, partial(check, name, overrides))
        if not overrides and name not in plan.names:
            plan.names.append(name)
