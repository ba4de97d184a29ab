"""The modern environment holds the pinned releases, and Adopter's kernels work beside them."""

from __future__ import annotations

from importlib import metadata

import torch

from tests.environments import MODERN_REQUIREMENTS


def test_pinned_releases_are_installed():
    for requirement in MODERN_REQUIREMENTS:
        name, _, version = requirement.partition("==")
        if version and name != "torch":
            assert metadata.version(name).split("+")[0] == version
    assert torch.__version__.split("+")[0] == "2.13.0"


def test_timm_transformers_and_diffusers_models_run_on_the_cpu():
    import timm
    from diffusers import AutoencoderKL
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    assert timm.create_model("resnet18", num_classes=4)(torch.randn(2, 3, 32, 32)).shape == (2, 4)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    ids = torch.randint(0, 64, (1, 8))
    assert LlamaForCausalLM(config)(ids, labels=ids).loss.isfinite()
    vae = AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=2)
    assert vae(torch.randn(1, 3, 16, 16)).sample.shape == (1, 3, 16, 16)


def test_every_command_prints_its_help_beside_the_libraries():
    """transformers 5 brings a recent click (huggingface-hub 2 needs 8.4 or later); an older
    typer raised a TypeError on every ``--help`` with it."""
    import subprocess
    import sys

    from typer.main import get_command
    from typer.testing import CliRunner

    from adopter.cli import app

    # The entry point, as a user starts it; then every command in this process (the same click
    # and typer: a subprocess each cost half a second of imports).
    done = subprocess.run(
        [sys.executable, "-m", "adopter", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Usage" in done.stdout and "Traceback" not in done.stderr
    commands = sorted(get_command(app).commands)  # type: ignore[attr-defined]
    assert "verify" in commands and "bench" in commands
    for command in commands:
        result = CliRunner().invoke(app, [command, "--help"])
        assert result.exit_code == 0, (command, result.output[-2000:], result.exception)
        assert "Usage" in result.stdout
