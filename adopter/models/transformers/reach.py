"""Which further checks may run a patched site the planned checks did not (transformers).

A site that did not run sits behind a condition on the configuration (``if
config.use_sparse:``), in a class only some model classes build, or in the eager attention
class that a configuration choosing SDPA never builds. These functions turn the fields a site's
conditions read (found statically, :mod:`adopter.models.sites`) into configuration overrides:
booleans negated, fields set to the constants they are compared with, per-layer lists made of
one kind; and order the classes and overrides worth a check.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

from ..interface import CACHED_STEP, PER_ELEMENT

__all__ = [
    "EveryLayer",
    "SubConfig",
    "config_defaults",
    "documented_values",
    "flips",
    "reach_attempts",
    "resolve_deferred",
]


def _guard_fields(site: Any) -> dict[str, list[Any]]:
    """The configuration fields that may decide whether ``site`` runs, with the constants they
    are compared with: those its own conditions read first, then those around the code that
    builds or calls it (an attention class chosen by ``config.attention_type``)."""
    fields = {name: list(constants) for name, constants in site.config_fields.items()}
    for name, constants in getattr(site, "caller_fields", {}).items():
        known = fields.setdefault(name, [])
        known.extend(c for c in constants if c not in known)
    return fields


def flips(site: Any, defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """Configuration overrides that may take the branch a site sits in: each boolean field
    the site's conditions (or its callers') read, negated; each field compared with constants,
    set to them; then all of those at once. A field the configuration does not have at the
    top but a sub-configuration has (``text_config``) is changed there."""
    singles: list[dict[str, Any]] = []
    for field, constants in _guard_fields(site).items():
        base = field.removesuffix(PER_ELEMENT)
        if base in defaults or base in (defaults.get("_aliases") or {}):
            singles += _field_flips(field, constants, defaults)
            continue
        for key, nested in defaults.items():
            if isinstance(nested, dict) and base in nested:
                singles += [
                    {key: SubConfig(flip)} for flip in _field_flips(field, constants, nested)
                ]
    if len(singles) > 1:
        combined: dict[str, Any] = {}
        for single in singles:
            for key, value in single.items():
                known = combined.get(key)
                if isinstance(known, SubConfig) and isinstance(value, SubConfig):
                    combined[key] = SubConfig({**value.fields, **known.fields})
                else:
                    combined.setdefault(key, value)
        singles.append(combined)
    return singles


def _field_flips(field: str, constants: list[Any], defaults: dict[str, Any]) -> list[dict]:
    """The overrides of one field of ``defaults``: a boolean negated, another value set to each
    constant of its type that it is compared with (see :func:`_element_flips` for lists)."""
    aliases = defaults.get("_aliases") or {}
    if field.endswith(PER_ELEMENT):
        base = field.removesuffix(PER_ELEMENT)
        return _element_flips(aliases.get(base, base), constants, defaults)
    field = field if field in defaults else aliases.get(field, field)
    if field not in defaults:
        return []
    default = defaults[field]
    if isinstance(default, bool):
        return [{field: not default}]
    return [
        {field: value}
        for value in constants
        if value != default and (default is None or type(value) is type(default))
    ]


class EveryLayer:
    """An override of a per-layer list (``mlp_layer_types``): this value at every layer, as
    many layers as the shrunk configuration has (known only once a recipe shrank it; see
    :func:`resolve_deferred`)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"every layer {self.value!r}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EveryLayer) and other.value == self.value

    def __hash__(self) -> int:
        return hash(("EveryLayer", repr(self.value)))


class SubConfig:
    """Overrides of some fields of a sub-configuration (``text_config``), on top of what the
    recipe made of it (known only once it is built; see :func:`resolve_deferred`)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = dict(fields)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self.fields.items()) + "}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubConfig) and other.fields == self.fields

    def __hash__(self) -> int:
        return hash(("SubConfig", repr(self)))


def _element_flips(field: str, constants: list[Any], defaults: dict[str, Any]) -> list[dict]:
    """A per-layer list whose elements a condition compares with constants (``config.
    mlp_layer_types[layer_idx] == "sparse"``): that constant at every layer, for each constant
    of the list's own element type (the shrunk list keeps only the first layers' kinds, which
    may all be the other kind). The site may sit in the other arm (``else: MLP(config)``), so
    the kinds the configuration's docstring names for the field count too; kinds the default
    list lacks go first."""
    default = defaults.get(field)
    if not isinstance(default, (list, tuple)) or not default:
        return []
    kinds = {type(element) for element in default}
    documented = (defaults.get("_documented") or {}).get(field, [])
    values = [
        value
        for value in dict.fromkeys([*constants, *documented])
        if type(value) in kinds and not isinstance(value, bool)
    ]
    values.sort(key=lambda value: value in default)  # stable: absent kinds first
    return [{field: EveryLayer(value)} for value in values]


def _every_layer(value: EveryLayer, current: Any) -> list[Any]:
    length = len(current) if isinstance(current, (list, tuple)) else 0
    return [value.value] * max(1, length)


def resolve_deferred(fixes: dict[str, Any], build: Any) -> dict[str, Any]:
    """``fixes`` with each :class:`EveryLayer` made a list as long as the configuration that
    ``build(other_fixes)`` makes has for that field (its shrunk layer count), and each
    :class:`SubConfig` made that configuration's sub-configuration with those fields set."""
    deferred = (EveryLayer, SubConfig)
    plain = {key: value for key, value in fixes.items() if not isinstance(value, deferred)}
    if len(plain) == len(fixes):
        return fixes
    config = build(plain)
    resolved = dict(plain)
    for key, value in fixes.items():
        if isinstance(value, EveryLayer):
            resolved[key] = _every_layer(value, getattr(config, key, None))
        elif isinstance(value, SubConfig):
            sub = getattr(config, key, None)
            nested = sub.to_dict() if hasattr(sub, "to_dict") else dict(sub or {})
            for field, inner in value.fields.items():
                nested[field] = (
                    _every_layer(inner, nested.get(field))
                    if isinstance(inner, EveryLayer)
                    else inner
                )
            resolved[key] = nested
    return resolved


_EAGER = {"attn_implementation": "eager"}
_EAGER_EXPERTS = {"experts_implementation": "eager"}


def reach_attempts(
    site: Any,
    checked: list[str],
    available: list[str],
    fixed: bool,
    defaults: dict[str, dict[str, Any]],
    broken: frozenset[str] = frozenset(),
) -> list[tuple[str, dict[str, Any]]]:
    """(class, overrides) pairs that may run ``site``, most promising first.

    The hosts are the model classes whose code reaches the site by name (``site.hosts``: its
    own class, the classes that build it, and so on up); where none of the checked classes is
    one, the unchecked hosts come first, as they are. Then the hosts under flipped options;
    where the configuration chooses the attention implementation (transformers >= 4.36 picks
    an SDPA class by default, so a patch of the eager class never runs), the eager one; then -
    unless the caller fixed the classes - the model classes not checked yet, hosts first.
    A site that no model class reaches by name gets no attempts; where that was not worked
    out (``site.hosts`` is None), the checked classes stand in as hosts. Options are flipped
    on one host only, never on a ``broken`` one (its model could not be built and run as it
    is: flipping a guard does not mend that, and each try costs every recipe).
    """
    if site.hosts is not None and not any(name in available for name in site.hosts):
        return []  # no model class of the file uses its code: no check can run it
    reaching = [name for name in site.hosts or [] if name in available]
    usable = [name for name in checked if name not in broken]
    checked_hosts = [name for name in usable if name in reaching] if reaching else usable
    fresh = [] if fixed else [name for name in reaching if name not in checked]
    attempts: list[tuple[str, dict[str, Any]]] = []
    if not checked_hosts:
        attempts += [(name, {}) for name in fresh[:2]]
    hosts = _flip_hosts(site, available, fixed, broken, checked_hosts + fresh)
    attempts += _flips_on(site, hosts, defaults)
    if not fixed:
        rest = fresh + [name for name in available if name not in checked and name not in fresh]
        attempts += [(name, {}) for name in rest]
    return attempts


def _flips_on(
    site: Any, hosts: list[str], defaults: dict[str, dict[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    """The flipped options of ``hosts``' first (``defaults``: each class's configuration
    defaults); for a site under a cache guard, a cached step of the next two as well (another
    host may be the decoder that returns a cache)."""
    attempts = [a for host in hosts[:1] for a in _host_flips(site, defaults.get(host, {}), host)]
    if _cache_guarded(site):
        attempts += [(host, _cached_step(defaults.get(host, {}))) for host in hosts[1:3]]
    return attempts


def _flip_hosts(
    site: Any, available: list[str], fixed: bool, broken: frozenset[str], candidates: list[str]
) -> list[str]:
    """The classes to flip options on, best first: the site's own class where it is a model
    class that can be built (and the caller did not fix the classes), then ``candidates``."""
    own = site.cls in available and site.cls not in broken and not fixed
    hosts = [site.cls] if own else []
    return hosts + [name for name in candidates if name not in hosts]


# A guard on the cache of keys and values (``past_key_value is not None``, GPT-2's
# ``layer_past``): the code under it runs on a cached step of generation only.
_CACHE_GUARD = re.compile(r"\b(past_key_values?|layer_past|cache)\b")


def _cache_guarded(site: Any) -> bool:
    return any(_CACHE_GUARD.search(guard) for guard in site.guards)


def _cached_step(defaults: dict[str, Any]) -> dict[str, Any]:
    """The overrides of a cached-step check: a model that is no decoder by default (BERT's
    family) returns no cache, so it is configured as one, as its language-model heads are."""
    cached: dict[str, Any] = {CACHED_STEP: True}
    if defaults.get("is_decoder") is False and not defaults.get("is_encoder_decoder"):
        cached["is_decoder"] = True
    return cached


def _host_flips(site: Any, defaults: dict[str, Any], host: str) -> list[tuple[str, dict]]:
    config_flips = flips(site, defaults)
    attempts = [(host, flip) for flip in config_flips]
    if _cache_guarded(site):
        cached = _cached_step(defaults)
        # the cached step alone first, then with each option flipped (a decoder's cross-
        # attention cache needs add_cross_attention too)
        attempts = (
            [(host, cached)] + [(host, {**flip, **cached}) for flip in config_flips] + attempts
        )
    if site.cls in defaults.get("_dispatched_experts", ()):
        attempts.append((host, dict(_EAGER_EXPERTS)))
    if defaults.get("_chooses_attention"):
        attempts.append((host, dict(_EAGER)))
    return attempts


def dispatched_experts(module: ModuleType) -> list[str]:
    """The classes of ``module`` whose ``forward`` the configuration's experts implementation
    replaces (transformers 5's ``@use_experts_implementation``: a grouped-matmul kernel by
    default, the class's own loop over the experts only with ``experts_implementation="eager"``)."""
    found = []
    for name, value in vars(module).items():
        if isinstance(value, type) and value.__module__ == module.__name__:
            code = getattr(getattr(value, "forward", None), "__code__", None)
            if code is not None and "_experts_implementation" in code.co_names:
                found.append(name)
    return found


def config_defaults(module: ModuleType, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each class's configuration defaults (``to_dict()``), plus whether that configuration
    picks the attention classes; a configuration that needs arguments gives no flips."""
    by_config: dict[Any, dict[str, Any]] = {}
    found: dict[str, dict[str, Any]] = {}
    experts = dispatched_experts(module)
    for name in names:
        config_class = getattr(getattr(module, name, None), "config_class", None)
        if config_class is None:
            continue
        if config_class not in by_config:
            try:
                config = config_class()
                defaults = dict(config.to_dict())
                # not in to_dict(): whether the configuration picks the attention classes
                defaults["_chooses_attention"] = hasattr(type(config), "_attn_implementation")
                # and the names code may read a field by (``num_experts`` for
                # ``num_local_experts``): a guard on the alias flips the field itself
                aliases = getattr(type(config), "attribute_map", None) or {}
                defaults["_aliases"] = {
                    str(alias): str(real) for alias, real in aliases.items() if real in defaults
                }
                defaults["_documented"] = documented_values(type(config).__doc__ or "")
                defaults["_dispatched_experts"] = experts
            except Exception:
                defaults = {}
            by_config[config_class] = defaults
        found[name] = by_config[config_class]
    return found


# ``    name (`type`, *optional*):`` opens an argument's entry in a transformers docstring.
_DOC_ENTRY = re.compile(r"^\s*(\w+) \(`[^`]*`[^)]*\):", re.MULTILINE)
_DOC_STRING_VALUE = re.compile(r"`([\"'])(\w+)\1`")


def documented_values(doc: str) -> dict[str, list[str]]:
    """Argument -> the string values its docstring entry names (```"dense"` or `"sparse"```):
    the kinds a per-layer list may hold, where the code compares only with one of them."""
    found: dict[str, list[str]] = {}
    entries = list(_DOC_ENTRY.finditer(doc))
    for entry, following in zip(entries, [*entries[1:], None]):
        text = doc[entry.end() : following.start() if following else len(doc)]
        values = [match.group(2) for match in _DOC_STRING_VALUE.finditer(text)]
        if values:
            found[entry.group(1)] = list(dict.fromkeys(values))
    return found
