"""The verdicts ``adopter verify`` hands back, and their JSON form.

The worker subprocess and the parent only share JSON, so every verdict type here converts to and
from plain dicts. Nothing in this module imports torch or the code under test: the parent process
must stay free of both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..models.sites import PatchedSite

Status = Literal["verified", "refuted", "not checkable", "not exercised"]

VERIFIED: Status = "verified"
REFUTED: Status = "refuted"
NOT_CHECKABLE: Status = "not checkable"
# Everything that was compared matched, but some patched site never ran in a check that
# matched: nothing is known about that site, so the file is not verified.
NOT_EXERCISED: Status = "not exercised"


def check_label(name: str, setting: str) -> str:
    """How a check is named in reports: its class, and the setting it was built with if any
    (``WhisperModel [use_weighted_layer_sum=True]``)."""
    return f"{name} [{setting}]" if setting else name


@dataclass
class ClassVerification:
    """The verdict for one model class (or one factory-built model).

    ``modes`` maps each comparison that was attempted (``eval``, ``train`` with dropout at 0,
    ``train-dropout`` with the configured dropout) to a one-line outcome that starts with
    ``verified``, ``refuted``, ``skipped`` or ``not checkable``. ``max_abs_diff`` and ``where``
    name the largest absolute difference seen - for a refuted class the worst offending output or
    parameter gradient, for a verified one the largest rounding difference (so a reader can see
    how close the patched model came).

    ``setting`` names configuration values verify changed from the defaults to reach a
    patched site (``use_weighted_layer_sum=True``; empty for the defaults). ``runs`` maps each
    mode to the patched sites (:attr:`PatchedSite.key`) that ran in it and how often.

    ``referee`` maps each mode whose float32 differences went to the float64 referee
    (:mod:`adopter.verify.differential`) to its figures; ``settled: true`` where it verified
    the mode (:attr:`settled_by_referee`).
    """

    cls: str
    status: Status
    reason: str
    max_abs_diff: float | None = None
    where: str | None = None
    modes: dict[str, str] = field(default_factory=dict)
    setting: str = ""
    runs: dict[str, dict[str, int]] = field(default_factory=dict)
    referee: dict[str, dict[str, Any]] = field(default_factory=dict)
    # mode -> site key -> "op=backend" -> calls: the kernel backends each site ran on
    backends: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    @property
    def settled_by_referee(self) -> list[str]:
        """The modes verified only after the float64 referee."""
        return [mode for mode, figures in self.referee.items() if figures.get("settled")]

    @property
    def label(self) -> str:
        return check_label(self.cls, self.setting)

    def matched_in(self, mode: str) -> bool:
        """Whether the comparison in ``mode`` ran and agreed."""
        return self.modes.get(mode, "").startswith(VERIFIED)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClassVerification:
        return cls(
            cls=str(data["cls"]),
            status=data["status"],
            reason=str(data.get("reason", "")),
            max_abs_diff=data.get("max_abs_diff"),
            where=data.get("where"),
            modes={str(k): str(v) for k, v in (data.get("modes") or {}).items()},
            setting=str(data.get("setting") or ""),
            runs={
                str(mode): {str(k): int(n) for k, n in counts.items()}
                for mode, counts in (data.get("runs") or {}).items()
            },
            referee={str(mode): dict(f) for mode, f in (data.get("referee") or {}).items()},
            backends={
                str(mode): {
                    str(site): {str(b): int(n) for b, n in (noted or {}).items()}
                    for site, noted in (per_site or {}).items()
                }
                for mode, per_site in (data.get("backends") or {}).items()
            },
        )


@dataclass
class SiteCoverage:
    """Whether one patched site ran and matched: ``exercised`` only when it ran in a mode
    whose comparison agreed (``matched_in``: "WhisperModel: eval" -> calls). ``ran_in`` counts
    every run, also in comparisons that did not agree or could not be judged."""

    site: PatchedSite
    matched_in: dict[str, int] = field(default_factory=dict)
    ran_in: dict[str, int] = field(default_factory=dict)
    reason: str = ""
    # "op=backend" -> calls in the comparisons that agreed: the backends verify proved here
    backends: dict[str, int] = field(default_factory=dict)

    @property
    def exercised(self) -> bool:
        return bool(self.matched_in)

    @property
    def status(self) -> str:
        return "exercised" if self.exercised else NOT_EXERCISED

    def to_json(self) -> dict[str, Any]:
        return {
            **self.site.to_json(),
            "status": self.status,
            "matched_in": dict(self.matched_in),
            "ran_in": dict(self.ran_in),
            "reason": self.reason,
            "backends": dict(self.backends),
        }


def site_coverage(sites: list[PatchedSite], classes: list[ClassVerification]) -> list[SiteCoverage]:
    """Which sites ran in which checks, and why those that never ran and matched did not."""
    covered = []
    for site in sites:
        entry = SiteCoverage(site)
        for verdict in classes:
            for mode, counts in verdict.runs.items():
                calls = counts.get(site.key, 0)
                if not calls:
                    continue
                label = f"{verdict.label}: {mode}"
                entry.ran_in[label] = calls
                if verdict.matched_in(mode):
                    entry.matched_in[label] = calls
                    noted = verdict.backends.get(mode, {}).get(site.key, {})
                    for backend, n in noted.items():
                        entry.backends[backend] = entry.backends.get(backend, 0) + n
        if not entry.exercised:
            parts = [
                "ran only in comparisons that did not agree or could not be judged ("
                + ", ".join(entry.ran_in)
                + ")"
                if entry.ran_in
                else "never ran"
            ]
            if site.hosts == []:
                parts.append("no model class of the file builds or calls its code (by name)")
            if site.guards:
                parts.append("guarded by " + " and ".join(f"`{g}`" for g in site.guards))
            tried = [
                v.label if v.status == VERIFIED else f"{v.label} ({v.status}: {v.reason[:90]})"
                for v in classes
            ]
            if tried:
                parts.append("checks tried: " + ", ".join(dict.fromkeys(tried)))
            entry.reason = "; ".join(parts)
        covered.append(entry)
    return covered


@dataclass
class FileVerification:
    """The verdicts for the model classes of one patched file.

    ``error`` is set when the file as a whole could not be checked (the worker could not import
    it, timed out before choosing classes, crashed); the classes list then holds whatever was
    decided before that. Use :attr:`status` rather than looking at the classes alone: an empty
    list must never read as "everything verified". ``seconds`` is the wall time the worker
    spent on the file, not counting its own start-up (importing torch); where the worker did not
    finish the file, the time the parent waited for it.
    """

    path: Path
    classes: list[ClassVerification] = field(default_factory=list)
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float | None = None
    sites: list[SiteCoverage] = field(default_factory=list)
    # Set for a patched text that differs from its original: then it must hold kernel calls
    # that can be watched running, and a comparison that agrees without any proves nothing.
    kernel_calls_expected: bool = False

    @property
    def not_exercised(self) -> list[SiteCoverage]:
        return [entry for entry in self.sites if not entry.exercised]

    @property
    def status(self) -> Status:
        """``refuted`` if any class is. Where the patched text calls kernels (``sites``):
        ``verified`` only when every site ran in a comparison that agreed (classes that could
        not be built, or were not reached before a timeout, do not count against it: they are
        listed), ``not exercised`` when comparisons agreed but some site never ran in one.
        Without sites: ``verified`` only if every class was checked and verified and the check
        finished, and the text was not changed (``kernel_calls_expected``: a patch whose kernel
        calls could not be located is ``not exercised``, nothing patched was seen running).
        Anything else is ``not checkable``."""
        if any(c.status == REFUTED for c in self.classes):
            return REFUTED
        if self.sites and any(c.status == VERIFIED for c in self.classes):
            return NOT_EXERCISED if self.not_exercised else VERIFIED
        if self.kernel_calls_expected and any(c.status == VERIFIED for c in self.classes):
            return NOT_EXERCISED
        if self.error is not None or not self.classes or self.sites:
            return NOT_CHECKABLE
        if all(c.status == VERIFIED for c in self.classes):
            return VERIFIED
        return NOT_CHECKABLE

    def reason(self) -> str:
        """One line saying why the file has its status."""
        status = self.status
        if status == REFUTED:
            worst = next(c for c in self.classes if c.status == REFUTED)
            return f"{worst.label}: {worst.reason}"
        if status == VERIFIED:
            agreed = [c.label for c in self.classes if c.status == VERIFIED]
            text = f"{len(agreed)} model check(s) agree: " + ", ".join(agreed)
            if self.sites:
                text += f"; all {len(self.sites)} patched site(s) ran and matched"
            refereed = [
                f"{c.label} ({', '.join(c.settled_by_referee)})"
                for c in self.classes
                if c.status == VERIFIED and c.settled_by_referee
            ]
            if refereed:
                text += (
                    "; float32 differences beyond the tolerance settled by the float64 referee in "
                    + ", ".join(refereed)
                )
            if self.error:
                text += f"; the check did not finish: {self.error}"
            return text
        if status == NOT_EXERCISED and not self.sites:
            return (
                "the patched text differs from the original but no adopter.kernels call was "
                "located in it, so no patched code was seen running (the model checks agree)"
            )
        if status == NOT_EXERCISED:
            missing = self.not_exercised
            return (
                f"{len(missing)} of {len(self.sites)} patched site(s) never ran in a check that "
                "matched: " + "; ".join(f"{m.site.describe()}: {m.reason}" for m in missing)
            )
        if self.error:
            return self.error
        reasons = [f"{c.label}: {c.reason}" for c in self.classes]
        return reasons[0] if reasons else "no model class could be built"

    def get(self, cls: str) -> ClassVerification:
        """The verdict of the class named ``cls`` (``KeyError`` if it was not checked)."""
        for verdict in self.classes:
            if verdict.cls == cls:
                return verdict
        raise KeyError(cls)

    def summary(self) -> str:
        """A few human-readable lines: one per class plus the file-level error and notes."""
        took = "" if self.seconds is None else f" ({self.seconds:.1f} s)"
        lines = [f"{self.path}: {self.status}{took}"]
        if self.error:
            lines.append(f"  error: {self.error}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        for c in self.classes:
            if c.max_abs_diff is None:
                diff = ""
            elif c.where is None:
                diff = " (bit-identical)"
            else:
                diff = f" (max |diff| {c.max_abs_diff:.3g} at {c.where})"
            lines.append(f"  {c.label}: {c.status}{diff} - {c.reason}")
        for entry in self.sites:
            detail = ", ".join(entry.matched_in) if entry.exercised else entry.reason
            lines.append(f"  site {entry.site.describe()}: {entry.status} - {detail}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "status": self.status,
            "reason": self.reason(),
            "error": self.error,
            "notes": list(self.notes),
            "seconds": self.seconds,
            "classes": [c.to_json() for c in self.classes],
            "sites": [entry.to_json() for entry in self.sites],
        }
