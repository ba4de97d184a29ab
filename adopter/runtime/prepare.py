"""From a module's file to the patched text the runtime may use: rewrite (or cache), verify.

Nothing of the module is executed here: its file is read and rewritten by the same static
pipeline as ``adopter apply``. The record kept in the cache is plain data (JSON): the patched
text, one line per site, and the constructions whose class the rewrite wraps in a kernel factory
(what instance patching needs for models built before the patch).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..extract.project import file_digest, recording_reads
from ..extract.source import decode_source
from . import records
from .cache import RuntimeCache, entry_key
from .rulechoice import RuleChoice

KERNEL_PREFIX = "adopter.kernels."


@dataclass
class Prepared:
    """What to do with one module file."""

    path: str
    original: str
    patched: str | None  # None: nothing to patch (or not allowed to)
    sites: list[dict[str, Any]] = field(default_factory=list)
    wrapped: list[dict[str, str]] = field(default_factory=list)
    error: str | None = None
    verdict: str | None = None  # with verify: "verified", "refuted", "not checkable"
    verdict_reason: str = ""
    cached: bool = False
    rewrite_seconds: float = 0.0  # spent rewriting now (0: read from the cache)


def _site_records(rewrite) -> list[dict[str, Any]]:
    return [
        {
            "rule": result.site.rule.id,
            "line": result.site.line,
            "class": result.site.cls,
            "method": result.site.method,
            "status": result.status.value,
            "reason": result.reason,
            "kernel": result.site.rule.kernel,
        }
        for result in rewrite.results
    ]


def _factory_targets(rule) -> dict[str, str]:
    """``{variable: kernel}`` for the constructions the rule rebuilds through a kernel class
    factory: ``@adopter.kernels.k(Class)(...) -> $v`` in its ``init`` replacement."""
    from ..dsl.syntax import Call, Name, Positional

    replacement = rule.init.replacement if rule.init is not None else None
    targets: dict[str, str] = {}
    for step in replacement if isinstance(replacement, tuple) else ():
        callee = step.callee
        if not (step.construct and isinstance(callee, Call) and isinstance(callee.base, Name)):
            continue
        kernel = callee.base.dotted
        class_argument = len(callee.args) == 1 and isinstance(callee.args[0], Positional)
        if kernel.startswith(KERNEL_PREFIX) and class_argument:
            for target in step.targets:
                targets[target.name] = kernel[len(KERNEL_PREFIX) :]
    return targets


def _wrapped_constructions(rewrite) -> list[dict[str, str]]:
    """``self.<attribute> = Constructs(...)`` in ``class``'s ``__init__`` that the rewrite made
    ``kernel(Constructs)(...)``: the kernel factory returns a subclass keeping ``__init__``."""
    import ast

    from ..match.matcher import BoundModule
    from ..rewrite import SiteStatus

    found = []
    for result in rewrite.results:
        site = result.site
        if result.status is not SiteStatus.PATCHED or not site.cls:
            continue
        for variable, kernel in _factory_targets(site.rule).items():
            bound = site.bindings.get(variable)
            if not isinstance(bound, BoundModule) or not bound.path.startswith("self."):
                continue
            node = bound.construction.node
            if not isinstance(node, ast.Call):
                continue
            found.append(
                {
                    "rule": site.rule.id,
                    "class": site.cls,
                    "attribute": bound.path[len("self.") :],
                    "constructs": ast.unparse(node.func),  # as the module spells it
                    "kernel": kernel,
                }
            )
    return found


def _rewrite_record(text: str, path: str, choice: RuleChoice) -> dict[str, Any]:
    from ..dsl.errors import LocatedError
    from ..match.matcher import Matcher
    from ..rewrite import rewrite_text

    failed = {"patched": None, "sites": [], "wrapped": [], "depends": {}}
    with recording_reads() as reads:
        try:
            rewrite = rewrite_text(text, path, Matcher(choice.rules()))
        except LocatedError as error:
            return {**failed, "error": str(error)}
        except RecursionError:
            return {**failed, "error": "source nested too deeply"}
    return {
        "patched": rewrite.patched if rewrite.changed else None,
        "sites": _site_records(rewrite),
        "wrapped": _wrapped_constructions(rewrite),
        "error": None,
        "depends": dict(sorted(reads.items())),
    }


def _verify_record(
    path: str, text: str, record: dict[str, Any], choice: RuleChoice, timeout: float
) -> dict[str, Any]:
    from ..match.matcher import Matcher
    from ..rewrite import rewrite_text
    from .proof import prove

    # The proof needs the site results, not only the text: rewrite again (cheap beside verify).
    rewrite = rewrite_text(text, path, Matcher(choice.rules()))
    proof = prove(rewrite, choice.rules(), timeout)
    kept = proof.rewrite
    return {
        "status": proof.status,
        "reason": proof.reason,
        "patched": kept.patched if kept is not None and kept.changed else None,
        "sites": _site_records(kept) if kept is not None else record["sites"],
        "wrapped": _wrapped_constructions(kept) if kept is not None else [],
        "depends": record["depends"],
    }


def _fresh(record: dict[str, Any] | None, fields: dict[str, tuple[type, ...]]) -> bool:
    """A cached record of the right shape whose every file read by the analysis (helpers in
    other files of the package) still has the bytes it had then."""
    if record is None or not records.well_formed(record, fields):
        return False
    return all(file_digest(path) == digest for path, digest in record["depends"].items())


def prepare(
    path: str | Path,
    choice: RuleChoice,
    cache: RuntimeCache | None,
    *,
    verify: bool = False,
    verify_timeout: float = 300,
    on_rewrite: Callable[[], None] | None = None,
) -> Prepared:
    """Rewrite the module file at ``path`` (from the cache when this exact input was seen);
    ``on_rewrite`` is called before a rewrite the cache does not hold."""
    name = str(path)
    data = Path(path).read_bytes()
    text = decode_source(data, name)
    key = entry_key(data, choice.fingerprint)
    record = cache.get(key) if cache is not None else None
    cached = _fresh(record, records.REWRITE)
    rewrite_seconds = 0.0
    if not cached or record is None:
        if on_rewrite is not None:
            on_rewrite()
        started = time.perf_counter()
        record = _rewrite_record(text, name, choice)
        rewrite_seconds = time.perf_counter() - started
        if cache is not None:
            cache.put(key, record)
    prepared = Prepared(
        name,
        text,
        record.get("patched"),
        list(record.get("sites", [])),
        list(record.get("wrapped", [])),
        record.get("error"),
        cached=cached,
        rewrite_seconds=rewrite_seconds,
    )
    if not verify or prepared.patched is None:
        return prepared
    verify_key = entry_key(data, choice.fingerprint, kind="verify")
    verdict = cache.get(verify_key) if cache is not None else None
    if verdict is None or not _fresh(verdict, records.VERIFY):
        prepared.cached = False
        verdict = _verify_record(name, text, record, choice, verify_timeout)
        if cache is not None:
            cache.put(verify_key, verdict)
    prepared.verdict, prepared.verdict_reason = verdict["status"], verdict["reason"]
    prepared.patched = verdict.get("patched")
    prepared.sites = list(verdict.get("sites", prepared.sites))
    prepared.wrapped = list(verdict.get("wrapped", []))
    return prepared
