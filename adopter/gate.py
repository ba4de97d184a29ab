"""The safety net between ``apply`` and the disk: verify each patched file and keep only what
was proven. A refuted file is narrowed down rule by rule, so one bad rule does not cost the
others; a file that cannot be checked is not written at all.

This stage comes after ``verify`` (it asks for the proofs) and serves ``apply --verify`` and
the runtime; the proof itself knows nothing of which rules made a file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .dsl.syntax import Rule
from .match.matcher import Matcher
from .rewrite.apply import FileRewrite
from .rewrite.driver import ApplyResult, rewrite_text
from .verify.options import VerifyOptions
from .verify.results import NOT_EXERCISED, REFUTED, VERIFIED, FileVerification
from .verify.runner import PatchedFile, verify_patched_files

__all__ = ["GatedFile", "describe", "file_status", "gate_rewrites", "keep_verified"]


def file_status(verification: FileVerification) -> tuple[str, str]:
    """One verdict for a whole file, with its reason: refuted if any check is; verified only
    when every patched site ran in a check that matched (see ``FileVerification.status``);
    otherwise not exercised or not checkable."""
    return verification.status, verification.reason()


def _kernel_of(rule: Rule) -> str:
    return rule.kernel.rpartition(".")[2] if rule.kernel else ""


@dataclass
class GatedFile:
    """A patched file after verification: the text that may be written (``None``: nothing)."""

    rewrite: FileRewrite
    status: str
    reason: str
    text: str | None
    kept_rules: list[str] = field(default_factory=list)
    dropped_rules: dict[str, str] = field(default_factory=dict)
    verification: FileVerification | None = None


def _verify(items: Sequence[tuple[str, str]], options: VerifyOptions) -> list[FileVerification]:
    return verify_patched_files([PatchedFile(path, text) for path, text in items], options)


def gate_rewrites(
    rewrites: Sequence[FileRewrite],
    rules: list[Rule],
    *,
    timeout: float = 300,
    modes: Sequence[str] = ("eval", "train"),
    max_heads: int = 2,
    progress: Callable[[str], None] | None = None,
) -> list[GatedFile]:
    """Verify changed files; narrow refuted ones down to the rules that verify on their own."""
    options = VerifyOptions(modes=tuple(modes), max_heads=max_heads, timeout=timeout)
    changed = [r for r in rewrites if r.error is None and r.changed]
    verdicts = _verify([(r.path, r.patched) for r in changed], options)
    gated: list[GatedFile] = []
    for rewrite, verification in zip(changed, verdicts, strict=True):
        status, reason = file_status(verification)
        used = rewrite.rules_patched
        if progress:
            progress(f"{rewrite.path}: {status}")
        if status == VERIFIED:
            gated.append(
                GatedFile(rewrite, status, reason, rewrite.patched, used, {}, verification)
            )
        elif status == REFUTED and len(used) > 1:
            gated.append(_narrow(rewrite, rules, used, options, reason))
        elif status == NOT_EXERCISED:
            gated.append(_without_unexercised(rewrite, rules, used, verification, options))
        else:
            dropped = dict.fromkeys(used, reason)
            gated.append(GatedFile(rewrite, status, reason, None, [], dropped, verification))
    return gated


def _narrow(
    rewrite: FileRewrite, rules: list[Rule], used: list[str], options: VerifyOptions, reason: str
) -> GatedFile:
    """Try each rule alone; keep those that verify, then check them together."""
    by_id = {rule.id: rule for rule in rules}
    singles = {
        rule_id: rewrite_text(rewrite.original, rewrite.path, Matcher([by_id[rule_id]])).patched
        for rule_id in used
    }
    verdicts = _verify([(rewrite.path, text) for text in singles.values()], options)
    kept, dropped = [], {}
    for rule_id, verification in zip(singles, verdicts, strict=True):
        status, why = file_status(verification)
        if status == VERIFIED:
            kept.append(rule_id)
        else:
            dropped[rule_id] = f"{status}: {why}"
    if not kept:
        return GatedFile(rewrite, REFUTED, reason, None, [], dropped)
    refused = _Refused(REFUTED, "refuted together", reason)
    return _kept_together(rewrite, [by_id[i] for i in kept], dropped, options, refused)


def _without_unexercised(
    rewrite: FileRewrite,
    rules: list[Rule],
    used: list[str],
    verification: FileVerification,
    options: VerifyOptions,
) -> GatedFile:
    """Keep the rules whose kernels only appear at sites that ran and matched; the others are
    dropped (nothing is known about a site that never ran) and the rest is checked again."""
    reason = verification.reason()
    by_id = {rule.id: rule for rule in rules}
    missing = {entry.site.kernel for entry in verification.not_exercised}
    kept = [rule_id for rule_id in used if _kernel_of(by_id[rule_id]) not in missing]
    dropped = {rule_id: f"{NOT_EXERCISED}: {reason}" for rule_id in used if rule_id not in kept}
    if not kept:
        return GatedFile(rewrite, NOT_EXERCISED, reason, None, [], dropped, verification)
    refused = _Refused(None, "without the others", reason)
    return _kept_together(rewrite, [by_id[i] for i in kept], dropped, options, refused)


@dataclass(frozen=True)
class _Refused:
    """How a file whose kept rules fail together is reported: with ``status`` (``None``: the
    status of that check), each kept rule dropped as ``what``, and the file's first ``reason``."""

    status: str | None
    what: str
    reason: str


def _kept_together(
    rewrite: FileRewrite,
    kept: list[Rule],
    dropped: dict[str, str],
    options: VerifyOptions,
    refused: _Refused,
) -> GatedFile:
    """The file rewritten with the ``kept`` rules alone and verified again: kept where that
    verifies, else nothing written and each kept rule ``dropped`` as well."""
    combined = rewrite_text(rewrite.original, rewrite.path, Matcher(kept))
    (verification,) = _verify([(rewrite.path, combined.patched)], options)
    status, why = file_status(verification)
    names = [rule.id for rule in kept]
    if status != VERIFIED:
        what = refused.what if refused.status else f"{status} {refused.what}"
        dropped.update(dict.fromkeys(names, f"{what}: {why}"))
        reported = refused.status or status
        return GatedFile(rewrite, reported, refused.reason, None, [], dropped, verification)
    note = f"verified with {', '.join(names)}; dropped " + ", ".join(dropped)
    return GatedFile(combined, VERIFIED, note, combined.patched, names, dropped, verification)


def keep_verified(
    result: ApplyResult, rules: list[Rule], *, timeout: float, say: Callable[[str], None]
) -> None:
    """``apply --verify``: gate the changed files of ``result`` and keep only what was proven,
    the (possibly narrowed) rewrite of each verified file; ``say`` each file's verdict."""
    gated = gate_rewrites(result.changed, rules, timeout=timeout)
    for item in gated:
        say(describe(item.rewrite.path, item))
    kept = [item.rewrite for item in gated if item.text is not None]
    result.keep(kept, held_back=len(gated) - len(kept))


def describe(path: str | Path, gated: GatedFile) -> str:
    """The file's verdict, then each rule whose sites are left unwritten and why: a kept file
    may still drop some rules, and each of their sites is skipped for that reason."""
    lines = [f"{path}: {gated.status} - {gated.reason}"]
    if gated.text is not None:
        lines += [f"  not written: {rule}: {why}" for rule, why in gated.dropped_rules.items()]
    return "\n".join(lines)
