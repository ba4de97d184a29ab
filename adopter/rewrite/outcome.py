"""What ``apply`` did with each site, as types rather than text to compare.

Modelled on LibCST's codemod runner (``TransformSuccess`` / ``TransformSkip`` with a
``SkipReason``): a site is patched, covered by an enclosing rewrite, or skipped, and a skip says
which kind of reason stopped it besides the sentence for the user. The members are strings
(``StrEnum``), so JSON, SARIF and every report print exactly the words they always printed, and
records read back from JSON compare equal to them.
"""

from __future__ import annotations

from enum import StrEnum


class SiteStatus(StrEnum):
    """What happened to one site (the ``status`` of ``apply --format json``)."""

    PATCHED = "patched"
    COVERED = "covered"  # inside code that an enclosing rewrite replaces as a whole
    SKIPPED = "skipped"  # not rewritten: see the result's ``skip`` and ``reason``


class SkipReason(StrEnum):
    """Why a site was skipped, by kind; the result's ``reason`` holds the details."""

    MODULAR_POLICY = "modular policy"  # transformers' modular/generated pair: the other file
    UNSAFE = "unsafe"  # the planner refused: the rewrite could change behaviour
    OVERLAP = "overlap"  # another site's rewrite of the same code is applied instead
    SYNTHESIS_FAILED = "synthesis failed"  # LibCST could not make the edit
    DOES_NOT_COMPILE = "does not compile"  # the patched file would not compile: left as it was
    TOO_MANY_ROUNDS = "too many rounds"  # nested sites still rewritable after the last round
    ENCODING = "encoding"  # the patched text cannot be written in the file's encoding
