"""Tiny random-weight copies of issue 21's eight decoder models, run on whichever transformers is
first on the path: eval logits, greedy ``generate``, a training loss with labels, and the
graph breaks ``torch._dynamo.explain`` counts in the eval forward. Run it once on the original
and once with a patched copy first on ``PYTHONPATH``; ``--compare`` prints the differences.

    python benchmarks/tiny_models_probe.py original.json
    PYTHONPATH=PATCHED_PARENT:. python benchmarks/tiny_models_probe.py patched.json
    python benchmarks/tiny_models_probe.py --compare original.json patched.json

A smoke check between the full suites of ``benchmarks/model_tests.py``, not a substitute.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

# model folder -> the config's model_type (gemma3's text-only model has its own)
MODEL_TYPES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "mistral": "mistral",
    "gemma": "gemma",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
    "olmo2": "olmo2",
}
TINY = {
    "vocab_size": 99,
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def probe(model_type: str) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **TINY)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    source = Path(sys.modules[type(model).__module__].__file__).read_text()
    ids = torch.randint(3, TINY["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(1))
    row: dict = {"patched": "adopter.kernels" in source}
    with torch.no_grad():
        row["logits_sum"] = float(model(ids).logits.double().sum())
        row["generate"] = model.generate(ids, max_new_tokens=5, do_sample=False).tolist()
    model.train()
    torch.manual_seed(2)  # the same dropout draws on both sides
    loss = model(ids, labels=ids).loss
    loss.backward()
    row["train_loss"] = float(loss)
    model.eval()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model.forward)(ids)
    row["graph_breaks"] = explained.graph_break_count
    reasons = {str(b.reason).splitlines()[0][:160] for b in explained.break_reasons}
    row["break_reasons"] = sorted(reasons)
    return row


def run(out: Path) -> None:
    import torch
    import transformers

    torch.set_num_threads(1)
    results: dict = {"transformers": transformers.__file__}
    for name, model_type in MODEL_TYPES.items():
        try:
            results[name] = probe(model_type)
        except Exception as error:  # a model that fails is a finding, not the end of the run
            results[name] = {"error": "".join(traceback.format_exception_only(error))[-400:]}
        print(name, {k: v for k, v in results[name].items() if k != "generate"}, flush=True)
    out.write_text(json.dumps(results, indent=1))


def compare(original_path: Path, patched_path: Path) -> int:
    original = json.loads(original_path.read_text())
    patched = json.loads(patched_path.read_text())
    differing = 0
    for name in MODEL_TYPES:
        a, b = original.get(name, {}), patched.get(name, {})
        if "error" in a or "error" in b:
            print(f"{name}: error: {a.get('error') or b.get('error')}")
            differing += 1
            continue
        same_tokens = a["generate"] == b["generate"]
        logits = abs(a["logits_sum"] - b["logits_sum"])
        loss = abs(a["train_loss"] - b["train_loss"])
        print(
            f"{name}: patched={b['patched']} logits sum diff {logits:.1e}, tokens "
            f"{'same' if same_tokens else 'DIFFER'}, loss diff {loss:.1e}, graph breaks "
            f"{a['graph_breaks']} -> {b['graph_breaks']} {b['break_reasons']}"
        )
        added = b["graph_breaks"] > a["graph_breaks"]
        differing += int(not same_tokens or logits > 1e-4 or loss > 1e-4 or added)
    return 1 if differing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--compare", action="store_true", help="compare two earlier runs")
    args = parser.parse_args()
    if args.compare:
        if len(args.paths) != 2:
            parser.error("--compare takes ORIGINAL.json PATCHED.json")
        return compare(*args.paths)
    run(args.paths[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
