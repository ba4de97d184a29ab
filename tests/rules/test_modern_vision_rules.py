"""modern.5 (GroupNorm + activation) and modern.6 (conv + batch norm + activation) beside the
other rules of ``all``: one rewrite per place.

modern.6 fuses the two calls paper.7 (conv + batch norm) fuses, and the activation after them.
Where both match, the longer match is applied and the paper.7 site is reported as covered by
it; where no activation follows, paper.7 alone applies. The cases are modern.6's own fixture.
"""

from __future__ import annotations

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set
from tests.rules.fixture_cases import FIXTURES, read_fixture

CONV_BN_ACT = read_fixture(FIXTURES / "modern_6_conv_bn_act.py")
GROUP_NORM_ACT = read_fixture(FIXTURES / "modern_5_groupnorm_silu.py")


def _case(cases, title_start):
    return next(case for case in cases if case.title.startswith(title_start))


def _statuses(source: str) -> dict[tuple[str, int], tuple[str, str]]:
    result = rewrite_text(source, "model.py", Matcher(load_rule_set("all")))
    assert result.error is None, result.error
    assert not rewrite_text(result.patched, "model.py", Matcher(load_rule_set("all"))).changed
    return {(r.site.rule.id, r.site.line): (r.status, r.reason) for r in result.results}


def test_conv_bn_act_covers_the_conv_batchnorm_site_it_contains():
    for title in ("ResNet stem", "torchvision-style", "transformers ResNetConvLayer"):
        case = _case(CONV_BN_ACT, title)
        statuses = _statuses(case.source)
        for line in case.sites:
            assert statuses[("modern.6", line)][0] == "patched", (title, line)
            status, reason = statuses[("paper.7", line)]
            assert status == "covered", (title, line)
            assert reason.startswith("inside the modern.6 fusion at line "), reason


def test_conv_batchnorm_without_an_activation_stays_paper_7():
    case = _case(CONV_BN_ACT, "conv + batch norm without an activation")
    statuses = _statuses(case.source)
    assert [key for key in statuses if key[0] == "modern.6"] == []
    assert [status for key, (status, _) in statuses.items() if key[0] == "paper.7"] == ["patched"]


def test_the_paper_set_alone_is_unchanged_by_the_modern_rules():
    case = _case(CONV_BN_ACT, "ResNet stem")
    result = rewrite_text(case.source, "model.py", Matcher(load_rule_set("paper")))
    assert [(r.site.rule.id, r.status) for r in result.results] == [("paper.7", "patched")]
    assert "conv_batch_norm(x, self.conv1, self.bn1)" in result.patched


def test_group_norm_sites_take_one_rewrite_in_all():
    case = _case(GROUP_NORM_ACT, "diffusers ResNet block")
    statuses = _statuses(case.source)
    assert {key: status for key, (status, _) in statuses.items()} == {
        ("modern.5", line): "patched" for line in case.sites
    }
