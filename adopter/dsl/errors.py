"""Errors that point at a place: every user-facing failure carries ``file:line:col``."""

from __future__ import annotations


class LocatedError(Exception):
    """An error in user input, printed as ``path:line:col: message``."""

    def __init__(self, path: str, line: int, column: int, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.column = column
        self.message = message

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.message}"

    def __reduce__(self):  # type: ignore[override]
        # Exceptions pickle as ``cls(*self.args)``, and ``args`` holds the message alone: rebuild
        # from every field instead, so that an error found in a scan worker reaches the parent.
        return (type(self), (self.path, self.line, self.column, self.message))


class DslError(LocatedError):
    """A rule or sequence text that does not parse or does not make sense."""
