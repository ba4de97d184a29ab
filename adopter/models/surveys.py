"""What an adapter's cheap look at a model found, kept on disk between processes, and the
choice of models that a file's classes are checked through.

Every verify worker is a fresh process, and finding which of timm's 1,300 registered models
builds a rare class (``SwiGLU``, ``GlobalResponseNormMlp``) means building many of them on
the meta device; keeping what each build showed lets the next file's worker start from it.
A survey only orders and filters the models tried: what a check proves is recorded while it
runs, so a stale entry can cost a wasted build, never a wrong verdict. The store is keyed by
the library's version; ``ADOPTER_SURVEY_CACHE=0`` keeps it in memory only.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .base import ModelSurvey

__all__ = [
    "Look",
    "SurveyStore",
    "candidate_order",
    "covering_order",
    "survey_dir",
    "module_survey",
    "stored_look",
    "survey_in_order",
    "surveyed_candidates",
]

Look = Callable[[str], "tuple[dict[str, list[str]], int] | None"]
"""A model's survey: the library's classes it builds per module and its parameter count,
``None`` where it cannot be built cheaply."""


def survey_budget(default: int) -> int:
    """How many models a library adapter may build afresh on the meta device to find those
    using a file: ``ADOPTER_SURVEY_BUDGET`` (a positive count) or the adapter's ``default``.
    A class no model builds costs the whole budget on a machine whose store is cold (timm:
    about half a second a model); a smaller one trades reach for that time."""
    value = os.environ.get("ADOPTER_SURVEY_BUDGET", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return default


def survey_dir() -> Path | None:
    """Where surveys are kept for this user (``None``: not on disk)."""
    if os.environ.get("ADOPTER_SURVEY_CACHE", "1") == "0":
        return None
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "adopter" / "surveys"


class SurveyStore:
    """``model name -> survey`` (a JSON-able value, ``None`` for "could not be surveyed") of
    one library version; read once, written back merged with what other workers added."""

    def __init__(self, library: str, version: str, folder: Path | None = None) -> None:
        folder = folder if folder is not None else survey_dir()
        self.path = folder / f"{library}-{version}.json" if folder is not None else None
        self.entries: dict[str, Any] = self._read()
        self.added: dict[str, Any] = {}

    def _read(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}  # missing or half-written by a killed worker: start afresh
        return data if isinstance(data, dict) else {}

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def get(self, name: str) -> Any:
        return self.entries.get(name)

    def put(self, name: str, value: Any) -> None:
        self.entries[name] = value
        self.added[name] = value

    def save(self) -> None:
        """Write what this process added, merged with the file as it is now (another worker
        may have written since), atomically; a store that cannot be written stays in memory."""
        if self.path is None or not self.added:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            merged = {**self._read(), **self.added}
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(merged, out, sort_keys=True)
            os.replace(temporary, self.path)
            self.added = {}
        except OSError:
            return


def covering_order(
    builds: Mapping[str, frozenset[str]], sizes: Mapping[str, int], needed: Iterable[str]
) -> list[str]:
    """Models (keys of ``builds``: the needed classes each builds) in the order to check them:
    first a covering set chosen greedily (the model building most classes not yet covered,
    the smaller of equals), then every other model that builds a needed class, smallest first.
    Models that build none of ``needed`` are left out."""
    wanted = set(needed)
    useful = {name: classes & wanted for name, classes in builds.items() if classes & wanted}
    uncovered = set().union(*useful.values()) if useful else set()
    order: list[str] = []
    while uncovered:
        best = min(
            (name for name in useful if name not in order),
            key=lambda name: (-len(useful[name] & uncovered), sizes[name], name),
        )
        order.append(best)
        uncovered -= useful[best]
    rest = sorted((n for n in useful if n not in order), key=lambda n: (sizes[n], n))
    return [*order, *rest]


def survey_in_order(
    models: list[str],
    look: Look,
    store: SurveyStore,
    module_name: str,
    needed: set[str],
    *,
    budget: int,
    choices: int,
    max_parameters: int,
    fallback_parameters: int | None = None,
) -> tuple[dict[str, frozenset[str]], dict[str, int], set[str]]:
    """Survey ``models`` in order: what ``store`` holds for free, fresh ``look``s until each
    class of ``needed`` has ``choices`` builders or ``budget`` fresh looks are made (a count,
    not a time, so that the models chosen do not depend on the machine's speed or load). Returns the
    classes of ``module_name`` each model of at most ``max_parameters`` builds (those building
    one of ``needed``), their sizes, and the models the survey showed building none of
    ``needed`` (the only ones it rules out: one not surveyed, or too large, stays a candidate
    that a check then reports). With ``fallback_parameters``, a needed class that no model of
    at most ``max_parameters`` builds is given the smallest surveyed model up to that size
    that does (:func:`_smallest_larger_builders`)."""
    builds: dict[str, frozenset[str]] = {}
    sizes: dict[str, int] = {}
    ruled_out: set[str] = set()
    larger: dict[str, tuple[frozenset[str], int]] = {}
    count: dict[str, int] = dict.fromkeys(needed, 0)
    fresh = 0
    for model in models:
        if model not in store:
            if fresh >= budget or min(count.values(), default=choices) >= choices:
                continue
            fresh += 1
            look(model)
        found = look(model)
        if found is None:
            continue
        by_module, parameters = found
        classes = frozenset(by_module.get(module_name, ()))
        if not classes & needed:
            ruled_out.add(model)
        elif parameters <= max_parameters:
            builds[model], sizes[model] = classes, parameters
            for name in classes & needed:
                count[name] += 1
        elif fallback_parameters is not None and parameters <= fallback_parameters:
            larger[model] = (classes, parameters)
    store.save()
    uncovered = needed - set().union(*builds.values())
    for model in _smallest_larger_builders(larger, uncovered):
        # recorded for the classes only it builds, so that the covering order takes it for
        # those alone, after small models of as many classes
        builds[model], sizes[model] = larger[model][0] & uncovered, larger[model][1]
    return builds, sizes, ruled_out


def _smallest_larger_builders(
    larger: Mapping[str, tuple[frozenset[str], int]], uncovered: set[str]
) -> list[str]:
    """For each class of ``uncovered``, the smallest model of ``larger`` (``name -> (classes,
    parameters)``) that builds it, once. Why: a class only large models build (timm's
    ``ChannelAttentionV2``, only in DaViT-Base/Huge; PNASNet's cells) would otherwise never
    run, and one check of a model a few times the small limit, at a small image, takes a
    minute on a CPU where "not exercised" proves nothing."""
    chosen: list[str] = []
    for model, (classes, _) in sorted(larger.items(), key=lambda item: (item[1][1], item[0])):
        if classes & uncovered:
            chosen.append(model)
            uncovered = uncovered - classes
    return chosen


def candidate_order(
    ranked: list[tuple[str, str]],
    builds: Mapping[str, frozenset[str]],
    sizes: Mapping[str, int],
    ruled_out: set[str],
    needed: set[str],
) -> list[tuple[str, str]]:
    """``(model, why)`` in the order to check: the :func:`covering_order` of the surveyed
    models, then every other model of ``ranked`` (in its order) that the survey did not rule
    out: not surveyed (the budget was spent), not buildable on the meta device, or too large."""
    reasons = dict(ranked)
    order = covering_order(builds, sizes, needed)
    chosen = [
        (
            model,
            f"builds {', '.join(sorted(builds[model] & needed))} ({sizes[model]:,} parameters "
            f"on the meta device); {reasons[model]}",
        )
        for model in order
    ]
    taken = set(order) | ruled_out
    return chosen + [(model, why) for model, why in ranked if model not in taken]


def surveyed_candidates(
    ranked: list[tuple[str, str]],
    own_text: str,
    names: set[str],
    look: Look,
    store: SurveyStore,
    module_name: str,
    *,
    budget: int,
    choices: int,
    max_parameters: int,
    fallback_parameters: int | None = None,
) -> tuple[list[tuple[str, str]], Mapping[str, frozenset[str]] | None]:
    """The :func:`candidate_order` of ``ranked`` after a :func:`survey_in_order` for the
    classes of ``names`` that the module's text (``own_text``) defines, and what each surveyed
    model builds; ``ranked`` as it is and ``None`` when the module defines none of them
    (nothing to look for in a build)."""
    needed = names & set(re.findall(r"^class\s+(\w+)", own_text, re.MULTILINE))
    if not needed:
        return ranked, None
    builds, sizes, ruled_out = survey_in_order(
        [model for model, _ in ranked],
        look,
        store,
        module_name,
        needed,
        budget=budget,
        choices=choices,
        max_parameters=max_parameters,
        fallback_parameters=fallback_parameters,
    )
    return candidate_order(ranked, builds, sizes, ruled_out, needed), builds


def stored_look(
    store: SurveyStore, name: str, build: Callable[[str], dict[str, Any] | None]
) -> tuple[dict[str, list[str]], int] | None:
    """A :data:`Look` through ``store``: ``build(name)`` (a meta-device build's
    ``{"modules": ..., "parameters": ...}``, or ``None``) runs once per library version."""
    if name not in store:
        store.put(name, build(name))
    found = store.get(name)
    return None if found is None else (found["modules"], int(found["parameters"]))


def module_survey(look: Look, name: str, module_name: str) -> ModelSurvey | None:
    """What ``look`` saw model ``name`` build of ``module_name``'s classes, and its size."""
    found = look(name)
    if found is None:
        return None
    by_module, parameters = found
    return ModelSurvey(frozenset(by_module.get(module_name, ())), parameters)
