"""Characters that :meth:`str.splitlines` treats as line breaks but Python does not (form feed,
vertical tab, U+001C..U+001E, U+0085, U+2028, U+2029) must not shift line numbers between the
parser, the analysis and the rewrite: each is placed at many points of a modeling file and the
rewrite must be the one of the clean file, with the character kept where it was."""

from __future__ import annotations

import functools
import io
import tokenize

import pytest

from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rules import load_rule_set
from tests.rewrite.samples import BERT_LIKE, EXTRA_LINE_BREAKS, PATCHED_FRAGMENTS

RULES = load_rule_set("paper")


def _rewrite(text: str, rules=RULES):
    return rewrite_text(text, "model.py", Matcher(rules))


CLEAN = _rewrite(BERT_LIKE)


def _insertion_points(text: str, character: str) -> list[int]:
    """Offsets where ``character`` leaves valid Python: inside every comment and string, and,
    for a form feed, also between tokens, at line starts and on blank lines."""
    points: list[int] = []
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    line_offsets = [0]
    for line in text.splitlines(keepends=True):
        line_offsets.append(line_offsets[-1] + len(line))
    code_tokens = 0
    for token in tokens:
        start = line_offsets[token.start[0] - 1] + token.start[1]
        if token.type == tokenize.COMMENT:
            points += [start + 1, start + len(token.string) // 2, start + len(token.string)]
        elif token.type == tokenize.STRING:
            points.append(start + len(token.string) // 2)
        elif character == "\x0c" and token.type in (tokenize.OP, tokenize.NAME):
            code_tokens += 1
            if code_tokens % 7 == 0:  # every 7th keeps the test fast and reaches every line kind
                points.append(start)
    if character == "\x0c":
        points += [offset for offset in line_offsets[:-1]]
    return sorted(set(points))


@functools.cache
def _expected(rule_ids: frozenset[str]) -> str:
    """The clean file rewritten by these rules only."""
    subset = [rule for rule in RULES if rule.id in rule_ids]
    return _rewrite(BERT_LIKE, subset).patched if subset else BERT_LIKE


def _valid(text: str) -> bool:
    try:
        compile(text, "model.py", "exec", dont_inherit=True)
    except SyntaxError:  # e.g. a form feed after indentation: the line dedents to column 0
        return False
    return True


@pytest.mark.parametrize("character", EXTRA_LINE_BREAKS, ids=lambda c: f"U+{ord(c):04X}")
def test_separator_characters_never_move_an_edit(character):
    placed = 0
    for point in _insertion_points(BERT_LIKE, character):
        text = BERT_LIKE[:point] + character + BERT_LIKE[point:]
        if not _valid(text):
            continue
        placed += 1
        result = _rewrite(text)
        where = f"at offset {point} (line {BERT_LIKE.count(chr(10), 0, point) + 1})"
        patched = [r.site.rule.id for r in result.results if r.status == "patched"]
        for r in result.results:
            assert r.status in ("patched", "skipped"), where
            assert r.status == "patched" or r.reason, where
        # The character stays where it was, unless it sat in a statement the rewrite replaced.
        line_start = BERT_LIKE.rfind("\n", 0, point) + 1
        line = BERT_LIKE[line_start : BERT_LIKE.find("\n", point) + 1]
        kept = result.patched.count(character)
        edited = CLEAN.patched.count(line) < BERT_LIKE.count(line)
        assert kept == 1 or (kept == 0 and edited), where
        # Everything else is the rewrite of the clean file by the rules that were applied.
        assert result.patched.replace(character, "") == _expected(frozenset(patched)), where
        for rule_id in patched:  # (a form feed between tokens may be copied into the call)
            assert PATCHED_FRAGMENTS[rule_id] in result.patched.replace(character, ""), where
        compile(result.patched, "model.py", "exec")
        again = _rewrite(result.patched)
        assert not again.changed, where
    assert placed >= 15


def test_form_feed_in_a_trailing_comment_edits_the_right_line():
    """The reported case: the dropout line ends in ``# page<FF>break``; the rewrite fused the
    wrong line (deleting the dropout) and still reported the site patched."""
    text = BERT_LIKE.replace("# page break", "# page\x0cbreak")
    result = _rewrite(text)
    assert [r.status for r in result.results] == ["patched"] * 5
    assert PATCHED_FRAGMENTS["paper.5"] in result.patched
    assert result.patched.replace("\x0c", " ") == CLEAN.patched
