"""``adopter verify`` on training code the ``train`` rules patched: each ``fused_optimizer``
call is proven by training a small model with the construction as written and as rewritten
(``adopter.verify.optimizer``), without importing (so without running) the script."""

from __future__ import annotations

from pathlib import Path

from adopter.models.sites import find_sites
from adopter.verify import verify_patched_file
from adopter.verify.optimizer import optimizer_verdicts

ORIGINAL = """\
import torch

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
raise SystemExit("importing this script would train")
"""

PATCHED = """\
import torch
from adopter.kernels import fused_optimizer

model = torch.nn.Linear(4, 2)
optimizer = fused_optimizer(torch.optim.AdamW, model.parameters(), lr=1e-3, weight_decay=0.1)
raise SystemExit("importing this script would train")
"""


def test_a_patched_construction_is_proven_by_training() -> None:
    sites = find_sites(PATCHED, ORIGINAL)
    (verdict,) = optimizer_verdicts(PATCHED, sites)
    assert verdict.status == "verified", verdict.reason
    assert verdict.reason.startswith("torch.optim.AdamW(params, lr=0.001, weight_decay=0.1)")
    assert verdict.runs == {"train-steps": {sites[0].key: 10}}


def test_run_time_arguments_are_not_checkable_and_other_kernels_are_left_alone() -> None:
    patched = PATCHED.replace("lr=1e-3", "lr=args.lr")
    (verdict,) = optimizer_verdicts(patched, find_sites(patched))
    assert verdict.status == "not checkable" and "`lr=args.lr`" in verdict.reason
    assert not verdict.runs
    other = "from adopter.kernels import rms_norm\ny = rms_norm(x, w, 1e-6)\n"
    assert optimizer_verdicts(other, find_sites(other)) == []


def test_verify_proves_a_training_script_without_running_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(ORIGINAL, encoding="utf-8")
    result = verify_patched_file(script, PATCHED)
    assert result.status == "verified", result.summary()
    assert [entry.exercised for entry in result.sites] == [True]
