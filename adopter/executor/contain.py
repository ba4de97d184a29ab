"""Keep worker processes contained: nothing a worker starts outlives it.

A contained worker (:mod:`adopter.executor.contained`; verify's runs model code) can start
processes of its own: data-loader workers, a compiler, or a child that calls ``setsid()`` and so
leaves the worker's process group and session, which is all a plain ``killpg`` reaches. Each
worker is therefore started in a session of its own *and* with a random mark in its environment,
which every process it starts inherits.
When the worker ends (finished, crashed or timed out) every process that is in its process group
or session, descends from it, or carries its mark is stopped (``SIGSTOP``, so that none can fork
while the rest are looked for) and then killed (``SIGKILL``).

Limits, said plainly: a process that clears its environment *and* leaves the session *and* is
re-parented away from the worker (a daemon that double-forks with an empty environment) is not
found; neither is one started through another service (``systemd-run``, ``ssh``). Finding
processes needs Linux's ``/proc``; elsewhere only the process group is killed. This contains
processes, not effects: there is no network, file-system or memory isolation (see README).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MARK_VARIABLE",
    "PARENT_VARIABLE",
    "contained_processes",
    "die_with_parent",
    "end_worker",
    "new_mark",
    "resident_bytes",
]

MARK_VARIABLE = "ADOPTER_CONTAINED_WORKER"
PARENT_VARIABLE = "ADOPTER_CONTAINED_PARENT"
_PR_SET_PDEATHSIG = 1
_PROC = Path("/proc")
_ROUNDS = 50  # a process that forks faster than we stop its children still ends in a few rounds


def new_mark() -> str:
    """A fresh, unguessable value for :data:`MARK_VARIABLE` (one per worker)."""
    return secrets.token_hex(12)


@dataclass(frozen=True)
class _Process:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str


def _read_stat(entry: Path) -> _Process | None:
    try:
        text = (entry / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:  # gone meanwhile, or not ours to read
        return None
    # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    if not head or len(fields) < 4:
        return None
    try:
        return _Process(int(entry.name), int(fields[1]), int(fields[2]), int(fields[3]), fields[0])
    except ValueError:
        return None


def _processes() -> dict[int, _Process]:
    found: dict[int, _Process] = {}
    try:
        entries = list(_PROC.iterdir())
    except OSError:
        return found
    for entry in entries:
        if entry.name.isdigit() and (process := _read_stat(entry)) is not None:
            found[process.pid] = process
    return found


def _carries_mark(pid: int, marker: bytes) -> bool:
    try:
        environment = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:  # another user's process, or gone
        return False
    return marker in environment.split(b"\0")


def contained_processes(leader: int, mark: str) -> set[int]:
    """Live processes that belong to the worker ``leader``: its process group and session,
    their descendants, and every process whose environment carries ``mark``."""
    processes = _processes()
    marker = f"{MARK_VARIABLE}={mark}".encode()
    members = {p.pid for p in processes.values() if leader in (p.pgid, p.sid)}
    members |= {pid for pid in processes if _carries_mark(pid, marker)}
    children: dict[int, list[int]] = defaultdict(list)
    for process in processes.values():
        children[process.ppid].append(process.pid)
    pending = list(members)
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in members:
                members.add(child)
                pending.append(child)
    own = {os.getpid(), os.getppid()}
    return {pid for pid in members if pid not in own and processes[pid].state != "Z"}


def resident_bytes(leader: int, mark: str) -> int:
    """Resident memory of the worker ``leader`` and everything it started, summed (pages that
    processes share, such as those a fork has not yet copied, count once per process, so the
    sum errs high). 0 where ``/proc`` is missing."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    for pid in contained_processes(leader, mark) | {leader}:
        try:
            fields = (_PROC / str(pid) / "statm").read_text(encoding="ascii").split()
        except OSError:  # gone meanwhile
            continue
        if len(fields) > 1 and fields[1].isdigit():
            total += int(fields[1]) * page
    return total


def die_with_parent() -> None:
    """Called by the worker first thing: on Linux, be killed when the process that started it
    dies without ending it (killed by force: ``kill -9`` of ``adopter``, a Ray worker that Ray
    kills), so the worker is never left running on its own. ``$ADOPTER_CONTAINED_PARENT`` names
    the parent, to catch one that died before this call. What the worker itself started is not
    covered (see the module's limits); a parent that ends normally kills all of it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):  # not Linux
        return
    parent = os.environ.get(PARENT_VARIABLE, "")
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def end_worker(leader: int, mark: str) -> int:
    """Stop, then kill, the worker ``leader`` and everything it started; the number of
    processes killed (the worker itself included when it was still running)."""
    try:
        os.killpg(leader, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        pass
    stopped: set[int] = set()
    if _PROC.is_dir():
        for _ in range(_ROUNDS):
            found = contained_processes(leader, mark) - stopped
            if not found:
                break
            for pid in found:
                _signal(pid, signal.SIGSTOP)
            stopped |= found
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    try:
        os.killpg(leader, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return len(stopped)
