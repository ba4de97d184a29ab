"""End-to-end differential tests on real transformers 4.34 modeling files.

A worker subprocess imports torch and transformers (a few seconds), so most cases run in one
batch (``verify_patched_files``) shared by the tests through a fixture. They cover: unchanged
sources must verify, a correct kernel patch must verify, wrong patches must be refuted with the
difference located, a renamed parameter must fail the strict ``state_dict`` load, and broken
code under test must come back as "not checkable" instead of crashing verify.

The test process itself never imports transformers: it only locates the installed package.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path

import pytest

from adopter.verify import (
    FileVerification,
    PatchedFile,
    VerifyOptions,
    module_name_for,
    verify_patched_file,
    verify_patched_files,
)

_SPEC = importlib.util.find_spec("transformers")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_SPEC is None, reason="transformers is not installed"),
]

KERNEL_IMPORT = "from adopter.kernels import dropout_add_layer_norm\n"
UNFUSED = """        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
"""
FUSED = """        hidden_states = dropout_add_layer_norm(hidden_states, input_tensor, self.dropout, self.LayerNorm)
"""


def modeling_file(family: str) -> Path:
    assert _SPEC is not None and _SPEC.origin is not None
    return Path(_SPEC.origin).parent / "models" / family / f"modeling_{family}.py"


def bert_source() -> str:
    return modeling_file("bert").read_text(encoding="utf-8")


def with_kernel_import(source: str) -> str:
    """Add the kernel import in front of the module's first import line."""
    head, sep, tail = source.partition("import math\n")
    assert sep, "modeling_bert.py changed: no 'import math' line"
    return head + KERNEL_IMPORT + sep + tail


def patch_bert(replacement: str) -> str:
    source = bert_source()
    assert source.count(UNFUSED) == 2  # BertSelfOutput and BertOutput
    return with_kernel_import(source.replace(UNFUSED, replacement))


@pytest.fixture(scope="module")
def corpus_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """modeling_bert.py in an unpacked-wheel layout outside the import path (like .cache/corpus)."""
    root = tmp_path_factory.mktemp("corpus") / "4.34.0"
    package = root / "transformers" / "models" / "bert"
    package.mkdir(parents=True)
    for directory in (root / "transformers", root / "transformers" / "models", package):
        (directory / "__init__.py").write_text("")
    shutil.copy(modeling_file("bert"), package / "modeling_bert.py")
    return package / "modeling_bert.py"


def assert_verified(result: FileVerification) -> None:
    assert result.error is None, result.summary()
    assert result.classes, result.summary()
    for verdict in result.classes:
        assert verdict.status == "verified", result.summary()
        assert verdict.modes["eval"].startswith("verified"), result.summary()
        assert verdict.modes["train"].startswith("verified"), result.summary()
    assert result.status == "verified"


UNPATCHED_CASES = {
    "bert": None,  # the default choice: BertModel plus two heads
    "gpt2": ["GPT2Model", "GPT2LMHeadModel"],
    "t5": ["T5ForConditionalGeneration"],
    "resnet": ["ResNetModel", "ResNetForImageClassification"],
}


def patched_cases(corpus_copy: Path) -> dict[str, PatchedFile]:
    """Every batch case by name: the original file and the patched text (and classes)."""
    bert = modeling_file("bert")
    cases = {
        f"unpatched-{family}": PatchedFile(
            modeling_file(family),
            modeling_file(family).read_text(encoding="utf-8"),
            classes=classes,
        )
        for family, classes in UNPATCHED_CASES.items()
    }
    # The original given as a copy outside the import path: it maps to the installed module.
    cases["fused"] = PatchedFile(corpus_copy, patch_bert(FUSED), classes=["BertModel"])
    # A copy whose text differs from the installed module: that text is the original.
    edited = corpus_copy.with_name("modeling_bert_edited.py")
    edited_text = bert_source().replace(
        "        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)\n",
        "        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=1e-3)\n",
    )
    assert edited_text != bert_source()
    edited.write_text(edited_text, encoding="utf-8")
    cases["edited-original"] = PatchedFile(
        edited,
        edited_text,
        module_name="transformers.models.bert.modeling_bert",
        classes=["BertModel"],
    )
    cases["edited-vs-installed"] = PatchedFile(
        edited,
        bert_source(),
        module_name="transformers.models.bert.modeling_bert",
        classes=["BertModel"],
    )
    # The fused patch, but the layer norms' epsilon changed from 1e-12 to 1e-2.
    wrong_eps = patch_bert(FUSED).replace("eps=config.layer_norm_eps", "eps=1e-2")
    cases["wrong-eps"] = PatchedFile(bert, wrong_eps, classes=["BertModel"])
    swapped = FUSED.replace("(hidden_states, input_tensor,", "(input_tensor, hidden_states,")
    cases["swapped"] = PatchedFile(bert, patch_bert(swapped), classes=["BertModel"])
    renamed = bert_source().replace("self.LayerNorm", "self.layer_norm")
    cases["renamed"] = PatchedFile(bert, renamed, classes=["BertModel"])
    attention = bert_source() + (
        "\n\nfrom adopter.kernels import fused_bert_self_attention\n"
        "BertSelfAttention = fused_bert_self_attention(BertSelfAttention)\n"
    )
    cases["attention"] = PatchedFile(bert, attention, classes=["BertModel"])
    broken = with_kernel_import(bert_source()).replace(
        KERNEL_IMPORT, "from adopter.kernels import no_such_kernel\n"
    )
    cases["import-error"] = PatchedFile(bert, broken, classes=["BertModel", "BertForMaskedLM"])
    return cases


@pytest.fixture(scope="module")
def batch(corpus_copy: Path) -> dict[str, FileVerification]:
    """All cases in one worker process: torch and transformers are imported once."""
    cases = patched_cases(corpus_copy)
    results = verify_patched_files(list(cases.values()), VerifyOptions(timeout=240))
    return dict(zip(cases, results))


@pytest.mark.parametrize("family", list(UNPATCHED_CASES))
def test_unpatched_source_verifies(batch: dict[str, FileVerification], family: str) -> None:
    result = batch[f"unpatched-{family}"]
    assert_verified(result)
    for verdict in result.classes:
        assert verdict.max_abs_diff == 0.0  # identical code is bit-identical
    if UNPATCHED_CASES[family] is None:
        names = [c.cls for c in result.classes]
        assert names[0] == "BertModel" and len(names) == 3, names


def test_correct_kernel_patch_verifies_including_dropout(
    batch: dict[str, FileVerification],
) -> None:
    result = batch["fused"]
    assert_verified(result)
    verdict = result.get("BertModel")
    # On the CPU the kernel draws its dropout mask exactly like nn.Dropout: compared, not skipped.
    assert verdict.modes["train-dropout"].startswith("verified"), verdict
    assert any("installed" in note for note in result.notes), result.notes


def test_an_original_that_differs_from_the_installed_module_is_used_as_is(
    batch: dict[str, FileVerification],
) -> None:
    result = batch["edited-original"]
    assert_verified(result)
    assert any("differs from the installed" in note for note in result.notes), result.notes
    # Patching the edited original back to the installed text changes the epsilon: refuted.
    assert batch["edited-vs-installed"].status == "refuted"


def test_wrong_layer_norm_eps_is_refuted(batch: dict[str, FileVerification]) -> None:
    result = batch["wrong-eps"]
    verdict = result.get("BertModel")
    assert verdict.status == "refuted", result.summary()
    assert result.status == "refuted"
    assert verdict.max_abs_diff is not None and 1e-3 < verdict.max_abs_diff < math.inf
    assert verdict.where is not None
    assert verdict.where.startswith(("output ", "grad ")), verdict.where
    assert "differ" in verdict.reason
    assert verdict.modes["eval"].startswith("refuted")


def test_swapped_residual_is_refuted_only_with_dropout(batch: dict[str, FileVerification]) -> None:
    """With dropout off, dropout(h) + r == dropout(r) + h: only train-dropout can tell."""
    verdict = batch["swapped"].get("BertModel")
    assert verdict.status == "refuted", batch["swapped"].summary()
    assert verdict.modes["eval"].startswith("verified")
    assert verdict.modes["train"].startswith("verified")
    assert verdict.modes["train-dropout"].startswith("refuted")
    assert verdict.max_abs_diff is not None and verdict.max_abs_diff > 1e-3


def test_renamed_parameter_fails_the_strict_state_dict_load(
    batch: dict[str, FileVerification],
) -> None:
    verdict = batch["renamed"].get("BertModel")
    assert verdict.status == "refuted", batch["renamed"].summary()
    assert verdict.where == "state_dict"
    assert "missing keys" in verdict.reason and "unexpected keys" in verdict.reason
    assert "embeddings.LayerNorm.weight" in verdict.reason
    assert "embeddings.layer_norm.weight" in verdict.reason


def test_attention_kernel_skips_dropout_comparison_with_reason(
    batch: dict[str, FileVerification],
) -> None:
    result = batch["attention"]
    assert_verified(result)
    verdict = result.get("BertModel")
    assert verdict.modes["train-dropout"].startswith("skipped"), verdict.modes
    assert "fused_bert_self_attention" in verdict.modes["train-dropout"]
    assert "skipped" in verdict.reason


def test_import_error_of_patched_source_is_not_checkable(
    batch: dict[str, FileVerification],
) -> None:
    result = batch["import-error"]
    assert [c.cls for c in result.classes] == ["BertModel", "BertForMaskedLM"]
    for verdict in result.classes:
        assert verdict.status == "not checkable"
        assert "failed to import" in verdict.reason and "no_such_kernel" in verdict.reason
    assert result.status == "not checkable"


def test_timeout_is_not_checkable() -> None:
    hanging = bert_source().replace("import math\n", "import math\nimport time\ntime.sleep(600)\n")
    result = verify_patched_file(
        modeling_file("bert"), hanging, VerifyOptions(timeout=3), classes=["BertModel"]
    )
    (verdict,) = result.classes
    assert verdict.status == "not checkable"
    assert "timed out after 3 s" in verdict.reason
    assert result.status == "not checkable"


def test_module_name_for_maps_copies_to_the_installed_name(corpus_copy: Path) -> None:
    name, root = module_name_for(corpus_copy)
    assert name == "transformers.models.bert.modeling_bert"
    assert root == corpus_copy.parents[3]
    assert module_name_for(modeling_file("gpt2"))[0] == "transformers.models.gpt2.modeling_gpt2"
