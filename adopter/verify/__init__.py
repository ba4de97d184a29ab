"""Differential testing of patched model code: prove every patch before it is kept.

Each model a patched file (or a pair of user factories) builds is built from the original and
from the patched source alike, the original's ``state_dict`` loaded strictly into the patch,
and outputs, gradients and buffers compared in eval and train mode: ``verified``, ``refuted``
(the largest difference and where) or ``not checkable`` (why). Importing this package imports
neither torch nor the code under test: that happens in a worker subprocess
(:mod:`adopter.verify.worker`) under a timeout. Which models use a file and how to build them
small is the adapters' business (:mod:`adopter.models`); what ``apply --verify`` keeps is
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
