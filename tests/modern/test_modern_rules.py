"""The modern rules on the transformers 5.x installed here: a Llama patched with every modern
rule is verified, each patched site having run in a comparison that matched (the chunked loss
in the training check with labels)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import transformers

from tests.environments import ROOT

LLAMA = Path(transformers.__file__).parent / "models" / "llama" / "modeling_llama.py"


def test_a_llama_patched_with_the_modern_rules_is_verified_at_every_site():
    done = subprocess.run(
        [sys.executable, "-m", "adopter", "verify", "--rule-set", "modern", "--format", "json"]
        + ["--classes", "LlamaForCausalLM", str(LLAMA)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(done.stdout)
    assert [row["status"] for row in rows if row["class"] == "(file)"] == ["verified"]
    sites = {row["class"].split(" at ")[0]: row["status"] for row in rows}
    for kernel in ("rms_norm", "gated_mlp", "rotary", "attention_function", "causal_lm_loss"):
        assert sites.get(f"site: {kernel}") == "exercised", (kernel, sites)
