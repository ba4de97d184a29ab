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
import re
import sys
import time
import traceback
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

from .contain import die_with_parent
from .factory_spec import load_factory, parse_factory
from .sites import PER_ELEMENT

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
            "sites": [],
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


def _with_labels(cls: type, inputs: Any) -> dict[str, Any] | None:
    """The inputs of a training step with labels (a language model's own token ids), for a
    model whose ``forward`` takes ``labels``: the loss a training loop reads is compared there,
    with every gradient (kernels that take over the loss run only when labels are given)."""
    import inspect

    if not isinstance(inputs, dict) or "labels" in inputs or "input_ids" not in inputs:
        return None
    try:
        parameters = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return None
    if "labels" not in parameters:
        return None
    return {**inputs, "labels": inputs["input_ids"].clone()}


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

    params = inspect.signature(model.forward).parameters
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", f"{exc} {_none_on_failing_line(exc)}")
    return tuple(dict.fromkeys(w for w in words if w in params and w not in inputs))


def _none_on_failing_line(exc: BaseException) -> str:
    """The names on the line that raised a ``'NoneType' object ...`` error whose local values
    are ``None`` there: an optional input the model used without checking (``bbox[:, :, 0]``
    in a helper that the caller handed ``bbox=None``)."""
    import linecache

    if not isinstance(exc, (TypeError, AttributeError)) or "NoneType" not in str(exc):
        return ""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    frame = tb.tb_frame
    line = linecache.getline(frame.f_code.co_filename, tb.tb_lineno)
    names = dict.fromkeys(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", line))
    return " ".join(n for n in names if n in frame.f_locals and frame.f_locals[n] is None)


def _module_text(module: ModuleType) -> str:
    """The source text of ``module`` ('' where it has none on disk)."""
    file = getattr(module, "__file__", None)
    try:
        return Path(file).read_text(encoding="utf-8") if file else ""
    except (OSError, UnicodeDecodeError):
        return ""


def _error_line(exc: BaseException) -> str:
    """The error's type and first line; where that line only introduces the complaint
    (``Class validation error for validator 'validate_architecture':``), the next one too."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    elif text.endswith(":") and exc.__cause__ is not None:
        text = f"{text} {type(exc.__cause__).__name__}: {str(exc.__cause__).strip()}"
    return f"{type(exc).__name__}: {text}"[:300]


def check_transformers_class(
    name: str,
    original_module: ModuleType,
    patched_module: ModuleType,
    job: dict[str, Any],
    recorder: Any = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The verdict (as JSON) for one transformers model class, built from the shrunk
    configuration with ``overrides`` on top; ``recorder`` (a :class:`SiteRecorder`) counts
    which patched sites run in each mode."""
    verdict = _check_transformers_class(
        name, original_module, patched_module, job, recorder, overrides or {}
    )
    verdict["setting"] = _setting_label(overrides or {})
    return verdict


def _setting_label(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in overrides.items())


def _measured(recorder: Any, runs: dict[str, dict[str, int]], mode: str, check: Any) -> Any:
    """Run one mode's check, noting which patched sites ran in it."""
    if recorder is None:
        return check()
    before = recorder.snapshot()
    backends_before = recorder.backends_snapshot()
    try:
        return check()
    finally:
        ran = recorder.since(before)
        if ran:
            runs[mode] = ran
            dispatched = recorder.backends_since(backends_before)
            if dispatched:  # read by _with_backends: which backend each site ran on
                runs.setdefault(_BACKENDS_KEY, {})[mode] = dispatched  # type: ignore[assignment]


# A key of ``runs`` that is no mode: the backends per mode and site (``_with_backends``).
_BACKENDS_KEY = "__backends__"


def _with_backends(verdict: Any, runs: dict[str, Any]) -> Any:
    """Set the verdict's ``runs`` and ``backends`` from the record ``_measured`` kept."""
    runs = dict(runs)
    verdict.backends = runs.pop(_BACKENDS_KEY, {})
    verdict.runs = runs
    return verdict


_BUILD_FAILED = "could not build and run the original model"


def _check_transformers_class(
    name: str,
    original_module: ModuleType,
    patched_module: ModuleType,
    job: dict[str, Any],
    recorder: Any,
    overrides: dict[str, Any],
) -> dict[str, Any]:
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
    from .hf import (
        build_config,
        layout_fix,
        make_inputs,
        recipes,
        size_fixes,
        split_fixes,
        token_id_fixes,
    )
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
    source = _module_text(original_module)
    token_keys: set[str] = set()  # placeholder-id fixes: they do not count as size retries
    attempts = [(recipe, dict(overrides)) for recipe in recipes()]
    fixes: dict[str, Any] = dict(overrides)
    while attempts:
        recipe, fixes = attempts.pop(0)
        config = probe = None
        try:
            fixes = _resolve_deferred(
                fixes,
                lambda plain, setting=recipe.setting: build_config(
                    config_class, setting, cls_name=name, fixes=plain
                ),
            )
            config = build_config(config_class, recipe.setting, cls_name=name, fixes=fixes)
            placeholders = token_id_fixes(config)
            if placeholders:  # image tokens inside the text vocabulary, kept for "train" too
                fixes = {**fixes, **placeholders}
                token_keys.update(placeholders)
                config = build_config(config_class, recipe.setting, cls_name=name, fixes=fixes)
            _refuse_if_too_large(original_cls, config, must_size=recipe.setting is None)
            probe = _build(original_cls, config, job)  # only to try the recipe: then dropped
            probe.eval()
            require: tuple[str, ...] = ()
            layouts: tuple[tuple[str, str], ...] = ()
            while True:
                inputs = make_inputs(
                    probe, config, job["seed"], recipe.every_modality, require, layouts
                )
                inputs = _cast_inputs(inputs, dtype)
                try:
                    with torch.no_grad():
                        probe(**inputs)
                except Exception as exc:
                    # "You have to specify bbox": generate the optional inputs it names, once.
                    named = _named_parameters(exc, probe, inputs)
                    if named and len(require) <= 8:
                        require = (*require, *named)
                        continue
                    # A shape error in the first layer: the input's other layout, once each.
                    layout = layout_fix(str(exc), inputs)
                    if layout is not None and layout not in layouts and len(layouts) < 4:
                        layouts = (*layouts, layout)
                        continue
                    raise
                break
        except Exception as exc:
            failures.setdefault(_error_line(exc), []).append(recipe.label)
            more = {}
            if config is not None:
                # The sections' default may sit in another family's file the model uses.
                texts = [source] if probe is None else _module_sources(probe, [source])
                more = size_fixes(config, str(exc)) or split_fixes(
                    config, str(exc), "\n".join(texts)
                )
            if more and len(set(fixes) - token_keys) < 4 and not set(more) <= set(fixes):
                attempts.insert(0, (recipe, {**fixes, **more}))  # same recipe, sizes agreed
            continue
        break
    else:
        tried = "; ".join(f"{' | '.join(labels)}: {error}" for error, labels in failures.items())
        reason = f"{_BUILD_FAILED} ({tried})"
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
    runs: dict[str, dict[str, int]] = {}
    if "eval" in job["modes"]:
        outcomes["eval"] = _measured(
            recorder,
            runs,
            "eval",
            lambda: check_mode(
                original, patched, state, inputs, training=False, seed=seed, tol=tol
            ),
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
                outcomes["train"] = _measured(
                    recorder,
                    runs,
                    "train",
                    lambda: check_mode(
                        quiet_original,
                        quiet_patched,
                        quiet_state,
                        inputs,
                        training=True,
                        seed=seed,
                        tol=tol,
                        prepare=zero_dropout_modules,
                    ),
                )
        patched_text = [Path(job["patched_path"]).read_text(encoding="utf-8")]
        outcomes["train-dropout"] = _measured(
            recorder,
            runs,
            "train-dropout",
            lambda: _train_dropout_outcome(original, patched, state, inputs, patched_text, job),
        )
        labelled = _with_labels(original_cls, inputs)
        if labelled is not None and "train" in outcomes and outcomes["train"].status != REFUTED:
            outcome = _measured(
                recorder,
                runs,
                "train-labels",
                lambda: check_mode(
                    quiet_original,
                    quiet_patched,
                    quiet_state,
                    labelled,
                    training=True,
                    seed=seed,
                    tol=tol,
                    prepare=zero_dropout_modules,
                    objective="loss",
                ),
            )
            if outcome.status != NOT_CHECKABLE:  # a model that takes no such labels: no check
                outcomes["train-labels"] = outcome
            else:
                runs.pop("train-labels", None)
    verdict = _with_backends(conclude(name, outcomes, prefix), runs)
    return verdict.to_json()


# Checks beyond the planned classes, tried only while a patched site has not run: other
# model classes, and configurations with the options that guard a site flipped. Bounded by
# count and by time (see _reach_time_left): a file has one timeout for all its checks.
_MAX_REACH_CHECKS = 12
# Start no further check unless the slowest check so far would still end within this share of
# the file's timeout (the first file of a worker also pays for importing torch).
_REACH_TIME_SHARE = 0.7


def _unreached(sites: list[Any], verdicts: list[dict[str, Any]]) -> list[Any]:
    """Sites that have not yet run in a mode whose comparison agreed."""
    from .results import ClassVerification, site_coverage

    classes = [ClassVerification.from_json(v) for v in verdicts]
    return [entry.site for entry in site_coverage(sites, classes) if not entry.exercised]


def _guard_fields(site: Any) -> dict[str, list[Any]]:
    """The configuration fields that may decide whether ``site`` runs, with the constants they
    are compared with: those its own conditions read first, then those around the code that
    builds or calls it (an attention class chosen by ``config.attention_type``)."""
    fields = {name: list(constants) for name, constants in site.config_fields.items()}
    for name, constants in getattr(site, "caller_fields", {}).items():
        known = fields.setdefault(name, [])
        known.extend(c for c in constants if c not in known)
    return fields


def _flips(site: Any, defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """Configuration overrides that may take the branch a site sits in: each boolean field
    the site's conditions (or its callers') read, negated; each field compared with constants,
    set to them; then all of those at once. A field the configuration does not have at the
    top but a sub-configuration has (``text_config``) is changed there."""
    singles: list[dict[str, Any]] = []
    for field, constants in _guard_fields(site).items():
        base = field.removesuffix(PER_ELEMENT)
        if base in defaults or base in (defaults.get("_aliases") or {}):
            singles += _field_flips(field, constants, defaults)
            continue
        for key, nested in defaults.items():
            if isinstance(nested, dict) and base in nested:
                singles += [
                    {key: SubConfig(flip)} for flip in _field_flips(field, constants, nested)
                ]
    if len(singles) > 1:
        combined: dict[str, Any] = {}
        for single in singles:
            for key, value in single.items():
                known = combined.get(key)
                if isinstance(known, SubConfig) and isinstance(value, SubConfig):
                    combined[key] = SubConfig({**value.fields, **known.fields})
                else:
                    combined.setdefault(key, value)
        singles.append(combined)
    return singles


def _field_flips(field: str, constants: list[Any], defaults: dict[str, Any]) -> list[dict]:
    """The overrides of one field of ``defaults``: a boolean negated, another value set to each
    constant of its type that it is compared with (see :func:`_element_flips` for lists)."""
    aliases = defaults.get("_aliases") or {}
    if field.endswith(PER_ELEMENT):
        base = field.removesuffix(PER_ELEMENT)
        return _element_flips(aliases.get(base, base), constants, defaults)
    field = field if field in defaults else aliases.get(field, field)
    if field not in defaults:
        return []
    default = defaults[field]
    if isinstance(default, bool):
        return [{field: not default}]
    return [
        {field: value}
        for value in constants
        if value != default and (default is None or type(value) is type(default))
    ]


class EveryLayer:
    """An override of a per-layer list (``mlp_layer_types``): this value at every layer, as
    many layers as the shrunk configuration has (known only once a recipe shrank it; see
    :func:`_resolve_deferred`)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"every layer {self.value!r}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EveryLayer) and other.value == self.value

    def __hash__(self) -> int:
        return hash(("EveryLayer", repr(self.value)))


class SubConfig:
    """Overrides of some fields of a sub-configuration (``text_config``), on top of what the
    recipe made of it (known only once it is built; see :func:`_resolve_deferred`)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = dict(fields)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self.fields.items()) + "}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubConfig) and other.fields == self.fields

    def __hash__(self) -> int:
        return hash(("SubConfig", repr(self)))


def _element_flips(field: str, constants: list[Any], defaults: dict[str, Any]) -> list[dict]:
    """A per-layer list whose elements a condition compares with constants (``config.
    mlp_layer_types[layer_idx] == "sparse"``): that constant at every layer, for each constant
    of the list's own element type (the shrunk list keeps only the first layers' kinds, which
    may all be the other kind). The site may sit in the other arm (``else: MLP(config)``), so
    the kinds the configuration's docstring names for the field count too; kinds the default
    list lacks go first."""
    default = defaults.get(field)
    if not isinstance(default, (list, tuple)) or not default:
        return []
    kinds = {type(element) for element in default}
    documented = (defaults.get("_documented") or {}).get(field, [])
    values = [
        value
        for value in dict.fromkeys([*constants, *documented])
        if type(value) in kinds and not isinstance(value, bool)
    ]
    values.sort(key=lambda value: value in default)  # stable: absent kinds first
    return [{field: EveryLayer(value)} for value in values]


def _every_layer(value: EveryLayer, current: Any) -> list[Any]:
    length = len(current) if isinstance(current, (list, tuple)) else 0
    return [value.value] * max(1, length)


def _resolve_deferred(fixes: dict[str, Any], build: Any) -> dict[str, Any]:
    """``fixes`` with each :class:`EveryLayer` made a list as long as the configuration that
    ``build(other_fixes)`` makes has for that field (its shrunk layer count), and each
    :class:`SubConfig` made that configuration's sub-configuration with those fields set."""
    deferred = (EveryLayer, SubConfig)
    plain = {key: value for key, value in fixes.items() if not isinstance(value, deferred)}
    if len(plain) == len(fixes):
        return fixes
    config = build(plain)
    resolved = dict(plain)
    for key, value in fixes.items():
        if isinstance(value, EveryLayer):
            resolved[key] = _every_layer(value, getattr(config, key, None))
        elif isinstance(value, SubConfig):
            sub = getattr(config, key, None)
            nested = sub.to_dict() if hasattr(sub, "to_dict") else dict(sub or {})
            for field, inner in value.fields.items():
                nested[field] = (
                    _every_layer(inner, nested.get(field))
                    if isinstance(inner, EveryLayer)
                    else inner
                )
            resolved[key] = nested
    return resolved


_EAGER = {"attn_implementation": "eager"}


def _reach_attempts(
    site: Any,
    checked: list[str],
    available: list[str],
    fixed: bool,
    defaults: dict[str, dict[str, Any]],
    broken: frozenset[str] = frozenset(),
) -> list[tuple[str, dict[str, Any]]]:
    """(class, overrides) pairs that may run ``site``, most promising first.

    The hosts are the model classes whose code reaches the site by name (``site.hosts``: its
    own class, the classes that build it, and so on up); where none of the checked classes is
    one, the unchecked hosts come first, as they are. Then the hosts under flipped options;
    where the configuration chooses the attention implementation (transformers >= 4.36 picks
    an SDPA class by default, so a patch of the eager class never runs), the eager one; then -
    unless the caller fixed the classes - the model classes not checked yet, hosts first.
    A site that no model class reaches by name gets no attempts; where that was not worked
    out (``site.hosts`` is None), the checked classes stand in as hosts. Options are flipped
    on one host only, never on a ``broken`` one (its model could not be built and run as it
    is: flipping a guard does not mend that, and each try costs every recipe).
    """
    if site.hosts is not None and not any(name in available for name in site.hosts):
        return []  # no model class of the file uses its code: no check can run it
    reaching = [name for name in site.hosts or [] if name in available]
    usable = [name for name in checked if name not in broken]
    checked_hosts = [name for name in usable if name in reaching] if reaching else usable
    fresh = [] if fixed else [name for name in reaching if name not in checked]
    hosts = [site.cls] if site.cls in available and site.cls not in broken and not fixed else []
    hosts += [name for name in checked_hosts + fresh if name not in hosts]
    attempts: list[tuple[str, dict[str, Any]]] = []
    if not checked_hosts:
        attempts += [(name, {}) for name in fresh[:2]]
    for host in hosts[:1]:  # ``defaults``: each class's configuration defaults
        attempts += [(host, flip) for flip in _flips(site, defaults.get(host, {}))]
        if defaults.get(host, {}).get("_chooses_attention"):
            attempts.append((host, dict(_EAGER)))
    if not fixed:
        rest = fresh + [name for name in available if name not in checked and name not in fresh]
        attempts += [(name, {}) for name in rest]
    return attempts


def _reach_time_left(
    started: float, slowest: float, budget: float | None, now: float | None = None
) -> bool:
    """Whether one more check, as slow as the slowest so far, ends within the time share."""
    if budget is None:
        return True
    now = time.perf_counter() if now is None else now
    return now - started + slowest <= _REACH_TIME_SHARE * budget


def _reach(
    names: list[str],
    verdicts: list[dict[str, Any]],
    sites: list[Any],
    check: Any,
    available: list[str],
    fixed: bool,
    defaults: dict[str, dict[str, Any]],
    writer: ResultWriter,
    budget_seconds: float | None = None,
    slowest: float = 0.0,
) -> None:
    """Further checks while some site has not run and matched: at most _MAX_REACH_CHECKS, and
    none that would likely run past _REACH_TIME_SHARE of ``budget_seconds`` (the file's
    timeout; ``slowest``: the slowest planned check's seconds)."""
    from .results import NOT_CHECKABLE

    done = {(name, "") for name in names}
    budget = _MAX_REACH_CHECKS
    while budget > 0:
        if any(verdict.get("status") == "refuted" for verdict in verdicts):
            return  # refuted already: reaching more sites cannot change the verdict
        if not _reach_time_left(writer.started, slowest, budget_seconds):
            writer.note("stopped trying to reach the remaining sites: the file's time is short")
            return
        unreached = _unreached(sites, verdicts)
        broken = frozenset(
            verdict["cls"]
            for verdict in verdicts
            if not verdict.get("setting")
            and verdict.get("status") == NOT_CHECKABLE
            and str(verdict.get("reason", "")).startswith(_BUILD_FAILED)
        )
        attempt = next(
            (
                (name, overrides)
                for site in unreached
                for name, overrides in _reach_attempts(
                    site, names, available, fixed, defaults, broken
                )
                if (name, _setting_label(overrides)) not in done
            ),
            None,
        )
        if attempt is None:
            return
        name, overrides = attempt
        done.add((name, _setting_label(overrides)))
        budget -= 1
        label = f"{name} [{_setting_label(overrides)}]" if overrides else name
        writer.plan([*writer.data["planned"], label])
        writer.start(label)
        began = time.perf_counter()
        verdict = check(name, overrides)
        slowest = max(slowest, time.perf_counter() - began)
        verdicts.append(verdict)
        if not overrides and name not in names:
            names.append(name)
        writer.add(verdict)


def _config_defaults(module: ModuleType, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each class's configuration defaults (``to_dict()``), plus whether that configuration
    picks the attention classes; a configuration that needs arguments gives no flips."""
    by_config: dict[Any, dict[str, Any]] = {}
    found: dict[str, dict[str, Any]] = {}
    for name in names:
        config_class = getattr(getattr(module, name, None), "config_class", None)
        if config_class is None:
            continue
        if config_class not in by_config:
            try:
                config = config_class()
                defaults = dict(config.to_dict())
                # not in to_dict(): whether the configuration picks the attention classes
                defaults["_chooses_attention"] = hasattr(type(config), "_attn_implementation")
                # and the names code may read a field by (``num_experts`` for
                # ``num_local_experts``): a guard on the alias flips the field itself
                aliases = getattr(type(config), "attribute_map", None) or {}
                defaults["_aliases"] = {
                    str(alias): str(real) for alias, real in aliases.items() if real in defaults
                }
                defaults["_documented"] = _documented_values(type(config).__doc__ or "")
            except Exception:
                defaults = {}
            by_config[config_class] = defaults
        found[name] = by_config[config_class]
    return found


# ``    name (`type`, *optional*):`` opens an argument's entry in a transformers docstring.
_DOC_ENTRY = re.compile(r"^\s*(\w+) \(`[^`]*`[^)]*\):", re.MULTILINE)
_DOC_STRING_VALUE = re.compile(r"`([\"'])(\w+)\1`")


def _documented_values(doc: str) -> dict[str, list[str]]:
    """Argument -> the string values its docstring entry names (```"dense"` or `"sparse"```):
    the kinds a per-layer list may hold, where the code compares only with one of them."""
    found: dict[str, list[str]] = {}
    entries = list(_DOC_ENTRY.finditer(doc))
    for entry, following in zip(entries, [*entries[1:], None]):
        text = doc[entry.end() : following.start() if following else len(doc)]
        values = [match.group(2) for match in _DOC_STRING_VALUE.finditer(text)]
        if values:
            found[entry.group(1)] = list(dict.fromkeys(values))
    return found


def run_transformers_job(job: dict[str, Any], writer: ResultWriter) -> None:
    """Import both sides, choose the classes and check them one by one; then, while a patched
    site has not run, try other classes and configurations that may reach it."""
    from .coverage import SiteRecorder
    from .hf import find_model_classes, select_classes
    from .results import NOT_CHECKABLE, ClassVerification
    from .sites import PatchedSite

    try:
        original_module = import_original(job, writer)
    except BaseException as exc:
        writer.error(
            f"importing the original {job['module_name']} failed:\n{_short_traceback(exc)}"
        )
        return
    available = find_model_classes(original_module)
    available_names = [c.__name__ for c in available]
    sites = [PatchedSite.from_json(site) for site in job.get("sites", [])]
    for site in sites:
        if site.hosts is not None:  # the classes a check can start from
            site.hosts = [name for name in site.hosts if name in available_names]
    writer.data["sites"] = [site.to_json() for site in sites]
    requested = job.get("classes")
    if requested:
        names = list(requested)
    else:
        names = [c.__name__ for c in select_classes(available, job.get("max_heads", 2))]
        # Every model class whose own code holds a patched site is checked too.
        names += [n for n in available_names if n not in names and any(s.cls == n for s in sites)]
        if not names:
            writer.error(
                "no transformers model classes (PreTrainedModel subclasses with a config_class) "
                "in this file; check plain nn.Module code with verify_factory"
            )
            return
    writer.plan(names)
    recorder = SiteRecorder(sites, files=[job["patched_path"]])
    try:
        with recorder.intercepting():
            patched_module = load_sibling(
                job["module_name"], f"{_PATCHED_PREFIX}{job['tag']}_", Path(job["patched_path"])
            )
    except BaseException as exc:
        reason = f"the patched source failed to import: {_error_line(exc)}"
        writer.note(_short_traceback(exc))
        for name in names:
            writer.add(ClassVerification(name, NOT_CHECKABLE, reason).to_json())
        return
    recorder.install(patched_module)

    def check(name: str, overrides: dict[str, Any]) -> dict[str, Any]:
        try:
            return check_transformers_class(
                name, original_module, patched_module, job, recorder, overrides
            )
        except Exception as exc:
            verdict = ClassVerification(
                name, NOT_CHECKABLE, f"verify itself failed: {_short_traceback(exc)}"
            ).to_json()
            verdict["setting"] = _setting_label(overrides)
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
        defaults = _config_defaults(original_module, available_names)
        _reach(
            names,
            verdicts,
            sites,
            check,
            available_names,
            bool(requested),
            defaults,
            writer,
            job.get("time_budget"),
            slowest,
        )


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
    recorder = _factory_recorder(patched_mod, original_fn, writer)
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
    _keep_sites_of(patched, writer)
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
    runs: dict[str, dict[str, int]] = {}
    if "eval" in job["modes"]:
        outcomes["eval"] = _measured(
            recorder,
            runs,
            "eval",
            lambda: check_mode(
                original_source, patched_source, state, inputs, training=False, seed=seed, tol=tol
            ),
        )
    if "train" in job["modes"]:
        outcomes["train"] = _measured(
            recorder,
            runs,
            "train",
            lambda: check_mode(
                original_source,
                patched_source,
                state,
                inputs,
                training=True,
                seed=seed,
                tol=tol,
                prepare=zero_dropout_modules,
            ),
        )
        patched_file = getattr(patched_mod, "__file__", None)
        extra = [Path(patched_file).read_text(encoding="utf-8")] if patched_file else []
        sources = _module_sources(patched, extra)
        outcomes["train-dropout"] = _measured(
            recorder,
            runs,
            "train-dropout",
            lambda: _train_dropout_outcome(
                original_source, patched_source, state, inputs, sources, job
            ),
        )
    verdict = _with_backends(conclude(name, outcomes), runs)
    writer.add(verdict.to_json())


def _keep_sites_of(model: Any, writer: ResultWriter) -> None:
    """Keep the sites that the patched model's code holds: those in its (sub)modules' classes
    and their bases, and module-level functions whose name that code mentions. A factory file
    may define other patched variants that this model never uses."""
    import inspect

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


def _factory_recorder(patched_module: ModuleType, original_fn: Any, writer: ResultWriter) -> Any:
    """A recorder installed in the patched factory's module and in every other loaded module of
    the user's (not the original factory's) that calls ``adopter.kernels``; its sites are the
    kernel calls in those modules' files."""
    from .coverage import SiteRecorder
    from .sites import KERNEL_PACKAGE, find_sites

    original_module = sys.modules.get(getattr(original_fn, "__module__", "") or "")
    chosen: list[ModuleType] = [patched_module]
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if module is original_module or module in chosen:
            continue
        if name.split(".")[0] in ("adopter", "torch") or not getattr(module, "__file__", None):
            continue
        if any(
            callable(v) and (getattr(v, "__module__", "") or "").startswith(KERNEL_PACKAGE)
            for v in list(vars(module).values())
        ):
            chosen.append(module)
    sites = []
    seen: set[str] = set()
    for module in chosen:
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
    recorder = SiteRecorder(sites)
    for module in chosen:
        recorder.install(module)
    writer.data["sites"] = [site.to_json() for site in sites]
    writer.flush()
    return recorder


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
    die_with_parent()
    sys.exit(main())
