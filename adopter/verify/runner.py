"""Parent side of ``adopter verify``: the jobs, run in a contained worker, and their verdicts.

The parent never imports the code under test (nor torch): model code can hang, crash the
interpreter or poison global state, and a verify run must survive all of that and report it as
"not checkable". Everything that touches models happens in ``python -m adopter.verify.worker``,
run by :func:`adopter.executor.contained.run_contained`: contained, so that whatever it started
dies with it, with a timeout per file and a memory limit. Several files go to one worker in a
batch (importing torch and a model library takes seconds, the check of a shrunk model a
fraction of that). What a job's result file says, and what a timeout or a crash makes of the
classes it did not finish, is decided here.

Where the batches run is an :class:`~adopter.executor.Executor`'s business: the default runs them
on this machine (one batch per worker), ``RayExecutor`` runs each file as a Ray task. Either way
the same work function, :func:`run_verify_jobs`, runs the contained worker: each
:class:`VerifyJob` carries everything a machine needs (the patched text, the original's text),
so the logic never depends on where it runs.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..executor import Executor, Task, TaskResult, run_in_order
from ..executor.contained import BatchJob, ContainedWorker, JobOutcome, run_contained
from ..models.interface import WORKER_ENVIRONMENT, adapter_for
from ..models.origin import module_of
from ..models.registry import library_of
from ..models.sites import PatchedSite, find_sites
from .job import FACTORY, FILE, LIBRARY, WorkerJob
from .options import VerifyOptions
from .results import (
    NOT_CHECKABLE,
    NOT_EXERCISED,
    VERIFIED,
    ClassVerification,
    FileVerification,
    site_coverage,
)

__all__ = [
    "PatchedFile",
    "VerifyOptions",
    "VerifyJob",
    "run_verify_jobs",
    "verify_factories",
    "verify_factory",
    "verify_patched_file",
    "verify_patched_files",
]

OnResult = Callable[[int, Any], None]


def _file_verification(
    path: Path, outcome: JobOutcome, requested: list[str] | None
) -> FileVerification:
    """Turn a job's (possibly partial) result into verdicts.

    Classes the worker planned (or the caller requested) but did not finish are "not checkable"
    with the reason the worker stopped, so a timeout or crash never silently drops a class.
    """
    result, trouble = outcome.result, outcome.failure
    seconds = round(outcome.seconds, 2)
    if result is not None and isinstance(result.get("seconds"), (int, float)):
        seconds = round(float(result["seconds"]), 2)  # the worker's own clock: no start-up
    if result is None:
        classes = [
            ClassVerification(name, NOT_CHECKABLE, trouble or "no result")
            for name in requested or []
        ]
        return FileVerification(path, classes, error=trouble or "no result", seconds=seconds)
    classes = [ClassVerification.from_json(c) for c in result.get("classes", [])]
    planned = result.get("planned") or requested or []
    classes += _unfinished(planned, {c.label for c in classes}, result.get("current"), trouble)
    error = result.get("error")
    if trouble is not None and not planned:
        error = f"{error}; {trouble}" if error else trouble
    notes = list(result.get("notes", []))
    sites = [PatchedSite.from_json(site) for site in result.get("sites") or []]
    return FileVerification(
        path,
        classes,
        error=error,
        notes=notes,
        seconds=seconds,
        sites=site_coverage(sites, classes),
    )


def _unfinished(
    planned: list[str], done: set[str], current: str | None, trouble: str | None
) -> list[ClassVerification]:
    """The planned classes without a verdict, not checkable with the reason the worker
    stopped."""
    missing = []
    for name in planned:
        if name in done:
            continue
        if trouble is None:
            reason = "the worker stopped before checking it"
        elif name == current:
            reason = f"{trouble} while checking it"
        else:
            reason = f"{trouble} before it was checked"
        missing.append(ClassVerification(name, NOT_CHECKABLE, reason))
    return missing


@dataclass
class PatchedFile:
    """One patched modeling file to verify: the original file and the patched text.

    ``module_name`` is only needed when it cannot be derived from the path; ``classes`` picks
    the model classes to check (default: the base model plus up to ``max_heads`` heads).
    ``original_text`` is the original where it is not the file's text (a file ``apply
    --write`` patched, compared with its pristine source); ``label`` names the file in the
    verdict where that is not ``original_path``.
    """

    original_path: Path | str
    patched_source: str
    module_name: str | None = None
    classes: list[str] | None = None
    original_text: str | None = None
    label: str | None = None


@dataclass(frozen=True)
class VerifyJob:
    """One file (or factory pair) to verify, with everything a machine needs to do it.

    ``worker_job`` is the worker's job less what only the running machine knows (its tag,
    result and patched paths). The patched text and the original's text travel here, so a
    machine without the caller's files (a Ray node) writes its own copies; a machine that has
    the original file with the same text uses it in place, exactly as without an executor.
    ``label`` is the path (or factory) as the caller named it: the verdict carries it.
    """

    label: str
    worker_job: WorkerJob
    requested: list[str] | None
    patched_source: str | None = None
    original_text: str | None = None

    @property
    def timeout(self) -> float:
        return self.worker_job.options.timeout

    @property
    def python(self) -> str | None:
        return self.worker_job.options.python

    @property
    def memory_limit(self) -> int | None:
        return self.worker_job.options.memory_limit


def _materialize(job: VerifyJob, scratch: Path, index: int) -> WorkerJob:
    """The worker's job for ``job`` on this machine, its files written under ``scratch``: the
    ``index``-th of its batch (its tag), its result file there too."""
    result_path = str(scratch / f"result-{index}.json")
    worker_job = replace(job.worker_job, tag=index, result_path=result_path)
    if job.patched_source is None:
        return worker_job
    folder = scratch / f"patched-{index}"
    folder.mkdir(parents=True)
    original = Path(worker_job.original_path)
    patched_path = folder / original.name
    patched_path.write_text(job.patched_source, encoding="utf-8")
    worker_job = replace(worker_job, patched_path=str(patched_path))
    if job.original_text is not None and _text_of(original) != job.original_text:
        copy = scratch / f"original-{index}" / original.name  # not here, or not the same text
        copy.parent.mkdir(parents=True)
        copy.write_text(job.original_text, encoding="utf-8")
        worker_job = replace(worker_job, original_path=str(copy))
    return worker_job


def _text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def run_verify_jobs(
    jobs: Sequence[VerifyJob], stop: threading.Event | None = None
) -> Iterator[FileVerification]:
    """Verify ``jobs`` in one contained worker (a fresh one after a crash or timeout) and yield
    each verdict, in order, as soon as it is known: the work function every executor runs.

    The jobs share the first job's interpreter, timeout and memory limit.
    """
    if not jobs:
        return
    first = jobs[0]
    with tempfile.TemporaryDirectory(prefix="adopter-verify-") as scratch:
        workdir = Path(scratch)
        worker_jobs = [_materialize(job, workdir, index) for index, job in enumerate(jobs)]
        batch = [BatchJob(job.to_json(), Path(job.result_path)) for job in worker_jobs]
        outcomes = run_contained(batch, _worker(first), workdir, stop)
        try:
            for job, outcome in zip(jobs, outcomes):
                verdict = _file_verification(Path(job.label), outcome, job.requested)
                verdict.kernel_calls_expected = job.worker_job.kernel_calls_expected
                yield verdict
        finally:
            outcomes.close()  # ends the worker now, before its folder goes


def _worker(job: VerifyJob) -> ContainedWorker:
    """Verify's worker under ``job``'s interpreter and limits. Its environment: what the
    adapters' libraries read (hubs offline) unless set here, a fixed hash seed unless set, and
    no stray threads."""
    defaults = {**WORKER_ENVIRONMENT, "PYTHONHASHSEED": "0"}
    environment = {name: os.environ.get(name, value) for name, value in defaults.items()}
    environment["OMP_NUM_THREADS"] = "1"  # see the worker: tiny models run fastest on one thread
    command = (job.python or sys.executable, "-m", "adopter.verify.worker")
    return ContainedWorker(command, job.timeout, job.memory_limit, environment)


def file_job(item: PatchedFile, options: VerifyOptions) -> VerifyJob:
    """The job that verifies ``item``: its module, the adapter of its library, its sites. A
    file of a library with a model adapter (:mod:`adopter.models.registry`) is checked
    through the library's models that use it (:mod:`adopter.verify.library`)."""
    path = Path(item.original_path)
    module_name, root = module_of(path, item.module_name)
    original = item.original_text if item.original_text is not None else _text_of(path)
    library = library_of(module_name)
    try:
        sites = find_sites(item.patched_source, original)
    except (SyntaxError, ValueError):  # the worker reports the import failure
        sites = []
    worker_job = WorkerJob(
        LIBRARY if library else FILE,
        options,
        original_path=str(path.resolve()),
        module_name=module_name,
        adapter=adapter_for(module_name),
        classes=tuple(item.classes) if item.classes else None,
        sites=tuple(site.to_json() for site in sites),
        # A changed text is a patch: it must call kernels that verify can see running.
        kernel_calls_expected=item.patched_source != original,
        # Appended, not prepended: an installed package of the same name wins.
        sys_path_append=(str(root),) if root is not None else (),
        library=library or "",
    )
    requested = list(item.classes) if item.classes else None
    label = item.label or str(item.original_path)
    return VerifyJob(label, worker_job, requested, item.patched_source, original)


def _run_jobs(
    jobs: Sequence[VerifyJob],
    executor: Executor | None,
    on_result: OnResult | None,
) -> list[FileVerification]:
    """Verdicts for ``jobs``, in their order, run by ``executor`` (default: one local worker);
    ``on_result(index, verdict)`` hears of each as it is known."""
    tasks = [Task(job, job.label, job.timeout, job.memory_limit) for job in jobs]
    return run_in_order(run_verify_jobs, tasks, _verdict_of, executor, on_result)


def _verdict_of(result: TaskResult, job: VerifyJob) -> FileVerification:
    """The task's verdict, or "not checkable" with the reason the executor gives for none."""
    if result.ok and isinstance(result.value, FileVerification):
        return result.value
    reason = result.failure or "no result"
    classes = [ClassVerification(name, NOT_CHECKABLE, reason) for name in job.requested or []]
    return FileVerification(Path(job.label), classes, error=reason, seconds=result.seconds)


def verify_patched_files(
    files: Sequence[PatchedFile],
    options: VerifyOptions | None = None,
    *,
    executor: Executor | None = None,
    on_result: OnResult | None = None,
) -> list[FileVerification]:
    """Verify several patched files; by default in one worker process (torch imported once).

    ``options.timeout`` applies to each file (the first file's includes the worker's start-up);
    a file that exceeds it, or crashes the worker, or whose worker holds more than
    ``options.memory_limit`` bytes resident, is reported as not checkable and the remaining
    files continue in a fresh worker. The files of one worker share an interpreter, so a patch
    with global side effects could influence the files after it; use
    :func:`verify_patched_file` per file where that matters. ``executor`` runs the work
    elsewhere or in parallel (see :mod:`adopter.executor`); ``on_result(index, verdict)`` hears
    of each file as it is done. Verdicts come back in ``files``' order.
    """
    options = options or VerifyOptions()
    verdicts: list[FileVerification | None] = [None] * len(files)
    jobs, positions = [], []
    for index, item in enumerate(files):
        path = Path(item.original_path)
        if not path.is_file():
            verdicts[index] = FileVerification(path, error=f"no such file: {path}")
            if on_result is not None:
                on_result(index, verdicts[index])
            continue
        jobs.append(file_job(item, options))
        positions.append(index)

    def heard(position: int, verdict: FileVerification) -> None:
        if on_result is not None:
            on_result(positions[position], verdict)

    for index, verdict in zip(positions, _run_jobs(jobs, executor, heard)):
        verdicts[index] = verdict
    return [v for v in verdicts if v is not None]


def verify_patched_file(
    original_path: Path | str,
    patched_source: str,
    options: VerifyOptions | None = None,
    *,
    module_name: str | None = None,
    classes: list[str] | None = None,
) -> FileVerification:
    """Differentially test a patched modeling file against the original.

    Args:
        original_path: the original file, inside an importable package: the installed model
            library or a copy of it (an unpacked wheel), mapped to the installed module of the
            same dotted name; its models are built by the adapter of that library.
        patched_source: the full text of the patched file.
        options: how to verify (:class:`VerifyOptions`: modes, dtype, seed, heads, timeout,
            interpreter, memory limit); default: its defaults.
        module_name: the dotted module name, when it cannot be derived from the path.
        classes: model classes to check; default: the base model plus ``max_heads`` heads.
    """
    item = PatchedFile(original_path, patched_source, module_name, classes)
    return verify_patched_files([item], options)[0]


def verify_factories(
    pairs: Sequence[tuple[str, str]],
    options: VerifyOptions | None = None,
    *,
    executor: Executor | None = None,
    on_result: OnResult | None = None,
) -> list[ClassVerification]:
    """:func:`verify_factory` for several ``(original, patched)`` pairs, by default in one
    worker; ``executor`` and ``on_result`` as for :func:`verify_patched_files` (``on_result``
    hears each pair's :class:`ClassVerification`). A factory file given by a relative path is
    found from the working directory of the machine that runs it."""
    options = options or VerifyOptions()
    search = tuple(str(Path(p).resolve()) for p in options.sys_path) + (os.getcwd(),)
    jobs = [
        VerifyJob(
            original,
            WorkerJob(
                FACTORY,
                options,
                original_factory=original,
                patched_factory=patched,
                sys_path_append=search,
            ),
            [original],
        )
        for original, patched in pairs
    ]

    def heard(index: int, verdict: FileVerification) -> None:
        if on_result is not None:
            on_result(index, _factory_verdict(pairs[index][0], verdict))

    file_verdicts = _run_jobs(jobs, executor, heard)
    return [
        _factory_verdict(original, verdict)
        for (original, _), verdict in zip(pairs, file_verdicts, strict=True)
    ]


def _factory_verdict(original: str, file_verdict: FileVerification) -> ClassVerification:
    """The one verdict of a factory pair: its check, with the file-level reasons folded in."""
    if not file_verdict.classes:
        return ClassVerification(original, NOT_CHECKABLE, file_verdict.error or "no result")
    chosen = file_verdict.classes[0]
    if file_verdict.error and chosen.status == NOT_CHECKABLE:
        chosen.reason = f"{chosen.reason} ({file_verdict.error})"
    if file_verdict.status == NOT_EXERCISED:
        chosen.reason = file_verdict.reason()
        chosen.status = NOT_EXERCISED
    elif chosen.status == VERIFIED and not file_verdict.sites:
        # The models agree, but no adopter.kernels call was seen in the patched model's code:
        # nothing patched is known to have run (a patched factory that builds the original
        # classes agrees with the original and proves nothing).
        chosen.status = NOT_EXERCISED
        chosen.reason = (
            f"{chosen.reason}; but the patched factory's code calls no adopter.kernels "
            "function, so no patched site was seen running"
        )
    return chosen


def verify_factory(
    original_factory: str, patched_factory: str, options: VerifyOptions | None = None
) -> ClassVerification:
    """Differentially test a plain ``nn.Module`` built by two factories.

    Each factory is ``"package.module:function"`` or ``"path/to/file.py:function"`` and returns
    ``(model, example_inputs)``, the inputs a tuple (positional) or a dict (keyword arguments).
    Both are called under the same seed; the original's inputs feed both models and its
    ``state_dict`` is loaded strictly into the patched model. ``options.sys_path`` entries are
    added to the worker's import path (the current directory already is). Modes as for
    :func:`verify_patched_file`; dropout modules are set to ``p = 0`` for the ``train`` mode.
    """
    return verify_factories([(original_factory, patched_factory)], options)[0]
