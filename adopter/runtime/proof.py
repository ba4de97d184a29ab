"""The one place the runtime asks ``adopter verify`` whether a rewrite may be kept.

Verification runs in a subprocess (the verify worker) on the module's file and the patched
text, exactly as ``adopter apply --verify`` does, including narrowing a refuted file down to the
rules that verify on their own. Anything but "verified" means not proven: the runtime then
keeps the original module.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..dsl import Rule
from ..rewrite import FileRewrite

DISABLE_VARIABLE = "ADOPTER_RUNTIME_DISABLED"


@dataclass
class Proof:
    status: str  # "verified", "refuted", "not checkable", ...
    reason: str
    rewrite: FileRewrite | None  # what may be used: None unless verified


@contextmanager
def _runtime_disabled() -> Iterator[None]:
    """The worker must import the *original* module: no import hook in its interpreter even
    when this process runs under ``adopter run`` (whose bootstrap it would inherit)."""
    previous = os.environ.get(DISABLE_VARIABLE)
    os.environ[DISABLE_VARIABLE] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(DISABLE_VARIABLE, None)
        else:
            os.environ[DISABLE_VARIABLE] = previous


def prove(rewrite: FileRewrite, rules: list[Rule], timeout: float) -> Proof:
    """Verify a changed rewrite of a module file in a subprocess."""
    from ..gate import gate_rewrites
    from ..verify import VERIFIED

    with _runtime_disabled():
        (gated,) = gate_rewrites([rewrite], rules, timeout=timeout)
    if gated.status == VERIFIED and gated.text is not None:
        return Proof(gated.status, gated.reason, gated.rewrite)
    return Proof(gated.status, gated.reason, None)
