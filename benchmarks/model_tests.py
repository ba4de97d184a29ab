"""Run transformers' own model tests on the installed release and on a copy patched by Adopter;
report every test that passes on the original and fails on the patched copy (docs/model-tests.md).

    python benchmarks/model_tests.py                      # fast tests (what transformers' CI runs)
    python benchmarks/model_tests.py --slow               # RUN_SLOW=1: TorchScript tests too
    python benchmarks/model_tests.py --tests-from /path/to/transformers@v4.34.0

The test files are not in the wheel, and the sdist on PyPI holds only the shared mixins
(``tests/test_modeling_common.py`` ...), not ``tests/models/``. They come from the release tag:
by default the tag's source archive is downloaded from GitHub; ``--tests-from`` takes a
checkout of the tag (a folder) or ``GIT_DIR@COMMIT`` (a clone, read with ``git archive``).
Whatever the source, every shared test file it holds must equal the sdist's copy (fetched with
pip), which proves the tree is the release's. Everything lands in the git-ignored
``.cache/model-tests/``; nothing fetched is committed.

The tests run in their own virtual environment (``.cache/model-tests/venv``: the pinned torch,
transformers and the pytest of that release's day - 4.34's ``testing_utils`` imports a helper
that pytest 8 removed). The patched side is a copy of that environment's transformers package
rewritten with ``adopter apply --write --rule-set all`` and put first on ``PYTHONPATH``;
both sides run offline (``HF_HUB_OFFLINE=1``, pipeline tests off), so tests that download a
checkpoint fail on both and are listed apart, not counted as regressions.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine  # noqa: E402

VERSION = "4.34.0"
MODELS = ("bert", "gpt2", "t5", "roberta", "albert", "distilbert", "gpt_neo", "resnet", "vit")
CACHE = ROOT / ".cache" / "model-tests"
ARCHIVE_URL = "https://github.com/huggingface/transformers/archive/refs/tags/v{version}.tar.gz"
# The test environment: the project's torch pin and the pytest of the release's day.
ENV_REQUIREMENTS = (
    "torch==2.13.0",
    f"transformers=={VERSION}",
    "pytest==7.4.4",
    "datasets",  # tests/pipelines/test_pipelines_common.py imports it at module level
    "parameterized",
    "timeout-decorator",
)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RUN_PIPELINE_TESTS": "0"}


class Unavailable(RuntimeError):
    """The test files (or the sdist that vouches for them) cannot be had here."""


# ---------------------------------------------------------------------------------------------
# The release's test files
# ---------------------------------------------------------------------------------------------


def needed(path: str, models: Sequence[str]) -> bool:
    """Whether a repository path is part of the test tree the model tests import."""
    parts = path.split("/")
    if path in ("conftest.py", "setup.cfg"):  # setup.cfg: the release's pytest settings
        return True
    if path in ("tests/utils/tiny_model_summary.json", "tests/models/__init__.py"):
        return True
    if parts[0] == "utils" and len(parts) > 1 and parts[1] == "test_module":
        return True  # tests/pipelines/test_pipelines_common.py imports utils/test_module
    if parts[0] != "tests":
        return False
    if len(parts) == 2:
        return path.endswith(".py")  # the shared mixins
    if parts[1] in ("generation", "pipelines"):
        return True
    return parts[1] == "models" and len(parts) > 3 and parts[2] in models


def _extract(archive: tarfile.TarFile, prefix: str, target: Path, models: Sequence[str]) -> int:
    count = 0
    for member in archive.getmembers():
        if not member.isfile() or not member.name.startswith(prefix):
            continue
        relative = member.name[len(prefix) :]
        if needed(relative, models):
            member.name = relative
            archive.extract(member, target, filter="data")
            count += 1
    return count


def fetch_sdist(cache: Path = CACHE) -> Path:
    """The release's sdist (downloaded once with pip) unpacked; its ``tests/`` holds the mixins."""
    unpacked = cache / f"sdist-{VERSION}"
    if (unpacked / ".complete").exists():
        return unpacked / f"transformers-{VERSION}"
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    command += ["--quiet", "--dest", str(downloads), f"transformers=={VERSION}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    sdist = downloads / f"transformers-{VERSION}.tar.gz"
    if done.returncode != 0 or not sdist.exists():
        last = (done.stderr or done.stdout).strip().splitlines()
        raise Unavailable(
            f"pip download transformers=={VERSION} failed: {last[-1] if last else ''}"
        )
    with tarfile.open(sdist) as archive:
        archive.extractall(unpacked, filter="data")
    (unpacked / ".complete").write_text(sdist.name)
    return unpacked / f"transformers-{VERSION}"


def _archive_from(source: str, work: Path) -> tuple[tarfile.TarFile, str]:
    """An open tar of the repository at the release and the prefix of its paths."""
    if source == "github":
        url = ARCHIVE_URL.format(version=VERSION)
        local = work / f"transformers-v{VERSION}.tar.gz"
        if not local.exists():
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    data = response.read()
            except OSError as error:
                raise Unavailable(f"cannot download {url}: {error}") from error
            local.write_bytes(data)
        return tarfile.open(local), f"transformers-{VERSION}/"
    git_dir, at, commit = source.rpartition("@")
    if at and Path(git_dir).is_dir():
        done = subprocess.run(
            ["git", "--git-dir", git_dir, "archive", "--format=tar", commit],
            capture_output=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise Unavailable(f"git archive {commit} in {git_dir}: {done.stderr.decode()[-300:]}")
        return tarfile.open(fileobj=io.BytesIO(done.stdout)), ""
    raise Unavailable(f"--tests-from {source!r}: not 'github', a folder, or GIT_DIR@COMMIT")


def _copy_folder(source: Path, target: Path, models: Sequence[str]) -> int:
    count = 0
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source).as_posix()
        if path.is_file() and needed(relative, models):
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / relative)
            count += 1
    return count


def check_against_sdist(tree: Path, sdist: Path) -> None:
    """Every shared test file of ``tree`` equals the sdist's: the tree is the release's."""
    shared = sorted((sdist / "tests").glob("*.py"))
    if not shared:
        raise Unavailable(f"the sdist at {sdist} holds no tests/*.py to compare with")
    for reference in shared:
        candidate = tree / "tests" / reference.name
        if not candidate.exists() or candidate.read_bytes() != reference.read_bytes():
            raise Unavailable(
                f"{candidate} differs from the {VERSION} sdist's copy: not the release's tests"
            )


def prepare_tests(source: str = "github", cache: Path = CACHE) -> Path:
    """The release's test tree (cached): conftest.py, tests/ (mixins, generation, pipelines and
    the listed models) and utils/test_module, checked against the sdist."""
    tree = cache / f"transformers-{VERSION}-tests"
    if (tree / ".complete").exists():
        return tree
    sdist = fetch_sdist(cache)
    partial = tree.with_name(tree.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if Path(source).is_dir():
        count = _copy_folder(Path(source), partial, MODELS)
    else:
        archive, prefix = _archive_from(source, cache)
        with archive:
            count = _extract(archive, prefix, partial, MODELS)
    expected = ["setup.cfg", *(f"tests/models/{m}/test_modeling_{m}.py" for m in MODELS)]
    missing = [path for path in expected if not (partial / path).exists()]
    if count == 0 or missing:
        raise Unavailable(f"{source}: no {', '.join(missing) or 'test files'}")
    check_against_sdist(partial, sdist)
    shutil.rmtree(tree, ignore_errors=True)
    partial.rename(tree)
    (tree / ".complete").write_text(source)
    return tree


# ---------------------------------------------------------------------------------------------
# Environment, patched copy, runs
# ---------------------------------------------------------------------------------------------


def ensure_env(cache: Path = CACHE) -> Path:
    """The test environment's python (created once)."""
    venv = cache / "venv"
    python = venv / "bin" / "python"
    marker = venv / ".complete"
    if marker.exists() and marker.read_text() == "\n".join(ENV_REQUIREMENTS):
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *ENV_REQUIREMENTS], check=True)
    marker.write_text("\n".join(ENV_REQUIREMENTS))
    return python


def installed_package(python: Path) -> Path:
    code = "import os, transformers; print(os.path.dirname(transformers.__file__))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def patched_copy(
    package: Path,
    work: Path,
    models: Sequence[str] | None = None,
    rule_set: str = "all",
    adopter_root: Path = ROOT,
) -> tuple[Path, str]:
    """A copy of ``package`` rewritten by ``adopter apply --write`` (the whole package, or only
    the folders of ``models``); returns its parent folder (for ``PYTHONPATH``) and apply's
    summary line."""
    parent = work / "patched"
    shutil.rmtree(parent, ignore_errors=True)
    parent.mkdir(parents=True)
    copy = parent / "transformers"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-m", "adopter", "apply", "--write", "--rule-set", rule_set]
    targets = [copy] if models is None else [copy / "models" / m for m in models]
    env = {**os.environ, "PYTHONPATH": str(adopter_root)}
    done = subprocess.run(
        [*command, *map(str, targets)], capture_output=True, text=True, cwd=adopter_root, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"adopter apply failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = [line for line in done.stderr.splitlines() + done.stdout.splitlines() if line]
    return parent, " ".join(" ".join(summary[-2:]).split())


@dataclass
class SideResult:
    outcomes: dict[str, str]  # test id -> passed / failed / skipped
    messages: dict[str, str] = field(default_factory=dict)  # test id -> first failure line
    seconds: float = 0.0

    def counts(self, model: str | None = None) -> Counter:
        return Counter(
            outcome
            for test, outcome in self.outcomes.items()
            if model is None or test.startswith(f"tests/models/{model}/")
        )


def _parse_junit(path: Path) -> SideResult:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    result = SideResult({}, seconds=sum(float(suite.get("time", 0)) for suite in suites))
    for case in root.iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        test_id = "/".join(parts[:-1]) + ".py::" + parts[-1] + "::" + case.get("name", "")
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                text = (child.get("message") or child.text or "").strip()
                result.messages[test_id] = text.splitlines()[0][:200] if text else child.tag
                break
            if child.tag == "skipped":
                outcome = "skipped"
        if outcome == "failed" or test_id not in result.outcomes:
            result.outcomes[test_id] = outcome
    return result


def run_side(
    python: Path,
    tree: Path,
    package_parent: Path,
    work: Path,
    name: str,
    slow: bool,
    models: Sequence[str] = MODELS,
    select: str | None = None,
    timeout: float = 3600,
    adopter_root: Path = ROOT,
) -> SideResult:
    """Run the model test files with ``package_parent`` first on the path."""
    run_dir = work / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(tree, run_dir, ignore=shutil.ignore_patterns(".complete"))
    # tests/test_pipeline_mixin.py reads the package through <checkout>/src/transformers.
    (run_dir / "src").mkdir()
    (run_dir / "src" / "transformers").symlink_to(package_parent / "transformers")
    junit = work / "runs" / f"{name}.xml"
    files = [f"tests/models/{m}/test_modeling_{m}.py" for m in models]
    command = [str(python), "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-W", "ignore"]
    command += ["--junitxml", str(junit), "-o", "junit_family=xunit1", "--rootdir", str(run_dir)]
    if select:
        command += ["-k", select]
    env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": f"{package_parent}{os.pathsep}{adopter_root}"}
    env["RUN_SLOW"] = "1" if slow else "0"
    env.setdefault("OMP_NUM_THREADS", "1")  # the two sides run side by side
    env.pop("PYTHONHOME", None)
    done = subprocess.run(
        command, cwd=run_dir, env=env, capture_output=True, text=True, timeout=timeout
    )
    if not junit.exists():
        raise RuntimeError(
            f"pytest ({name}) wrote no report: {(done.stdout + done.stderr)[-2000:]}"
        )
    result = _parse_junit(junit)
    return result


@dataclass
class Comparison:
    original: SideResult
    patched: SideResult

    def ids(self) -> list[str]:
        return sorted(set(self.original.outcomes) | set(self.patched.outcomes))

    def regressions(self) -> list[str]:
        """Tests that pass on the original and do not pass on the patched copy."""
        return [
            t
            for t in self.ids()
            if self.original.outcomes.get(t) == "passed"
            and self.patched.outcomes.get(t) != "passed"
        ]

    def fixed(self) -> list[str]:
        return [
            t
            for t in self.ids()
            if self.original.outcomes.get(t) == "failed"
            and self.patched.outcomes.get(t) == "passed"
        ]

    def failing_on_both(self) -> list[str]:
        return [
            t
            for t in self.ids()
            if self.original.outcomes.get(t) == "failed"
            and self.patched.outcomes.get(t) == "failed"
        ]


def compare(
    python: Path,
    tree: Path,
    work: Path,
    slow: bool,
    models: Sequence[str] = MODELS,
    select: str | None = None,
    patch_whole_package: bool = True,
    adopter_root: Path = ROOT,
) -> tuple[Comparison, str]:
    """Original and patched runs of the same tests, and apply's summary line."""
    package = installed_package(python)
    patched_parent, summary = patched_copy(
        package, work, None if patch_whole_package else models, adopter_root=adopter_root
    )
    tag = "slow" if slow else "fast"
    sides = {"original": package.parent, "patched": patched_parent}
    # The two sides are independent processes: run them side by side.
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            name: pool.submit(
                run_side,
                python,
                tree,
                parent,
                work,
                f"{name}-{tag}",
                slow,
                models,
                select,
                adopter_root=adopter_root,
            )
            for name, parent in sides.items()
        }
        results = {name: future.result() for name, future in futures.items()}
    return Comparison(results["original"], results["patched"]), summary


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _row(counts: Counter) -> str:
    return f"{counts['passed']} | {counts['failed']} | {counts['skipped']}"


def render(runs: dict[str, Comparison], metas: dict[str, dict]) -> str:
    lines = [
        "# transformers' own model tests on patched code",
        "",
        f"transformers {VERSION}'s own test files (`tests/models/<model>/test_modeling_<model>.py`"
        " with the shared mixins, from the release tag, checked against the sdist's copies) run "
        "against the installed package (**original**) and against a copy of it rewritten by "
        "`adopter apply --write --rule-set all` (**patched**). A **regression** is a test that "
        "passes on the original and fails on the patched copy. `fast` is what transformers' CI "
        "runs by default; `RUN_SLOW=1` adds the tests marked slow (4.34 marks its TorchScript "
        "tests slow). Both sides run offline, so tests that download a checkpoint fail on both.",
        "",
        "Each side runs in its own process, the two side by side (`OMP_NUM_THREADS=1`); the "
        "times are pytest's own.",
        "",
    ]
    for name in runs:
        meta = metas.get(name, {})
        lines += [
            f"**{name}**: `{meta.get('command', '(command not recorded)')}`  ",
            f"Machine: {meta.get('machine', describe_machine())}  ",
            f"Patched copy: {meta.get('summary', '(not recorded)')}",
            "",
        ]
    lines += [
        "## Summary",
        "",
        "| run | original passed | failed | skipped | patched passed | failed | skipped "
        "| regressions | fixed | time original / patched |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, comparison in runs.items():
        o, p = comparison.original, comparison.patched
        lines.append(
            f"| {name} | {_row(o.counts())} | {_row(p.counts())} "
            f"| **{len(comparison.regressions())}** | {len(comparison.fixed())} "
            f"| {o.seconds:.0f} s / {p.seconds:.0f} s |"
        )
    for name, comparison in runs.items():
        lines += ["", f"## {name}: per model", ""]
        lines += [
            "| model | original passed | failed | skipped | patched passed | failed | skipped |"
        ]
        lines += ["|---|---|---|---|---|---|---|"]
        for model in MODELS:
            o, p = comparison.original.counts(model), comparison.patched.counts(model)
            if o or p:
                lines.append(f"| {model} | {_row(o)} | {_row(p)} |")
        regressions = comparison.regressions()
        lines += ["", f"Regressions: {len(regressions) or 'none'}", ""]
        for test in regressions:
            message = comparison.patched.messages.get(test, comparison.patched.outcomes.get(test))
            lines.append(f"- `{test}`: {message}")
        both = comparison.failing_on_both()
        if both:
            lines += ["", "Failing on the original and on the patched copy alike:", ""]
            for test in both:
                lines.append(f"- `{test}`: {comparison.original.messages.get(test, '')}")
    return "\n".join(lines) + "\n"


RUN_NAMES = {"fast": "fast", "slow": "RUN_SLOW=1"}


def _meta_path(work: Path, tag: str) -> Path:
    return work / "runs" / f"{tag}.json"


def load_runs(work: Path, tags: Sequence[str]) -> tuple[dict[str, Comparison], dict[str, dict]]:
    """The comparisons (and their commands) of earlier runs, from their JUnit reports."""
    runs: dict[str, Comparison] = {}
    metas: dict[str, dict] = {}
    for tag in tags:
        files = [work / "runs" / f"{side}-{tag}.xml" for side in ("original", "patched")]
        if not all(path.exists() for path in files):
            raise Unavailable(f"no reports of a {tag} run in {work / 'runs'}")
        runs[RUN_NAMES[tag]] = Comparison(*(_parse_junit(path) for path in files))
        meta = _meta_path(work, tag)
        metas[RUN_NAMES[tag]] = json.loads(meta.read_text()) if meta.exists() else {}
    return runs, metas


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests-from", default="github", help="github, a folder, or GIT@COMMIT")
    parser.add_argument("--slow", action="store_true", help="also a run with RUN_SLOW=1")
    parser.add_argument("--runs", help="fast, slow or fast,slow (default: fast; --slow: both)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("-k", dest="select", help="pytest -k expression (a subset)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "model-tests.md"))
    parser.add_argument("--work", default=str(CACHE), help="folder for the patched copy and runs")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: write the report from the runs' JUnit files in --work",
    )
    parser.add_argument(
        "--adopter-root",
        default=str(ROOT),
        help="the Adopter source tree that rewrites the copy and whose kernels it imports "
        "(e.g. a worktree of an older commit, for a before/after figure)",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    models = [m for m in args.models.split(",") if m]
    tags = (args.runs or ("fast,slow" if args.slow else "fast")).split(",")
    if any(tag not in RUN_NAMES for tag in tags):
        parser.error(f"--runs takes fast and/or slow, not {args.runs!r}")
    work = Path(args.work).resolve()
    shown = shlex.join(["python", "benchmarks/model_tests.py", *(argv or sys.argv[1:])])
    if not args.report_only:
        try:
            tree = prepare_tests(args.tests_from)
        except Unavailable as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        python = ensure_env()
        for tag in tags:
            comparison, summary = compare(
                python,
                tree,
                work,
                tag == "slow",
                models,
                args.select,
                adopter_root=Path(args.adopter_root),
            )
            meta = {"command": shown, "summary": summary, "machine": describe_machine()}
            _meta_path(work, tag).write_text(json.dumps(meta), encoding="utf-8")
            print(
                f"{tag}: original {dict(comparison.original.counts())}, "
                f"patched {dict(comparison.patched.counts())}, "
                f"{len(comparison.regressions())} regression(s)",
                flush=True,
            )
    try:
        runs, metas = load_runs(work, tags)
    except Unavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    Path(args.out).write_text(render(runs, metas), encoding="utf-8")
    print(f"wrote {args.out}")
    return 1 if any(c.regressions() for c in runs.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
