"""Run transformers' own model tests on the installed release and on a copy patched by Adopter;
report every test that passes on the original and fails on the patched copy (docs/model-tests.md).

    python benchmarks/model_tests.py                      # fast tests (what transformers' CI runs)
    python benchmarks/model_tests.py --slow               # RUN_SLOW=1: TorchScript tests too
    python benchmarks/model_tests.py --tests-from /path/to/transformers@v4.34.0
    python benchmarks/model_tests.py --version 5.24.0 --tests-from .cache/model-tests/files-5.24.0 \
        --base-env /work/main/.cache/venv-modern --one-side-at-a-time     # docs/model-tests-5.x.md

The test files are not in the wheel, and the sdist on PyPI holds only the shared mixins
(``tests/test_modeling_common.py`` ...), not ``tests/models/``. They come from the release tag:
by default the tag's source archive is downloaded from GitHub; ``--tests-from`` takes a
checkout of the tag (a folder) or ``GIT_DIR@COMMIT`` (a clone, read with ``git archive``).
Whatever the source, every shared test file it holds must equal the sdist's copy (fetched with
pip), which proves the tree is the release's. For 5.x (``--version``) a folder may hold only
the files the sdist lacks (``tests/models/<model>/``, ``tests/generation/``, ``tests/exporters/``,
``tests/causal_lm_tester.py``, gathered from the repository one by one): the sdist's own mixins
complete it. Everything lands in the git-ignored ``.cache/model-tests/``; nothing fetched is
committed.

The tests run in their own virtual environment (``.cache/model-tests/venv``, or ``venv-<version>``:
the pinned torch, transformers and the pytest of that release's day - 4.34's ``testing_utils``
imports a helper that pytest 8 removed); ``--base-env`` reuses an environment that already holds
torch and the release, read-only, and installs only the test tools. The patched side is a copy
of that environment's transformers package rewritten with ``adopter apply --write --rule-set
all`` and put first on ``PYTHONPATH``;
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
# The decoder-only models of issue 21 (5.x): the ones the kernels' rules reach.
MODELS_5 = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma3", "phi3", "olmo2")
CACHE = ROOT / ".cache" / "model-tests"
ARCHIVE_URL = "https://github.com/huggingface/transformers/archive/refs/tags/v{version}.tar.gz"


def is_5x(version: str) -> bool:
    return int(version.split(".")[0]) >= 5


def default_models(version: str) -> tuple[str, ...]:
    return MODELS_5 if is_5x(version) else MODELS


def env_requirements(version: str) -> tuple[str, ...]:
    """The test environment: the project's torch pin, the release, and the pytest of the
    release's day (4.34's ``testing_utils`` imports a helper that pytest 8 removed)."""
    if is_5x(version):
        return ("torch==2.13.0", f"transformers=={version}", "pytest", "parameterized",
                "timeout-decorator", "pytest-timeout")  # fmt: skip
    return (
        "torch==2.13.0",
        f"transformers=={version}",
        "pytest==7.4.4",
        "datasets",  # tests/pipelines/test_pipelines_common.py imports it at module level
        "parameterized",
        "timeout-decorator",
    )


ENV_REQUIREMENTS = env_requirements(VERSION)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RUN_PIPELINE_TESTS": "0"}


class Unavailable(RuntimeError):
    """The test files (or the sdist that vouches for them) cannot be had here."""


# ---------------------------------------------------------------------------------------------
# The release's test files
# ---------------------------------------------------------------------------------------------


def needed(path: str, models: Sequence[str]) -> bool:
    """Whether a repository path is part of the test tree the model tests import."""
    parts = path.split("/")
    # setup.cfg (4.x) and pyproject.toml (5.x): the release's pytest settings and markers.
    if path in ("conftest.py", "setup.cfg", "pyproject.toml"):
        return True
    if path in ("tests/utils/tiny_model_summary.json", "tests/models/__init__.py"):
        return True
    if parts[0] == "utils" and len(parts) > 1 and parts[1] == "test_module":
        return True  # tests/pipelines/test_pipelines_common.py imports utils/test_module
    if parts[0] != "tests":
        return False
    if len(parts) == 2:
        return path.endswith(".py")  # the shared mixins
    if parts[1] in ("generation", "pipelines", "exporters"):  # exporters: 5.x's ModelTesterMixin
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


def fetch_sdist(cache: Path = CACHE, version: str = VERSION) -> Path:
    """The release's sdist (downloaded once with pip) unpacked; its ``tests/`` holds the mixins."""
    unpacked = cache / f"sdist-{version}"
    if (unpacked / ".complete").exists():
        return unpacked / f"transformers-{version}"
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    command += ["--quiet", "--dest", str(downloads), f"transformers=={version}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    sdist = downloads / f"transformers-{version}.tar.gz"
    if done.returncode != 0 or not sdist.exists():
        last = (done.stderr or done.stdout).strip().splitlines()
        raise Unavailable(
            f"pip download transformers=={version} failed: {last[-1] if last else ''}"
        )
    with tarfile.open(sdist) as archive:
        archive.extractall(unpacked, filter="data")
    (unpacked / ".complete").write_text(sdist.name)
    return unpacked / f"transformers-{version}"


def _archive_from(source: str, work: Path, version: str = VERSION) -> tuple[tarfile.TarFile, str]:
    """An open tar of the repository at the release and the prefix of its paths."""
    if source == "github":
        url = ARCHIVE_URL.format(version=version)
        local = work / f"transformers-v{version}.tar.gz"
        if not local.exists():
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    data = response.read()
            except OSError as error:
                raise Unavailable(f"cannot download {url}: {error}") from error
            local.write_bytes(data)
        return tarfile.open(local), f"transformers-{version}/"
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


def check_against_sdist(tree: Path, sdist: Path, version: str = VERSION) -> None:
    """Every shared test file of ``tree`` equals the sdist's: the tree is the release's."""
    shared = sorted((sdist / "tests").glob("*.py"))
    if not shared:
        raise Unavailable(f"the sdist at {sdist} holds no tests/*.py to compare with")
    for reference in shared:
        candidate = tree / "tests" / reference.name
        if not candidate.exists() or candidate.read_bytes() != reference.read_bytes():
            raise Unavailable(
                f"{candidate} differs from the {version} sdist's copy: not the release's tests"
            )


def _take_shared_from_sdist(tree: Path, sdist: Path) -> int:
    """Copy the sdist's shared test files (and its pytest settings) that ``tree`` lacks.

    A folder of files gathered from the repository one by one (5.x's repository is too large to
    clone here) need not hold the mixins: the sdist is the release's own copy of them. Files the
    folder does hold are left for ``check_against_sdist`` to compare."""
    count = 0
    references = [*sorted((sdist / "tests").glob("*.py")), sdist / "pyproject.toml"]
    for reference in references:
        relative = reference.relative_to(sdist)
        if reference.is_file() and not (tree / relative).exists():
            (tree / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(reference, tree / relative)
            count += 1
    return count


def expected_files(version: str, models: Sequence[str]) -> list[str]:
    """The files a usable test tree must hold."""
    model_files = [f"tests/models/{m}/test_modeling_{m}.py" for m in models]
    if is_5x(version):
        # 5.x's ModelTesterMixin imports both; the causal-LM tests build on causal_lm_tester.
        shared = ["tests/generation/test_utils.py", "tests/exporters/test_export.py"]
        return [*shared, "tests/causal_lm_tester.py", *model_files]
    return ["setup.cfg", *model_files]


def prepare_tests(
    source: str = "github",
    cache: Path = CACHE,
    version: str = VERSION,
    models: Sequence[str] | None = None,
) -> Path:
    """The release's test tree (cached): conftest.py, tests/ (mixins, generation, pipelines and
    the listed models) and utils/test_module, checked against the sdist."""
    models = tuple(models or default_models(version))
    # The 4.34 tree keeps its historical name (tests/kernels reads it there).
    suffix = "" if version == VERSION else "-" + "-".join(models)
    tree = cache / f"transformers-{version}-tests{suffix}"
    if (tree / ".complete").exists():
        return tree
    sdist = fetch_sdist(cache, version)
    partial = tree.with_name(tree.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if Path(source).is_dir():
        count = _copy_folder(Path(source), partial, models)
        count += _take_shared_from_sdist(partial, sdist)
    else:
        archive, prefix = _archive_from(source, cache, version)
        with archive:
            count = _extract(archive, prefix, partial, models)
    missing = [path for path in expected_files(version, models) if not (partial / path).exists()]
    if count == 0 or missing:
        raise Unavailable(f"{source}: no {', '.join(missing) or 'test files'}")
    # Packages the files of the tree import relatively (``from ...test_modeling_common``).
    tests_root = partial / "tests"
    folders = {tests_root} | {
        parent
        for path in tests_root.glob("**/*.py")
        for parent in path.parents
        if parent.is_relative_to(tests_root)
    }
    for folder in sorted(folders):
        (folder / "__init__.py").touch()
    check_against_sdist(partial, sdist, version)
    shutil.rmtree(tree, ignore_errors=True)
    partial.rename(tree)
    (tree / ".complete").write_text(source)
    return tree


# ---------------------------------------------------------------------------------------------
# Environment, patched copy, runs
# ---------------------------------------------------------------------------------------------


def _site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def ensure_env(cache: Path = CACHE, version: str = VERSION, base_env: Path | None = None) -> Path:
    """The test environment's python (created once).

    With ``base_env`` (a virtual environment that already holds torch and the release, e.g. the
    project's modern environment) the new environment sees that one's packages read-only
    through a ``.pth`` file and installs only what the tests add (pytest's plugins,
    parameterized ...): minutes of CPU saved on a shared machine, and nothing written there."""
    requirements = env_requirements(version)
    venv = cache / ("venv" if version == VERSION and base_env is None else f"venv-{version}")
    python = venv / "bin" / "python"
    marker = venv / ".complete"
    recipe = "\n".join([*requirements, f"base: {base_env}"] if base_env else requirements)
    if marker.exists() and marker.read_text() == recipe:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    if base_env is not None:
        base_python = base_env / "bin" / "python"
        (_site_packages(python) / "base-env.pth").write_text(f"{_site_packages(base_python)}\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *requirements], check=True)
    marker.write_text(recipe)
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
    side_by_side: bool = True,
) -> tuple[Comparison, str]:
    """Original and patched runs of the same tests, and apply's summary line."""
    package = installed_package(python)
    patched_parent, summary = patched_copy(
        package, work, None if patch_whole_package else models, adopter_root=adopter_root
    )
    tag = "slow" if slow else "fast"
    sides = {"original": package.parent, "patched": patched_parent}
    # The two sides are independent processes: run them side by side (or one after the other,
    # where the cores are shared with others and each side's time should be its own).
    with ThreadPoolExecutor(max_workers=2 if side_by_side else 1) as pool:
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


def render(
    runs: dict[str, Comparison],
    metas: dict[str, dict],
    version: str = VERSION,
    models: Sequence[str] = MODELS,
) -> str:
    lines = [
        "# transformers' own model tests on patched code",
        "",
        f"transformers {version}'s own test files (`tests/models/<model>/test_modeling_<model>.py`"
        " with the shared mixins, from the release tag, checked against the sdist's copies) run "
        "against the installed package (**original**) and against a copy of it rewritten by "
        "`adopter apply --write --rule-set all` (**patched**). A **regression** is a test that "
        "passes on the original and fails on the patched copy. `fast` is what transformers' CI "
        "runs by default; `RUN_SLOW=1` adds the tests marked slow"
        + ("" if is_5x(version) else " (4.34 marks its TorchScript tests slow)")
        + ". Both sides run offline, so tests that download a checkpoint fail on both.",
        "",
        "Each side runs in its own process (`OMP_NUM_THREADS=1`), the two side by side unless "
        "the command says `--one-side-at-a-time`; the times are pytest's own.",
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
        for model in models:
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
    parser.add_argument("--version", default=VERSION, help="the transformers release to test")
    parser.add_argument(
        "--models", help=f"comma-separated (default: {','.join(MODELS)}; 5.x: {','.join(MODELS_5)})"
    )
    parser.add_argument("-k", dest="select", help="pytest -k expression (a subset)")
    parser.add_argument("--out", help="the report (default: docs/model-tests.md; 5.x: -5.x.md)")
    parser.add_argument(
        "--base-env",
        help="a virtual environment holding torch and the release, reused read-only "
        "(only the test tools are installed, in the test environment of --work)",
    )
    parser.add_argument(
        "--one-side-at-a-time",
        action="store_true",
        help="run the patched side after the original, not beside it (a shared machine)",
    )
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
    version = args.version
    models = [m for m in args.models.split(",") if m] if args.models else default_models(version)
    out = Path(args.out or ROOT / "docs" / f"model-tests{'-5.x' if is_5x(version) else ''}.md")
    tags = (args.runs or ("fast,slow" if args.slow else "fast")).split(",")
    if any(tag not in RUN_NAMES for tag in tags):
        parser.error(f"--runs takes fast and/or slow, not {args.runs!r}")
    work = Path(args.work).resolve()
    shown = shlex.join(["python", "benchmarks/model_tests.py", *(argv or sys.argv[1:])])
    if not args.report_only:
        try:
            tree = prepare_tests(args.tests_from, version=version, models=models)
        except Unavailable as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        python = ensure_env(
            version=version, base_env=Path(args.base_env) if args.base_env else None
        )
        for tag in tags:
            comparison, summary = compare(
                python,
                tree,
                work,
                tag == "slow",
                models,
                args.select,
                adopter_root=Path(args.adopter_root),
                side_by_side=not args.one_side_at_a_time,
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
    out.write_text(render(runs, metas, version, models), encoding="utf-8")
    print(f"wrote {out}")
    return 1 if any(c.regressions() for c in runs.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
