"""Load rule files, reusing earlier parses so that a run whose rules are cached never loads Lark.

Importing Lark and building its parser costs more than scanning one model file, so
:mod:`adopter.dsl.parser` is imported only when a rule text has not been parsed before.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

from ..files import FileRefused, read_text_file
from .declared import check_declared_kernels
from .errors import DslError
from .syntax import Rule, Step

GRAMMAR_PATH = Path(__file__).with_name("grammar.lark")


def parse_rules(text: str, path: str = "<string>") -> list[Rule]:
    """Parse the text of a rule file; raises :class:`DslError` with the place of any problem."""
    from .parser import parse_rules as parse

    return parse(text, path)


def parse_sequence(text: str, path: str = "<string>") -> list[Step]:
    """Parse a bare model-structure sequence, e.g. ``torch.nn.Linear($x) -> $h; ...``."""
    from .parser import parse_sequence as parse

    return parse(text, path)


def load_rule_file(path: str | Path, *, use_cache: bool = True) -> list[Rule]:
    """Read and parse one rule file, attaching its leading comment block as documentation, and
    check that each rule calls only its declared kernel (:mod:`adopter.dsl.declared`).

    This is where every command's rules come from (built-in sets and user files alike), so the
    check runs on every load, also of a cached parse: whether a third-party kernel is on the
    import path depends on the environment, not on the text. ``use_cache=False`` neither reads
    nor writes the parse cache (the runtime, which runs what it derives from the rules).
    Only a regular file of at most :func:`adopter.files.max_file_bytes` is read (a FIFO or a
    device such as ``/dev/zero`` would never end)."""
    path = Path(path)
    try:
        text = read_text_file(path)
    except FileNotFoundError:
        raise DslError(str(path), 1, 1, "rule file not found") from None
    except UnicodeDecodeError as error:
        raise DslError(str(path), 1, error.start + 1, "rule file is not valid UTF-8") from None
    except FileRefused as error:
        raise DslError(str(path), 1, 1, str(error)) from None
    except OSError as error:
        raise DslError(str(path), 1, 1, f"cannot read rule file: {error.strerror}") from None
    key = _cache_key(text, str(path))
    rules = _load_cached(key) if use_cache else None
    if rules is None:
        doc = leading_comment(text)
        try:
            rules = [_with_doc(rule, doc) for rule in parse_rules(text, str(path))]
        except RecursionError:  # the parser bounds nesting; this is the backstop
            raise DslError(str(path), 1, 1, "rule nested too deeply") from None
        if use_cache:
            _store_cached(key, rules)
    check_declared_kernels(rules)
    return rules


# -- the parse cache ------------------------------------------------------------------------------
#
# Parsed rules are kept as pickles, and unpickling runs code: the cache must be a place that
# only this user can write. It lives in the user's cache folder (never the shared temporary
# folder, where another user could plant a file under a predictable name), its folders are
# created 0700, and a folder or file that is not this user's own, or that others may write, is
# neither read nor written: the rules are then parsed afresh.


def rules_cache_dir() -> Path | None:
    """Where parsed rules are cached: ``$XDG_CACHE_HOME/adopter/rules``, else
    ``~/.cache/adopter/rules`` (``None`` when there is no home folder)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG specification says to ignore a relative value
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:
            return None
    return Path(base) / "adopter" / "rules"


def _owned_privately(info: os.stat_result, kind: Callable[[int], bool]) -> bool:
    return (
        kind(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _trusted_cache_dir(create: bool) -> Path | None:
    """The cache folder, when it and its parent ``adopter`` folder are this user's own and
    writable by no one else (checked without following links); created when ``create``."""
    folder = rules_cache_dir()
    if folder is None or not hasattr(os, "geteuid"):
        return None
    try:
        if create:
            folder.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        for part in (folder.parent, folder):
            if create:
                try:
                    os.mkdir(part, 0o700)
                except FileExistsError:
                    pass
            if not _owned_privately(os.lstat(part), stat.S_ISDIR):
                return None
    except OSError:
        return None
    return folder


# Bumped when :class:`Rule` gains a field, so that no parse pickled before is read back.
_SYNTAX_VERSION = "rule-kernel-at"


def _cache_key(text: str, path: str) -> str:
    """The name of the parse of this exact text (for this grammar and this path)."""
    digest = hashlib.sha256()
    for part in (text, path, _grammar_text(), str(pickle.HIGHEST_PROTOCOL), _SYNTAX_VERSION):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    return f"{digest.hexdigest()[:32]}.pickle"


def _load_cached(key: str) -> list[Rule] | None:
    folder = _trusted_cache_dir(create=False)
    if folder is None:
        return None
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(folder / key, flags)
    except OSError:
        return None
    try:
        with os.fdopen(descriptor, "rb") as stream:
            if not _owned_privately(os.fstat(stream.fileno()), stat.S_ISREG):
                return None
            rules = pickle.load(stream)
    except Exception:  # noqa: BLE001 - a stale or damaged entry is parsed afresh
        return None
    if not isinstance(rules, list) or not all(isinstance(rule, Rule) for rule in rules):
        return None
    return rules


def _store_cached(key: str, rules: list[Rule]) -> None:
    folder = _trusted_cache_dir(create=True)
    if folder is None:
        return
    try:
        descriptor, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")  # mode 0600
        try:
            with os.fdopen(descriptor, "wb") as stream:
                pickle.dump(rules, stream)
            os.replace(temporary, folder / key)
        except BaseException:
            os.unlink(temporary)
            raise
    except (OSError, pickle.PicklingError, RecursionError):
        pass


@cache
def _grammar_text() -> str:
    return GRAMMAR_PATH.read_text(encoding="utf-8")


def leading_comment(text: str) -> str:
    """The ``#`` comment block at the top of a rule file, without the ``#`` markers."""
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            if stripped:
                break
            lines.append("")
            continue
        lines.append(stripped[2:] if stripped.startswith("# ") else stripped[1:])
    return "\n".join(lines).strip()


def _with_doc(rule: Rule, doc: str) -> Rule:
    from dataclasses import replace

    variants = tuple(replace(variant, doc=doc) for variant in rule.variants)
    return replace(rule, doc=doc, variants=variants)
