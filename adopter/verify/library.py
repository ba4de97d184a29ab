"""Worker side of verifying a patched file of a model library with a model adapter:
the models that use the file, each built twice through the adapter, compared.

The adapter (:mod:`adopter.models`) says which of the library's models may run the file's code
and builds a small one with inputs (:class:`~adopter.models.library_sides.LibrarySides`); the
proof is verify's (:func:`adopter.verify.prove.prove`): the original's ``state_dict`` is loaded
strictly into the patched side, and both run in eval and train mode (dropout off) under the
same seed. Models are tried until every patched site has run in a comparison, the time budget
is spent or ``max_models`` were checked; a model whose cheap survey shows it builds none of the
classes that host a site still to reach is passed over unbuilt.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace
from importlib import import_module
from pathlib import Path
from typing import Any

from ..models.base import worth_building
from ..models.common import error_line
from ..models.interface import DEFAULT_ADAPTER, PART_SUFFIX, BuildSettings, Subject
from ..models.library_sides import LibrarySides
from ..models.loading import import_original, import_patched
from ..models.parts import part_classes, parts_to_check
from ..models.registry import adapter_for
from ..models.sites import PatchedSite, attribute_flips, reaching_names
from .coverage import SiteRecorder
from .file_job import run_file_job
from .job import FILE, WorkerJob
from .prove import verdict_of
from .results import VERIFIED, ClassVerification

__all__ = ["run_library_job"]

MAX_MODELS = 6
"""Models compared per file at most (each costs seconds to a minute on a CPU)."""


def _load_sides(job: WorkerJob, writer: Any, adapter: Any, recorder: SiteRecorder) -> LibrarySides:
    with adapter.keeping_registries():
        original = import_original(job.module_name, job.original_path, job.tag, writer.note)
        with recorder.intercepting():
            patched = import_patched(job.module_name, job.patched_path, job.tag)
    recorder.install(patched)
    given = original if original.__name__ != job.module_name else None
    settings = BuildSettings(job.options.seed, job.options.dtype)
    return LibrarySides(adapter, job.module_name, given, patched, settings)


@dataclass
class _Checks:
    """What every comparison of one file shares: how to build both sides, the recorder, the
    job and the writer of its result."""

    sides: LibrarySides
    recorder: SiteRecorder
    job: WorkerJob
    writer: Any


def run_library_job(job: WorkerJob, writer: Any) -> None:
    """Verify one patched library file (``job.library`` names the adapter)."""
    began = time.monotonic()  # the candidate search spends from the same budget as checks
    adapter = adapter_for(job.library)
    sites = [PatchedSite.from_json(site) for site in job.sites]
    writer.data["sites"] = [site.to_json() for site in sites]
    candidates = adapter.candidates(job.module_name, reaching_names(sites))
    if not candidates:
        _check_own_models(job, writer)
        return
    recorder = SiteRecorder(sites, files=[job.patched_path])
    try:
        sides = _load_sides(job, writer, adapter, recorder)
    except BaseException as exc:
        writer.error(f"importing {job.module_name} or its patch failed: {error_line(exc)}")
        return
    checks = _Checks(sides, recorder, job, writer)
    matched: set[str] = set()
    checked = _check_candidates(candidates, sites, matched, checks, began)
    unmatched = [site for site in sites if site.key not in matched]
    if unmatched:
        checked += _check_parts(candidates, unmatched, checks, began)
    if checked == 0:
        writer.error(
            f"none of the {len(candidates)} {job.library} model(s) that may use the file "
            "builds a class holding a patched site at a small size (tried: "
            + ", ".join(c.name for c in candidates[:8])
            + ")"
        )


def _check_own_models(job: WorkerJob, writer: Any) -> None:
    """A file no model of its library is known to use: the model classes it defines itself,
    where the default adapter may find some (a text encoder of another library's kind inside
    a pipeline), are checked as a modeling file's are; else that is the verdict."""
    unused = f"no {job.library} model is known to use {job.module_name}"
    default = import_module(DEFAULT_ADAPTER)
    if not default.may_define_models(Path(job.original_path).read_text("utf-8")):
        writer.error(unused)
        return
    writer.note(f"{unused}: the model classes the file defines are checked on their own")
    run_file_job(replace(job, kind=FILE, adapter=DEFAULT_ADAPTER), writer)


def _spent(checks: _Checks, began: float) -> bool:
    """Whether the file's time budget (counted from ``began``, when the worker started on it)
    is spent: the checks still to make would not finish before its timeout."""
    return time.monotonic() - began > float(checks.job.options.timeout) * 0.8


def _check_candidates(
    candidates: list[Any],
    sites: list[PatchedSite],
    matched: set[str],
    checks: _Checks,
    began: float,
) -> int:
    """Compare the candidate models in turn until every site ran in a matching comparison
    (``matched`` grows by their keys), the time budget is spent or :data:`MAX_MODELS` were
    checked; the number checked."""
    checked = 0
    for candidate in candidates:
        remaining = [site for site in sites if site.key not in matched]
        if not remaining or checked >= MAX_MODELS:
            break
        if _spent(checks, began):
            checks.writer.note(f"time budget spent after {checked} model(s)")
            break
        hosts = {name for site in remaining for name in site.reached_from}
        module_name = checks.job.module_name
        wanted, why = worth_building(checks.sides.adapter, candidate, module_name, hosts)
        if wanted:
            _check_one(candidate, why, sites, matched, checks)
            checked += 1
    return checked


def _check_one(
    candidate: Any, why: str, sites: list[PatchedSite], matched: set[str], checks: _Checks
) -> None:
    """Compare one model through each entry point that may run a site still to reach, then,
    where its forward agreed, with the guards' attributes flipped and with the constructor
    keywords that build a guarded attribute as a site needs; ``matched`` grows by the sites
    that ran in a matching comparison."""
    remaining = [site for site in sites if site.key not in matched]
    runs: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("forward", {}, {}),
        *[(e, {}, {}) for e in checks.sides.entries_reaching(candidate.name, remaining)],
    ]
    for entry, flags, overrides in runs:
        if not remaining:
            break
        checks.sides.flags, checks.sides.overrides = flags, overrides
        verdict = _checked(candidate, entry, checks)
        verdict.reason = f"{verdict.reason}; {'; '.join(x for x in (candidate.reason, why) if x)}"
        checks.writer.add(verdict.to_json())
        for mode, counts in verdict.runs.items():
            if verdict.matched_in(mode):
                matched.update(counts)
        remaining = [site for site in sites if site.key not in matched]
        agreed = bool(verdict.runs) or verdict.status == VERIFIED
        if remaining and agreed and (entry, flags, overrides) == ("forward", {}, {}):
            runs += _guard_runs(remaining, checks)


def _check_parts(
    candidates: list[Any], remaining: list[PatchedSite], checks: _Checks, began: float
) -> int:
    """While ``remaining`` sites have not run in a matching comparison (their model does not
    run whole on any inputs tried, or no input takes their path): each module class that holds
    or reaches one, nearest first, checked on its own as a part of a candidate model built
    small (:func:`~adopter.models.parts.parts_to_check`); the number of part checks made."""
    module = checks.job.module_name
    hosts = {site.key: site.hosts or [] for site in remaining}
    wanted = part_classes(remaining, hosts, [])
    unmatched = {site.key for site in remaining}
    reaching = set(wanted)
    # no model builds a class that reaches them (a processor class no model sets): any model
    # of the module lends its parts, to build a module class from its configuration or to
    # hold an object of the class in place of the one it calls
    worth = [c for c in candidates if worth_building(checks.sides.adapter, c, module, reaching)[0]]
    worth = worth or [
        c for c in candidates if worth_building(checks.sides.adapter, c, module, set())[0]
    ]
    builds = [(c.name, functools.partial(checks.sides.unrun_subject, c.name)) for c in worth]
    modules = (checks.sides.original or import_module(module), checks.sides.patched)
    settings = checks.sides.settings

    def still_wanted(cls: str) -> bool:  # some of its sites have not run yet
        return bool(wanted[cls] & unmatched)

    made = 0
    adapter = checks.sides.adapter
    more = functools.partial(adapter.part_inputs, seed=settings.seed)
    for cls, found in parts_to_check(builds, list(wanted), still_wanted, modules, settings, more):
        if _spent(checks, began):
            checks.writer.note(f"time budget spent after {made} part check(s)")
            break
        label = found.name if isinstance(found, Subject) else cls + PART_SUFFIX
        checks.writer.plan([*checks.writer.data["planned"], label])
        checks.writer.start(label)
        verdict = verdict_of(found, label, checks.recorder, checks.job.options)
        checks.writer.add(verdict.to_json())
        for mode, counts in verdict.runs.items():
            if verdict.matched_in(mode):
                unmatched.difference_update(counts)
        made += 1
    return made


def _guard_runs(
    remaining: list[PatchedSite], checks: _Checks
) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """After a forward that agreed, though guards kept ``remaining`` from running
    (``fused_attn`` on by default, ``self.qkv`` built only with ``qkv_fused``): the runs that
    follow where they lead, with the attributes set after the build, or built so."""
    flips, built = attribute_flips(remaining), checks.sides.construction_flips(remaining)
    both = [(flips, built)] if flips and built else []  # SimPool: gamma set, fused_attn off
    return [("forward", f, o) for f, o in [(flips, {}), ({}, built), *both] if f or o]


def _label(name: str, entry: str, flags: dict[str, Any]) -> str:
    label = name if entry == "forward" else f"{name}.{entry}"
    if flags:
        label += " [" + ", ".join(f"{key}={value}" for key, value in flags.items()) + "]"
    return label


def _checked(candidate: Any, entry: str, checks: _Checks) -> ClassVerification:
    """One model of the library, original against patched, in the job's modes; ``entry`` the
    method the comparison calls (its label then names it)."""
    label = _label(candidate.name, entry, {**checks.sides.flags, **checks.sides.overrides})
    checks.writer.plan([*checks.writer.data["planned"], label])
    checks.writer.start(label)
    found = checks.sides.subject(candidate.name, label, entry)
    return verdict_of(found, label, checks.recorder, checks.job.options)
