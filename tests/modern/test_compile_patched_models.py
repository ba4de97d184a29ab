"""A patched transformers 5.x decoder compiles like the original: no added graph break in a
training step or in the compiled forward ``generate`` uses, and the same results.

Each model (Llama, Gemma, Qwen 3; 2 layers, hidden size 64) is measured as built, then patched
in place with ``adopter.patch(model)`` (every built-in rule), measured again and unpatched:

* training step: ``torch._dynamo.explain`` of the forward with labels in train mode counts no more
  graph breaks than the original's, and the forward compiled with ``fullgraph=True`` gives the
  original's loss and gradients (AOT autograd's trace of each kernel's backward is
  tests/kernels/test_compile_graph_breaks.py's; here it would only add CPU time);
* generation: ``generate`` with a static cache and a ``CompileConfig(fullgraph=True)`` compiles
  the decode forward (as transformers' ``test_generate_compile_model_forward_fullgraph`` does; a
  graph break fails that compile) and gives the original's tokens and logits.

Backend ``eager`` / ``aot_eager``: Dynamo and AOT autograd are where a kernel breaks the graph;
Inductor's code generation would cost CPU minutes and checks nothing more here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo as dynamo
import transformers
from transformers.generation.configuration_utils import CompileConfig

import adopter

TINY = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 64,
}

MODELS: dict[str, Callable[[], transformers.PreTrainedModel]] = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)),
    "gemma": lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(**TINY)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY)),
}

# The kernels a patched decoder of these families must call (so the comparison is not vacuous).
KERNEL_SITES = ("modern.1", "modern.2", "modern.3", "modern.4", "modern.7")


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    dynamo.reset()
    yield
    dynamo.reset()


def _train_breaks(model: torch.nn.Module, ids: torch.Tensor) -> tuple[int, list[str]]:
    model.train()
    dynamo.reset()
    explained = dynamo.explain(model)(input_ids=ids, labels=ids)
    return explained.graph_break_count, [
        str(b.reason).split("\n")[0] for b in explained.break_reasons
    ]


def _train_step(
    model: torch.nn.Module, ids: torch.Tensor, compiled: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.train()
    model.zero_grad(set_to_none=True)
    dynamo.reset()
    forward = torch.compile(model, backend="eager", fullgraph=True) if compiled else model
    loss = forward(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _generate(model: transformers.PreTrainedModel, ids: torch.Tensor) -> tuple[torch.Tensor, list]:
    model.eval()
    dynamo.reset()
    config = CompileConfig(fullgraph=True, backend="eager", mode=None)
    config._compile_all_devices = True  # transformers compiles on a GPU only unless told
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=4,
        do_sample=False,
        cache_implementation="static",
        compile_config=config,
        return_dict_in_generate=True,
        output_logits=True,
        pad_token_id=0,
    )
    assert hasattr(model, "_compiled_call"), "generate did not compile the forward"
    return out.sequences, [logits.detach() for logits in out.logits]


def _patched(model: torch.nn.Module, cache: Path) -> Iterator[None]:
    """``model`` patched in place with every built-in rule, as ``adopter.patch(model)`` does
    for a user, for the body of a ``with``; unpatched after (the modules are shared)."""
    report = adopter.patch(model, cache=cache)
    try:
        sites = [site for module in report.modules for site in module.sites]
        for rule in KERNEL_SITES:
            assert any(site.startswith(rule + " ") for site in sites), (rule, sites)
        yield
    finally:
        adopter.unpatch(model)


patched = contextlib.contextmanager(_patched)


def _model(name: str) -> tuple[transformers.PreTrainedModel, torch.Tensor]:
    torch.manual_seed(0)
    model = MODELS[name]()
    return model, torch.randint(1, TINY["vocab_size"], (2, 8))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_patched_training_step_compiles_without_added_graph_breaks(name: str, runtime_cache: Path):
    model, ids = _model(name)
    original_breaks, _ = _train_breaks(model, ids)
    original_loss, original_grads = _train_step(model, ids, compiled=False)
    with patched(model, runtime_cache):
        breaks, reasons = _train_breaks(model, ids)
        assert breaks <= original_breaks, (breaks, original_breaks, sorted(set(reasons)))
        loss, grads = _train_step(model, ids, compiled=True)
    torch.testing.assert_close(loss, original_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == original_grads.keys()
    for key, grad in grads.items():
        torch.testing.assert_close(grad, original_grads[key], rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_patched_model_generates_with_a_fullgraph_compiled_forward(name: str, runtime_cache: Path):
    model, ids = _model(name)
    original_tokens, original_logits = _generate(model, ids)
    del model._compiled_call  # the patched model compiles its own forward
    with patched(model, runtime_cache):
        tokens, logits = _generate(model, ids)
    assert torch.equal(tokens, original_tokens)
    assert len(logits) == len(original_logits)
    for got, want in zip(logits, original_logits, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
