"""The worker's protocol: the job it is handed and the result file it keeps up to date.

A batch file (:mod:`adopter.executor.contained`) holds ``{"jobs": [WorkerJob.to_json(), ...]}``;
for each job the worker writes its result file after every change (atomically), so a timeout or
a crash keeps the verdicts already reached and the parent can name the class that was running.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..executor.contained import ResultFile
from .options import VerifyOptions

__all__ = ["FACTORY", "FILE", "LIBRARY", "ResultWriter", "WorkerJob"]

FILE = "file"  # a patched source file, its models built by an adapter
FACTORY = "factory"  # a pair of factories that build the models and their inputs
LIBRARY = "library"  # a patched file of a library whose registered models use it (by its adapter)


@dataclass(frozen=True)
class WorkerJob:
    """One file (``kind`` :data:`FILE`: the original's path and dotted name, the adapter that
    builds its models, the classes asked for, the patched sites) or one factory pair
    (:data:`FACTORY`), or a library file (:data:`LIBRARY`: its models found and built by the
    library's adapter), with the run's options. ``tag``, ``result_path`` and ``patched_path``
    are filled in by the machine that runs it."""

    kind: str
    options: VerifyOptions
    original_path: str = ""
    module_name: str = ""
    adapter: str = ""
    classes: tuple[str, ...] | None = None
    sites: tuple[dict[str, Any], ...] = ()
    kernel_calls_expected: bool = False
    sys_path_append: tuple[str, ...] = ()
    library: str = ""  # for LIBRARY: the library whose model adapter builds the models
    original_factory: str = ""
    patched_factory: str = ""
    patched_path: str = ""
    tag: int = 0
    result_path: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"] = self.options.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerJob:
        fields = dict(data)
        fields["options"] = VerifyOptions.from_json(data["options"])
        fields["classes"] = tuple(data["classes"]) if data.get("classes") else None
        fields["sites"] = tuple(data.get("sites") or ())
        fields["sys_path_append"] = tuple(data.get("sys_path_append") or ())
        return cls(**fields)


class ResultWriter(ResultFile):
    """Keeps the result JSON on disk up to date (written atomically after every change): the
    verdicts reached, the classes planned and the one being checked, the sites."""

    def __init__(self, path: Path, source_path: str) -> None:
        fields = {
            "path": source_path,
            "error": None,
            "notes": [],
            "planned": [],
            "current": None,
            "classes": [],
            "sites": [],
        }
        super().__init__(path, fields)

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
