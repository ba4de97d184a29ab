"""One factory pair in the worker: plain ``nn.Module`` code built by the user's factories.

Each factory returns ``(model, inputs)`` (see :mod:`adopter.models.factories`). Both are called
under the same seed, the original's inputs feed both models, and the modes are those of every
proof (:func:`adopter.verify.prove.run_modes`); the sites are the kernel calls in the modules of
the user's that the patched model uses.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ..models.common import cast_inputs, error_line, module_sources, short_traceback, torch_dtype
from ..models.factories import resolve_factory
from ..models.loading import ORIGINAL_PREFIX, PATCHED_PREFIX
from ..models.sites import KERNEL_PACKAGE, PatchedSite, find_sites
from .compare import tolerance_for
from .coverage import SiteRecorder
from .differential import conclude, seed_everything
from .job import ResultWriter, WorkerJob
from .prove import ModeRun, run_modes, sides_from, with_backends
from .results import NOT_CHECKABLE, REFUTED, ClassVerification

__all__ = ["run_factory_job"]


def _factories(job: WorkerJob, writer: ResultWriter) -> tuple[Any, Any, ModuleType] | None:
    """(original factory, patched factory, the patched factory's module), or ``None`` with
    the pair not checkable where one fails to import."""
    try:
        original_fn, _ = resolve_factory(job.original_factory, f"{ORIGINAL_PREFIX}{job.tag}")
        patched_fn, patched_mod = resolve_factory(job.patched_factory, f"{PATCHED_PREFIX}{job.tag}")
    except BaseException as exc:
        reason = f"importing a factory failed: {error_line(exc)}"
        writer.note(short_traceback(exc))
        writer.add(ClassVerification(job.original_factory, NOT_CHECKABLE, reason).to_json())
        return None
    return original_fn, patched_fn, patched_mod


def run_factory_job(job: WorkerJob, writer: ResultWriter) -> None:
    """Check one model built by a user factory against the patched factory's model."""
    label = job.original_factory
    writer.plan([label])
    found = _factories(job, writer)
    if found is None:
        return
    original_fn, patched_fn, patched_mod = found
    writer.start(label)
    recorder = _factory_recorder(patched_mod, original_fn, writer)
    seed, dtype = job.options.seed, torch_dtype(job.options.dtype)

    def build(factory: Any) -> Any:
        seed_everything(seed)
        return factory()[0].to(dtype)

    try:
        seed_everything(seed)
        original, inputs = original_fn()
        original = original.to(dtype)
        inputs = cast_inputs(inputs, dtype)
    except Exception as exc:
        reason = f"the original factory raised {error_line(exc)}"
        writer.add(ClassVerification(label, NOT_CHECKABLE, reason).to_json())
        return
    name = type(original).__name__
    writer.plan([name])
    writer.start(name)
    try:
        patched = build(patched_fn)
    except Exception as exc:
        reason = f"the patched factory raised {error_line(exc)}"
        writer.add(ClassVerification(name, REFUTED, reason, where="construction").to_json())
        return
    _keep_sites_of(patched, writer)
    sides, problem = sides_from(
        original, patched, lambda: build(original_fn), lambda: build(patched_fn)
    )
    if problem is not None:
        writer.add(ClassVerification(name, REFUTED, problem, where="state_dict").to_json())
        return
    options = job.options
    tol = tolerance_for(torch_dtype(options.dtype))
    run = ModeRun(list(options.modes), inputs, tol, seed, recorder)
    texts = _dropout_texts(patched, patched_mod) if "train" in options.modes else []
    outcomes, runs = run_modes(run, sides, None, texts)
    writer.add(with_backends(conclude(name, outcomes), runs).to_json())


def _dropout_texts(patched: Any, patched_module: ModuleType) -> list[str]:
    """The sources whose kernels decide whether dropout can be compared in train mode."""
    patched_file = getattr(patched_module, "__file__", None)
    extra = [Path(patched_file).read_text(encoding="utf-8")] if patched_file else []
    return module_sources(patched, extra)


def _keep_sites_of(model: Any, writer: ResultWriter) -> None:
    """Keep the sites that the patched model's code holds: those in its (sub)modules' classes
    and their bases, and module-level functions whose name that code mentions. A factory file
    may define other patched variants that this model never uses."""
    classes = {c for m in model.modules() for c in type(m).__mro__ if c.__module__ != "builtins"}
    names = {c.__name__ for c in classes}
    texts = []
    for cls in classes:
        try:
            texts.append(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
    mentioned = "\n".join(texts)
    writer.data["sites"] = [
        site
        for site in writer.data["sites"]
        if site["cls"] in names
        or (site["cls"] is None and site["function"].split(":")[-1].split(".")[0] in mentioned)
    ]
    writer.flush()


def _factory_modules(patched_module: ModuleType, original_fn: Any) -> list[ModuleType]:
    """The patched factory's module and every other loaded module of the user's (not the
    original factory's, not adopter's or torch's) that calls ``adopter.kernels``."""
    original_module = sys.modules.get(getattr(original_fn, "__module__", "") or "")
    chosen: list[ModuleType] = [patched_module]
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if module is original_module or module in chosen:
            continue
        if name.split(".")[0] in ("adopter", "torch") or not getattr(module, "__file__", None):
            continue
        if _calls_kernels(module):
            chosen.append(module)
    return chosen


def _calls_kernels(module: ModuleType) -> bool:
    return any(
        callable(v) and (getattr(v, "__module__", "") or "").startswith(KERNEL_PACKAGE)
        for v in list(vars(module).values())
    )


def _sites_in(modules: list[ModuleType]) -> list[PatchedSite]:
    """The kernel calls in the modules' files; functions named with their file where there
    is more than one file."""
    sites: list[PatchedSite] = []
    seen: set[str] = set()
    for module in modules:
        file = getattr(module, "__file__", None)
        if not file or file in seen or not file.endswith(".py"):
            continue
        seen.add(file)
        try:
            found = find_sites(Path(file).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for site in found:
            site.file = file
            if len(seen) > 1:
                site.function = f"{Path(file).name}:{site.function}"
        sites += found
    return sites


def _factory_recorder(
    patched_module: ModuleType, original_fn: Any, writer: ResultWriter
) -> SiteRecorder:
    """A recorder installed in the patched factory's module and in every other loaded module of
    the user's (not the original factory's) that calls ``adopter.kernels``; its sites are the
    kernel calls in those modules' files."""
    chosen = _factory_modules(patched_module, original_fn)
    sites = _sites_in(chosen)
    recorder = SiteRecorder(sites)
    for module in chosen:
        recorder.install(module)
    writer.data["sites"] = [site.to_json() for site in sites]
    writer.flush()
    return recorder
