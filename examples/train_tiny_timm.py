"""Train a tiny timm image classifier (DLA-46-C) for a few steps on CPU: random weights and
data, no downloads. Prints the loss of every step and the peak memory of a step.

    python examples/train_tiny_timm.py
    adopter run -- python examples/train_tiny_timm.py

Both print the same losses (up to float rounding); ``adopter run`` also says what it patched.
Needs a timm that imports (timm imports torchvision, which must match the installed torch).
"""

from __future__ import annotations

import timm
import torch
import torch.nn.functional as F
from _common import arguments, report, seed_everything, train

CLASSES, BATCH, SIZE = 10, 4, 64


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    seed_everything(args.seed)
    model = timm.create_model("dla46_c", pretrained=False, num_classes=CLASSES)
    data = torch.Generator().manual_seed(args.seed + 1)
    batches = [
        (
            torch.randn(BATCH, 3, SIZE, SIZE, generator=data),
            torch.randint(0, CLASSES, (BATCH,), generator=data),
        )
        for _ in range(args.steps)
    ]

    def loss_of_step(step: int) -> torch.Tensor:
        images, labels = batches[step]
        return F.cross_entropy(model(images), labels)

    losses, peak = train(model, loss_of_step, args.steps)
    report(losses, peak, args.json)


if __name__ == "__main__":
    main()
