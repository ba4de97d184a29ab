"""Which patched sites ran: count each kernel call by the call site it came from (worker side).

Only the module object that verify loaded from the patched text is instrumented: each kernel
name in its namespace is swapped for a recorder that looks at its caller's frame (code object
and instruction, whose source span Python 3.11+ reports exactly), counts the site whose span
that is, and calls the kernel. The patched *text*, and so the code a user runs, is not changed.
A class-building kernel (``fused_bert_self_attention(BertSelfAttention)``) gets, per site, a
subclass of the class it builds whose ``forward`` counts and then runs the kernel's own; a site
of that kind counts when such a module runs, not when it is built.

Each counted call also notes the backends the kernel dispatched to
(``adopter.kernels.backends.recording``: ``op=backend``, ``op=original`` when none took the
call), so a verdict names what ran; kernels without alternatives note nothing.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import CodeType, FrameType, ModuleType
from typing import Any

from ..dsl.declared import KERNEL_PACKAGE
from ..models.sites import PatchedSite

__all__ = ["SiteRecorder"]


@contextmanager
def _nothing() -> Iterator[list[tuple[str, str]]]:
    yield []


class SiteRecorder:
    """Counts kernel calls per site for the modules it is installed in."""

    def __init__(self, sites: Iterable[PatchedSite], files: Iterable[str] = ()) -> None:
        self.sites = list(sites)
        # Sites without a file are those of the one patched file (its path is only known in
        # the worker): "*" matches any instrumented file.
        self._by_position = {(site.file or "*", site.position): site.key for site in self.sites}
        self._by_line: dict[tuple[str, int], list[str]] = {}
        for site in self.sites:
            for line in range(site.line, site.end_line + 1):
                self._by_line.setdefault((site.file or "*", line), []).append(site.key)
        self.counts: Counter[str] = Counter()
        # per site, "op=backend" -> calls (read per mode by ``backends_since``)
        self.backends: dict[str, Counter[str]] = {}
        self.unattributed = 0
        self._files: set[str] = {str(file) for file in files}
        self._positions: dict[CodeType, list[tuple[Any, ...]]] = {}
        self._classes: dict[tuple[type, str], type] = {}

    # -- installing --------------------------------------------------------------------------
    @contextmanager
    def intercepting(self) -> Iterator[None]:
        """While the patched module executes: ``from adopter.kernels import x`` binds recorders,
        so that kernel calls made at import time (a module-level
        ``Attention = fused_bert_self_attention(Attention)``) are seen too."""
        package = importlib.import_module(KERNEL_PACKAGE)
        saved = {}
        for name in getattr(package, "__all__", []):
            value = getattr(package, name, None)
            if callable(value) and not isinstance(value, type):
                saved[name] = value
                setattr(package, name, self._recording(value))
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(package, name, value)

    def install(self, module: ModuleType) -> list[str]:
        """Swap the kernels in ``module``'s namespace for recorders; the names swapped."""
        file = getattr(module, "__file__", None)
        if file:
            self._files.add(file)
        swapped = []
        for name, value in list(vars(module).items()):
            owner = getattr(value, "__module__", "") or ""
            if callable(value) and owner.startswith(KERNEL_PACKAGE) and not isinstance(value, type):
                if getattr(value, "__adopter_recorder__", None) is self:
                    continue
                setattr(module, name, self._recording(value))
                swapped.append(name)
        return swapped

    def _recording(self, kernel: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(kernel)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            key = self._locate(sys._getframe(1))
            if key is None:
                self.unattributed += 1
                return kernel(*args, **kwargs)
            with self._dispatches() as dispatched:
                result = kernel(*args, **kwargs)
            if isinstance(result, type):  # a class-building kernel: count when it runs
                return self._site_class(result, key)
            self.counts[key] += 1
            if dispatched:
                noted = self.backends.setdefault(key, Counter())
                noted.update(f"{op}={backend}" for op, backend in dispatched)
            return result

        recorded.__adopter_recorder__ = self  # type: ignore[attr-defined]
        return recorded

    @staticmethod
    def _dispatches() -> Any:
        """The kernels' dispatch record (a list filled while the call runs), read from the
        kernel package the model code imported; a package without backends records nothing."""
        dispatch = sys.modules.get(f"{KERNEL_PACKAGE}.backends")
        recording = getattr(dispatch, "recording", None)
        return recording() if recording is not None else _nothing()

    def _site_class(self, built: type, key: str) -> type:
        cached = self._classes.get((built, key))
        if cached is not None:
            return cached
        inner = built.forward  # type: ignore[attr-defined]
        counts = self.counts

        @functools.wraps(inner)
        def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return inner(module, *args, **kwargs)

        namespace = {
            "forward": forward,
            "__module__": built.__module__,
            "__qualname__": built.__qualname__,
            # A kernel class may reduce itself to the plain kernel class (for pickling);
            # verify deep-copies models, and a copy must keep counting for this site.
            "__reduce_ex__": object.__reduce_ex__,
        }
        cached = self._classes[(built, key)] = type(built.__name__, (built,), namespace)
        return cached

    # -- locating ----------------------------------------------------------------------------
    def _locate(self, frame: FrameType | None) -> str | None:
        """The site a kernel was called from: the calling instruction's exact source span,
        else the one site on its line."""
        if frame is None or frame.f_code.co_filename not in self._files:
            return None
        code = frame.f_code
        positions = self._positions.get(code)
        if positions is None:
            positions = self._positions[code] = list(code.co_positions())
        index = frame.f_lasti // 2
        for file in (code.co_filename, "*"):
            if 0 <= index < len(positions):
                key = self._by_position.get((file, tuple(positions[index])))
                if key is not None:
                    return key
            candidates = self._by_line.get((file, frame.f_lineno or 0), [])
            if len(candidates) == 1:
                return candidates[0]
        return None

    # -- reading -----------------------------------------------------------------------------
    def snapshot(self) -> Counter[str]:
        return Counter(self.counts)

    def backends_snapshot(self) -> dict[str, Counter[str]]:
        return {key: Counter(noted) for key, noted in self.backends.items()}

    def backends_since(self, before: dict[str, Counter[str]]) -> dict[str, dict[str, int]]:
        """Per site, the backends its calls dispatched to since ``before``."""
        found = {}
        for key, noted in self.backends.items():
            earlier = before.get(key, Counter())
            new = {name: n - earlier[name] for name, n in noted.items() if n > earlier[name]}
            if new:
                found[key] = new
        return found

    def since(self, before: Counter[str]) -> dict[str, int]:
        """Calls per site since ``before`` (sites that did not run are left out)."""
        return {key: n - before.get(key, 0) for key, n in self.counts.items() if n > before[key]}
