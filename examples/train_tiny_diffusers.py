"""Train a tiny text-to-image latent-diffusion pair from diffusers for a few steps on CPU: the
LDM-BERT text encoder of ``LDMTextToImagePipeline`` and a small ``UNet2DConditionModel`` that
predicts the noise ``DDPMScheduler`` added, conditioned on the encoded text. Configurations
built here, random weights and data, no downloads.

    python examples/train_tiny_diffusers.py
    adopter run -- python examples/train_tiny_diffusers.py

Both print the same losses (up to float rounding); ``adopter run`` also says what it patched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _common import arguments, report, seed_everything, train
from diffusers import DDPMScheduler, UNet2DConditionModel
from diffusers.pipelines.latent_diffusion.pipeline_latent_diffusion import (
    LDMBertConfig,
    LDMBertModel,
)

VOCAB, TEXT, BATCH, SIZE, WIDTH = 256, 16, 4, 16, 64


class TextToImage(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.text = LDMBertModel(
            LDMBertConfig(
                vocab_size=VOCAB,
                max_position_embeddings=TEXT,
                encoder_layers=2,
                encoder_ffn_dim=4 * WIDTH,
                encoder_attention_heads=4,
                head_dim=WIDTH // 4,
                d_model=WIDTH,
                dropout=0.0,
                attention_dropout=0.0,
            )
        )
        self.unet = UNet2DConditionModel(
            sample_size=SIZE,
            in_channels=4,
            out_channels=4,
            block_out_channels=(32, 64),
            layers_per_block=1,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=WIDTH,
            attention_head_dim=8,
            norm_num_groups=8,
        )

    def forward(self, tokens, noisy, timesteps):
        context = self.text(tokens).last_hidden_state
        return self.unet(noisy, timesteps, encoder_hidden_states=context).sample


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    seed_everything(args.seed)
    model = TextToImage()
    scheduler = DDPMScheduler(num_train_timesteps=100)
    data = torch.Generator().manual_seed(args.seed + 1)
    batches = [
        (
            torch.randint(0, VOCAB, (BATCH, TEXT), generator=data),
            torch.randn(BATCH, 4, SIZE, SIZE, generator=data),
            torch.randn(BATCH, 4, SIZE, SIZE, generator=data),
            torch.randint(0, 100, (BATCH,), generator=data),
        )
        for _ in range(args.steps)
    ]

    def loss_of_step(step: int) -> torch.Tensor:
        tokens, latents, noise, timesteps = batches[step]
        noisy = scheduler.add_noise(latents, noise, timesteps)
        return F.mse_loss(model(tokens, noisy, timesteps), noise)

    losses, peak = train(model, loss_of_step, args.steps)
    report(losses, peak, args.json)


if __name__ == "__main__":
    main()
