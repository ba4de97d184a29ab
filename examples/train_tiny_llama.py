"""Train a tiny Llama (transformers 5.x) for a few steps on CPU: configuration built here,
random weights, no downloads. Prints the loss of every step and the peak memory of a step.

    python examples/train_tiny_llama.py
    adopter run -- python examples/train_tiny_llama.py     # the same, kernels patched in memory

Both print the same losses (up to float rounding); ``adopter run`` also says what it patched.
"""

from __future__ import annotations

import torch
from _common import arguments, report, seed_everything, train
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, BATCH, LENGTH = 512, 4, 64


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    seed_everything(args.seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2 * LENGTH,
        attention_dropout=0.0,
    )
    model = LlamaForCausalLM(config)
    data = torch.Generator().manual_seed(args.seed + 1)
    batches = [torch.randint(0, VOCAB, (BATCH, LENGTH), generator=data) for _ in range(args.steps)]

    def loss_of_step(step: int) -> torch.Tensor:
        tokens = batches[step]
        return model(input_ids=tokens, labels=tokens).loss

    losses, peak = train(model, loss_of_step, args.steps)
    report(losses, peak, args.json)


if __name__ == "__main__":
    main()
