"""Parent side of ``adopter verify``: write jobs, run the worker under timeouts, read verdicts.

The parent never imports the code under test (nor torch): model code can hang, crash the
interpreter or poison global state, and a verify run must survive all of that and report it as
"not checkable". Everything that touches models happens in ``python -m adopter.verify.worker``,
started in its own session and with a mark in its environment, so that when it ends - done,
crashed or timed out - everything it started is killed with it, including processes that left
its session (see :mod:`adopter.verify.contain`).
Several files go to one worker in a batch (importing torch and transformers takes seconds, the
check of a shrunk model a fraction of that); each file still has its own timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .contain import MARK_VARIABLE, end_worker, new_mark
from .results import (
    NOT_CHECKABLE,
    NOT_EXERCISED,
    ClassVerification,
    FileVerification,
    site_coverage,
)
from .sites import PatchedSite, find_sites

__all__ = [
    "PatchedFile",
    "module_name_for",
    "verify_factories",
    "verify_factory",
    "verify_patched_file",
    "verify_patched_files",
]

_MODES = ("eval", "train")
_DTYPES = ("float32", "float64", "float16", "bfloat16")
_OUTPUT_TAIL = 2000
_POLL_SECONDS = 0.05


def module_name_for(path: Path) -> tuple[str, Path]:
    """The dotted module name of ``path`` and the directory it is importable from.

    Walks up while the directory is a package (has ``__init__.py``): for
    ``.../site-packages/transformers/models/bert/modeling_bert.py`` and equally for the unpacked
    wheel ``.cache/corpus/4.34.0/transformers/models/bert/modeling_bert.py`` this gives
    ``transformers.models.bert.modeling_bert``; the worker then imports the installed package of
    that name (and only falls back to the given directory when nothing is installed).
    """
    path = path.resolve()
    parts = [path.stem]
    directory = path.parent
    while (directory / "__init__.py").exists():
        parts.append(directory.name)
        directory = directory.parent
    return ".".join(reversed(parts)), directory


def _root_for(path: Path, module_name: str) -> Path | None:
    """The import root that makes ``path`` the module ``module_name``, if the path fits."""
    parts = module_name.split(".")
    resolved = path.resolve()
    if resolved.stem != parts[-1]:
        return None
    root = resolved.parent
    for part in reversed(parts[:-1]):
        if root.name != part:
            return None
        root = root.parent
    return root


def _check_options(modes: Sequence[str], dtype: str, timeout: float) -> list[str]:
    chosen = list(dict.fromkeys(modes))
    unknown = [m for m in chosen if m not in _MODES]
    if unknown or not chosen:
        raise ValueError(f"modes must be a non-empty subset of {_MODES}, got {tuple(modes)}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    return chosen


def _worker_env(mark: str) -> dict[str, str]:
    """The worker's environment: this ``adopter`` importable, hubs offline, no stray threads,
    and the mark that finds every process the worker starts."""
    env = dict(os.environ)
    env[MARK_VARIABLE] = mark
    adopter_root = str(Path(__file__).resolve().parents[2])
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = adopter_root + (os.pathsep + existing if existing else "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONHASHSEED", "0")
    env["OMP_NUM_THREADS"] = "1"  # see the worker: tiny models run fastest on one thread
    return env


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _OUTPUT_TAIL else "..." + text[-_OUTPUT_TAIL:]


def _is_done(result_path: Path) -> bool:
    try:
        return bool(json.loads(result_path.read_text(encoding="utf-8")).get("done"))
    except (OSError, json.JSONDecodeError):  # not written yet, or being replaced right now
        return False


def _read_result(result_path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(result_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _end(process: subprocess.Popen[bytes], mark: str) -> None:
    """Kill the worker (when still running) and every process it started."""
    end_worker(process.pid, mark)
    process.wait()


@dataclass
class _JobOutcome:
    """What the parent learnt about one job: its result JSON, what went wrong, how long."""

    result: dict[str, Any] | None
    trouble: str | None
    seconds: float


def _run_batch(
    jobs: list[dict[str, Any]], workdir: Path, timeout: float, python: str | None
) -> list[_JobOutcome]:
    """Run ``jobs`` in as few worker processes as possible, each job under ``timeout``.

    One worker runs the jobs in order, so torch and the model library are imported once. The
    parent watches each job's result file: a job that is not done ``timeout`` seconds after the
    previous one finished (or the worker started) is timed out - the worker is killed and a new
    one takes the remaining jobs; a worker that dies takes only its current job with it.
    A job's seconds count from that same point, so the first job's include the worker start.
    """
    outcomes: list[_JobOutcome] = []
    for index, job in enumerate(jobs):
        job["tag"] = index
        job["result_path"] = str(workdir / f"result-{index}.json")
    launch = 0
    while len(outcomes) < len(jobs):
        first = len(outcomes)
        batch_path = workdir / f"batch-{launch}.json"
        log_path = workdir / f"worker-{launch}.log"
        batch_path.write_text(json.dumps({"jobs": jobs[first:]}, indent=1), encoding="utf-8")
        command = [python or sys.executable, "-m", "adopter.verify.worker", str(batch_path)]
        mark = new_mark()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=_worker_env(mark),
                start_new_session=True,
            )
        clock, timed_out = time.monotonic(), False
        while True:
            returncode = process.poll()
            while len(outcomes) < len(jobs):
                result_path = Path(jobs[len(outcomes)]["result_path"])
                if not _is_done(result_path):
                    break
                now = time.monotonic()
                outcomes.append(_JobOutcome(_read_result(result_path), None, now - clock))
                clock = now
            if returncode is not None or len(outcomes) == len(jobs):
                _end(process, mark)  # what the model code left running goes too
                break
            if time.monotonic() - clock > timeout:
                _end(process, mark)
                timed_out = True
                break
            time.sleep(_POLL_SECONDS)
        if len(outcomes) < len(jobs):
            if timed_out:
                trouble = f"timed out after {timeout:g} s"
            else:
                output = log_path.read_text(encoding="utf-8", errors="replace")
                trouble = f"the worker exited with code {process.returncode}: {_tail(output)}"
            result = _read_result(Path(jobs[len(outcomes)]["result_path"]))
            outcomes.append(_JobOutcome(result, trouble, time.monotonic() - clock))
        launch += 1
    return outcomes


def _file_verification(
    path: Path, outcome: _JobOutcome, requested: list[str] | None
) -> FileVerification:
    """Turn a job's (possibly partial) result into verdicts.

    Classes the worker planned (or the caller requested) but did not finish are "not checkable"
    with the reason the worker stopped, so a timeout or crash never silently drops a class.
    """
    result, trouble = outcome.result, outcome.trouble
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
    done = {c.label for c in classes}
    planned = result.get("planned") or requested or []
    current = result.get("current")
    for name in planned:
        if name in done:
            continue
        if trouble is None:
            reason = "the worker stopped before checking it"
        elif name == current:
            reason = f"{trouble} while checking it"
        else:
            reason = f"{trouble} before it was checked"
        classes.append(ClassVerification(name, NOT_CHECKABLE, reason))
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


@dataclass
class PatchedFile:
    """One patched modeling file to verify: the original file and the patched text.

    ``module_name`` is only needed when it cannot be derived from the path; ``classes`` picks
    the model classes to check (default: the base model plus up to ``max_heads`` heads).
    """

    original_path: Path | str
    patched_source: str
    module_name: str | None = None
    classes: list[str] | None = None


def _transformers_job(item: PatchedFile, patched_dir: Path, options: dict[str, Any]) -> dict:
    path = Path(item.original_path)
    if item.module_name is None:
        module_name, root = module_name_for(path)
    else:
        module_name, root = item.module_name, _root_for(path, item.module_name)
    patched_dir.mkdir(parents=True)
    patched_path = patched_dir / path.name
    patched_path.write_text(item.patched_source, encoding="utf-8")
    try:
        original = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        original = None
    try:
        sites = find_sites(item.patched_source, original)
    except (SyntaxError, ValueError):  # the worker reports the import failure
        sites = []
    return {
        "sites": [site.to_json() for site in sites],
        "kind": "transformers",
        "original_path": str(path.resolve()),
        "module_name": module_name,
        "patched_path": str(patched_path),
        "classes": list(item.classes) if item.classes else None,
        # Appended, not prepended: an installed package of the same name wins.
        "sys_path_append": [str(root)] if root is not None else [],
        **options,
    }


def verify_patched_files(
    files: Sequence[PatchedFile],
    *,
    timeout: float = 300,
    modes: Sequence[str] = ("eval", "train"),
    dtype: str = "float32",
    seed: int = 0,
    max_heads: int = 2,
    python: str | None = None,
) -> list[FileVerification]:
    """Verify several patched files in one worker process (torch is imported once).

    ``timeout`` applies to each file (the first file's includes the worker's start-up); a file
    that exceeds it, or crashes the worker, is reported as not checkable and the remaining files
    continue in a fresh worker. The files share one
    interpreter, so a patch with global side effects could influence the files after it; use
    :func:`verify_patched_file` per file where that matters. Other arguments as there.
    """
    chosen_modes = _check_options(modes, dtype, timeout)
    options = {"modes": chosen_modes, "dtype": dtype, "seed": seed, "max_heads": max_heads}
    verdicts: list[FileVerification | None] = [None] * len(files)
    with tempfile.TemporaryDirectory(prefix="adopter-verify-") as scratch:
        workdir = Path(scratch)
        jobs, positions = [], []
        for index, item in enumerate(files):
            path = Path(item.original_path)
            if not path.is_file():
                verdicts[index] = FileVerification(path, error=f"no such file: {path}")
                continue
            jobs.append(_transformers_job(item, workdir / f"patched-{index}", options))
            positions.append(index)
        for index, outcome in zip(positions, _run_batch(jobs, workdir, timeout, python)):
            item = files[index]
            requested = list(item.classes) if item.classes else None
            verdicts[index] = _file_verification(Path(item.original_path), outcome, requested)
    return [v for v in verdicts if v is not None]


def verify_patched_file(
    original_path: Path | str,
    patched_source: str,
    *,
    module_name: str | None = None,
    classes: list[str] | None = None,
    timeout: float = 300,
    modes: Sequence[str] = ("eval", "train"),
    dtype: str = "float32",
    seed: int = 0,
    max_heads: int = 2,
    python: str | None = None,
) -> FileVerification:
    """Differentially test a patched transformers modeling file against the original.

    Args:
        original_path: the original file, inside an importable package: the installed
            ``transformers`` or a copy of it (an unpacked wheel), mapped to the installed module
            of the same dotted name.
        patched_source: the full text of the patched file.
        module_name: the dotted module name, when it cannot be derived from the path.
        classes: model classes to check; default: the base model plus ``max_heads`` heads.
        timeout: seconds for the file, the worker's start-up (importing torch and the model
            library) included; classes not finished by then are reported as not checkable.
        modes: ``eval`` and/or ``train``. ``train`` compares with every dropout probability at
            0 and additionally (as mode ``train-dropout``) with the configured dropout where the
            kernels draw random numbers like the original code.
        dtype: the floating-point type the models run in (tolerances follow it).
        seed: seeds weights, inputs and dropout.
        python: the interpreter for the worker (default: this one).
    """
    item = PatchedFile(original_path, patched_source, module_name, classes)
    return verify_patched_files(
        [item],
        timeout=timeout,
        modes=modes,
        dtype=dtype,
        seed=seed,
        max_heads=max_heads,
        python=python,
    )[0]


def verify_factories(
    pairs: Sequence[tuple[str, str]],
    *,
    timeout: float = 300,
    modes: Sequence[str] = ("eval", "train"),
    dtype: str = "float32",
    seed: int = 0,
    sys_path: Sequence[str | Path] = (),
    python: str | None = None,
) -> list[ClassVerification]:
    """:func:`verify_factory` for several ``(original, patched)`` pairs in one worker."""
    chosen_modes = _check_options(modes, dtype, timeout)
    search = [str(Path(p).resolve()) for p in sys_path] + [os.getcwd()]
    jobs = [
        {
            "kind": "factory",
            "original_factory": original,
            "patched_factory": patched,
            "modes": chosen_modes,
            "dtype": dtype,
            "seed": seed,
            "sys_path_append": search,
        }
        for original, patched in pairs
    ]
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="adopter-verify-") as scratch:
        outcomes = _run_batch(jobs, Path(scratch), timeout, python)
    for (original, _), outcome in zip(pairs, outcomes):
        file_verdict = _file_verification(Path(original), outcome, [original])
        if file_verdict.classes:
            chosen = file_verdict.classes[0]
            if file_verdict.error and chosen.status == NOT_CHECKABLE:
                chosen.reason = f"{chosen.reason} ({file_verdict.error})"
            if file_verdict.status == NOT_EXERCISED:
                chosen.reason = file_verdict.reason()
                chosen.status = NOT_EXERCISED
        else:
            chosen = ClassVerification(original, NOT_CHECKABLE, file_verdict.error or "no result")
        verdicts.append(chosen)
    return verdicts


def verify_factory(
    original_factory: str,
    patched_factory: str,
    *,
    timeout: float = 300,
    modes: Sequence[str] = ("eval", "train"),
    dtype: str = "float32",
    seed: int = 0,
    sys_path: Sequence[str | Path] = (),
    python: str | None = None,
) -> ClassVerification:
    """Differentially test a plain ``nn.Module`` built by two factories.

    Each factory is ``"package.module:function"`` or ``"path/to/file.py:function"`` and returns
    ``(model, example_inputs)``, the inputs a tuple (positional) or a dict (keyword arguments).
    Both are called under the same seed; the original's inputs feed both models and its
    ``state_dict`` is loaded strictly into the patched model. ``sys_path`` entries are added to
    the worker's import path (the current directory already is). Modes as for
    :func:`verify_patched_file`; dropout modules are set to ``p = 0`` for the ``train`` mode.
    """
    return verify_factories(
        [(original_factory, patched_factory)],
        timeout=timeout,
        modes=modes,
        dtype=dtype,
        seed=seed,
        sys_path=sys_path,
        python=python,
    )[0]
