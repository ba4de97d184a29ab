"""Run tasks on a Ray cluster (``pip install 'adopter[ray]'``).

Each task is one Ray task: a streaming generator that first reports where it started, then
yields the work function's result for its payload. Knowing when a task *started* (not when it
was queued) lets the driver hold it to its own timeout: the work function enforces the timeout
itself (verify kills its contained worker process tree at it), and a task still running
``grace`` seconds later is cancelled from here as a backstop.

Placement:

* ``"task"`` (verify): every task is submitted at once with ``num_cpus=1`` and its ``memory``
  reserved, and Ray's scheduler spreads them over the cluster as CPUs free up.
* ``"node"`` (bench): one task per node at a time. The driver pins each task to a free node
  (hard node affinity) and reserves ``num_cpus`` = all of that node's CPUs, so no other Ray task
  - of this run or another job - shares a node with a timed benchmark, whatever the nodes' sizes.
  (A custom resource would do the same but needs every node started with it; ``num_cpus`` of a
  fixed size would let two tasks share a bigger node.)

Failures: a task whose Ray worker crashed or whose node died (``WorkerCrashedError``,
``NodeDiedError``, an out-of-memory kill, ...) is started once more, then reported with the
reason; an exception raised by the work function, a runtime environment that cannot be set up,
or a cancellation is reported at once. Ctrl-C cancels every task (running ones get a
``KeyboardInterrupt``, so they end what they started; ones that do not end within seconds are
killed) and shuts down the Ray instance this executor started.

Runtime environment: the ``adopter`` package of this process travels with every task as a Ray
``py_modules`` entry, so nodes run this very revision without installing it and verify's worker
subprocess finds it on its ``PYTHONPATH``; the nodes must have torch and the model library
installed (or get them from the ``runtime_env`` given here: ``pip``, ``uv``, ``conda``,
``image_uri``). ``working_dir`` is not used by default: it would upload the current directory
(often a repository with virtual environments) and change the task's working directory.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import Executor, ExecutorUnavailable, Task, TaskResult, WorkFunction

__all__ = ["PLACEMENTS", "RayExecutor", "import_ray"]

PLACEMENTS = ("task", "node")
INSTALL_HINT = "Ray is not installed here: pip install 'adopter[ray]'"
_WAIT_SECONDS = 0.5
_CANCEL_WAIT_SECONDS = 10.0
_NODE_REFRESH_SECONDS = 5.0
_ADOPTER_PACKAGE = Path(__file__).resolve().parents[1]


def import_ray() -> Any:
    """The ``ray`` module, or :class:`ExecutorUnavailable` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ExecutorUnavailable(INSTALL_HINT) from None
    return ray


def _remote_task(function: WorkFunction, payload: Any) -> Iterator[tuple[str, Any]]:
    """The body of every Ray task: say where it runs, then the work function's one result.

    ``ray.cancel`` raises ``KeyboardInterrupt`` in here; it passes through the work function,
    whose ``finally`` blocks end the processes it started.
    """
    import ray

    node = ray.get_runtime_context().get_node_id()
    yield "started", f"{socket.gethostname()} (node {node[:8]}, pid {os.getpid()})"
    results = function([payload], threading.Event())
    try:
        for value in results:
            yield "value", value
            return
    finally:
        # Close it now: its ``finally`` blocks (verify's scratch folder, its contained worker)
        # ran only when the suspended generator was collected, and a Ray worker that something
        # kept it alive in, or that was ended first, left /tmp/adopter-verify-* behind.
        close = getattr(results, "close", None)
        if close is not None:
            close()
    raise RuntimeError("the work function yielded no result")


@dataclass
class _Attempt:
    index: int
    number: int
    submitted: float
    started: float | None = None
    where: str = "(not started)"
    node: str | None = None
    cancelled_at: float | None = None
    timed_out: bool = False


class RayExecutor(Executor):
    """Tasks as Ray tasks on the cluster at ``address`` (``None``: ``ray.init()`` here).

    ``cpus`` sizes a Ray instance started here (default: all CPUs); it cannot be given with an
    address. ``runtime_env`` is merged with the ``py_modules`` entry that carries adopter and
    becomes the job's runtime environment. Where this process is already connected to Ray
    (``ray.init`` called by the caller), that connection and its runtime environment are used
    as they are, and left open.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        cpus: int | None = None,
        placement: str = "task",
        runtime_env: dict[str, Any] | None = None,
        retries: int = 1,
        grace: float = 30.0,
    ) -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if address and cpus is not None:
            raise ValueError("cpus sizes a Ray instance started here; not with an address")
        self.address = address or None
        self.cpus = cpus
        self.placement = placement
        self.retries = retries
        self.grace = grace
        self.runtime_env = _with_adopter(runtime_env or {})
        self._ray: Any = None
        self._owns_ray = False

    # -- connection ------------------------------------------------------------------------

    def __enter__(self) -> RayExecutor:
        self._connect()
        return self

    def _connect(self) -> Any:
        if self._ray is not None:
            return self._ray
        ray = import_ray()
        if not ray.is_initialized():
            # Ray uploads local folders (py_modules) only for a whole job, at ray.init.
            options: dict[str, Any] = {
                "include_dashboard": False,
                "logging_level": "warning",
                "runtime_env": self.runtime_env,
            }
            if self.cpus is not None:
                options["num_cpus"] = self.cpus
            try:
                ray.init(address=self.address, **options)
            except (ConnectionError, RuntimeError, ValueError) as error:
                where = self.address or "this machine"
                message = f"cannot start or reach Ray at {where}: {error}"
                raise ExecutorUnavailable(message) from None
            self._owns_ray = True
        self._ray = ray
        return ray

    def close(self) -> None:
        if self._ray is not None and self._owns_ray:
            self._ray.shutdown()
        self._ray, self._owns_ray = None, False

    def _alive_nodes(self) -> dict[str, tuple[str, int]]:
        """Alive nodes with CPUs: node id -> (host name, CPU count)."""
        nodes = {}
        for node in self._connect().nodes():
            cpus = int(node.get("Resources", {}).get("CPU", 0))
            if node.get("Alive") and cpus >= 1:
                nodes[node["NodeID"]] = (node.get("NodeManagerHostname", "?"), cpus)
        return nodes

    @property
    def workers(self) -> int:
        if self.placement == "node":
            return max(1, len(self._alive_nodes()))
        return max(1, int(self._connect().cluster_resources().get("CPU", 1)))

    def describe(self) -> str:
        nodes = self._alive_nodes()
        cpus = sum(count for _, count in nodes.values())
        where = f"at {self.address}" if self.address else "started on this machine"
        unit = "one task per node" if self.placement == "node" else "one task per CPU"
        size = f"{len(nodes)} node(s), {cpus} CPU(s)"
        return f"Ray {self._ray.__version__} cluster {where}: {size}, {unit}"

    # -- running ---------------------------------------------------------------------------

    def _submit(self, function: WorkFunction, task: Task[Any], node: tuple[str, int] | None) -> Any:
        ray = self._ray
        options: dict[str, Any] = {"max_retries": 0}
        if node is None:
            options["num_cpus"] = 1
            if task.memory:
                options["memory"] = int(task.memory)
        else:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["num_cpus"] = node[1]
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node[0], soft=False)
        remote = ray.remote(_remote_task).options(**options)
        return remote.remote(function, task.payload)

    def run(self, function: WorkFunction, tasks: Sequence[Task[Any]]) -> Iterator[TaskResult]:
        ray = self._connect()
        by_node = self.placement == "node"
        queued: deque[tuple[int, int]] = deque((index, 1) for index in range(len(tasks)))
        reasons: dict[int, str] = {}
        flying: dict[Any, _Attempt] = {}
        answered: list[Any] = []  # tasks whose value is here, still ending what they started
        nodes: dict[str, tuple[str, int]] = {}
        busy: set[str] = set()
        refreshed = 0.0

        def launch(index: int, number: int, node: str | None) -> None:
            spec = (node, nodes[node][1]) if node is not None else None
            generator = self._submit(function, tasks[index], spec)
            flying[generator] = _Attempt(index, number, time.monotonic(), node=node)
            if node is not None:
                busy.add(node)

        def result(attempt: _Attempt, value: Any, failure: str | None) -> TaskResult:
            begun = attempt.started or attempt.submitted
            task = tasks[attempt.index]
            seconds = time.monotonic() - begun
            return TaskResult(
                attempt.index, task.label, value, failure, attempt.number, seconds, attempt.where
            )

        finished = False
        try:
            while queued or flying:
                now = time.monotonic()
                if by_node:
                    if now - refreshed > _NODE_REFRESH_SECONDS or not nodes:
                        nodes, refreshed = self._alive_nodes(), now
                        busy &= set(nodes)
                    if not nodes and not flying:
                        while queued:
                            index, number = queued.popleft()
                            reason = reasons.get(index, "no alive Ray node with CPUs")
                            yield result(_Attempt(index, number, now), None, reason)
                        break
                    for node in [n for n in nodes if n not in busy]:
                        if not queued:
                            break
                        launch(*queued.popleft(), node)
                else:
                    while queued:
                        launch(*queued.popleft(), None)
                self._enforce_timeouts(tasks, flying)
                if not flying:
                    time.sleep(_WAIT_SECONDS)
                    continue
                ready, _ = ray.wait(list(flying), num_returns=1, timeout=_WAIT_SECONDS)
                for generator in ready:
                    attempt = flying.pop(generator)
                    kind, data = self._next(generator, attempt)
                    if kind == "started":
                        attempt.started, attempt.where = time.monotonic(), str(data)
                        flying[generator] = attempt
                        continue
                    if attempt.node is not None:
                        busy.discard(attempt.node)
                    if kind == "value":
                        answered.append(generator)
                        yield result(attempt, data, None)
                    elif kind == "died" and attempt.number <= self.retries:
                        reasons[attempt.index] = str(data)
                        refreshed = 0.0  # its node may be gone: look again before placing
                        queued.appendleft((attempt.index, attempt.number + 1))
                    elif kind == "died":
                        earlier = reasons.get(attempt.index)
                        text = f"the Ray worker died: {data}"
                        if earlier is not None:
                            text = (
                                f"the Ray worker died twice (retried once): {earlier}; then {data}"
                            )
                        yield result(attempt, None, text)
                    else:
                        yield result(attempt, None, str(data))
            finished = True
        finally:
            if not finished:
                self._cancel_all(flying)
            self._await_endings(answered)

    def _next(self, generator: Any, attempt: _Attempt) -> tuple[str, Any]:
        """The next item of a ready task: ``started``, ``value``, ``died`` or ``failed``."""
        ray = self._ray
        errors = ray.exceptions
        try:
            kind, data = ray.get(next(generator))
            return kind, data
        except StopIteration:
            return "failed", "the Ray task ended without a result"
        except errors.RayError as error:
            if attempt.timed_out:  # killed by _enforce_timeouts (Ray may call it either way)
                limit = (attempt.cancelled_at or 0.0) - (attempt.started or attempt.submitted)
                return "failed", f"timed out: the Ray task still ran {limit:.0f} s after it started"
            if isinstance(error, errors.TaskCancelledError):
                return "failed", "cancelled"
            return self._classify(error)

    def _classify(self, error: Exception) -> tuple[str, str]:
        """``failed`` for what another start would not change (the work function raised, the
        runtime environment cannot be set up); ``died`` for a crashed worker, a dead node, an
        out-of-memory kill or a lost object, which another start may get past."""
        errors = self._ray.exceptions
        if isinstance(error, errors.RuntimeEnvSetupError):
            return "failed", f"the Ray runtime environment could not be set up: {error}"
        if isinstance(error, errors.RayTaskError):
            cause = getattr(error, "cause", None) or error
            return "failed", f"the task raised {type(cause).__name__}: {cause}"
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return "died", f"{type(error).__name__}: {first}"

    def _enforce_timeouts(self, tasks: Sequence[Task[Any]], flying: dict[Any, _Attempt]) -> None:
        """Kill tasks still running ``grace`` seconds past their timeout.

        The work function holds its own timeout (verify's loop checks it every 50 ms), so a task
        still running here is stuck where ``KeyboardInterrupt`` cannot reach it (in a long call
        into C); Ray honours one cancel request per task, so this one forces: the Ray worker is
        killed, and verify's worker process dies with it (it asked the kernel to).
        """
        now = time.monotonic()
        for generator, attempt in flying.items():
            timeout = tasks[attempt.index].timeout
            if timeout is None or attempt.started is None or attempt.cancelled_at is not None:
                continue
            if now - attempt.started > timeout + self.grace:
                attempt.timed_out, attempt.cancelled_at = True, now
                self._ray.cancel(generator, force=True)

    def _await_endings(self, answered: list[Any]) -> None:
        """Wait (a few seconds at most) for tasks that gave their value to end: each still
        closes its work function (verify ends its worker and removes its scratch folder), and
        a job that disconnects first has Ray kill them midway, leaving the folder behind."""
        if self._ray is not None and answered:
            ends = [generator.completed() for generator in answered]
            self._ray.wait(ends, num_returns=len(ends), timeout=_CANCEL_WAIT_SECONDS)

    def _cancel_all(self, flying: dict[Any, _Attempt]) -> None:
        """Cancel every task: queued ones are dropped, running ones get ``KeyboardInterrupt``
        and end what they started (verify's loop kills its worker tree). Waits a few seconds
        for them; a task that does not end by then goes with the Ray instance this executor
        started (``close``), or with this job when it disconnects from a cluster."""
        ray = self._ray
        if ray is None or not flying:
            return
        for generator in flying:
            ray.cancel(generator)
        # A cancelled stream reads as ready at once; its task's completion is what tells.
        ends = [generator.completed() for generator in flying]
        ray.wait(ends, num_returns=len(ends), timeout=_CANCEL_WAIT_SECONDS)


def _with_adopter(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with this adopter package added to ``py_modules``."""
    merged = dict(runtime_env)
    modules = list(merged.get("py_modules") or [])
    if str(_ADOPTER_PACKAGE) not in modules:
        modules.append(str(_ADOPTER_PACKAGE))
    merged["py_modules"] = modules
    return merged
