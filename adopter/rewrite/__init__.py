"""Synthesis-based rewriting: matched sites become kernel calls in the model's own source."""

from .apply import FileRewrite, SiteResult, rewrite_source
from .diff import unified_diff
from .driver import ApplyResult, rewrite_file, rewrite_paths, rewrite_text
from .outcome import SiteStatus, SkipReason
from .write import (
    WriteOptions,
    WriteResult,
    WriteStatus,
    remove_stale_temporaries,
    write_changed,
    write_rewrite,
    write_rewrites,
)

__all__ = [
    "ApplyResult",
    "FileRewrite",
    "SiteResult",
    "SiteStatus",
    "SkipReason",
    "WriteOptions",
    "WriteResult",
    "WriteStatus",
    "remove_stale_temporaries",
    "rewrite_file",
    "rewrite_paths",
    "rewrite_source",
    "rewrite_text",
    "unified_diff",
    "write_changed",
    "write_rewrite",
    "write_rewrites",
]
