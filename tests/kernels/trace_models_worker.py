"""Subprocess side of ``test_kernels_tracing_models.py``: trace original and patched models.

Reads a JSON job ``{"family": {"module": ..., "patched": path}}``, imports each installed
modeling module as it is and the patched text of the same file under a sibling name (its classes
keep their names, which is what transformers' ``symbolic_trace`` checks), builds one small model
of each side with the same weights, and writes per family: whether HFTracer's
``symbolic_trace`` and ``torch.jit.trace(check_trace=True)`` work on the patched model, whether
their graphs equal the original model's, whether the traced output equals the eager one, and
which fused kernels the patched model holds (so a test cannot pass on an unpatched model).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import sys
import traceback
from collections import Counter
from typing import Any

import torch

SMALL = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "vocab_size": 99,
    "max_position_embeddings": 64,
}
BATCH, SEQ, IMAGE = 2, 7, 16


def _config(transformers: Any, family: str) -> tuple[str, Any]:
    """The head class traced for ``family`` and a small configuration for it."""
    vision = {k: v for k, v in SMALL.items() if k not in ("vocab_size", "max_position_embeddings")}
    choices = {
        "bert": ("BertForMaskedLM", lambda: transformers.BertConfig(**SMALL)),
        "roberta": ("RobertaForMaskedLM", lambda: transformers.RobertaConfig(**SMALL)),
        "albert": (
            "AlbertForMaskedLM",
            lambda: transformers.AlbertConfig(embedding_size=16, **SMALL),
        ),
        "distilbert": (
            "DistilBertForMaskedLM",
            lambda: transformers.DistilBertConfig(
                dim=32, n_layers=2, n_heads=4, hidden_dim=37, vocab_size=99
            ),
        ),
        "gpt2": (
            "GPT2LMHeadModel",
            lambda: transformers.GPT2Config(
                n_embd=32, n_layer=2, n_head=4, vocab_size=99, n_positions=64
            ),
        ),
        "gpt_neo": (
            "GPTNeoForCausalLM",
            lambda: transformers.GPTNeoConfig(
                hidden_size=32,
                num_layers=2,
                num_heads=4,
                vocab_size=99,
                max_position_embeddings=64,
                attention_types=[[["global", "local"], 1]],
                window_size=4,
            ),
        ),
        "t5": (
            "T5ForConditionalGeneration",
            lambda: transformers.T5Config(
                d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4, vocab_size=99
            ),
        ),
        "resnet": (
            "ResNetForImageClassification",
            lambda: transformers.ResNetConfig(
                embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3
            ),
        ),
        "vit": (
            "ViTForImageClassification",
            lambda: transformers.ViTConfig(image_size=IMAGE, patch_size=4, num_labels=3, **vision),
        ),
    }
    name, make = choices[family]
    return name, make()


def _inputs(family: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    if family in ("resnet", "vit"):
        return {
            "pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator),
            "labels": torch.randint(0, 3, (BATCH,), generator=generator),
        }
    ids = torch.randint(0, 99, (BATCH, SEQ), generator=generator)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -2:] = 0  # padding: the masked attention paths
    inputs = {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}
    if family == "t5":
        inputs["decoder_input_ids"] = torch.randint(0, 99, (BATCH, 5), generator=generator)
        inputs["labels"] = inputs["decoder_input_ids"].clone()
    return inputs


def _load_patched(module_name: str, path: str) -> Any:
    name = module_name + "_adopter_patched"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _node_kinds(traced: Any) -> Counter[str]:
    """The TorchScript graph's operations, counted (a rewrite may order independent ones
    differently: fused QKV projections run before the key's transpose)."""
    return Counter(node.kind() for node in traced.inlined_graph.nodes())


def _fx_structure(graph: torch.fx.Graph) -> tuple[int, Counter[int]]:
    """The computation an fx graph records, independent of node names and of the order of
    independent nodes: each node is numbered by its operation and target over the numbers of
    its inputs (equal computations get equal numbers); the output's number and the count of
    every number."""
    numbers: dict[Any, int] = {}
    of_node: dict[torch.fx.Node, int] = {}

    def shape(value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            return ("node", of_node[value])
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, tuple(shape(v) for v in value))
        if isinstance(value, dict):
            return ("dict", tuple(sorted((k, shape(v)) for k, v in value.items())))
        return repr(value)

    for node in graph.nodes:  # topological order: inputs come first
        if node.op == "placeholder":
            key: Any = ("placeholder", node.target)
        else:
            target = node.target
            if not isinstance(target, str):
                target = getattr(target, "__qualname__", repr(target))
            key = (node.op, target, shape(node.args), shape(node.kwargs))
        of_node[node] = numbers.setdefault(key, len(numbers))
    output = next(node for node in graph.nodes if node.op == "output")
    return of_node[output], Counter(of_node.values())


def _first(output: Any) -> torch.Tensor:
    if isinstance(output, dict):
        return output["loss"]
    return output[0]


def trace_family(transformers: Any, family: str, module_name: str, patched_path: str) -> dict:
    from transformers.utils.fx import symbolic_trace

    original_module = importlib.import_module(module_name)
    patched_module = _load_patched(module_name, patched_path)
    class_name, config = _config(transformers, family)
    inputs = _inputs(family)
    result: dict[str, Any] = {"class": class_name}

    def build(module: Any, torchscript: bool) -> torch.nn.Module:
        # A copy each: a model's first loss sets ``config.problem_type``, which changes the
        # code (and graph) of the next forward.
        own = copy.deepcopy(config)
        own.torchscript = torchscript
        torch.manual_seed(0)
        return getattr(module, class_name)(own).eval()

    original = build(original_module, False)
    patched = build(patched_module, False)
    patched.load_state_dict(original.state_dict(), strict=True)
    result["fused"] = sorted(
        {type(m).__name__ for m in patched.modules() if type(m).__name__.startswith("Fused")}
    )
    try:
        graph = symbolic_trace(patched, input_names=list(inputs))
        reference = symbolic_trace(original, input_names=list(inputs))
        result["fx_same_graph"] = _fx_structure(graph.graph) == _fx_structure(reference.graph)
        with torch.no_grad():
            result["fx_matches_eager"] = bool(
                torch.allclose(_first(graph(**inputs)), _first(patched(**inputs)), atol=1e-6)
            )
        result["fx"] = "ok"
    except Exception as exc:  # reported to the test, which names the family
        result["fx"] = f"{type(exc).__name__}: {str(exc)[:300]}"

    original = build(original_module, True)
    patched = build(patched_module, True)
    patched.load_state_dict(original.state_dict(), strict=True)
    try:
        traced = torch.jit.trace(patched, example_kwarg_inputs=inputs, check_trace=True)
        reference = torch.jit.trace(original, example_kwarg_inputs=inputs, check_trace=True)
        result["jit_same_graph"] = _node_kinds(traced) == _node_kinds(reference)
        with torch.no_grad():
            result["jit_matches_eager"] = bool(
                torch.allclose(_first(traced(**inputs)), _first(patched(**inputs)), atol=1e-6)
            )
        result["jit"] = "ok"
    except Exception as exc:
        result["jit"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return result


def main() -> None:
    job = json.loads(open(sys.argv[1], encoding="utf-8").read())
    import transformers

    results = {}
    for family, item in job.items():
        try:
            results[family] = trace_family(transformers, family, item["module"], item["patched"])
        except Exception:
            results[family] = {"error": traceback.format_exc()[-1500:]}
    with open(sys.argv[2], "w", encoding="utf-8") as out:
        json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
