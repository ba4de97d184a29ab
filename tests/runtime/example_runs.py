"""Running an example training script plainly and under ``adopter run`` and comparing losses."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLES = ("train_tiny_diffusers.py", "train_tiny_llama.py", "train_tiny_timm.py")


def run_example(
    command: list[str], tmp_path: Path, name: str, cache: Path | None = None
) -> tuple[dict, str]:
    out = tmp_path / f"{name}.json"
    cache = cache or tmp_path / "cache"
    env = dict(os.environ, ADOPTER_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore")
    done = subprocess.run(
        [*command, "--steps", "2", "--json", str(out)],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stderr


def compare_with_and_without_adopter(
    python: Path | str, example: str, tmp_path: Path, cache: Path | None = None
) -> str:
    """``cache``: the runtime cache folder (default: one of this test's own, a first run)."""
    script = str(REPOSITORY / "examples" / example)
    plain, _ = run_example([str(python), script], tmp_path, "plain")
    adopted, log = run_example(
        [str(python), "-m", "adopter", "run", "-v", "--", "python", script],
        tmp_path,
        "adopted",
        cache,
    )
    assert len(plain["losses"]) == len(adopted["losses"]) == 2
    for a, b in zip(plain["losses"], adopted["losses"]):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), (plain, adopted)
    return log
