"""transformers' ``symbolic_trace`` (HFTracer) and ``torch.jit.trace`` on patched 4.34 models.

The modeling files of the nine families that transformers 4.34's own ``test_torch_fx`` and
TorchScript tests failed on after ``apply --rule-set all`` are patched with that rule set (the
installed files, rewritten in memory, never written back), and a subprocess traces a small model
of each family, original and patched with the same weights: both tracers must work on the
patched model, record the original model's graph, and compute what the eager model does.
``benchmarks/model_tests.py`` runs transformers' own test files for the same check.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set

_SPEC = importlib.util.find_spec("transformers")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_SPEC is None, reason="transformers is not installed"),
]

FAMILIES = ("bert", "gpt2", "t5", "roberta", "albert", "distilbert", "gpt_neo", "resnet", "vit")
WORKER = Path(__file__).with_name("trace_models_worker.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    assert _SPEC is not None and _SPEC.submodule_search_locations
    package = Path(_SPEC.submodule_search_locations[0])
    matcher = Matcher(load_rule_set("all"))
    folder = tmp_path_factory.mktemp("patched")
    job = {}
    for family in FAMILIES:
        source = package / "models" / family / f"modeling_{family}.py"
        rewrite = rewrite_text(source.read_text(encoding="utf-8"), str(source), matcher)
        assert rewrite.error is None and rewrite.changed, family
        target = folder / f"modeling_{family}.py"
        target.write_text(rewrite.patched, encoding="utf-8")
        job[family] = {
            "module": f"transformers.models.{family}.modeling_{family}",
            "patched": str(target),
        }
    job_file, result_file = folder / "job.json", folder / "result.json"
    job_file.write_text(json.dumps(job), encoding="utf-8")
    completed = subprocess.run(
        [sys.executable, str(WORKER), str(job_file), str(result_file)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(result_file.read_text(encoding="utf-8"))


# Each family's fused attention class (families without one are patched by function kernels).
FUSED_ATTENTION = {
    "bert": "FusedBertSelfAttention",
    "roberta": "FusedRobertaSelfAttention",
    "albert": "FusedAlbertAttention",
    "distilbert": "FusedMultiHeadSelfAttention",
    "gpt2": "FusedGPT2Attention",
    "gpt_neo": "FusedGPTNeoSelfAttention",
    "t5": "FusedT5Attention",
}


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_symbolic_trace_records_the_original_graph(traced, family):
    result = traced[family]
    assert "error" not in result, result.get("error")
    if family in FUSED_ATTENTION:
        assert FUSED_ATTENTION[family] in result["fused"]
    assert result["fx"] == "ok"
    assert result["fx_same_graph"]
    assert result["fx_matches_eager"]


@pytest.mark.parametrize("family", FAMILIES)
def test_jit_trace_check_passes_and_records_the_original_graph(traced, family):
    result = traced[family]
    assert "error" not in result, result.get("error")
    assert result["jit"] == "ok"
    assert result["jit_same_graph"]
    assert result["jit_matches_eager"]
