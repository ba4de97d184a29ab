"""Reading and parsing Python source without ever executing it."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from ..dsl.errors import LocatedError
from ..files import FileRefused, read_regular_file


class SourceError(LocatedError):
    """A source file that cannot be read or parsed."""


def decode_source(data: bytes, path: str) -> str:
    """Decode bytes as Python does: a PEP 263 coding cookie, else UTF-8."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as error:
        raise SourceError(path, 1, 1, f"unreadable encoding declaration: {error}") from None
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise SourceError(
            path, line, column, f"cannot decode byte 0x{data[error.start]:02x} as {encoding}"
        ) from None
    return text[1:] if text.startswith("\ufeff") else text


def read_source(path: str | Path) -> str:
    """Read a Python file; raises :class:`SourceError` with a location on any failure (only
    regular files of at most :func:`adopter.files.max_file_bytes` are read)."""
    name = str(path)
    try:
        data = read_regular_file(path)
    except FileNotFoundError:
        raise SourceError(name, 1, 1, "no such file") from None
    except IsADirectoryError:
        raise SourceError(name, 1, 1, "is a directory, not a file") from None
    except FileRefused as error:
        raise SourceError(name, 1, 1, str(error)) from None
    except OSError as error:
        raise SourceError(name, 1, 1, f"cannot read: {error.strerror or error}") from None
    return decode_source(data, name)


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
