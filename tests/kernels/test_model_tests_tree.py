"""``benchmarks/model_tests.py`` assembles a 5.x test tree from a folder of repository files and
the release's sdist: the sdist supplies the shared mixins the folder lacks, a mixin the folder
does hold must equal the sdist's, and a tree without the files 5.x's mixins import is refused
with their names. Offline: the sdist here is a stand-in unpacked where the benchmark caches it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "model_tests.py"
VERSION = "5.99.0"  # no such release: nothing may be downloaded for it


def _benchmark():
    spec = importlib.util.spec_from_file_location("model_tests_tree_benchmark", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _fake_sdist(cache: Path) -> Path:
    unpacked = cache / f"sdist-{VERSION}"
    root = unpacked / f"transformers-{VERSION}"
    _write(root / "tests" / "test_modeling_common.py", "MIXIN = 'release'\n")
    _write(root / "tests" / "test_configuration_common.py", "CONFIG = 'release'\n")
    _write(root / "pyproject.toml", "[tool.pytest.ini_options]\n")
    (unpacked / ".complete").write_text("stand-in")
    return root


def _repository_files(folder: Path) -> None:
    _write(folder / "tests" / "generation" / "test_utils.py", "GENERATION = 1\n")
    _write(folder / "tests" / "exporters" / "test_export.py", "EXPORT = 1\n")
    _write(folder / "tests" / "causal_lm_tester.py", "CAUSAL = 1\n")
    _write(folder / "tests" / "models" / "llama" / "test_modeling_llama.py", "LLAMA = 1\n")
    _write(folder / "tests" / "models" / "bert" / "test_modeling_bert.py", "BERT = 1\n")


def test_the_sdist_supplies_the_mixins_a_folder_of_5x_files_lacks(tmp_path: Path):
    model_tests = _benchmark()
    cache, folder = tmp_path / "cache", tmp_path / "files"
    sdist = _fake_sdist(cache)
    _repository_files(folder)
    tree = model_tests.prepare_tests(str(folder), cache, version=VERSION, models=("llama",))
    mixin = tree / "tests" / "test_modeling_common.py"
    assert mixin.read_bytes() == (sdist / "tests" / "test_modeling_common.py").read_bytes()
    assert (tree / "pyproject.toml").exists()  # 5.x's pytest markers live there
    assert (tree / "tests" / "models" / "llama" / "test_modeling_llama.py").exists()
    assert not (tree / "tests" / "models" / "bert").exists()  # only the listed models
    # The relative imports (``from ...test_modeling_common``) need the folders as packages.
    for folder_name in ("tests", "tests/models", "tests/models/llama", "tests/generation"):
        assert (tree / folder_name / "__init__.py").exists(), folder_name


def test_a_folder_whose_mixin_differs_from_the_sdist_is_refused(tmp_path: Path):
    model_tests = _benchmark()
    cache, folder = tmp_path / "cache", tmp_path / "files"
    _fake_sdist(cache)
    _repository_files(folder)
    _write(folder / "tests" / "test_modeling_common.py", "MIXIN = 'another commit'\n")
    with pytest.raises(model_tests.Unavailable, match="test_modeling_common.py differs"):
        model_tests.prepare_tests(str(folder), cache, version=VERSION, models=("llama",))


def test_a_5x_tree_without_the_files_the_mixins_import_is_refused_with_their_names(
    tmp_path: Path,
):
    model_tests = _benchmark()
    cache, folder = tmp_path / "cache", tmp_path / "files"
    _fake_sdist(cache)
    _repository_files(folder)
    (folder / "tests" / "generation" / "test_utils.py").unlink()
    (folder / "tests" / "causal_lm_tester.py").unlink()
    with pytest.raises(model_tests.Unavailable) as refused:
        model_tests.prepare_tests(str(folder), cache, version=VERSION, models=("llama",))
    assert "tests/generation/test_utils.py" in str(refused.value)
    assert "tests/causal_lm_tester.py" in str(refused.value)
