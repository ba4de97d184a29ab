"""A patched text back to bytes in the file's own encoding, byte for byte outside the edits.

Python source may declare any codec its tokenizer accepts (``# -*- coding: latin-1 -*-``) and may
start with a UTF-8 byte order mark. The patched text is encoded with the same codec and BOM, and
only when three checks hold, so that every line the rewrite did not touch keeps its exact bytes:

* the original bytes decode and encode back to themselves (``raw_unicode_escape`` reads
  ``\\u00e9`` and ``é`` as the same character and would write both as ``é``);
* the codec encodes line by line (the bytes of a text are the bytes of its lines, one after the
  other), which stateful codecs such as ISO-2022 need not do;
* the result decodes, under its own coding cookie, to the patched text.

Anything else refuses the file with a located message rather than write it.
"""

from __future__ import annotations

import codecs

from ..dsl.errors import LocatedError
from ..extract.source import DecodedSource, SourceError, decode_source_file, split_lines


class EncodingRefusal(LocatedError):
    """A patched text that cannot be written in its file's encoding without changing bytes
    outside the edits."""


def encode_patched(path: str, data: bytes, source: DecodedSource, patched: str) -> bytes:
    """The bytes to write for ``patched``, the new text of the file whose bytes were ``data``
    (decoded as ``source``); raises :class:`EncodingRefusal`."""
    bom = codecs.BOM_UTF8 if source.bom else b""
    encoding = source.encoding
    original = _encode_lines(path, source.text, encoding, "the file")
    if bom + original != data:
        line = _first_differing_line(bom + original, data)
        raise EncodingRefusal(
            path,
            line,
            1,
            f"the file's bytes do not survive decoding and encoding as {encoding} (line {line}); "
            "file left unchanged",
        )
    new = bom + _encode_lines(path, patched, encoding, "the patch")
    try:
        back = decode_source_file(new, path)
    except SourceError as error:
        raise EncodingRefusal(
            path, error.line, error.column, f"the patched file would not decode: {error.message}"
        ) from None
    if back.text != patched or back.encoding != encoding:
        raise EncodingRefusal(
            path, 1, 1, f"the patched file would not decode as {encoding}; file left unchanged"
        )
    return new


def _encode_lines(path: str, text: str, encoding: str, what: str) -> bytes:
    lines = split_lines(text)
    encoded: list[bytes] = []
    for number, line in enumerate(lines, 1):
        try:
            encoded.append(line.encode(encoding))
        except UnicodeEncodeError as error:
            character = line[error.start]
            column = len(line[: error.start].encode("utf-8")) + 1
            raise EncodingRefusal(
                path,
                number,
                column,
                f"{what} has {character!r} (U+{ord(character):04X}) on line {number}, which "
                f"{encoding} cannot encode; file left unchanged",
            ) from None
        except UnicodeError as error:
            raise EncodingRefusal(
                path, number, 1, f"cannot encode {what} as {encoding}: {error}"
            ) from None
    whole = b"".join(encoded)
    try:
        at_once = text.encode(encoding)
    except UnicodeError as error:
        raise EncodingRefusal(path, 1, 1, f"cannot encode {what} as {encoding}: {error}") from None
    if whole != at_once:
        raise EncodingRefusal(
            path,
            1,
            1,
            f"{encoding} does not encode line by line (a stateful codec), so the lines around "
            "an edit could change; file left unchanged",
        )
    return whole


def _first_differing_line(first: bytes, second: bytes) -> int:
    index = next(
        (i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second))
    )
    return second.count(b"\n", 0, index) + 1
