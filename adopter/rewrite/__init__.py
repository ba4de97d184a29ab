"""Synthesis-based rewriting: matched sites become kernel calls in the model's own source."""

from .apply import FileRewrite, SiteResult, rewrite_source
from .driver import ApplyResult, rewrite_file, rewrite_paths, rewrite_text, write_atomically

__all__ = [
    "ApplyResult",
    "FileRewrite",
    "SiteResult",
    "rewrite_file",
    "rewrite_paths",
    "rewrite_source",
    "rewrite_text",
    "write_atomically",
]
