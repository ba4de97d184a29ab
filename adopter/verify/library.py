"""Worker side of verifying a patched file of a model library with a model adapter:
the models that use the file, each built twice through the adapter, compared.

The adapter (:mod:`adopter.models`) says which of the library's models may run the file's code
and builds a small one with inputs; the proof is this module's: the second build gets the
classes of the patched text (:func:`~adopter.models.base.adopt_patched_classes`), the
original's ``state_dict`` is loaded strictly into it, and both run in eval and train mode
(dropout off) under the same seed. Models are tried until every patched site has run in a
comparison, the time budget is spent or ``max_models`` were checked; a model whose cheap survey
shows it builds none of the classes that host a site still to reach is passed over unbuilt.
"""

from __future__ import annotations

import re
import time
from types import ModuleType
from typing import Any

from ..models.base import MAX_SMALL_PARAMETERS, NotSmallError, adopt_patched_classes
from ..models.common import cast_inputs, error_line, torch_dtype
from ..models.loading import import_original, import_patched
from ..models.registry import adapter_for
from ..models.sites import PatchedSite
from .compare import tolerance_for
from .differential import conclude, zero_dropout_modules
from .job import WorkerJob
from .prove import ModeRun, sides_from, with_backends
from .results import NOT_CHECKABLE, REFUTED, VERIFIED, ClassVerification

__all__ = ["run_library_job"]

MAX_MODELS = 6
"""Models compared per file at most (each costs seconds to a minute on a CPU)."""


def _hosts(site: PatchedSite) -> set[str]:
    """The file's classes whose code reaches ``site`` (its own class, and the static hosts)."""
    return {*(site.hosts or []), *([site.cls] if site.cls else [])}


def _names_of(sites: list[PatchedSite]) -> set[str]:
    """The classes and functions of the file whose code holds a site or reaches one."""
    names = {name for site in sites for name in _hosts(site)}
    names |= {site.function.split(".")[0] for site in sites if site.cls is None}
    return names


_ATTRIBUTE_GUARD = re.compile(r"^(not \()?self\.(\w+)\)?$")


def attribute_flips(sites: list[PatchedSite]) -> dict[str, bool]:
    """``self.<flag>`` guards of ``sites`` and the value that reaches each (``not
    (self.fused_attn)``: ``fused_attn=False``): a module attribute set at construction from a
    global option (an environment switch of the library) that a comparison can set on both sides."""
    flips: dict[str, bool] = {}
    for site in sites:
        for guard in site.guards:
            match = _ATTRIBUTE_GUARD.match(guard.strip())
            if match:
                flips[match.group(2)] = match.group(1) is None
    return flips


def _set_flags(model: Any, flags: dict[str, bool]) -> None:
    for module in model.modules():
        for name, value in flags.items():
            if isinstance(getattr(module, name, None), bool):
                setattr(module, name, value)


class _Sides:
    """How to build each side of one model: the library's build, then the patched text's
    classes (and the given original's, where that text is not the installed one)."""

    def __init__(
        self,
        adapter: Any,
        job: WorkerJob,
        original: ModuleType | None,
        patched: ModuleType,
    ) -> None:
        self.adapter, self.job = adapter, job
        self.module_name = job.module_name
        self.original, self.patched = original, patched
        self.settings: dict[str, Any] = {}
        self.flags: dict[str, bool] = {}

    def build(self, name: str, patched: bool, entry: str = "forward") -> tuple[Any, Any]:
        built = self.adapter.build(name, seed=self.job.options.seed, entry=entry)
        self.settings = built.settings
        replacement = self.patched if patched else self.original
        if replacement is not None:
            adopt_patched_classes(built.model, self.module_name, replacement)
        _set_flags(built.model, self.flags)
        dtype = torch_dtype(self.job.options.dtype)
        return built.model.to(dtype), cast_inputs(built.inputs, dtype)


def _compare(
    name: str, sides: _Sides, recorder: Any, job: WorkerJob, entry: str = "forward"
) -> ClassVerification:
    """One model of the library, original against patched, in the job's modes; ``entry``
    the method the comparison calls (its label then names it)."""
    label = _label(name, entry, sides.flags)
    try:
        original, inputs = sides.build(name, False, entry)
    except NotSmallError as exc:
        return ClassVerification(label, NOT_CHECKABLE, f"skipped: {exc}")
    except Exception as exc:
        return ClassVerification(label, NOT_CHECKABLE, f"could not build it: {error_line(exc)}")
    try:
        patched, _ = sides.build(name, True, entry)
    except Exception as exc:
        reason = f"the patched build raised {error_line(exc)}"
        return ClassVerification(label, REFUTED, reason, where="construction")
    both, problem = sides_from(
        original,
        patched,
        lambda: sides.build(name, False, entry)[0],
        lambda: sides.build(name, True, entry)[0],
    )
    if problem is not None:
        return ClassVerification(label, REFUTED, problem, where="state_dict")
    options = job.options
    tol = tolerance_for(torch_dtype(options.dtype))
    run = ModeRun(list(options.modes), inputs, tol, options.seed, recorder)
    outcomes: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    for mode in run.modes:
        training = mode == "train"
        prepare = zero_dropout_modules if training else None
        outcomes[mode] = run.measured(
            runs, mode, lambda t=training, p=prepare: run.compare(both, t, prepare=p)
        )
    verdict = with_backends(conclude(label, outcomes), runs)
    built = ", ".join(f"{key}={value}" for key, value in sides.settings.items())
    verdict.reason = f"{verdict.reason} (built with {built or 'the defaults'})"
    return verdict


def _load_sides(job: WorkerJob, writer: Any, adapter: Any, recorder: Any) -> _Sides:
    with adapter.keeping_registries():
        original = import_original(job.module_name, job.original_path, job.tag, writer.note)
        with recorder.intercepting():
            patched = import_patched(job.module_name, job.patched_path, job.tag)
    recorder.install(patched)
    given = original if original.__name__ != job.module_name else None
    return _Sides(adapter, job, given, patched)


def _wanted(
    candidate: Any, adapter: Any, module_name: str, remaining: list[PatchedSite]
) -> tuple[bool, str]:
    """Whether to build ``candidate``: its survey shows a class hosting a site still to reach,
    or it cannot be surveyed (then only building it tells)."""
    survey = adapter.survey(candidate.name, module_name)
    if survey is None:
        return True, "could not be surveyed"
    if survey.parameters > MAX_SMALL_PARAMETERS:
        return False, ""
    hosts = {name for site in remaining for name in _hosts(site)}
    if hosts and not survey.classes & hosts:
        return False, ""
    return True, f"builds {', '.join(sorted(survey.classes & hosts)) or 'the module'}"


def run_library_job(job: WorkerJob, writer: Any) -> None:
    """Verify one patched library file (``job.library`` names the adapter)."""
    from .coverage import SiteRecorder

    began = time.monotonic()  # the candidate search spends from the same budget as checks
    adapter = adapter_for(job.library)
    sites = [PatchedSite.from_json(site) for site in job.sites]
    writer.data["sites"] = [site.to_json() for site in sites]
    recorder = SiteRecorder(sites, files=[job.patched_path])
    try:
        sides = _load_sides(job, writer, adapter, recorder)
    except BaseException as exc:
        writer.error(f"importing {job.module_name} or its patch failed: {error_line(exc)}")
        return
    candidates = adapter.candidates(job.module_name, _names_of(sites))
    if not candidates:
        writer.error(f"no {job.library} model is known to use {job.module_name}")
        return
    checked = _check_candidates(candidates, sites, sides, recorder, job, writer, began)
    if checked == 0:
        writer.error(
            f"none of the {len(candidates)} {job.library} model(s) that may use the file "
            "builds a class holding a patched site at a small size (tried: "
            + ", ".join(c.name for c in candidates[:8])
            + ")"
        )


def _check_candidates(
    candidates: list[Any],
    sites: list[PatchedSite],
    sides: _Sides,
    recorder: Any,
    job: WorkerJob,
    writer: Any,
    began: float,
) -> int:
    """Compare the candidate models in turn until every site ran in a matching comparison, the
    time budget (counted from ``began``, when the worker started on the file) is spent or
    :data:`MAX_MODELS` were checked; the number checked."""
    budget = float(job.options.timeout) * 0.8
    matched: set[str] = set()
    checked = 0
    for candidate in candidates:
        remaining = [site for site in sites if site.key not in matched]
        if not remaining or checked >= MAX_MODELS:
            break
        if time.monotonic() - began > budget:
            writer.note(f"time budget spent after {checked} model(s)")
            break
        wanted, why = _wanted(candidate, sides.adapter, job.module_name, remaining)
        if wanted:
            _check_one(candidate, why, sites, matched, sides, recorder, job, writer)
            checked += 1
    return checked


def _check_one(
    candidate: Any,
    why: str,
    sites: list[PatchedSite],
    matched: set[str],
    sides: _Sides,
    recorder: Any,
    job: WorkerJob,
    writer: Any,
) -> None:
    """Compare one model through each entry point that may run a site still to reach, then
    with the guards' attributes flipped where its forward ran the file; ``matched`` grows by
    the sites that ran in a matching comparison."""
    remaining = [site for site in sites if site.key not in matched]
    runs = [
        ("forward", {}),
        *[(e, {}) for e in _entries_to_try(sides.adapter, candidate.name, remaining)],
    ]
    for entry, flags in runs:
        if not remaining:
            break
        sides.flags = flags
        verdict = _checked(candidate, entry, sides, recorder, job, writer)
        flips = attribute_flips(remaining)
        agreed = bool(verdict.runs) or verdict.status == VERIFIED
        if flips and not flags and agreed and entry == "forward":
            # The model builds the file's classes and agreed, though its guards may have kept
            # every site from running (``fused_attn`` on by default): now where they lead.
            runs.append((entry, flips))
        verdict.reason = f"{verdict.reason}; {'; '.join(x for x in (candidate.reason, why) if x)}"
        writer.add(verdict.to_json())
        for mode, counts in verdict.runs.items():
            if verdict.matched_in(mode):
                matched.update(counts)
        remaining = [site for site in sites if site.key not in matched]


def _label(name: str, entry: str, flags: dict[str, bool]) -> str:
    label = name if entry == "forward" else f"{name}.{entry}"
    if flags:
        label += " [" + ", ".join(f"{key}={value}" for key, value in flags.items()) + "]"
    return label


def _entries_to_try(adapter: Any, name: str, remaining: list[PatchedSite]) -> list[str]:
    """The model's other entry points that hold a site still to reach."""
    methods = {site.function.rpartition(".")[2] for site in remaining}
    return [entry for entry in adapter.entries(name) if entry in methods]


def _checked(
    candidate: Any, entry: str, sides: _Sides, recorder: Any, job: WorkerJob, writer: Any
) -> ClassVerification:
    label = _label(candidate.name, entry, sides.flags)
    writer.plan([*writer.data["planned"], label])
    writer.start(label)
    return _compare(candidate.name, sides, recorder, job, entry)
