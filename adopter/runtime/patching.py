"""``adopter.patch`` and ``adopter.unpatch``: adopt kernels in imported code without editing files.

``patch(target)`` accepts

* an imported module, or the name of a module (imported if it is not yet): that module;
* a package, or its name (``"transformers"``, ``"transformers.models.llama"``): every submodule
  of it imported now, and - through an import hook - every submodule imported later. Submodules
  are not imported for the purpose: importing all of ``transformers`` executes thousands of
  files and needs every optional dependency, while a program only ever runs the ones it imports;
* an ``nn.Module`` instance: the modules that define the classes of its submodules, and in
  place the submodules built before the patch (see :func:`_wrap_built_children`).

Each module's file is rewritten by the static pipeline of ``adopter apply`` (from the cache when
the same source, rules, Adopter, torch and Python were seen before), optionally verified, and
the changed functions get the patched code in place (:mod:`.transplant`), so classes keep their
identity and models built afterwards - or already built - use the kernels. ``unpatch`` puts the
original code back.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ..rules import DEFAULT_RULE_SET
from . import hook
from .cache import CacheRefused, RuntimeCache, cache_dir
from .log import LOGGER, once, once_per_key, rewriting, rewritten, summarise
from .prepare import Prepared, prepare
from .rulechoice import RuleArgument, RuleChoice
from .transplant import (
    AppliedTransplant,
    Unpatchable,
    apply_transplant,
    plan_transplant,
    stale_functions,
)

_LOCK = threading.RLock()
_SKIP_MODULES = ("torch", "builtins", "adopter")


@dataclass
class RuntimeOptions:
    """How modules are patched: rules, verification, cache."""

    choice: RuleChoice
    verify: bool = False
    verify_timeout: float = 300.0
    cache: bool | str | Path = True

    @property
    def fingerprint(self) -> tuple[str, bool]:
        return (self.choice.fingerprint, self.verify)

    def open_cache(self) -> RuntimeCache | None:
        if self.cache is False:
            return None
        folder = cache_dir() if self.cache is True else Path(self.cache)  # type: ignore[arg-type]
        return _open_cache(folder)


_CACHES: dict[Path, RuntimeCache | None] = {}


def _open_cache(folder: Path) -> RuntimeCache | None:
    with _LOCK:
        if folder not in _CACHES:
            try:
                _CACHES[folder] = RuntimeCache(folder)
            except (CacheRefused, OSError) as error:
                once(logging.WARNING, "cache", f"not using the cache: {error}")
                _CACHES[folder] = None
        return _CACHES[folder]


@dataclass
class ModuleOutcome:
    """What happened to one module."""

    module: str
    status: str  # "patched", "already patched", "unchanged", "skipped"
    sites: list[str] = field(default_factory=list)  # the patched sites, described
    reason: str = ""


@dataclass
class PatchReport:
    """The outcome of one :func:`patch` call."""

    modules: list[ModuleOutcome] = field(default_factory=list)
    hooked: list[str] = field(default_factory=list)  # packages patched on import from now on
    wrapped_children: int = 0  # submodules of an nn.Module given to patch() rebuilt in place

    @property
    def patched(self) -> dict[str, list[str]]:
        return {
            o.module: o.sites for o in self.modules if o.status in ("patched", "already patched")
        }

    @property
    def skipped(self) -> dict[str, str]:
        return {o.module: o.reason for o in self.modules if o.status == "skipped"}


@dataclass
class _Patched:
    module: ModuleType
    applied: AppliedTransplant
    prepared: Prepared
    fingerprint: tuple[str, bool]
    outcome: ModuleOutcome


_PATCHED: dict[str, _Patched] = {}


@dataclass
class _ModelRecord:
    children: list[tuple[Any, type]] = field(default_factory=list)  # (submodule, its class)
    modules: list[str] = field(default_factory=list)  # modules this model's patch patched


_MODELS: weakref.WeakKeyDictionary[Any, _ModelRecord] = weakref.WeakKeyDictionary()


def _describe(site: dict[str, Any]) -> str:
    owner = f"{site['class']}.{site['method']}" if site.get("class") else site.get("method")
    return f"{site['rule']} {owner} line {site['line']}"


def _source_file(module: ModuleType) -> str | None:
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None) or getattr(module, "__file__", None)
    if not isinstance(origin, str) or not origin.endswith(".py") or not os.path.isfile(origin):
        return None
    return origin


def _skip(name: str, reason: str) -> ModuleOutcome:
    once(logging.INFO, name, f"left {name} unpatched: {reason}", outcome="unpatched")
    return ModuleOutcome(name, "skipped", reason=reason)


def patch_module(module: ModuleType, options: RuntimeOptions) -> ModuleOutcome:
    """Patch one imported module in place (idempotent; a different rule choice re-patches)."""
    name = module.__name__
    with _LOCK:
        current = _PATCHED.get(name)
        if current is not None:
            if not current.applied.in_effect():  # reloaded: its functions are new ones
                del _PATCHED[name]
            elif current.module is module and current.fingerprint == options.fingerprint:
                return ModuleOutcome(name, "already patched", current.outcome.sites)
            else:
                _restore(name)
        file = _source_file(module)
        if file is None:
            return ModuleOutcome(name, "unchanged", reason="no Python source file")
        try:
            prepared = prepare(
                file,
                options.choice,
                options.open_cache(),
                verify=options.verify,
                verify_timeout=options.verify_timeout,
                on_rewrite=lambda: rewriting(name),
            )
        except Exception as error:  # a module we cannot read or rewrite stays as it is
            return _skip(name, f"rewriting failed: {type(error).__name__}: {error}")
        if prepared.rewrite_seconds:
            rewritten(name, prepared.rewrite_seconds)
        if prepared.error:
            return _skip(name, prepared.error)
        not_patched = [s for s in prepared.sites if s["status"] == "skipped"]
        if not_patched:
            details = "; ".join(
                dict.fromkeys(f"{_describe(s)}: {s['reason']}" for s in not_patched)
            )
            once(logging.INFO, name, f"{name}: site(s) not patched: {details}", outcome="partial")
        if prepared.patched is None:
            if prepared.verdict is not None:
                why = f"verify found it {prepared.verdict}: {prepared.verdict_reason}"
                return _skip(name, why)
            once(logging.DEBUG, name, f"{name}: nothing to patch")
            return ModuleOutcome(name, "unchanged")
        try:
            stale = stale_functions(module, prepared.original, file)
        except (SyntaxError, ValueError, RecursionError) as error:
            return _skip(name, f"cannot compile {file} to compare: {error}")
        if stale:
            shown = ", ".join(stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
            return _skip(
                name,
                f"the running code of {shown} is not what {file} compiles to now "
                "(the file was edited after the import, or upgraded in place)",
            )
        try:
            transplant = plan_transplant(prepared.original, prepared.patched, file)
            applied = apply_transplant(module, transplant, file)
        except Unpatchable as error:
            return _skip(name, str(error))
        except Exception as error:  # e.g. a kernel that fails to import: stay original
            return _skip(name, f"patching failed: {type(error).__name__}: {error}")
        sites = [_describe(s) for s in prepared.sites if s["status"] == "patched"]
        outcome = ModuleOutcome(name, "patched", sites)
        _PATCHED[name] = _Patched(module, applied, prepared, options.fingerprint, outcome)
        notes = [prepared.verdict or "", "cached" if prepared.cached else ""]
        notes = [note for note in notes if note]
        suffix = f" ({', '.join(notes)})" if notes else ""
        message = f"patched {name}{suffix}: {', '.join(sites)}"
        once(logging.INFO, name, message, outcome="patched", sites=len(sites))
        _kernel_notices(prepared.sites)
        return outcome


def _kernel_notices(sites: list[dict[str, Any]]) -> None:
    """Once per process and kernel, at patch time: what a patched-in kernel changes that the
    user sees (the kernel registry's ``notice``; modern.7's ``logits=None``), and how to keep
    the original behaviour. The kernels are imported already: the patch just bound them."""
    patched = [s for s in sites if s["status"] == "patched" and s["kernel"]]
    if not patched:
        return
    from ..kernels.registry import ENTRIES

    notices = {f"adopter.kernels.{entry.name}": entry.notice for entry in ENTRIES if entry.notice}
    for kernel in dict.fromkeys(s["kernel"] for s in patched):
        if kernel not in notices:
            continue
        rules = ",".join(dict.fromkeys(s["rule"] for s in patched if s["kernel"] == kernel))
        once_per_key(
            logging.WARNING,
            f"notice:{kernel}",
            f"{rules} patched in ({kernel}): {notices[kernel]}; or leave the rule out: "
            f'adopter.patch(..., exclude="{rules}") / adopter run --exclude {rules}',
        )


def _restore(name: str) -> bool:
    record = _PATCHED.pop(name, None)
    if record is None:
        return False
    record.applied.undo()
    return True


def _resolve(target: Any) -> tuple[str, Any]:
    """("model", module instance) | ("package", name) | ("module", module)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(target, torch.nn.Module):
        return "model", target
    if isinstance(target, ModuleType):
        return ("package", target.__name__) if hasattr(target, "__path__") else ("module", target)
    if not isinstance(target, str):
        raise TypeError(f"cannot patch {type(target).__name__}: give a module, a name or a model")
    if target in sys.modules and isinstance(sys.modules[target], ModuleType):
        return _resolve(sys.modules[target])
    spec = importlib.util.find_spec(target)
    if spec is None:
        raise ModuleNotFoundError(f"no module named {target!r}")
    if spec.submodule_search_locations is not None:
        return "package", target
    return "module", importlib.import_module(target)


def _imported_within(package: str) -> list[ModuleType]:
    return [
        module
        for name, module in sorted(list(sys.modules.items()))
        if hook.within(name, package) and isinstance(module, ModuleType)
    ]


def patch(
    target: Any,
    rules: RuleArgument = None,
    *,
    verify: bool = False,
    select: str | Sequence[str] | None = None,
    cache: bool | str | Path = True,
    verify_timeout: float = 300.0,
    exclude: str | Sequence[str] | None = None,
) -> PatchReport:
    """Patch ``target`` (a module, module or package name, or an ``nn.Module``) with ``rules``.

    ``rules``: built-in rule set names (default ``"all"``), ``.adopt`` files, or parsed rules;
    ``select`` narrows them to rule ids or id prefixes, ``exclude`` leaves those out (e.g.
    ``exclude="modern.7"`` keeps a causal LM's logits in training). ``verify=True`` keeps a
    module's rewrite only when ``adopter verify`` proves it (run once in a subprocess, the
    verdict cached).
    ``cache``: ``False``, or a folder instead of the per-user default.
    """
    choice = RuleChoice.of(rules, select, exclude)
    options = RuntimeOptions(choice, verify, verify_timeout, cache)
    try:
        return _patch_target(target, options)
    finally:
        summarise()  # the modules' outcomes, one line per package on stderr at INFO


def _patch_target(target: Any, options: RuntimeOptions) -> PatchReport:
    kind, value = _resolve(target)
    report = PatchReport()
    if kind == "model":
        return _patch_model(value, options)
    if kind == "module":
        report.modules.append(patch_module(value, options))
        return report
    hook.install(value, options, patch_module)
    report.hooked.append(value)
    for module in _imported_within(value):
        report.modules.append(patch_module(module, options))
    return report


def _model_modules(model: Any) -> list[ModuleType]:
    names: dict[str, None] = {}
    for child in model.modules():
        for cls in type(child).__mro__:
            name = cls.__module__ or ""
            if name.split(".")[0] not in _SKIP_MODULES:
                names[name] = None
    return [sys.modules[n] for n in names if isinstance(sys.modules.get(n), ModuleType)]


def _patch_model(model: Any, options: RuntimeOptions) -> PatchReport:
    report = PatchReport()
    with _LOCK:
        for module in _model_modules(model):
            report.modules.append(patch_module(module, options))
        record = _MODELS.setdefault(model, _ModelRecord())
        record.modules.extend(o.module for o in report.modules if o.status == "patched")
        report.wrapped_children = _wrap_built_children(model, record)
    if report.wrapped_children:
        once(
            logging.INFO,
            f"model-{id(model)}",
            f"wrapped {report.wrapped_children} submodule(s) of a "
            f"{type(model).__name__} built before the patch",
        )
    return report


def _resolve_dotted(namespace: dict[str, Any], dotted: str) -> Any:
    head, *rest = dotted.split(".")
    value = namespace.get(head)
    for part in rest:
        value = getattr(value, part, None)
    return value


def _wrap_built_children(model: Any, record: _ModelRecord) -> int:
    """Submodules built before the patch, where the patched ``__init__`` now builds
    ``kernel(Class)(...)`` instead of ``Class(...)``: their class becomes ``kernel(Class)``,
    a subclass that keeps ``__init__`` and so the same parameters and buffers."""
    kernels = None
    count = 0
    for patched in list(_PATCHED.values()):
        namespace = vars(patched.module)
        for wrap in patched.prepared.wrapped:
            owner = namespace.get(wrap["class"])
            constructs = _resolve_dotted(namespace, wrap["constructs"])
            if not isinstance(owner, type) or not isinstance(constructs, type):
                continue
            if kernels is None:
                kernels = importlib.import_module("adopter.kernels")
            factory = getattr(kernels, wrap["kernel"], None)
            for parent in model.modules():
                if not isinstance(parent, owner):
                    continue
                child = _resolve_dotted(vars(parent).get("_modules", {}), wrap["attribute"])
                if type(child) is not constructs or factory is None:
                    continue
                try:
                    fused = factory(constructs)
                except Exception as error:  # the kernel refuses this class: leave it
                    once(logging.INFO, wrap["kernel"], f"{wrap['kernel']}: {error}")
                    continue
                if (
                    isinstance(fused, type)
                    and fused is not constructs
                    and issubclass(fused, constructs)
                ):
                    child.__class__ = fused
                    record.children.append((child, constructs))
                    count += 1
    return count


def unpatch(target: Any = None) -> list[str]:
    """Undo :func:`patch`: everything (no target), a module, a package (and its hook) or a model
    (its rebuilt submodules and the modules its patch patched). Returns the modules restored."""
    with _LOCK:
        if target is None:
            hook.uninstall()
            for model in list(_MODELS.keys()):
                _unpatch_model(model)
            names = list(_PATCHED)
            for name in names:
                _restore(name)
            return names
        kind, value = _resolve_for_unpatch(target)
        if kind == "model":
            return _unpatch_model(value)
        if kind == "module":
            return [value] if _restore(value) else []
        hook.uninstall(value)
        names = [name for name in list(_PATCHED) if hook.within(name, value)]
        for name in names:
            _restore(name)
        return names


def _resolve_for_unpatch(target: Any) -> tuple[str, Any]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(target, torch.nn.Module):
        return "model", target
    if isinstance(target, ModuleType):
        return ("package" if hasattr(target, "__path__") else "module"), target.__name__
    if isinstance(target, str):
        module = sys.modules.get(target)
        if isinstance(module, ModuleType) and not hasattr(module, "__path__"):
            return "module", target
        return "package", target
    raise TypeError(f"cannot unpatch {type(target).__name__}")


def _unpatch_model(model: Any) -> list[str]:
    record = _MODELS.pop(model, None)
    if record is None:
        return []
    for child, cls in reversed(record.children):
        child.__class__ = cls
    restored = [name for name in record.modules if _restore(name)]
    return restored


def patched_modules() -> dict[str, list[str]]:
    """The modules patched now, with their patched sites."""
    with _LOCK:
        return {name: list(record.outcome.sites) for name, record in _PATCHED.items()}


def _log_level_from_environment() -> None:
    level = os.environ.get("ADOPTER_LOG")
    if level:
        from .log import show_on_stderr

        show_on_stderr(level.upper() if not level.isdigit() else int(level))


def install_from_environment() -> PatchReport | None:
    """``import adopter.auto`` / ``adopter run``: hook the packages the environment names.

    ``ADOPTER_PACKAGES`` (comma-separated; default transformers,timm,diffusers),
    ``ADOPTER_RULES`` (comma-separated rule sets and ``.adopt`` files; default all),
    ``ADOPTER_SELECT`` (rule ids), ``ADOPTER_EXCLUDE`` (rule ids left out),
    ``ADOPTER_VERIFY=1``, ``ADOPTER_LOG`` (a level: print the ``adopter`` logger on stderr).
    ``ADOPTER_RUNTIME_DISABLED=1`` turns all of it off.
    """
    from .proof import DISABLE_VARIABLE

    if os.environ.get(DISABLE_VARIABLE):
        return None
    _log_level_from_environment()
    packages = [
        p.strip()
        for p in os.environ.get("ADOPTER_PACKAGES", ",".join(hook.DEFAULT_PACKAGES)).split(",")
        if p.strip()
    ]
    named = os.environ.get("ADOPTER_RULES", DEFAULT_RULE_SET)
    rules = [r.strip() for r in named.split(",") if r.strip()]
    options = RuntimeOptions(
        RuleChoice.of(
            rules,
            os.environ.get("ADOPTER_SELECT") or None,
            os.environ.get("ADOPTER_EXCLUDE") or None,
        ),
        verify=os.environ.get("ADOPTER_VERIFY", "") not in ("", "0", "false", "no"),
    )
    report = PatchReport()
    for package in packages:
        hook.install(package, options, patch_module)
        report.hooked.append(package)
        for module in _imported_within(package):
            report.modules.append(patch_module(module, options))
    LOGGER.debug("hooked %s with %s", ", ".join(packages), options.choice.describe())
    return report
