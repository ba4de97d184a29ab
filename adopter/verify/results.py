"""The verdicts ``adopter verify`` hands back, and their JSON form.

The worker subprocess and the parent only share JSON, so every verdict type here converts to and
from plain dicts. Nothing in this module imports torch or the code under test: the parent process
must stay free of both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["verified", "refuted", "not checkable"]

VERIFIED: Status = "verified"
REFUTED: Status = "refuted"
NOT_CHECKABLE: Status = "not checkable"


@dataclass
class ClassVerification:
    """The verdict for one model class (or one factory-built model).

    ``modes`` maps each comparison that was attempted (``eval``, ``train`` with dropout at 0,
    ``train-dropout`` with the configured dropout) to a one-line outcome that starts with
    ``verified``, ``refuted``, ``skipped`` or ``not checkable``. ``max_abs_diff`` and ``where``
    name the largest absolute difference seen - for a refuted class the worst offending output or
    parameter gradient, for a verified one the largest rounding difference (so a reader can see
    how close the patched model came).
    """

    cls: str
    status: Status
    reason: str
    max_abs_diff: float | None = None
    where: str | None = None
    modes: dict[str, str] = field(default_factory=dict)

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
        )


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

    @property
    def status(self) -> Status:
        """``refuted`` if any class is, ``verified`` only if all were checked and verified."""
        if any(c.status == REFUTED for c in self.classes):
            return REFUTED
        if self.error is None and self.classes and all(c.status == VERIFIED for c in self.classes):
            return VERIFIED
        return NOT_CHECKABLE

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
            lines.append(f"  {c.cls}: {c.status}{diff} - {c.reason}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "status": self.status,
            "error": self.error,
            "notes": list(self.notes),
            "seconds": self.seconds,
            "classes": [c.to_json() for c in self.classes],
        }
