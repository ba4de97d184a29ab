"""One factory pair in the worker: plain ``nn.Module`` code built by the user's factories.

Each factory returns ``(model, inputs)`` (see :mod:`adopter.models.factories`). Both are called
under the same seed (:func:`adopter.models.factory_models.build_seeded`), the original's inputs
feed both models, and the proof is every proof's (:func:`adopter.verify.prove.prove`); the
sites are the kernel calls in the modules of the user's that the patched model uses.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..models.common import error_line, short_traceback
from ..models.factories import resolve_factory
from ..models.factory_models import (
    build_seeded,
    dropout_texts,
    sites_in,
    sites_used_by,
    user_modules,
)
from ..models.interface import Subject, prebuilt_first
from ..models.loading import ORIGINAL_PREFIX, PATCHED_PREFIX
from .coverage import SiteRecorder
from .job import ResultWriter, WorkerJob
from .prove import prove
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
    seed, dtype = job.options.seed, job.options.dtype
    try:
        original, inputs = build_seeded(original_fn, seed, dtype)
    except Exception as exc:
        reason = f"the original factory raised {error_line(exc)}"
        writer.add(ClassVerification(label, NOT_CHECKABLE, reason).to_json())
        return
    name = type(original).__name__
    writer.plan([name])
    writer.start(name)
    try:
        patched, _ = build_seeded(patched_fn, seed, dtype)
    except Exception as exc:
        reason = f"the patched factory raised {error_line(exc)}"
        writer.add(ClassVerification(name, REFUTED, reason, where="construction").to_json())
        return
    writer.data["sites"] = [site.to_json() for site in sites_used_by(patched, recorder.sites)]
    writer.flush()
    subject = Subject(
        name,
        "",
        prebuilt_first(original, lambda: build_seeded(original_fn, seed, dtype)[0]),
        prebuilt_first(patched, lambda: build_seeded(patched_fn, seed, dtype)[0]),
        inputs,
        dropout_texts=dropout_texts(patched, patched_mod) if "train" in job.options.modes else [],
    )
    writer.add(prove(subject, recorder, job.options).to_json())


def _factory_recorder(
    patched_module: ModuleType, original_fn: Any, writer: ResultWriter
) -> SiteRecorder:
    """A recorder installed in the patched factory's module and in every other loaded module of
    the user's (not the original factory's) that calls ``adopter.kernels``; its sites are the
    kernel calls in those modules' files."""
    chosen = user_modules(patched_module, original_fn)
    recorder = SiteRecorder(sites_in(chosen))
    for module in chosen:
        recorder.install(module)
    writer.data["sites"] = [site.to_json() for site in recorder.sites]
    writer.flush()
    return recorder
