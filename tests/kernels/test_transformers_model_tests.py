"""A fast subset of ``benchmarks/model_tests.py``: transformers 4.34's own ``test_torch_fx``
and ``test_torchscript_simple`` of BERT and ResNet, on the installed package and on a copy patched with
``apply --rule-set all``; none may pass on the original and fail on the patched copy.

It needs the release's test files and the test environment that the benchmark caches in
``.cache/model-tests/`` (the files are not in the wheel and come from the release tag, which
needs a network); without them it skips and says how to make them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "model_tests.py"


def _benchmark():
    spec = importlib.util.spec_from_file_location("model_tests_benchmark", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_fx_and_torchscript_tests_pass_on_the_patched_copy(tmp_path: Path):
    model_tests = _benchmark()
    cache = model_tests.CACHE
    tree = cache / f"transformers-{model_tests.VERSION}-tests"
    python = cache / "venv" / "bin" / "python"
    if not (tree / ".complete").exists() or not (cache / "venv" / ".complete").exists():
        pytest.skip(
            "transformers' test files are not cached (they need a network): run "
            "`python benchmarks/model_tests.py` once"
        )
    comparison, summary = model_tests.compare(
        python,
        tree,
        tmp_path,
        slow=True,  # 4.34 marks its TorchScript tests slow
        models=("bert", "resnet"),
        select="(test_torch_fx and not output_loss) or test_torchscript_simple",
        patch_whole_package=False,  # the two models' folders: what these tests import
    )
    assert "patched" in summary, summary
    passed = comparison.patched.counts()["passed"]
    assert passed >= 4, dict(comparison.patched.counts())  # the tests ran, not only skipped
    regressions = comparison.regressions()
    assert not regressions, {t: comparison.patched.messages.get(t) for t in regressions}
