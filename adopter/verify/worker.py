"""The subprocess that imports the code under test and runs the differential checks.

Run as ``python -m adopter.verify.worker BATCH.json``. The parent (:mod:`adopter.verify.runner`)
never imports model code: a modeling file can hang, crash the interpreter or leave global state
behind, so all of that happens here, under the parent's timeout.

Original and patched models live in this one process so their tensors can be compared directly.
The original module is imported under its real name (``transformers.models.bert.modeling_bert``);
the patched text is loaded from a scratch file as a *sibling* module of the same package
(``transformers.models.bert._adopter_patched_modeling_bert``), so its relative imports
(``from ...modeling_utils import PreTrainedModel``, ``from .configuration_bert import
BertConfig``) resolve to the very same objects the original uses, and only the classes defined
in the file differ.

The result file is rewritten after every class, so a timeout or a crash keeps the verdicts
already reached and the parent can name the class that was running.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

from .factory_spec import load_factory, parse_factory

__all__ = ["main"]

_PATCHED_PREFIX = "_adopter_patched_"
_ORIGINAL_PREFIX = "_adopter_original_"
# Beyond this size (reached by the unshrunk default configuration, the last resort, or by a
# configuration the name rules could not shrink) a CPU run of three modes - nine forward and
# backward passes per class - takes minutes, so give up instead.
_MAX_PARAMETERS = 30_000_000


class ResultWriter:
    """Keeps the result JSON on disk up to date (written atomically after every change)."""

    def __init__(self, path: Path, source_path: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "path": source_path,
            "error": None,
            "notes": [],
            "planned": [],
            "current": None,
            "classes": [],
            "done": False,
            "seconds": None,
        }
        self.started = time.perf_counter()
        self.flush()

    def flush(self) -> None:
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps(self.data, indent=1))
        os.replace(scratch, self.path)

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.flush()

    def error(self, text: str) -> None:
        self.data["error"] = text
        self.flush()

    def plan(self, names: list[str]) -> None:
        self.data["planned"] = names
        self.flush()

    def start(self, name: str) -> None:
        self.data["current"] = name
        self.flush()

    def add(self, verdict: dict[str, Any]) -> None:
        self.data["classes"].append(verdict)
        self.data["current"] = None
        self.flush()

    def finish(self) -> None:
        """Mark the job complete: the parent starts the next job's clock from here."""
        self.data["done"] = True
        self.data["seconds"] = round(time.perf_counter() - self.started, 3)
        self.flush()


def _short_traceback(exc: BaseException, limit: int = 1500) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) <= limit else "..." + text[-limit:]


def load_sibling(module_name: str, prefix: str, file_path: Path) -> ModuleType:
    """Execute ``file_path`` as module ``<package>.<prefix><name>`` next to ``module_name``.

    Registered in ``sys.modules`` before execution (``@dataclass`` and pickling look the module
    up there) and removed again if execution fails.
    """
    package, _, base = module_name.rpartition(".")
    name = f"{package}.{prefix}{base}" if package else f"{prefix}{base}"
    if package:
        importlib.import_module(package)
    spec = importlib.util.spec_from_file_location(name, file_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file_path} as {name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def import_original(job: dict[str, Any], writer: ResultWriter) -> ModuleType:
    """The original module: the installed one, or ``original_path``'s text where they differ.

    ``original_path`` may be a copy outside the import path (an unpacked wheel under
    ``.cache/corpus``); the installed module of the same name is used when its text is the
    same, and otherwise the given text is executed inside the installed package, so that the
    patch is always compared against the source it was made from.
    """
    module_name = job["module_name"]
    original_path = Path(job["original_path"])
    module = importlib.import_module(module_name)
    installed = Path(getattr(module, "__file__", "") or "")
    if installed.exists() and installed.resolve() == original_path.resolve():
        return module
    original_text = original_path.read_text(encoding="utf-8")
    if installed.exists() and installed.read_text(encoding="utf-8") == original_text:
        writer.note(
            f"original: the installed {module_name} ({installed}), same text as the given file"
        )
        return module
    writer.note(
        f"original: {original_path} differs from the installed {module_name}; its text runs "
        "inside the installed package"
    )
    return load_sibling(module_name, f"{_ORIGINAL_PREFIX}{job['tag']}_", original_path)


def _torch_dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"not a floating-point torch dtype: {name!r}")
    return dtype


def _cast_inputs(inputs: Any, dtype: Any) -> Any:
    import torch

    if isinstance(inputs, torch.Tensor):
        return inputs.to(dtype) if inputs.is_floating_point() else inputs
    if isinstance(inputs, dict):
        return {k: _cast_inputs(v, dtype) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(_cast_inputs(v, dtype) for v in inputs)
    return inputs


def _has_dropout(model: Any) -> bool:
    """Whether training draws dropout masks: a dropout module with ``p > 0``, or a non-zero
    dropout-like configuration value (many models call ``F.dropout(x, p=self.dropout)``)."""
    from torch import nn

    from .shrink import zero_dropout_dict

    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    return bool(callable(to_dict) and zero_dropout_dict(to_dict()))


def _module_sources(model: Any, extra: list[str]) -> list[str]:
    """Texts of the modules defining ``model``'s submodule classes (outside torch), plus extra."""
    texts = list(extra)
    seen: set[str] = set()
    for module in model.modules():
        name = type(module).__module__
        if name in seen or name.split(".")[0] == "torch":
            continue
        seen.add(name)
        file = getattr(sys.modules.get(name), "__file__", None)
        if file and file.endswith(".py") and Path(file).exists():
            texts.append(Path(file).read_text(encoding="utf-8", errors="replace"))
    return texts


def _train_dropout_outcome(
    original: Any, patched: Any, state: Any, inputs: Any, sources: list[str], job: dict[str, Any]
) -> Any:
    """Train mode with the configured dropout, or a skip saying why it cannot be compared.

    ``original`` and ``patched`` are model sources (see ``differential.pristine_copies``).
    """
    from .differential import SKIPPED, ModeOutcome, check_mode
    from .rng import rng_mismatch_reason

    if not _has_dropout(original()):
        return ModeOutcome(SKIPPED, "the model has no active dropout")
    reason = rng_mismatch_reason(sources, "cpu")
    if reason is not None:
        return ModeOutcome(SKIPPED, f"random numbers are drawn differently: {reason}")
    return check_mode(
        original, patched, state, inputs, training=True, seed=job["seed"], tol=_tol(job)
    )


def _tol(job: dict[str, Any]) -> Any:
    from .compare import tolerance_for

    return tolerance_for(_torch_dtype(job["dtype"]))


def _build(cls: type, config: Any, job: dict[str, Any]) -> Any:
    import torch

    torch.manual_seed(job["seed"])
    model = cls(config)
    return model.to(_torch_dtype(job["dtype"]))


def _refuse_if_too_large(cls: type, config: Any, *, must_size: bool) -> None:
    """Raise unless ``cls(config)`` is small enough to check.

    Sized on the meta device, so a 7-billion-parameter default configuration (or one the name
    rules failed to shrink) is never materialised. Some models cannot be built on the meta
    device; that is only fatal where ``must_size`` (the unshrunk default configuration).
    """
    import torch

    try:
        with torch.device("meta"):
            size = sum(p.numel() for p in cls(config).parameters())
    except Exception as exc:
        if must_size:
            raise ValueError(f"cannot size the model on the meta device ({exc})") from exc
        return
    if size > _MAX_PARAMETERS:
        raise ValueError(f"{size:,} parameters, too many to check within the timeout")


def _named_parameters(exc: BaseException, model: Any, inputs: dict[str, Any]) -> tuple[str, ...]:
    """Forward parameters the error message names that the inputs leave out."""
    import inspect
    import re

    params = inspect.signature(model.forward).parameters
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(exc))
    return tuple(dict.fromkeys(w for w in words if w in params and w not in inputs))


def _error_line(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"[:300]


def check_transformers_class(
    name: str, original_module: ModuleType, patched_module: ModuleType, job: dict[str, Any]
) -> dict[str, Any]:
    """The verdict (as JSON) for one transformers model class."""
    import torch

    from .differential import (
        ModelSource,
        ModeOutcome,
        check_mode,
        conclude,
        load_strictly,
        pristine_copies,
        snapshot_state,
        zero_dropout_modules,
    )
    from .hf import build_config, make_inputs, recipes, size_fixes
    from .results import NOT_CHECKABLE, REFUTED, ClassVerification

    original_cls = getattr(original_module, name, None)
    if not isinstance(original_cls, type):
        return ClassVerification(name, NOT_CHECKABLE, "no such class in the original").to_json()
    patched_cls = getattr(patched_module, name, None)
    if not isinstance(patched_cls, type):
        return ClassVerification(name, REFUTED, "the patched source does not define it").to_json()
    config_class = original_cls.config_class
    dtype = _torch_dtype(job["dtype"])

    failures: dict[str, list[str]] = {}  # error -> the recipes that hit it
    attempts = [(recipe, {}) for recipe in recipes()]
    fixes: dict[str, Any] = {}
    while attempts:
        recipe, fixes = attempts.pop(0)
        config = None
        try:
            config = build_config(config_class, recipe.setting, cls_name=name, fixes=fixes)
            _refuse_if_too_large(original_cls, config, must_size=recipe.setting is None)
            probe = _build(original_cls, config, job)  # only to try the recipe: then dropped
            probe.eval()
            require: tuple[str, ...] = ()
            while True:
                inputs = make_inputs(probe, config, job["seed"], recipe.every_modality, require)
                inputs = _cast_inputs(inputs, dtype)
                try:
                    with torch.no_grad():
                        probe(**inputs)
                except Exception as exc:
                    # "You have to specify bbox": generate the optional inputs it names, once.
                    named = _named_parameters(exc, probe, inputs)
                    if not named or len(require) > 8:
                        raise
                    require = (*require, *named)
                    continue
                break
        except Exception as exc:
            failures.setdefault(_error_line(exc), []).append(recipe.label)
            more = size_fixes(config, str(exc)) if config is not None else {}
            if more and len(fixes) < 4 and not set(more) <= set(fixes):
                attempts.insert(0, (recipe, {**fixes, **more}))  # same recipe, sizes agreed
            continue
        break
    else:
        tried = "; ".join(f"{' | '.join(labels)}: {error}" for error, labels in failures.items())
        reason = f"could not build and run the original model ({tried})"
        return ClassVerification(name, NOT_CHECKABLE, reason).to_json()
    prefix = f"{recipe.label}: "

    def sources(config: Any) -> tuple[ModelSource, ModelSource, dict[str, Any], str | None]:
        """Fresh-model sources of both sides, the original's weights, and why the patched
        model does not take them (``None`` when it does)."""
        original = _build(original_cls, config, job)
        patched = _build(patched_cls, config, job)
        state = snapshot_state(original)
        problem = load_strictly(patched, state)
        return (
            pristine_copies(original, lambda: _build(original_cls, config, job)),
            pristine_copies(patched, lambda: _build(patched_cls, config, job)),
            state,
            problem,
        )

    try:
        original, patched, state, problem = sources(config)
    except Exception as exc:
        reason = f"building the patched model raised {_error_line(exc)}"
        return ClassVerification(name, REFUTED, reason, where="construction").to_json()
    if problem is not None:
        return ClassVerification(name, REFUTED, problem, where="state_dict").to_json()

    tol = _tol(job)
    seed = job["seed"]
    outcomes: dict[str, ModeOutcome] = {}
    if "eval" in job["modes"]:
        outcomes["eval"] = check_mode(
            original, patched, state, inputs, training=False, seed=seed, tol=tol
        )
    if "train" in job["modes"]:
        try:
            quiet = build_config(
                config_class, recipe.setting, cls_name=name, zero_dropout=True, fixes=fixes
            )
            quiet_original, quiet_patched, quiet_state, problem = sources(quiet)
        except Exception as exc:
            outcomes["train"] = ModeOutcome(
                NOT_CHECKABLE, f"building the models without dropout raised {_error_line(exc)}"
            )
        else:
            if problem is not None:
                outcomes["train"] = ModeOutcome(REFUTED, problem)
            else:
                outcomes["train"] = check_mode(
                    quiet_original,
                    quiet_patched,
                    quiet_state,
                    inputs,
                    training=True,
                    seed=seed,
                    tol=tol,
                    prepare=zero_dropout_modules,
                )
        patched_text = [Path(job["patched_path"]).read_text(encoding="utf-8")]
        outcomes["train-dropout"] = _train_dropout_outcome(
            original, patched, state, inputs, patched_text, job
        )
    return conclude(name, outcomes, prefix).to_json()


def run_transformers_job(job: dict[str, Any], writer: ResultWriter) -> None:
    """Import both sides, choose the classes and check them one by one."""
    from .hf import find_model_classes, select_classes
    from .results import NOT_CHECKABLE, ClassVerification

    try:
        original_module = import_original(job, writer)
    except BaseException as exc:
        writer.error(
            f"importing the original {job['module_name']} failed:\n{_short_traceback(exc)}"
        )
        return
    available = find_model_classes(original_module)
    requested = job.get("classes")
    if requested:
        names = list(requested)
    else:
        names = [c.__name__ for c in select_classes(available, job.get("max_heads", 2))]
        if not names:
            writer.error(
                "no transformers model classes (PreTrainedModel subclasses with a config_class) "
                "in this file; check plain nn.Module code with verify_factory"
            )
            return
    writer.plan(names)
    try:
        patched_module = load_sibling(
            job["module_name"], f"{_PATCHED_PREFIX}{job['tag']}_", Path(job["patched_path"])
        )
    except BaseException as exc:
        reason = f"the patched source failed to import: {_error_line(exc)}"
        writer.note(_short_traceback(exc))
        for name in names:
            writer.add(ClassVerification(name, NOT_CHECKABLE, reason).to_json())
        return
    for name in names:
        writer.start(name)
        try:
            verdict = check_transformers_class(name, original_module, patched_module, job)
        except Exception as exc:
            verdict = ClassVerification(
                name, NOT_CHECKABLE, f"verify itself failed: {_short_traceback(exc)}"
            ).to_json()
        writer.add(verdict)


def _resolve_factory(spec: str, alias: str) -> tuple[Any, ModuleType]:
    """``module:function`` or ``path/to/file.py:function`` -> (function, module); the syntax is
    :func:`adopter.verify.factory_spec.parse_factory`'s, shared with ``adopter bench``."""
    return load_factory(parse_factory(spec), alias)


def run_factory_job(job: dict[str, Any], writer: ResultWriter) -> None:
    """Check one model built by a user factory against the patched factory's model."""
    from .differential import (
        ModeOutcome,
        check_mode,
        conclude,
        load_strictly,
        pristine_copies,
        seed_everything,
        snapshot_state,
        zero_dropout_modules,
    )
    from .results import NOT_CHECKABLE, REFUTED, ClassVerification

    label = job["original_factory"]
    writer.plan([label])
    try:
        tag = job["tag"]
        original_fn, _ = _resolve_factory(job["original_factory"], f"_adopter_original_{tag}")
        patched_fn, patched_mod = _resolve_factory(
            job["patched_factory"], f"_adopter_patched_{tag}"
        )
    except BaseException as exc:
        reason = f"importing a factory failed: {_error_line(exc)}"
        writer.note(_short_traceback(exc))
        writer.add(ClassVerification(label, NOT_CHECKABLE, reason).to_json())
        return
    writer.start(label)
    dtype = _torch_dtype(job["dtype"])
    try:
        seed_everything(job["seed"])
        original, inputs = original_fn()
        original = original.to(dtype)
        inputs = _cast_inputs(inputs, dtype)
    except Exception as exc:
        reason = f"the original factory raised {_error_line(exc)}"
        writer.add(ClassVerification(label, NOT_CHECKABLE, reason).to_json())
        return
    name = type(original).__name__
    writer.plan([name])
    writer.start(name)
    try:
        seed_everything(job["seed"])
        patched, _ = patched_fn()
        patched = patched.to(dtype)
    except Exception as exc:
        reason = f"the patched factory raised {_error_line(exc)}"
        writer.add(ClassVerification(name, REFUTED, reason, where="construction").to_json())
        return
    state = snapshot_state(original)
    problem = load_strictly(patched, state)
    if problem is not None:
        writer.add(ClassVerification(name, REFUTED, problem, where="state_dict").to_json())
        return

    def rebuild(factory: Any) -> Any:
        seed_everything(job["seed"])
        return factory()[0].to(dtype)

    original_source = pristine_copies(original, lambda: rebuild(original_fn))
    patched_source = pristine_copies(patched, lambda: rebuild(patched_fn))
    tol, seed = _tol(job), job["seed"]
    outcomes: dict[str, ModeOutcome] = {}
    if "eval" in job["modes"]:
        outcomes["eval"] = check_mode(
            original_source, patched_source, state, inputs, training=False, seed=seed, tol=tol
        )
    if "train" in job["modes"]:
        outcomes["train"] = check_mode(
            original_source,
            patched_source,
            state,
            inputs,
            training=True,
            seed=seed,
            tol=tol,
            prepare=zero_dropout_modules,
        )
        patched_file = getattr(patched_mod, "__file__", None)
        extra = [Path(patched_file).read_text(encoding="utf-8")] if patched_file else []
        outcomes["train-dropout"] = _train_dropout_outcome(
            original_source, patched_source, state, inputs, _module_sources(patched, extra), job
        )
    writer.add(conclude(name, outcomes).to_json())


def run_job(job: dict[str, Any]) -> None:
    """Run one job, recording any failure of verify itself in its result file."""
    writer = ResultWriter(
        Path(job["result_path"]), job.get("original_path") or job.get("original_factory", "")
    )
    for entry in job.get("sys_path_append", []):
        if entry not in sys.path:
            sys.path.append(entry)
    try:
        if job["kind"] == "transformers":
            run_transformers_job(job, writer)
        elif job["kind"] == "factory":
            run_factory_job(job, writer)
        else:
            writer.error(f"unknown job kind {job['kind']!r}")
    except BaseException as exc:  # SystemExit from code under test must not end the batch
        writer.error(f"verify worker failed:\n{_short_traceback(exc)}")
    finally:
        writer.finish()


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m adopter.verify.worker BATCH.json``.

    The batch file holds ``{"jobs": [...]}``; jobs run one after the other in this process, so
    torch and transformers are imported once for all of them. Each job's sibling modules carry
    the job's ``tag`` in their names, so several patches of one file never collide.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m adopter.verify.worker BATCH.json", file=sys.stderr)
        return 2
    batch = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    warnings.simplefilter("ignore")
    import torch

    # Shrunk models are far too small to gain from intra-op threads, and on a busy machine
    # OpenMP's spinning threads slow each tiny op down a hundredfold; one thread also keeps
    # reductions in a fixed order.
    torch.set_num_threads(1)
    for job in batch["jobs"]:
        run_job(job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
