"""Reading and parsing Python source without ever executing it."""

from __future__ import annotations

import ast
import codecs
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

from ..dsl.errors import LocatedError
from ..files import FileRefused, read_regular_file


class SourceError(LocatedError):
    """A source file that cannot be read or parsed."""


# Python's tokenizer, and so every ``ast`` line number, breaks lines at these three only.
# ``str.splitlines`` also breaks at \v, \f, \x1c-\x1e, \x85, \u2028 and \u2029, which are
# ordinary characters inside a comment or a string (and \f is whitespace between tokens).
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_BYTE_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` as Python numbers them, each with its own line ending."""
    return _LINE.findall(text)


def line_ending(text: str) -> str:
    """The file's line ending: the first one it uses (LibCST and ruff choose the same way)."""
    found = _LINE_BREAK.search(text)
    return found.group() if found else "\n"


@dataclass(frozen=True)
class DecodedSource:
    """A file's text and how to write it back: its codec (as Python's tokenizer names it, for
    the bytes after any BOM) and whether it starts with a UTF-8 byte order mark."""

    text: str
    encoding: str
    bom: bool


def decode_source_file(data: bytes, path: str) -> DecodedSource:
    """Decode bytes as Python does: a PEP 263 coding cookie, else UTF-8; a UTF-8 BOM is kept
    apart from the text."""
    # The cookie sits on line 1 or 2, as Python splits lines: a file with CR line endings has
    # no b"\n" at all, which is all that ``BytesIO.readline`` splits at.
    lines = _BYTE_LINE.finditer(data)
    first_lines = iter([match.group() for match, _ in zip(lines, range(2))])
    try:
        encoding, _ = tokenize.detect_encoding(lambda: next(first_lines, b""))
    except SyntaxError as error:
        raise SourceError(path, 1, 1, f"unreadable encoding declaration: {error}") from None
    bom = data.startswith(codecs.BOM_UTF8)
    if bom:
        data, encoding = data[len(codecs.BOM_UTF8) :], "utf-8"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise SourceError(
            path, line, column, f"cannot decode byte 0x{data[error.start]:02x} as {encoding}"
        ) from None
    except UnicodeError as error:  # codecs that fail as a whole (idna, punycode)
        raise SourceError(path, 1, 1, f"cannot decode as {encoding}: {error}") from None
    return DecodedSource(text, encoding, bom)


def decode_source(data: bytes, path: str) -> str:
    """Decode bytes as Python does: a PEP 263 coding cookie, else UTF-8."""
    return decode_source_file(data, path).text


def read_source_bytes(path: str | Path) -> bytes:
    """A Python file's bytes; raises :class:`SourceError` with a location on any failure (only
    regular files of at most :func:`adopter.files.max_file_bytes` are read)."""
    name = str(path)
    try:
        return read_regular_file(path)
    except FileNotFoundError:
        raise SourceError(name, 1, 1, "no such file") from None
    except IsADirectoryError:
        raise SourceError(name, 1, 1, "is a directory, not a file") from None
    except FileRefused as error:
        raise SourceError(name, 1, 1, str(error)) from None
    except OSError as error:
        raise SourceError(name, 1, 1, f"cannot read: {error.strerror or error}") from None


def read_source(path: str | Path) -> str:
    """Read a Python file; raises :class:`SourceError` with a location on any failure."""
    return decode_source(read_source_bytes(path), str(path))


def failure_as_error(path: str, error: BaseException) -> LocatedError:
    """The located error to report when analysing ``path`` raised ``error``.

    Analysis walks syntax trees recursively and prints literals, so inputs at Python's own
    limits fail inside it: a 100,000-term expression exceeds the recursion limit, and a hex
    literal of thousands of digits cannot be printed in decimal. Anything else is a defect of
    Adopter, still reported against the file so that the other files go on.
    """
    if isinstance(error, LocatedError):
        return error
    if isinstance(error, RecursionError):
        return SourceError(path, 1, 1, "source nested too deeply (over Python's recursion limit)")
    if isinstance(error, ValueError) and "integer string conversion" in str(error):
        return SourceError(
            path, 1, 1, "integer literal too large to analyse (over Python's 4300-digit limit)"
        )
    if isinstance(error, MemoryError):
        return SourceError(path, 1, 1, "out of memory while analysing the file")
    return SourceError(
        path, 1, 1, f"internal error: {type(error).__name__}: {error} (please report this)"
    )


def parse_source(text: str, path: str) -> ast.Module:
    """Parse with the standard library only; syntax errors become :class:`SourceError`."""
    try:
        return ast.parse(text, filename=path)
    except SyntaxError as error:
        raise SourceError(
            path, error.lineno or 1, error.offset or 1, f"invalid Python: {error.msg}"
        ) from None
    except ValueError as error:  # e.g. null bytes
        raise SourceError(path, 1, 1, f"invalid Python: {error}") from None
