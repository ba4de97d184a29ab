"""Load rule files, reusing earlier parses so that a run whose rules are cached never loads Lark.

Importing Lark and building its parser costs more than scanning one model file, so
:mod:`adopter.dsl.parser` is imported only when a rule text has not been parsed before.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from functools import cache
from pathlib import Path

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


def load_rule_file(path: str | Path) -> list[Rule]:
    """Read and parse one rule file, attaching its leading comment block as documentation."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DslError(str(path), 1, 1, "rule file not found") from None
    except UnicodeDecodeError as error:
        raise DslError(str(path), 1, error.start + 1, "rule file is not valid UTF-8") from None
    except OSError as error:
        raise DslError(str(path), 1, 1, f"cannot read rule file: {error.strerror}") from None
    cached = _cache_file(text, str(path))
    try:
        with cached.open("rb") as stream:
            return pickle.load(stream)
    except (OSError, pickle.PickleError, EOFError, AttributeError, TypeError):
        pass
    doc = leading_comment(text)
    rules = [_with_doc(rule, doc) for rule in parse_rules(text, str(path))]
    try:  # parsed rules are reused by later runs: parsing costs more than a scan of one file
        cached.parent.mkdir(parents=True, exist_ok=True)
        temporary = cached.with_suffix(f".{os.getpid()}.tmp")
        with temporary.open("wb") as stream:
            pickle.dump(rules, stream)
        os.replace(temporary, cached)
    except OSError:
        pass
    return rules


@cache
def _grammar_text() -> str:
    return GRAMMAR_PATH.read_text(encoding="utf-8")


def _cache_file(text: str, path: str) -> Path:
    """Where the parse of this exact text (for this grammar and this path) is kept."""
    digest = hashlib.sha256()
    for part in (text, path, _grammar_text(), str(pickle.HIGHEST_PROTOCOL)):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    return Path(tempfile.gettempdir()) / "adopter-rules" / f"{digest.hexdigest()[:32]}.pickle"


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

    return replace(rule, doc=doc)
