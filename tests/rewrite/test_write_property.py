"""Property: whatever a model file's encoding, BOM, coding cookie, line endings and stray
separator characters, ``apply --write`` changes only the edited statements, the file still
compiles and decodes as it declares, and a second apply changes nothing."""

from __future__ import annotations

import ast
import codecs
import difflib
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from adopter.match import Matcher
from adopter.rewrite import WriteStatus, rewrite_file, write_rewrites
from adopter.rules import load_rule_set
from tests.rewrite.samples import BERT_LIKE, EXTRA_LINE_BREAKS

# A second template: a Fig. 4 style optional batch norm, an nn.Sequential conv stack, and a
# head with bias + activation, dropout + add + layer norm and softmax (paper.4-7).
VISION_TEXT = """\
# A small vision-and-text model.
import torch
from torch import nn
from torch.nn import functional as F
ACT2FN = {"gelu": nn.GELU()}
GREETING = "hello"


class ConvLayer(nn.Module):
    def __init__(self, use_bn=True):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.use_bn = use_bn

    def forward(self, x):
        x = self.conv(x)  # convolve
        if self.use_bn:
            x = self.norm(x)
        return x


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(8, 8, 1, bias=False),  # 1x1
            nn.BatchNorm2d(8),
            nn.ReLU(),
        )

    def forward(self, x):
        return self.body(x)


class Head(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(8, 32)
        self.act = ACT2FN[config.hidden_act]
        self.out = nn.Linear(32, 8)
        self.drop = nn.Dropout(0.1)
        self.ln = nn.LayerNorm(8)

    def forward(self, hidden, residual):
        hidden = self.act(self.fc(hidden))
        hidden = self.drop(self.out(hidden))
        hidden = self.ln(hidden + residual)
        weights = F.softmax(hidden, dim=-1)
        return weights
"""

TEMPLATES = [BERT_LIKE, VISION_TEXT]
# Substrings of every statement a rule may edit in the templates: an original line outside
# them must come through byte for byte.
SITE_STATEMENTS = re.compile(
    rb"self\.(dropout|LayerNorm|dense|intermediate_act_fn|conv|bn|norm|fc|act|drop|ln|out|body)\("
    rb"|F\.softmax\(|^\s*(if self\.use_bn:|else:)\s*$"
)
KERNEL_LINE = re.compile(
    rb"adopter\.kernels|conv_batch_norm|dropout_add_layer_norm|linear_bias_activation|softmax"
    rb"|linear_batch_norm|^\s*\)?\s*$|^\s*\w+,\s*$|^\s*(if self\.use_bn:|else:)\s*$"
    rb"|self\.conv\(x\)"
)
BYTE_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
# Codecs Python source may declare that are ASCII-compatible (the cookie must be readable).
ENCODINGS = ["utf-8", "latin-1", "cp1252", "iso-8859-15", "cp437", "mac-roman", "koi8-r", "cp1251"]
NON_ASCII = "\u00e9\u00e0\u00ef\u00e7\u00f8\u00df\u00f1\u00fc\u0416\u0436\u042f\u20ac\u00a3\u00b5"
COOKIES = ["# -*- coding: {} -*-", "# coding={}", "# vim: set fileencoding={} :"]
MATCHER = Matcher(load_rule_set("paper"))


@st.composite
def model_files(draw) -> bytes:
    """The bytes of a model file."""
    text = draw(st.sampled_from(TEMPLATES))
    encoding = draw(st.sampled_from(ENCODINGS))
    bom = encoding == "utf-8" and draw(st.booleans())
    alphabet = [c for c in NON_ASCII if _encodable(c, encoding)] + list("abc xyz")
    greeting = draw(st.text(alphabet=alphabet, min_size=1, max_size=12))
    text = re.sub(r'GREETING = "[^"]*"', f'GREETING = "{greeting}"', text, count=1)
    comment = draw(st.text(alphabet=alphabet, max_size=8))
    text = text.replace("# regularise", f"# {comment} regularise").replace(
        "# convolve", f"# {comment} convolve"
    )
    for _ in range(draw(st.integers(0, 3))):  # stray separators in comments and strings
        character = draw(st.sampled_from([c for c in EXTRA_LINE_BREAKS if _encodable(c, encoding)]))
        spots = [m.end() for m in re.finditer(r"# |\"[a-z]", text)]
        if character == "\x0c":
            spots += [m.start() for m in re.finditer(r"^", text, re.M)][:-1]
        spot = draw(st.sampled_from(spots))
        text = text[:spot] + character + text[spot:]
    cookie_needed = encoding != "utf-8" or draw(st.booleans())
    if cookie_needed and not bom:
        cookie = draw(st.sampled_from(COOKIES)).format(encoding)
        if draw(st.booleans()):
            cookie = "#!/usr/bin/env python\n" + cookie
        text = cookie + "\n" + text
    newline = draw(st.sampled_from(["\n", "\r\n", "\r", "mixed"]))
    lines = text.split("\n")
    endings = [
        draw(st.sampled_from(["\n", "\r\n", "\r"])) if newline == "mixed" else newline
        for _ in lines[:-1]
    ]
    for index in range(1, len(endings)):  # "\r" then an empty "\n" line would read as one CRLF
        if endings[index - 1] == "\r" and not lines[index] and endings[index].startswith("\n"):
            endings[index] = "\r"
    text = "".join(line + ending for line, ending in zip(lines, endings)) + lines[-1]
    return (codecs.BOM_UTF8 if bom else b"") + text.encode(encoding)


def _encodable(character: str, encoding: str) -> bool:
    try:
        character.encode(encoding)
    except UnicodeEncodeError:
        return False
    return True


def _greeting(data: bytes) -> str:
    """GREETING as Python itself decodes the file (cookie, BOM, line endings)."""
    tree = ast.parse(data)
    return next(
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "GREETING"
    )


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(model_files())
def test_write_changes_only_the_edited_statements(data):
    try:
        compile(data, "model.py", "exec", dont_inherit=True)
    except SyntaxError:
        assume(False)
    greeting = _greeting(data)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.py"
        path.write_bytes(data)
        rewrite = rewrite_file(str(path), MATCHER)
        assert rewrite.error is None
        for result in rewrite.results:
            assert result.status == "patched" or result.reason
        (outcome,) = write_rewrites([rewrite])
        expected = WriteStatus.WRITTEN if rewrite.changed else WriteStatus.UNCHANGED
        assert outcome.status is expected, outcome
        written = path.read_bytes()
        # It compiles, and Python decodes it as it declares: the string is the same string.
        compile(written, str(path), "exec", dont_inherit=True)
        assert _greeting(written) == greeting
        assert written.startswith(codecs.BOM_UTF8) == data.startswith(codecs.BOM_UTF8)
        # Every original line outside an edited statement comes through byte for byte.
        old, new = BYTE_LINE.findall(data), BYTE_LINE.findall(written)
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        for tag, old_start, old_end, new_start, new_end in matcher.get_opcodes():
            if tag == "equal":
                continue
            for line in old[old_start:old_end]:
                assert SITE_STATEMENTS.search(line), (line, tag)
            for line in new[new_start:new_end]:
                # (or the comment of a removed statement, on a line of its own)
                carried = line.lstrip().startswith(b"#") and line.strip() in data
                assert KERNEL_LINE.search(line) or SITE_STATEMENTS.search(line) or carried, (
                    line,
                    tag,
                )
        # A second apply changes nothing.
        again = rewrite_file(str(path), MATCHER)
        assert not again.changed and again.error is None
