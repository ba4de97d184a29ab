"""Differential testing of patched model code: prove every patch before it is kept.

``verify_patched_file`` builds each model class of a patched modeling file twice -
from the original source and from the patched source - with the same small configuration, loads
the original's ``state_dict`` strictly into the patched model, feeds both the same seeded inputs
and compares outputs, parameter gradients and buffers in eval mode and in train mode. The
verdict per class is ``verified``, ``refuted`` (with the largest difference and where it is) or
``not checkable`` (with the reason). ``verify_factory`` does the same for plain ``nn.Module``
code built by user factories. ``verify_patched_files`` / ``verify_factories`` check many at once
in one worker process, importing torch and the model library only once.

Importing this package imports neither torch nor the code under test: all of that happens in a
worker subprocess (:mod:`adopter.verify.worker`) under a timeout. This is the proof alone: which
models use a file and how to build them small is the adapters' (:mod:`adopter.models`, the
file's kernel calls in :mod:`adopter.models.sites`), what ``apply --verify`` keeps
:mod:`adopter.gate`'s.
"""

from ..models.origin import module_name_for
from ..models.sites import PatchedSite
from .options import VerifyOptions
from .results import (
    NOT_CHECKABLE,
    NOT_EXERCISED,
    REFUTED,
    VERIFIED,
    ClassVerification,
    FileVerification,
    SiteCoverage,
    Status,
)
from .runner import (
    PatchedFile,
    verify_factories,
    verify_factory,
    verify_patched_file,
    verify_patched_files,
)

__all__ = [
    "NOT_CHECKABLE",
    "NOT_EXERCISED",
    "REFUTED",
    "VERIFIED",
    "ClassVerification",
    "FileVerification",
    "PatchedFile",
    "PatchedSite",
    "SiteCoverage",
    "Status",
    "VerifyOptions",
    "module_name_for",
    "verify_factories",
    "verify_factory",
    "verify_patched_file",
    "verify_patched_files",
]
