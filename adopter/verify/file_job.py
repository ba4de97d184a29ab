"""One patched modeling file in the worker: its model classes, each proven, then reach.

The adapter named in the job (:mod:`adopter.models.interface`) says which classes the file
defines, which to check first and how to build each small with inputs that run; this module
imports both sides, proves each class (:func:`adopter.verify.prove.verdict_of`) and, while a
patched site has not run, runs the further checks the adapter proposes (:mod:`.reach`).
"""

from __future__ import annotations

import importlib
import time
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

from ..models.common import error_line, short_traceback
from ..models.interface import BuildSettings, Subject, setting_label
from ..models.loading import import_original, import_patched
from ..models.parts import PART_SUFFIX, part_classes, parts_to_check
from ..models.sites import PatchedSite
from .coverage import SiteRecorder
from .job import ResultWriter, WorkerJob
from .optimizer import OPTIMIZER_KERNEL, optimizer_verdicts
from .prove import verdict_of
from .reach import Reach, may_go_on, reach, run_further, unreached
from .results import NOT_CHECKABLE, VERIFIED, ClassVerification, check_label

__all__ = ["check_class", "run_file_job"]


def check_class(
    adapter: ModuleType,
    name: str,
    modules: tuple[ModuleType, ModuleType],
    job: WorkerJob,
    recorder: Any = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The verdict (as JSON) for one model class of the original and patched ``modules``,
    built by ``adapter`` with ``overrides`` on its configuration; ``recorder`` (a
    :class:`SiteRecorder`) counts which patched sites run in each mode."""
    overrides = overrides or {}
    settings = BuildSettings(job.options.seed, job.options.dtype)
    found = adapter.subject(name, modules[0], modules[1], overrides, settings)
    verdict = verdict_of(found, name, recorder, job.options).to_json()
    verdict["setting"] = setting_label(overrides)
    return verdict


def _classes_to_check(
    adapter: ModuleType, module: ModuleType, job: WorkerJob, sites: list[PatchedSite]
) -> tuple[list[str], list[str]]:
    """Every model class of the file, and those to check first: the requested ones, else the
    adapter's plan plus every model class whose own code holds a patched site."""
    available = list(adapter.model_classes(module))
    if job.classes:
        return available, list(job.classes)
    names = list(adapter.planned(module, available, job.options.max_heads))
    names += [n for n in available if n not in names and any(s.cls == n for s in sites)]
    return available, names


def _patched_module(
    job: WorkerJob, recorder: SiteRecorder, names: list[str], writer: ResultWriter
) -> ModuleType | None:
    """The patched text imported beside the original (``None``, each class not checkable,
    where it fails to import)."""
    try:
        with recorder.intercepting():
            module = import_patched(job.module_name, job.patched_path, job.tag)
    except BaseException as exc:
        reason = f"the patched source failed to import: {error_line(exc)}"
        writer.note(short_traceback(exc))
        for name in names:
            writer.add(ClassVerification(name, NOT_CHECKABLE, reason).to_json())
        return None
    recorder.install(module)
    return module


def run_file_job(job: WorkerJob, writer: ResultWriter) -> None:
    """Import both sides, choose the classes and check them one by one; then, while a patched
    site has not run, try other classes and configurations that may reach it."""
    sites = [PatchedSite.from_json(site) for site in job.sites]
    for verdict in optimizer_verdicts(Path(job.patched_path).read_text("utf-8"), sites):
        writer.add(verdict.to_json())
    if sites and all(site.kernel == OPTIMIZER_KERNEL for site in sites):
        writer.data["sites"] = [site.to_json() for site in sites]
        return  # training code: its optimizers are proven, and importing it would train
    adapter = importlib.import_module(job.adapter)
    try:
        original = import_original(job.module_name, job.original_path, job.tag, writer.note)
    except BaseException as exc:
        writer.error(f"importing the original {job.module_name} failed:\n{short_traceback(exc)}")
        return
    available, names = _classes_to_check(adapter, original, job, sites)
    for site in sites:
        if site.hosts is not None:  # the classes a check can start from
            site.hosts = [name for name in site.hosts if name in available]
    writer.data["sites"] = [site.to_json() for site in sites]
    if not names:
        writer.error(adapter.NO_MODELS)
        return
    writer.plan(names)
    recorder = SiteRecorder(sites, files=[job.patched_path])
    patched = _patched_module(job, recorder, names, writer)
    if patched is None:
        return

    checked: list[tuple[str, dict[str, Any]]] = []  # the checks that verified, for parts

    def check(name: str, overrides: dict[str, Any]) -> dict[str, Any]:
        try:
            verdict = check_class(adapter, name, (original, patched), job, recorder, overrides)
            if verdict["status"] == VERIFIED:
                checked.append((name, overrides))
            return verdict
        except Exception as exc:
            reason = f"verify itself failed: {short_traceback(exc)}"
            verdict = ClassVerification(name, NOT_CHECKABLE, reason).to_json()
            verdict["setting"] = setting_label(overrides)
            return verdict

    verdicts: list[dict[str, Any]] = []
    slowest = 0.0
    for name in names:
        writer.start(name)
        began = time.perf_counter()
        verdicts.append(check(name, {}))
        slowest = max(slowest, time.perf_counter() - began)
        writer.add(verdicts[-1])
    if sites:
        context = adapter.reach_context(original, available)
        plan = Reach(
            names, available, bool(job.classes), context, adapter.reach_attempts,
            job.options.timeout, slowest,
        )  # fmt: skip
        reach(plan, verdicts, sites, check, writer)
        _check_parts(adapter, (original, patched), job, (recorder, plan), checked, verdicts, writer)


def _check_parts(
    adapter: ModuleType,
    modules: tuple[ModuleType, ModuleType],
    job: WorkerJob,
    tools: tuple[SiteRecorder, Reach],
    checked: list[tuple[str, dict[str, Any]]],
    verdicts: list[dict[str, Any]],
    writer: ResultWriter,
) -> None:
    """While sites in classes of the file have not run, check each such class on its own: its
    part of a model a check verified (``checked``: class and configuration overrides), or
    built from such a model's configuration (:mod:`adopter.models.parts`)."""
    recorder, plan = tools
    hosts = {s.key: s.hosts or [] for s in map(PatchedSite.from_json, job.sites)}
    wanted = part_classes(unreached(recorder.sites, verdicts), hosts, plan.available)
    settings = BuildSettings(job.options.seed, job.options.dtype)
    builds = [
        (check_label(name, setting_label(overrides)),
         partial(adapter.subject, name, modules[0], modules[1], overrides, settings))
        for name, overrides in checked
    ]  # fmt: skip
    builds += _unrun_builds(adapter, modules, settings, verdicts)

    def still_wanted(cls: str) -> bool:  # some of its sites have not run yet
        return bool(wanted[cls] & {site.key for site in unreached(recorder.sites, verdicts)})

    for cls, found in parts_to_check(builds, list(wanted), still_wanted, modules, settings):
        if not may_go_on(plan, verdicts, writer):
            return
        name, setting = (
            (found.name, found.label) if isinstance(found, Subject) else (cls + PART_SUFFIX, "")
        )
        run = partial(_part_check, found, name, setting, recorder, job)
        run_further(plan, verdicts, writer, check_label(name, setting), run)


def _unrun_builds(
    adapter: ModuleType,
    modules: tuple[ModuleType, ModuleType],
    settings: BuildSettings,
    verdicts: list[dict[str, Any]],
) -> list[tuple[str, Any]]:
    """Hosts of parts after the verified checks: each class whose check at its default
    configuration was not checkable (no recipe's model ran on the inputs made), built small
    without running it whole, where the adapter can (``unrun_subject``)."""
    unrun = getattr(adapter, "unrun_subject", None)
    if unrun is None:
        return []
    names = [v["cls"] for v in verdicts if v["status"] == NOT_CHECKABLE and not v.get("setting")]
    return [
        (name, partial(unrun, name, modules[0], modules[1], settings))
        for name in dict.fromkeys(names)
    ]


def _part_check(found: Any, name: str, setting: str, recorder: Any, job: WorkerJob) -> Any:
    """The verdict of a part check (``found``: its subject, or why there is none)."""
    return {**verdict_of(found, name, recorder, job.options).to_json(), "setting": setting}
