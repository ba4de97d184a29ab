"""The subprocess that imports the code under test and runs the differential checks.

Run as ``python -m adopter.verify.worker BATCH.json``, a contained worker of
:mod:`adopter.executor.contained`. The parent (:mod:`adopter.verify.runner`) never imports model
code: a modeling file can hang, crash the interpreter or leave global state behind, so all of
that happens here, under the parent's timeout.

Original and patched models live in this one process so their tensors can be compared directly.
The original module is imported under its real name (``<library>.models.bert.modeling_bert``);
the patched text is loaded from a scratch file as a *sibling* module of the same package
(``<library>.models.bert._adopter_patched_modeling_bert``, see
:func:`adopter.models.loading.load_sibling`), so its relative imports resolve to the very same
objects the original uses, and only the classes defined in the file differ.

The result file is rewritten after every class (:class:`adopter.verify.job.ResultWriter`), so a
timeout or a crash keeps the verdicts already reached and the parent can name the class that
was running.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from ..executor.contain import die_with_parent
from ..executor.contained import read_batch
from ..models.common import short_traceback
from .job import FACTORY, FILE, LIBRARY, ResultWriter, WorkerJob

__all__ = ["main", "run_job"]


def run_job(job: WorkerJob) -> None:
    """Run one job, recording any failure of verify itself in its result file."""
    from .factory_job import run_factory_job
    from .file_job import run_file_job
    from .library import run_library_job

    writer = ResultWriter(Path(job.result_path), job.original_path or job.original_factory)
    for entry in job.sys_path_append:
        if entry not in sys.path:
            sys.path.append(entry)
    try:
        if job.kind == FILE:
            run_file_job(job, writer)
        elif job.kind == FACTORY:
            run_factory_job(job, writer)
        elif job.kind == LIBRARY:
            run_library_job(job, writer)
        else:
            writer.error(f"unknown job kind {job.kind!r}")
    except BaseException as exc:  # SystemExit from code under test must not end the batch
        writer.error(f"verify worker failed:\n{short_traceback(exc)}")
    finally:
        writer.finish()


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m adopter.verify.worker BATCH.json``.

    The batch file holds ``{"jobs": [...]}``; jobs run one after the other in this process, so
    torch and the model library are imported once for all of them. Each job's sibling modules
    carry the job's ``tag`` in their names, so several patches of one file never collide.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m adopter.verify.worker BATCH.json", file=sys.stderr)
        return 2
    jobs = read_batch(args[0])
    warnings.simplefilter("ignore")
    import torch

    # Shrunk models are far too small to gain from intra-op threads, and on a busy machine
    # OpenMP's spinning threads slow each tiny op down a hundredfold; one thread also keeps
    # reductions in a fixed order.
    torch.set_num_threads(1)
    for job in jobs:
        run_job(WorkerJob.from_json(job))
    return 0


if __name__ == "__main__":
    die_with_parent()
    sys.exit(main())
