"""Verification and benchmarks on a local Ray cluster of three one-CPU nodes started here.

The same verification runs on the local pool and on the cluster and must give identical
verdicts, a crashing and a hanging factory included; a Ray worker that dies is started once more
and then reported; a task that overruns its timeout is cancelled; one-per-node placement never
puts two tasks on a node at once; Ctrl-C leaves no worker behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from adopter.executor import LocalExecutor, Task  # noqa: E402
from adopter.executor.ray_cluster import RayExecutor  # noqa: E402
from adopter.verify import VerifyOptions, verify_factories  # noqa: E402

pytestmark = pytest.mark.slow  # see pyproject.toml's markers

ROOT = Path(__file__).resolve().parents[2]
FACTORIES = ROOT / "tests" / "verify" / "factories.py"
GUARDED = ROOT / "tests" / "verify" / "guarded" / "modeling_guarded.py"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token file written for a test
    started = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    for _ in range(2):
        started.add_node(num_cpus=1)
    started.wait_for_nodes()
    # The work functions below live in this test module, which Ray workers cannot import by
    # name: send them by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield started
    if ray.is_initialized():
        ray.shutdown()
    started.shutdown()


# -- work functions (run on the cluster) -----------------------------------------------------


def die_until_marked(payloads: Sequence[str], stop: threading.Event) -> Iterator[str]:
    """Kill the Ray worker the first time (and every time, for an 'always' payload)."""
    marker = Path(payloads[0])
    if marker.name == "always" or not marker.exists():
        marker.touch()
        os._exit(1)
    yield "second start"


def overrun(payloads: Sequence[float], stop: threading.Event) -> Iterator[float]:
    """Ignore the timeout: the executor's backstop must end the task."""
    time.sleep(payloads[0])
    yield payloads[0]


def hold_node(payloads: Sequence[float], stop: threading.Event) -> Iterator[tuple]:
    began = time.time()
    time.sleep(payloads[0])
    yield ray.get_runtime_context().get_node_id(), began, time.time()


KEPT: list[Iterator[str]] = []  # in the Ray worker: what keeps a finished task's generator alive


def clean_up_when_closed(payloads: Sequence[str], stop: threading.Event) -> Iterator[str]:
    """Make a folder and remove it in a ``finally``, as verify's scratch folder is; the
    generator is kept referenced in the worker, as something of Ray's may keep it, so only an
    explicit close runs that ``finally``."""

    def run() -> Iterator[str]:
        folder = Path(payloads[0])
        folder.mkdir()
        try:
            yield "made"
        finally:
            folder.rmdir()

    running = run()
    KEPT.append(running)
    return running


# -- the tests -------------------------------------------------------------------------------


def test_a_finished_task_s_clean_up_runs_before_its_result_is_back(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Each suite run left one or two /tmp/adopter-verify-* folders of verify jobs run here.
    folder = tmp_path / "scratch"
    with RayExecutor(cluster.address) as executor:
        (result,) = executor.run(clean_up_when_closed, [Task(str(folder), "scratch")])
    assert result.value == "made"
    assert not folder.exists()


def test_a_dead_worker_is_started_once_more_then_reported(cluster: Cluster, tmp_path: Path) -> None:
    tasks = [Task(str(tmp_path / "once"), "once"), Task(str(tmp_path / "always"), "always")]
    with RayExecutor(cluster.address) as executor:
        results = {r.label: r for r in executor.run(die_until_marked, tasks)}
    assert results["once"].value == "second start"
    assert results["once"].attempts == 2
    assert results["always"].value is None and results["always"].attempts == 2
    assert results["always"].failure.startswith("the Ray worker died twice (retried once)")
    assert "WorkerCrashedError" in results["always"].failure


def test_a_task_past_its_timeout_is_cancelled(cluster: Cluster) -> None:
    started = time.monotonic()
    with RayExecutor(cluster.address, grace=1.0) as executor:
        (result,) = executor.run(overrun, [Task(60.0, "stuck", timeout=1.0)])
    assert result.value is None
    assert result.failure.startswith("timed out")
    assert time.monotonic() - started < 30


def test_one_task_per_node_at_a_time_on_every_node(cluster: Cluster) -> None:
    tasks = [Task(1.0, f"job{n}") for n in range(6)]
    with RayExecutor(cluster.address, placement="node") as executor:
        assert executor.workers == 3
        spans = [r.value for r in executor.run(hold_node, tasks)]
    assert all(spans)
    assert len({node for node, _, _ in spans}) == 3
    for node in {node for node, _, _ in spans}:
        mine = sorted((begin, end) for n, begin, end in spans if n == node)
        assert all(later[0] >= earlier[1] for earlier, later in zip(mine, mine[1:]))


def _pairs() -> list[tuple[str, str]]:
    original = f"{FACTORIES}:make_original"
    return [
        (original, f"{FACTORIES}:{name}")
        for name in ("make_patched", "make_wrong", "make_crashing")
    ]


def test_factories_give_the_same_verdicts_on_the_cluster_as_here(cluster: Cluster) -> None:
    # A generous timeout: on a loaded machine a worker's first torch import alone can take
    # seconds, and a verdict that depends on the load is not the one under test. The timeout
    # path on the cluster is test_a_task_past_its_timeout_is_cancelled's.
    options = VerifyOptions(timeout=120.0, modes=("eval",))
    here = verify_factories(_pairs(), options, executor=LocalExecutor(1))
    heard: list[int] = []
    with RayExecutor(cluster.address) as executor:
        there = verify_factories(
            _pairs(), options, executor=executor, on_result=lambda i, _: heard.append(i)
        )
    statuses = [v.status for v in here]
    assert statuses == ["verified", "refuted", "not checkable"]
    assert "exited with code 3" in here[2].reason
    assert [(v.cls, v.status, v.reason) for v in there] == [
        (v.cls, v.status, v.reason) for v in here
    ]
    assert sorted(heard) == [0, 1, 2]


def test_the_command_reports_the_same_rows_on_the_cluster(cluster: Cluster) -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers")
    from typer.testing import CliRunner

    from adopter.cli import app

    command = ["verify", str(GUARDED), "--select", "paper.4", "--modes", "eval", "-f", "jsonl"]

    def rows(extra: list[str]) -> list[dict]:
        result = CliRunner().invoke(app, command + extra)
        assert result.exit_code == 0, result.output
        found = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
        return [{k: v for k, v in row.items() if k != "seconds"} for row in found]

    here, there = rows([]), rows(["--executor", f"ray:{cluster.address}"])
    assert there == here
    assert [row["status"] for row in here if row["kind"] == "file"] == ["not exercised"]


def _hanging_factory(tmp_path: Path) -> str:
    source = tmp_path / "hang.py"
    source.write_text(
        "import os, time\n"
        "from pathlib import Path\n"
        "def make():\n"
        "    Path(__file__).with_name('pid').write_text(str(os.getpid()))\n"
        "    time.sleep(600)\n",
        encoding="utf-8",
    )
    return f"{source}:make"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_ctrl_c_leaves_no_worker_behind(cluster: Cluster, tmp_path: Path, executor: str) -> None:
    hang = _hanging_factory(tmp_path)
    spec = executor if executor == "local" else f"ray:{cluster.address}"
    process = subprocess.Popen(
        [sys.executable, "-m", "adopter", "verify", "--factory", hang, "--patched-factory"]
        + [hang, "--executor", spec, "--timeout", "300"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        # A background job of a non-interactive shell ignores SIGINT; Ctrl-C must not be.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    pid_file = tmp_path / "pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert pid_file.exists(), process.communicate()[1].decode()[-2000:]
    worker = int(pid_file.read_text())
    assert _alive(worker)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=30)
    assert process.returncode != 0
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)
