"""Give back shrunk configuration entries that a configuration's own validation rejects.

The name rules of :mod:`adopter.models.transformers.shrink` cannot know every constraint a
configuration class enforces (transformers 5 configurations validate themselves on construction: a
``codebook_size`` must be a power of two, ``n_input_layers + n_recurrent_layers +
n_output_layers`` must equal the layer count, a count of convolution layers must match the
length of its per-layer lists). Rather than teach each one, a rejected set of overrides is
repaired by reverting shrunk entries to their defaults: first the entries the error message
names, then any single entry, cheapest first, within a bounded number of tries. The constructor
is the judge; the smallest accepted configuration (fewest and cheapest reverts) wins. Entries
the caller fixed (flipped options, size fixes, zeroed dropout) are never reverted.

Pure dict manipulation: the constructor is passed in, so this module imports neither torch nor
transformers.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable
from typing import Any

from ..config_names import is_sub_config

__all__ = [
    "MAX_TRIES",
    "KeyPath",
    "construct_repaired",
    "error_text",
    "repair_overrides",
    "shrunk_paths",
]

KeyPath = tuple[str, ...]

MAX_TRIES = 64
"""Constructor calls one repair may make (each one is a plain configuration construction)."""


def shrunk_paths(defaults: dict[str, Any], overrides: dict[str, Any]) -> list[KeyPath]:
    """Every entry ``overrides`` changes, nested sub-configurations entry by entry."""
    paths: list[KeyPath] = []
    for key, new in overrides.items():
        old = defaults.get(key)
        if is_sub_config(key, old) and isinstance(new, dict):
            paths.extend((key, *inner) for inner in shrunk_paths(old, new))
        elif key not in defaults or old != new:
            paths.append((key,))
    return paths


def error_text(exc: BaseException) -> str:
    """An error's message with those of its causes: validators wrap the real complaint."""
    parts, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(str(current))
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


def _revert(
    defaults: dict[str, Any], overrides: dict[str, Any], paths: Iterable[KeyPath]
) -> dict[str, Any]:
    result = copy.deepcopy(overrides)
    for path in paths:
        target, source = result, defaults
        for key in path[:-1]:
            target, source = target[key], source[key]
        if path[-1] in source:
            target[path[-1]] = copy.deepcopy(source[path[-1]])
        else:
            target.pop(path[-1], None)
    return result


def _value(tree: dict[str, Any], path: KeyPath) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _cost(defaults: dict[str, Any], overrides: dict[str, Any], path: KeyPath) -> float:
    """How much reverting ``path`` grows the configuration: the ratio of default to shrunk
    size (1 for entries that are no sizes)."""
    old, new = _value(defaults, path), _value(overrides, path)
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        widest = max((_ratio(a, b) for a, b in zip(old, new)), default=1.0)
        return widest * max(1, len(old)) / max(1, len(new))
    return _ratio(old, new)


def _ratio(old: Any, new: Any) -> float:
    if isinstance(old, bool) or isinstance(new, bool):
        return 1.0
    if isinstance(old, (int, float)) and isinstance(new, (int, float)) and new > 0 and old > 0:
        return max(1.0, old / new)
    return 1.0


def _named(paths: list[KeyPath], overrides: dict[str, Any], message: str) -> list[KeyPath]:
    """The entries an error message names (``codebook_size``, ``adaptor_config.hidden_size``),
    then those whose shrunk value it quotes (``... in a head of width 8``; values above 3, as
    smaller numbers are everywhere)."""
    by_name = [p for p in paths if re.search(rf"(?<![\w]){re.escape(p[-1])}(?![\w])", message)]
    numbers = {int(n) for n in re.findall(r"(?<![\w.])\d+(?![\w.])", message)}
    by_value = [
        p
        for p in paths
        if p not in by_name
        and isinstance(value := _value(overrides, p), int)
        and not isinstance(value, bool)
        and value > 3
        and value in numbers
    ]
    return by_name + by_value


Constructor = Callable[[dict[str, Any]], Any]
SubConstructors = Callable[[str], "tuple[Constructor, SubConstructors] | None"]
"""The constructor (and its own sub-constructors) of the sub-configuration under a key."""


def construct_repaired(
    construct: Constructor,
    defaults: dict[str, Any],
    overrides: dict[str, Any],
    revertible: list[KeyPath],
    subs: SubConstructors | None = None,
    max_tries: int = MAX_TRIES,
) -> Any:
    """``construct(overrides)``; where it raises, the same with some ``revertible`` entries
    reverted to ``defaults`` (see :func:`repair_overrides`)."""
    repaired = repair_overrides(construct, defaults, overrides, revertible, subs, max_tries)
    return construct(copy.deepcopy(repaired))


def repair_overrides(
    construct: Constructor,
    defaults: dict[str, Any],
    overrides: dict[str, Any],
    revertible: list[KeyPath],
    subs: SubConstructors | None = None,
    max_tries: int = MAX_TRIES,
) -> dict[str, Any]:
    """``overrides``, or where ``construct`` rejects them, the same with some ``revertible``
    entries reverted to ``defaults``.

    Sub-configurations with a constructor of their own (``subs``) are repaired first, each on
    its own: several can break the same rule with the very same message. Then each round tries,
    cheapest first, every single entry the error names, then all named ones together, then
    every other single entry; the first set of overrides constructed is returned. Where no
    single step is accepted, the named entries stay reverted and the next round reads the new
    error. The original error is raised when nothing is accepted within ``max_tries``.
    """
    try:
        construct(copy.deepcopy(overrides))
        return overrides
    except Exception as exc:
        first = exc
    repaired = _repair_sub_configs(defaults, overrides, revertible, subs, max_tries)
    retry_as_is = repaired != overrides  # the sub-configurations' repairs may be enough
    overrides = repaired
    message = error_text(first)
    reverted: list[KeyPath] = []
    pending = [p for p in revertible if _value(overrides, p) is not None or len(p) == 1]
    tries = 0
    while tries < max_tries:
        named = sorted(
            _named(pending, overrides, message), key=lambda p: _cost(defaults, overrides, p)
        )
        others = sorted(
            (p for p in pending if p not in named), key=lambda p: _cost(defaults, overrides, p)
        )
        steps = [[p] for p in named] + ([named] if len(named) > 1 else []) + [[p] for p in others]
        progress: str | None = None
        for step in [[], *steps] if retry_as_is and tries == 0 else steps:
            if tries >= max_tries:
                break
            tries += 1
            candidate = _revert(defaults, overrides, [*reverted, *step])
            try:
                construct(copy.deepcopy(candidate))
                return candidate
            except Exception as exc:
                if step == named:  # all named entries reverted: read what is left
                    progress = error_text(exc)
        if not named:
            break
        reverted.extend(named)
        pending = [p for p in pending if p not in named]
        message = progress if progress is not None else message
    raise first


def _repair_sub_configs(
    defaults: dict[str, Any],
    overrides: dict[str, Any],
    revertible: list[KeyPath],
    subs: SubConstructors | None,
    max_tries: int,
) -> dict[str, Any]:
    if subs is None:
        return overrides
    repaired = dict(overrides)
    for key, value in overrides.items():
        old = defaults.get(key)
        found = subs(key) if is_sub_config(key, old) and isinstance(value, dict) else None
        if found is None:
            continue
        inner = [p[1:] for p in revertible if len(p) > 1 and p[0] == key]
        try:
            repaired[key] = repair_overrides(found[0], old, value, inner, found[1], max_tries)
        except Exception:
            continue  # rejected even with its defaults alone: the parent's rounds decide
    return repaired
