"""The shape of the runtime cache's records, checked on every read.

An entry is executed in the user's process, and its file may come from an older Adopter, a
half-written disk or anything else that writes well-formed JSON: every record is checked field
by field (exact set of fields, each of its type) before use, and one that does not fit is
treated as absent - the runtime rewrites the module and overwrites the entry - never raised.
"""

from __future__ import annotations

from typing import Any

_OPTIONAL_TEXT = (str, type(None))

_SITE: dict[str, tuple[type, ...]] = {
    "rule": (str,),
    "line": (int,),
    "class": _OPTIONAL_TEXT,
    "method": _OPTIONAL_TEXT,
    "status": (str,),
    "reason": _OPTIONAL_TEXT,
    "kernel": (str,),
}
_WRAPPED: dict[str, tuple[type, ...]] = {
    "rule": (str,),
    "class": (str,),
    "attribute": (str,),
    "constructs": (str,),
    "kernel": (str,),
}
REWRITE: dict[str, tuple[type, ...]] = {
    "format": (int,),
    "patched": _OPTIONAL_TEXT,
    "sites": (list,),
    "wrapped": (list,),
    "error": _OPTIONAL_TEXT,
    "depends": (dict,),
}
VERIFY: dict[str, tuple[type, ...]] = {
    "format": (int,),
    "status": (str,),
    "reason": (str,),
    "patched": _OPTIONAL_TEXT,
    "sites": (list,),
    "wrapped": (list,),
    "depends": (dict,),
}


def _fits(value: Any, fields: dict[str, tuple[type, ...]]) -> bool:
    if not isinstance(value, dict) or set(value) != set(fields):
        return False
    for name, types in fields.items():
        item = value[name]
        # bool is an int to isinstance; no field of ours is a bool
        if isinstance(item, bool) or not isinstance(item, types):
            return False
    return True


def well_formed(record: Any, fields: dict[str, tuple[type, ...]]) -> bool:
    """Whether ``record`` is a record of this shape (``REWRITE`` or ``VERIFY``)."""
    if not _fits(record, fields):
        return False
    if not all(_fits(site, _SITE) for site in record["sites"]):
        return False
    if not all(_fits(wrap, _WRAPPED) for wrap in record["wrapped"]):
        return False
    return all(
        isinstance(path, str) and (digest is None or isinstance(digest, str))
        for path, digest in record["depends"].items()
    )
