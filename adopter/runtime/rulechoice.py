"""Which rules the runtime patches with, and a fingerprint of them that keys the cache.

The fingerprint comes from the rule files' bytes, so a warm start never parses a rule: Lark and
the built-in rules are loaded only when a module has to be rewritten. Rules are loaded without
the parse cache (``load_rule_file(..., use_cache=False)``: the cache is unpickled, and the runtime
executes what it derives from the rules inside the user's training process). A user's own rule
files and rule objects are checked at once, when the choice is made, so that a rule calling
anything but its declared kernel fails ``adopter.patch`` before a module is patched
(:mod:`adopter.dsl.declared`); the built-in sets pass that check (their tests load them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..dsl import Rule, check_declared_kernels, load_rule_file
from ..rules import CALL_RULES, DEFAULT_RULE_SET, RULE_SETS, rule_files

RuleArgument = str | Path | Rule | Sequence[str | Path | Rule] | None


@dataclass
class RuleChoice:
    """Rule files and/or rule objects, narrowed by ``select`` and then ``exclude`` (ids or id
    prefixes)."""

    files: tuple[Path, ...] = ()
    objects: tuple[Rule, ...] = ()
    select: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    _loaded: list[Rule] | None = field(default=None, repr=False, compare=False)
    _fingerprint: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(
        cls,
        rules: RuleArgument = None,
        select: str | Sequence[str] | None = None,
        exclude: str | Sequence[str] | None = None,
    ) -> RuleChoice:
        """Built-in set names (``"all"``, ``"paper"``), ``.adopt`` paths, or parsed rules."""
        items: list[str | Path | Rule]
        if rules is None:
            items = [DEFAULT_RULE_SET]
        elif isinstance(rules, (str, Path, Rule)):
            items = [rules]
        else:
            items = list(rules)
        files: list[Path] = []
        objects: list[Rule] = []
        for item in items:
            if isinstance(item, Rule):
                objects.append(item)
            elif isinstance(item, str) and item in RULE_SETS:
                files.extend(rule_files(item))
                objects.extend(CALL_RULES.get(item, ()))  # a set's rules written as data
            else:
                path = Path(item).expanduser()
                if not path.is_file():
                    known = ", ".join(RULE_SETS)
                    raise ValueError(f"{item}: neither a rule file nor a rule set ({known})")
                files.append(path.resolve())
        built_in = {path.resolve() for name in RULE_SETS for path in rule_files(name)}
        for path in files:
            if path not in built_in:
                load_rule_file(path, use_cache=False)  # DslError for a rule that fails the check
        check_declared_kernels(objects)
        return cls(tuple(dict.fromkeys(files)), tuple(objects), _ids(select), _ids(exclude))

    @property
    def fingerprint(self) -> str:
        """A digest of every rule's text and of ``select``: equal choices, equal rewrites."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for path in self.files:
                digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
            for rule in self.objects:
                digest.update(repr(rule).encode() + b"\0")
            digest.update(",".join(self.select).encode())
            if self.exclude:
                digest.update(b"\0exclude:" + ",".join(self.exclude).encode())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def rules(self) -> list[Rule]:
        """The parsed rules (parsed once, on first use)."""
        if self._loaded is None:
            loaded: list[Rule] = []
            for path in self.files:
                loaded.extend(load_rule_file(path, use_cache=False))
            loaded.extend(self.objects)
            if self.select:
                loaded = [rule for rule in loaded if _selected(rule.id, self.select)]
            if self.exclude:
                loaded = [rule for rule in loaded if not _selected(rule.id, self.exclude)]
            self._loaded = loaded
        return self._loaded

    def describe(self) -> str:
        parts = [path.name for path in self.files] + [rule.id for rule in self.objects]
        text = ", ".join(parts) or "no rules"
        text += f" (select {','.join(self.select)})" if self.select else ""
        return text + (f" (exclude {','.join(self.exclude)})" if self.exclude else "")


def _ids(items: str | Sequence[str] | None) -> tuple[str, ...]:
    """Rule ids from ``"a,b"`` or ``["a", "b"]``."""
    if isinstance(items, str):
        items = items.split(",")
    return tuple(part.strip() for part in items or () if part.strip())


def unmatched(wanted: Sequence[str], rule_ids: Sequence[str]) -> list[str]:
    """The ids (or id prefixes) of ``wanted`` that name none of ``rule_ids``."""
    return [item for item in wanted if not any(_selected(rule, [item]) for rule in rule_ids)]


def _selected(rule_id: str, wanted: Sequence[str]) -> bool:
    return any(rule_id == item or rule_id.startswith(item + ".") for item in wanted)
