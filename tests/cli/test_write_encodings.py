"""``apply --write`` keeps a file's encoding, BOM and line endings: every byte outside the edited
statements stays as it was, and the written file decodes with its own declared encoding."""

from __future__ import annotations

import ast

import pytest
from typer.testing import CliRunner

from adopter.cli import app
from adopter.extract.source import decode_source_file
from adopter.match import Matcher
from adopter.rewrite import rewrite_text
from adopter.rewrite.encoding import EncodingRefusal, encode_patched
from adopter.rules import load_rule_set
from tests.rewrite.samples import BERT_LIKE

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

CLEAN = rewrite_text(BERT_LIKE, "model.py", Matcher(load_rule_set("paper"))).patched


def _greeting(data: bytes) -> str:
    """The module's GREETING string as Python itself decodes the file (cookie, BOM, endings)."""
    tree = ast.parse(data)
    (value,) = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "GREETING"
    ]
    return value


def _apply(path) -> None:
    result = runner.invoke(app, ["apply", str(path), "--write"])
    assert result.exit_code == 0, result.stderr
    assert "5 site(s) patched in 1 file(s)" in result.stderr


@pytest.mark.parametrize(
    "encoding",
    ["latin-1", "cp1252", "iso-8859-15", "utf-8", "mac-roman", "cp437"],
)
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_coding_cookie_and_line_endings_are_kept(tmp_path, encoding, newline):
    cookie = f"# -*- coding: {encoding} -*-\n"
    target = tmp_path / "model.py"
    target.write_bytes((cookie + BERT_LIKE).replace("\n", newline).encode(encoding))
    _apply(target)
    written = target.read_bytes()
    assert written == (cookie + CLEAN).replace("\n", newline).encode(encoding)
    assert (
        _greeting(written)
        == _greeting(BERT_LIKE.encode())
        == "d\u00e9j\u00e0 vu, na\u00efve caf\u00e9"
    )


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_utf8_bom_is_kept(tmp_path, newline):
    target = tmp_path / "model.py"
    target.write_bytes(b"\xef\xbb\xbf" + BERT_LIKE.replace("\n", newline).encode())
    _apply(target)
    assert target.read_bytes() == b"\xef\xbb\xbf" + CLEAN.replace("\n", newline).encode()


def test_a_byte_that_does_not_round_trip_refuses_the_file(tmp_path):
    """raw_unicode_escape decodes ``\\u00e9`` to ``é`` but writes ``é`` back as one byte: the
    file would change outside the edits, so its sites are skipped with the reason and the line."""
    source = "# coding: raw_unicode_escape\n" + BERT_LIKE.replace(
        'GREETING = "', 'GREETING = "\\u00e9 '
    )
    target = tmp_path / "model.py"
    target.write_bytes(source.encode("raw_unicode_escape"))
    result = runner.invoke(app, ["apply", str(target), "--write"])
    assert target.read_bytes() == source.encode("raw_unicode_escape")
    assert "0 site(s) patched" in result.stderr and "5 skipped" in result.stderr
    assert (
        "do not survive decoding and encoding as raw_unicode_escape (line 10); file left unchanged"
        in result.stderr
    )


def test_text_the_encoding_cannot_hold_is_refused_with_its_place():
    """Kernel names are ASCII and copied source is the file's own, so a patch cannot add such
    a character today; if one did, the file is refused at the character, not written."""
    original = "# -*- coding: latin-1 -*-\nx = 'caf\u00e9'\n"
    data = original.encode("latin-1")
    source = decode_source_file(data, "model.py")
    patched = original + "y = '\u03b1'\n"
    with pytest.raises(EncodingRefusal) as refused:
        encode_patched("model.py", data, source, patched)
    assert str(refused.value).startswith("model.py:3:6: the patch has '\u03b1' (U+03B1) on line 3")
    assert "iso-8859-1 cannot encode" in str(refused.value)
    assert encode_patched("model.py", data, source, original + "y = 1\n") == (
        original + "y = 1\n"
    ).encode("latin-1")


@pytest.mark.parametrize(
    "encoding, text",
    [
        ("utf-7", "x = 'caf\u00e9'  # +- 1\n"),
        ("iso2022_jp", "x = '\u3042'  # \u3044\n"),
        ("hz", "x = '\u4e2d'  # \u6587\n"),
    ],
)
def test_stateful_codecs_keep_every_unchanged_line(encoding, text):
    """Codecs with shift states are written only when they encode line by line; these do, so
    an added line leaves the bytes of the others as they were."""
    original = f"# -*- coding: {encoding} -*-\n{text}y = 2\n"
    data = original.encode(encoding)
    source = decode_source_file(data, "model.py")
    assert encode_patched("model.py", data, source, original + "z = 3\n") == data + b"z = 3\n"
