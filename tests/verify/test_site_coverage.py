""" "Verified" means every patched site ran and matched.

Regression for a wrong patch (Whisper's ``WhisperForAudioClassification`` in transformers 5.x)
reported "verified, max diff 0.0": the patched softmax sits under
``if self.config.use_weighted_layer_sum:`` (False by default) in a head class that the default
choice of classes (base model + first head) does not check. ``guarded/modeling_guarded.py`` is
our own small model with the same shape; a module constant guards a second site that nothing
can reach.
"""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from adopter.models.sites import find_sites
from adopter.rules import load_rule_set
from adopter.verify import FileVerification, VerifyOptions
from adopter.verify.coverage import SiteRecorder
from tests.verify.fixture_files import rewritten_by, verdicts_of

pytestmark = pytest.mark.slow  # see pyproject.toml's markers

FIXTURE = Path(__file__).with_name("guarded") / "modeling_guarded.py"
GUARDED = "weights = softmax(self.pool_query(hidden).squeeze(-1), dim=-1)"
UNREACHABLE = "weights = softmax(hidden.sum(-1), dim=-1)"
UNREACHABLE_ORIGINAL = "weights = nn.functional.softmax(hidden.sum(-1), dim=-1)"


def _line_of(text: str, fragment: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if fragment in line)


# -- static: the sites of a patched text ---------------------------------------------------------
def test_sites_are_kernel_calls_with_their_guards_and_config_fields() -> None:
    patched = textwrap.dedent(
        """\
        from adopter.kernels import softmax as sm, fused_bert_self_attention

        class Head:
            def __init__(self, config):
                self.pool = config.pooling_kind
                self.attention = fused_bert_self_attention(Attention)(config)

            def forward(self, x):
                if self.config.use_weighted_layer_sum:
                    x = sm(x, dim=-1)
                elif self.pool == "attention":
                    x = sm(
                        x, dim=0)
                return x
        """
    )
    original = patched.replace("x = sm(\n            x, dim=0)", "x = x.softmax(0)")
    sites = find_sites(patched, original)
    assert [(s.kernel, s.line, s.function) for s in sites] == [
        ("fused_bert_self_attention", 6, "Head.__init__"),
        ("softmax", 10, "Head.forward"),
        ("softmax", 12, "Head.forward"),
    ]
    assert sites[0].guards == [] and sites[0].end_column == len(
        "        self.attention = fused_bert_self_attention(Attention)"
    )
    assert sites[1].guards == ["self.config.use_weighted_layer_sum"]
    assert sites[1].config_fields == {"use_weighted_layer_sum": []}
    assert sites[2].guards[-1] == "self.pool == 'attention'"
    # self.pool comes from config.pooling_kind in __init__: that field, compared with "attention"
    assert sites[2].config_fields["pooling_kind"] == ["attention"]
    assert (sites[2].line, sites[2].end_line) == (12, 13)
    assert sites[2].original_line == 12


# -- the recorder: counts by exact call position ------------------------------------------------
def _kernel(x: int) -> int:
    return x + 1


_kernel.__module__ = "adopter.kernels.fake"


class _Built:
    def forward(self, x: int) -> int:
        return x * 2


def _class_kernel(base: type) -> type:
    return _Built


_class_kernel.__module__ = "adopter.kernels.fake"


def _load(tmp_path: Path, text: str) -> ModuleType:
    path = tmp_path / "patched_module.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("patched_module", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recorder_counts_each_call_site_and_built_modules_when_they_run(tmp_path: Path) -> None:
    text = textwrap.dedent(
        """\
        from adopter.kernels import kernel, class_kernel

        def run(x, twice):
            y = kernel(kernel(x))
            if twice:
                y = kernel(y)
            return y

        def build():
            return class_kernel(object)()
        """
    )
    module = _load(tmp_path, text.replace("from adopter.kernels import kernel, class_kernel", ""))
    module.kernel, module.class_kernel = _kernel, _class_kernel
    sites = find_sites(text)
    recorder = SiteRecorder(sites)
    assert sorted(recorder.install(module)) == ["class_kernel", "kernel"]
    assert module.run(1, twice=False) == 3
    keys = {(s.line, s.column): s.key for s in sites}
    assert recorder.counts == {keys[(4, 8)]: 1, keys[(4, 15)]: 1}
    built = module.build()
    assert recorder.counts[keys[(10, 11)]] == 0  # built, not run yet
    assert built.forward(2) == 4 and isinstance(built, _Built)
    assert recorder.counts[keys[(10, 11)]] == 1
    before = recorder.snapshot()
    module.run(1, twice=True)
    assert recorder.since(before) == {keys[(4, 8)]: 1, keys[(4, 15)]: 1, keys[(6, 12)]: 1}


# -- end to end on the guarded model ------------------------------------------------------------


def _patched_correctly() -> str:
    patched = rewritten_by(FIXTURE, "paper.4").patched
    assert GUARDED in patched and UNREACHABLE in patched
    return patched


@pytest.fixture(scope="module")
def verdicts() -> dict[str, FileVerification]:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers")
    patched = _patched_correctly()
    cases = {
        # the guarded site alone is wrong: the Whisper case
        "wrong-guarded": patched.replace(GUARDED, GUARDED.replace("dim=-1", "dim=0")).replace(
            UNREACHABLE, UNREACHABLE_ORIGINAL
        ),
        "correct": patched.replace(UNREACHABLE, UNREACHABLE_ORIGINAL),
        "unreachable": patched,
    }
    return verdicts_of(FIXTURE, cases, VerifyOptions(max_heads=1, timeout=240))


def test_a_wrong_patch_under_a_config_flag_in_an_unchecked_head_is_refuted(
    verdicts: dict[str, FileVerification],
) -> None:
    verification = verdicts["wrong-guarded"]
    assert verification.status == "refuted", verification.summary()
    refuted = [c for c in verification.classes if c.status == "refuted"]
    assert [c.label for c in refuted] == ["GuardedForAudioClassification [use_attention_pool=True]"]


def test_a_correct_patch_is_verified_once_the_flag_is_flipped(
    verdicts: dict[str, FileVerification],
) -> None:
    verification = verdicts["correct"]
    assert verification.status == "verified", verification.summary()
    guarded = next(e for e in verification.sites if e.site.cls == "GuardedForAudioClassification")
    assert set(guarded.matched_in) == {
        "GuardedForAudioClassification [use_attention_pool=True]: eval",
        "GuardedForAudioClassification [use_attention_pool=True]: train",
    }
    # the head that holds the site is checked although it is not among the first heads
    assert "GuardedForAudioClassification" in [c.label for c in verification.classes]


def test_a_site_nothing_reaches_makes_the_file_not_exercised(
    verdicts: dict[str, FileVerification],
) -> None:
    verification = verdicts["unreachable"]
    assert verification.status == "not exercised", verification.summary()
    (missing,) = verification.not_exercised
    original = FIXTURE.read_text(encoding="utf-8")
    assert missing.site.original_line == _line_of(original, UNREACHABLE_ORIGINAL)
    assert missing.site.kernel == "softmax"
    assert missing.ran_in == {}
    assert "_EXPERIMENTAL_POOL" in missing.reason
    assert "not exercised" in verification.summary()
    assert verification.to_json()["sites"][-1]["status"] == "not exercised"


def test_apply_verify_does_not_write_a_file_whose_sites_did_not_all_run() -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers")
    from adopter.gate import gate_rewrites

    rules = [r for r in load_rule_set("paper") if r.id == "paper.4"]
    rewrite = rewritten_by(FIXTURE, "paper.4")
    (gated,) = gate_rewrites([rewrite], rules, timeout=240, modes=("eval",), max_heads=1)
    assert gated.status == "not exercised", gated.reason
    assert gated.text is None and "paper.4" in gated.dropped_rules
    assert "_EXPERIMENTAL_POOL" in gated.reason


def test_verify_command_rows_name_the_file_verdict_and_every_site() -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers")
    import json

    from typer.testing import CliRunner

    from adopter.cli import app

    result = CliRunner().invoke(
        app, ["verify", str(FIXTURE), "--select", "paper.4", "--modes", "eval", "-f", "json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    (file_row,) = [row for row in rows if row["kind"] == "file"]
    assert file_row["status"] == "not exercised"
    sites = [row for row in rows if row["kind"] == "site"]
    original = FIXTURE.read_text(encoding="utf-8")
    assert {(row["line"], row["status"]) for row in sites} == {
        (_line_of(original, "probs = nn.functional.softmax"), "exercised"),
        (_line_of(original, "nn.functional.softmax(self.pool_query"), "exercised"),
        (_line_of(original, UNREACHABLE_ORIGINAL), "not exercised"),
    }


def test_several_kernel_calls_for_one_original_line_are_told_apart() -> None:
    original = "def f(x):\n    return self.seq(x)\n"
    patched = (
        "from adopter.kernels import conv_batch_norm as cbn\n"
        "def f(x):\n    return cbn(cbn(x, a, b), c, d)\n"
    )
    sites = find_sites(patched, original)
    assert [s.original_line for s in sites] == [2, 2]
    assert [s.describe() for s in sites] == [
        "conv_batch_norm at line 2 (call 1 of 2 there) (f)",
        "conv_batch_norm at line 2 (call 2 of 2 there) (f)",
    ]


def test_recorder_notes_the_backend_each_site_dispatched_to(tmp_path: Path) -> None:
    import torch

    import adopter.kernels as kernels

    text = textwrap.dedent(
        """\
        from adopter.kernels import rms_norm, linear_cross_entropy

        def run(x, w, t):
            return linear_cross_entropy(rms_norm(x, None, 1e-6), w, None, t)
        """
    )
    module = _load(tmp_path, text.replace(text.splitlines()[0], ""))
    module.rms_norm, module.linear_cross_entropy = kernels.rms_norm, kernels.linear_cross_entropy
    sites = find_sites(text)
    recorder = SiteRecorder(sites)
    recorder.install(module)
    before = recorder.backends_snapshot()
    module.run(torch.randn(4, 3), torch.randn(5, 3), torch.tensor([0, 1, 2, -100]))
    keys = {(s.line, s.column): s.key for s in sites}
    ran = recorder.backends_since(before)
    # the CPU defaults in eager code: ours
    assert ran == {
        keys[(4, 32)]: {"rms_norm=adopter": 1},
        keys[(4, 11)]: {"linear_cross_entropy=adopter": 1},
    }
