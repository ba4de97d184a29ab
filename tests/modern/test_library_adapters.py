"""The timm and diffusers adapters against the installed libraries: the models they name use
the file, build small and run; a copied, patched timm file is verified through them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from adopter.models.registry import adapter_for
from tests.environments import ROOT


@pytest.mark.slow
def test_timm_candidates_of_a_model_module_build_the_patched_class():
    adapter = adapter_for("timm")
    candidates = adapter.candidates("timm.models.resnet", {"BasicBlock"})
    assert candidates and candidates[0].reason.startswith("builds BasicBlock")
    survey = adapter.survey(candidates[0].name, "timm.models.resnet")
    assert survey is not None and "BasicBlock" in survey.classes
    built = adapter.build("resnet18")
    assert built.inputs[0].shape == (2, 3, 64, 64)
    with torch.no_grad():
        assert built.model.eval()(*built.inputs).shape == (2, 10)


# No registered model builds CoordAttn: finding that out spends the whole survey budget (250
# meta-device builds, about two minutes where the survey store is cold, as on a fresh CI
# machine). The class on its own comes first however many models were surveyed; these tests
# survey few.
FEW_LOOKS = "30"


def test_a_timm_layer_no_registered_model_builds_is_built_on_its_own(monkeypatch):
    monkeypatch.setenv("ADOPTER_SURVEY_BUDGET", FEW_LOOKS)
    adapter = adapter_for("timm")
    candidates = adapter.candidates("timm.layers.coord_attn", {"CoordAttn"})
    # first whether or not the survey store is warm (models left unsurveyed may follow)
    assert candidates[0].name == "timm.layers.coord_attn:CoordAttn"
    survey = adapter.survey(candidates[0].name, "timm.layers.coord_attn")
    assert survey is not None and survey.classes == {"CoordAttn"}
    assert adapter.entries(candidates[0].name) == []
    built = adapter.build(candidates[0].name, overrides={"bias": True})
    assert built.settings == {"bias": True, "input": "2x32x8x8"}
    with torch.no_grad():
        assert built.model.eval()(*built.inputs).shape == (2, 32, 8, 8)


@pytest.mark.slow
def test_timm_candidates_cover_the_rare_classes_of_a_layer_file(monkeypatch):
    # Two of the classes have fewer small builders than the survey's three choices, so on a
    # cold store it spends its whole budget (250 meta-device builds, 80 s here); the last
    # class gets its first small builder about 100 models in, and 120 still shows the
    # ranking reaching all four.
    monkeypatch.setenv("ADOPTER_SURVEY_BUDGET", "120")
    names = {"Mlp", "SwiGLU", "GatedMlp", "GlobalResponseNormMlp"}
    adapter = adapter_for("timm")
    candidates = adapter.candidates("timm.layers.mlp", names)
    covered = set()
    for candidate in candidates[:6]:
        survey = adapter.survey(candidate.name, "timm.layers.mlp")
        assert survey is not None
        covered |= survey.classes & names
    assert covered == names


@pytest.mark.slow
def test_a_patched_copy_of_a_timm_module_does_not_take_over_the_registry():
    import timm

    from adopter.bench.command import patch_text, patched_source_file
    from adopter.models.loading import load_sibling
    from adopter.rules import load_rule_set

    adapter = adapter_for("timm")
    path = (
        Path(sys.modules["timm.models.dla"].__file__)
        if "timm.models.dla" in sys.modules
        else (Path(timm.__file__).parent / "models" / "dla.py")
    )
    patched, _ = patch_text(path.read_text(), str(path), load_rule_set("all"))
    with adapter.keeping_registries():
        load_sibling("timm.models.dla", "_adopter_test_", patched_source_file(patched, path.name))
    model = timm.create_model("dla34", pretrained=False)
    assert type(model).__module__ == "timm.models.dla"


@pytest.mark.slow
def test_diffusers_builds_a_small_unet_with_inputs_that_run():
    built = adapter_for("diffusers").build("UNet2DConditionModel")
    assert sum(p.numel() for p in built.model.parameters()) < 10_000_000
    with torch.no_grad():
        (out,) = built.model.eval()(**built.inputs)
    assert out.shape == built.inputs["sample"].shape


@pytest.mark.slow
def test_verify_on_a_copied_folder_after_apply_write_compares_with_the_installed_file(tmp_path):
    """A user copies a library file into a folder of their own, patches it in place, then asks
    verify: the original is the installed file of the same name (timm's coord_attn, a small
    layer file whose classes are built on their own: seconds, where a model file is a minute)."""
    import timm

    folder = tmp_path / "my_models"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    shutil.copy(Path(timm.__file__).parent / "layers" / "coord_attn.py", folder / "coord_attn.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ADOPTER_SURVEY_BUDGET": FEW_LOOKS}
    run = [sys.executable, "-m", "adopter"]
    subprocess.run([*run, "apply", "--write", str(folder)], env=env, check=True, cwd=tmp_path)
    done = subprocess.run(
        [*run, "verify", str(folder / "coord_attn.py"), "-f", "json", "--timeout", "600"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    rows = json.loads(done.stdout)
    files = [row for row in rows if row["kind"] == "file"]
    assert [row["status"] for row in files] == ["verified"], files
    sites = [row for row in rows if row["kind"] == "site"]
    assert len(sites) >= 2 and all(row["status"] == "exercised" for row in sites), sites


KREA2 = "models/transformers/transformer_krea2.py"
BLIP2 = "pipelines/deprecated/blip_diffusion/modeling_blip2.py"


@pytest.fixture(scope="module")
def copied_diffusers_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """A user's copies of two installed diffusers files in a folder of their own, patched in
    place with every rule (``apply --write``), then verified by ``adopter verify`` alone: each
    file's JSON rows. One apply and one verify for both: each run imports torch, transformers
    and diffusers afresh."""
    import diffusers

    folder = tmp_path_factory.mktemp("copies") / "my_models"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    targets = {}
    for relative in (KREA2, BLIP2):
        targets[relative] = folder / Path(relative).name
        shutil.copy(Path(diffusers.__file__).parent / relative, targets[relative])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-m", "adopter"]
    subprocess.run(
        [*run, "apply", "--rule-set", "all", "--write", str(folder)], env=env, check=True
    )
    files = [str(target) for target in targets.values()]
    done = subprocess.run(
        [*run, "verify", "--rule-set", "all", *files, "-f", "json", "--timeout", "600"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    rows = json.loads(done.stdout)
    return {
        relative: [row for row in rows if Path(row["path"]).name == target.name]
        for relative, target in targets.items()
    }


@pytest.mark.slow
def test_a_diffusers_model_that_takes_pipeline_inputs_is_verified_through_its_parts(
    copied_diffusers_rows: dict[str, list[dict]],
) -> None:
    """Krea2's forward needs position ids only its pipeline makes, so the whole model runs on
    no inputs the adapter makes; its attention and feed-forward modules take plain tensors, and
    both patched sites are proven in them, each verdict naming the part and its input."""
    rows = copied_diffusers_rows[KREA2]
    (whole,) = [r for r in rows if r["class"].endswith(":Krea2Transformer2DModel")]
    assert whole["status"] == "not checkable"
    parts = {r["class"]: r for r in rows if r["class"].endswith("(part)")}
    assert {"Krea2Attention (part)", "Krea2SwiGLU (part)"} <= set(parts)
    assert all("input 2x5x" in r["reason"] for r in parts.values())
    sites = [r for r in rows if r["kind"] == "site"]
    assert sites and all(r["status"] == "exercised" for r in sites)
    assert [r["status"] for r in rows if r["kind"] == "file"] == ["verified"]


@pytest.mark.slow
def test_a_transformers_model_inside_diffusers_is_verified_through_its_own_classes(
    copied_diffusers_rows: dict[str, list[dict]],
) -> None:
    """BLIP-Diffusion's Q-Former file defines transformers models (``Blip2VisionModel``) that
    no diffusers model class builds: with no diffusers candidate, the file's own model classes
    are built from their configurations, as a transformers modeling file's are."""
    rows = copied_diffusers_rows[BLIP2]
    checked = {r["class"]: r["status"] for r in rows if r["kind"] == "class"}
    assert checked.get("Blip2VisionModel") == "verified", rows
    assert [r["status"] for r in rows if r["kind"] == "file"] == ["verified"], rows


def test_only_a_file_that_may_define_transformers_models_is_handed_to_their_adapter():
    from adopter.models.transformers import may_define_models

    assert may_define_models("class A(Blip2PreTrainedModel):\n    pass\n")
    assert may_define_models("class A(Base):\n    config_class = AConfig\n")
    assert not may_define_models("class EMAModel:\n    decay = 0.9\n")
    assert not may_define_models("class Step(ModularPipelineBlocks):\n    model_name = 'x'\n")


def test_diffusers_makes_a_part_s_inputs_by_the_role_of_their_names():
    from torch import nn

    class TimestepEmbedder(nn.Module):  # takes timesteps, which no layer of it suggests
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(16, 8)

        def forward(self, timestep: torch.Tensor) -> torch.Tensor:
            angles = timestep[:, None].float() * torch.arange(16) / 16
            return self.linear(torch.sin(angles))

    part = TimestepEmbedder()
    label, inputs = next(adapter_for("diffusers").part_inputs(part, seed=0))
    assert label.startswith("timestep=2 ")
    assert part(**inputs).shape == (2, 8)
