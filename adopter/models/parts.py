"""A part of a model as a subject of its own: the module that holds a patched site, taken
out of both sides of a model built alike, with inputs its ``forward`` takes.

Whole-model checks do not run every part a model builds: a multimodal model's projector and
vision tower run only when it is given images, a pooler or an adapter layer only under some
heads or options. While such a site has not run, verify checks the part on its own: the
submodule of the site's class at the same path in the original and in the patched model (the
original's weights are loaded strictly into the patched part, as for a whole model), called
with random tensors whose width comes from the part's own layers (a linear layer's input
features, a convolution's input channels, a norm's shape), the first shape the original part
accepts. The patched part must then match in every mode, like a whole model (its first
output, every gradient and buffer: see :class:`MainOutput`); the verdict names the part and
the shape, so a reader sees the site was proven on its own.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from .common import call_model, seed_everything, torch_dtype
from .interface import PART_SUFFIX, BuildSettings, Subject, Unbuildable

__all__ = [
    "STANDALONE_WIDTH",
    "MainOutput",
    "input_candidates",
    "part_classes",
    "part_paths",
    "part_subject",
    "parts_to_check",
    "runnable_inputs",
    "standalone_part",
]

_TOKENS = 5  # sequence length of a token-shaped input
_SPATIAL = {1: (16,), 2: (8, 8), 3: (4, 8, 8)}  # extent of a convolution's input per dimension
_WIDTHS_TRIED = 4  # a part's first layers that suggest an input width
_ROTARY = "position_embeddings"  # transformers 5's name for the (cos, sin) a layer rotates by
# an attention's arguments: one tensor in self-attention
_ATTENTION_OPERANDS = {"query", "key", "value"}
MAX_PART_MODELS = 4
"""Models of a file built again to take parts from (each costs a build, as a check does)."""


def _of_class(value: object, cls: str, module_name: str) -> bool:
    return type(value).__name__ == cls and type(value).__module__ == module_name


def part_paths(model: nn.Module, cls: str, module_name: str) -> list[str]:
    """Where ``model`` holds modules of the class ``cls`` defined in ``module_name``, or, for a
    class that is no module, the modules holding one of its objects as an attribute (an
    attention module and the processor object its ``forward`` hands the work to)."""
    return [
        path
        for path, module in model.named_modules()
        if path
        and (
            _of_class(module, cls, module_name)
            or any(_of_class(value, cls, module_name) for value in vars(module).values())
        )
    ]


def _layer_shapes(layer: nn.Module) -> list[tuple[int, ...]]:
    """Input shapes (batch 2) the layer takes: token-shaped and flat for a feature width,
    channels first with a small extent for a convolution or a channel norm."""
    if isinstance(layer, nn.Linear):
        width = layer.in_features  # tokens, a flat vector, a channels-last grid
        return [(2, _TOKENS, width), (2, width), (2, *_SPATIAL[2], width)]
    if isinstance(layer, nn.LayerNorm) and layer.normalized_shape:
        return [(2, _TOKENS, *layer.normalized_shape)]
    if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        dims = len(layer.kernel_size)
        return [(2, layer.in_channels, *_SPATIAL[dims])]
    if isinstance(layer, nn.BatchNorm2d):
        return [(2, layer.num_features, *_SPATIAL[2])]
    if isinstance(layer, nn.GroupNorm):  # any extent: an image, a signal, a video
        return [(2, layer.num_channels, *_SPATIAL[dims]) for dims in (2, 1, 3)]
    return []


def _required(forward: Callable[..., Any]) -> list[str]:
    """The parameters of ``forward`` a call must give (``self`` and defaults left out)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [
        p.name
        for p in inspect.signature(forward).parameters.values()
        if p.kind in kinds and p.default is inspect.Parameter.empty
    ]


def _shapes(part: nn.Module) -> list[tuple[int, ...]]:
    """Input shapes ``part``'s first layers take, without repeats; for a part with weights of
    its own and no layers (a hand-written norm), its weight's width."""
    shapes: list[tuple[int, ...]] = []
    taken = [found for m in part.modules() if m is not part and (found := _layer_shapes(m))]
    for layer_shapes in taken[:_WIDTHS_TRIED]:
        shapes += [s for s in layer_shapes if s not in shapes]
    own = [p.shape[0] for p in part.parameters(recurse=False) if p.dim() == 1]
    shapes += [(2, _TOKENS, own[0])] if own and (2, _TOKENS, own[0]) not in shapes else []
    # last, a square grid of narrower tokens: a projector that first folds each f x f block of
    # a vision grid into one token of f*f times the width (pixel shuffle, space to depth)
    # takes width / f**2 at its first layer's width
    widths = [shape[-1] for shape in shapes if len(shape) == 3 and shape[1] == _TOKENS]
    for factor in (2, 3):
        shapes += [
            (2, (2 * factor) ** 2, width // factor**2)
            for width in widths[:1]
            if width % factor**2 == 0
        ]
    return shapes


def input_candidates(part: nn.Module, settings: BuildSettings) -> Iterator[tuple[str, Any]]:
    """Inputs to try, each with how it is shaped: every required argument of ``forward`` a
    random tensor of one shape its first layers take (seeded, one draw per argument; first
    one draw for all of an attention's ``query``, ``key`` and ``value``)."""
    try:
        names = _required(part.forward)
    except (TypeError, ValueError):  # no signature to read: nothing sensible to pass
        return
    if not names:
        return
    dtype = torch_dtype(settings.dtype)
    rotary = _rotary_widths(part)
    for shape in _shapes(part):
        generator = torch.Generator().manual_seed(settings.seed)
        tensors = [torch.randn(shape, generator=generator, dtype=dtype) for _ in names]
        label = "x".join(map(str, shape))
        for width in rotary if len(shape) == 3 else []:
            # an attention module or layer that rotates by the model's (cos, sin): random
            # angles of the head's rotary width, the further arguments left out. First: a
            # module that runs without them too (rotary only when given) skips the rotation.
            angles = torch.randn((*shape[:2], width), generator=generator, dtype=dtype)
            named = {names[0]: tensors[0], _ROTARY: (angles.cos(), angles.sin())}
            named.update({name: None for name in names[1:] if name != _ROTARY})
            yield f"{label}, {_ROTARY}=(cos, sin) of width {width}", named
        shared = [name for name in names if name in _ATTENTION_OPERANDS]
        if len(shared) > 1:
            # self-attention: one tensor as query, key and value (a fused path the rewrite put
            # behind `key is query and value is query` runs only so); then one tensor each
            one = [tensors[0] if n in shared else t for n, t in zip(names, tensors, strict=True)]
            yield f"{label}, one tensor as {', '.join(shared)}", tuple(one)
        yield label, tuple(tensors)
        if len(names) > 1:  # the further arguments optional in practice (a mask, a cache)
            rest = ", ".join(f"{name}=None" for name in names[1:])
            yield f"{label}, {rest}", (tensors[0], *[None] * (len(names) - 1))


def _rotary_widths(part: nn.Module) -> list[int]:
    """The widths of the (cos, sin) ``part`` may rotate its heads by, when its ``forward``
    takes them (``position_embeddings``): its (or its first attention's) ``head_dim``, and the
    rotated share of it where the configuration rotates only part of each head."""
    try:
        if _ROTARY not in inspect.signature(part.forward).parameters:
            return []
    except (TypeError, ValueError):
        return []
    for module in part.modules():
        head = getattr(module, "head_dim", None)
        if isinstance(head, int) and head > 0:
            factor = getattr(getattr(module, "config", None), "partial_rotary_factor", None)
            partial = int(head * factor) if isinstance(factor, float) and 0 < factor < 1 else None
            return [head] + ([partial] if partial else [])
    return []


def runnable_inputs(
    part: nn.Module,
    settings: BuildSettings,
    candidates: Iterable[tuple[str, Any]] | None = None,
) -> tuple[str, Any] | None:
    """The first of ``candidates`` (default: :func:`input_candidates`) the part runs on in eval
    mode and answers with a floating-point tensor (its first output, as compared:
    :class:`MainOutput`), or ``None``."""
    part.eval()
    for shape, inputs in input_candidates(part, settings) if candidates is None else candidates:
        seed_everything(settings.seed)
        try:
            with torch.no_grad():
                result = call_model(MainOutput(part), inputs)
        except Exception:  # noqa: BLE001 - a shape the part does not take: try the next
            continue
        if isinstance(result, torch.Tensor) and result.is_floating_point():
            return shape, inputs
    return None


class MainOutput(nn.Module):
    """A part whose first output alone is compared (with every gradient and buffer): what a
    module returns after it (attention probabilities, a cache) its model reads only under
    options a part check does not set, and a kernel may leave out (``None``) unless asked."""

    def __init__(self, part: nn.Module) -> None:
        super().__init__()
        self.part = part

    def forward(self, *inputs: Any, **named: Any) -> Any:
        result = self.part(*inputs, **named)
        return result[0] if isinstance(result, tuple) and result else result


def _taken(build: Callable[[], nn.Module], path: str) -> Callable[[], nn.Module]:
    return lambda: MainOutput(build().get_submodule(path))


def part_subject(whole: Subject, name: str, cls: str, path: str, found: tuple[str, Any]) -> Subject:
    """The part at ``path`` of ``whole``'s models (``name``: how the check that built them is
    named) as a subject called with the inputs ``found`` (their shape, the inputs)."""
    shape, inputs = found
    quiet = whole.quiet

    def quiet_parts() -> tuple[Callable[[], Any], Callable[[], Any]]:
        assert quiet is not None
        original, patched = quiet()
        return _taken(original, path), _taken(patched, path)

    sides = (_taken(whole.build_original, path), _taken(whole.build_patched, path))
    label = f"{name}.{path}, input {shape}"
    return _part_of(whole, cls, label, inputs, sides, None if quiet is None else quiet_parts)


def _part_of(
    whole: Subject,
    cls: str,
    label: str,
    inputs: Any,
    sides: tuple[Callable[[], Any], Callable[[], Any]],
    quiet: Callable[[], tuple[Callable[[], Any], Callable[[], Any]]] | None,
) -> Subject:
    """A part check's subject: builders of both sides' part (``sides``, and without dropout,
    ``quiet``), the dropout sources of ``whole``, named after the part's class."""
    return Subject(
        name=cls + PART_SUFFIX,
        label=label,
        build_original=sides[0],
        build_patched=sides[1],
        inputs=inputs,
        quiet=quiet,
        dropout_texts=whole.dropout_texts,
        dropout_mode=whole.dropout_mode,
    )


def _configurations(config: Any) -> list[Any]:
    """``config`` and the configurations it holds (``text_config``, ``vision_config``...)."""
    held = [v for k, v in vars(config).items() if k.endswith("_config") and hasattr(v, "__dict__")]
    return [config, *held]


# Constructor parameters that number a layer (``Attention(config, layer_idx)``): the first.
_LAYER_NUMBERS = frozenset({"layer_idx", "layer_index", "layer_id"})


def _arguments(names: list[str], source: Any) -> dict[str, Any] | None:
    """The constructor's required ``names`` filled from the configuration ``source``: the
    configuration itself for ``config``, layer 0 for a layer's number, else the value of the
    same name; ``None`` when ``source`` has no such value."""
    arguments: dict[str, Any] = {}
    for name in names:
        if name == "config":
            arguments[name] = source
        elif name in _LAYER_NUMBERS:
            arguments[name] = 0
        elif hasattr(source, name):
            arguments[name] = getattr(source, name)
        else:
            return None
    return arguments


def _with_unset_sizes(cls: type, config: Any) -> Any | None:
    """A copy of ``config`` in which the entries ``cls``'s constructor reads (``config.X``)
    and the configuration leaves ``None`` or lacks get its width (16 without one): the options
    that switch a part on (Wav2Vec2's attention adapter is built when ``adapter_attn_dim`` is
    set, and then of that width; HuBERT's configuration, whose file kept the class, has no such
    entry). ``None`` when there are none, or the source cannot be read."""
    try:
        source = inspect.getsource(cls.__init__)
    except (OSError, TypeError):
        return None
    unset = sorted(
        name for name in set(_CONFIG_READS.findall(source)) if getattr(config, name, None) is None
    )
    if not unset or not hasattr(config, "__dict__"):
        return None
    width = getattr(config, "hidden_size", None)
    filled = copy.copy(config)
    for name in unset:
        setattr(filled, name, width if isinstance(width, int) and width > 0 else 16)
    return filled


# ``config.adapter_attn_dim`` read in a constructor (a method call is no entry)
_CONFIG_READS = re.compile(r"\bconfig\.([A-Za-z_]\w*)\b(?!\s*\()")


def _construct(cls: type, config: Any) -> nn.Module:
    """``cls(config)``, else ``cls`` of ``config`` with the sizes its constructor reads and
    ``config`` leaves unset filled (:func:`_with_unset_sizes`), else ``cls`` given what its
    constructor requires by name from ``config`` or a configuration it holds
    (``RMSNorm(hidden_size)``, ``AudioAttention(audio_config, layer_idx)``)."""
    try:
        return cls(config)
    except Exception:
        filled = _with_unset_sizes(cls, config)
        if filled is not None:
            try:
                return cls(filled)
            except Exception:  # noqa: BLE001, S110 - the names below may build it
                pass
        names = _required(cls)
        for source in _configurations(config) if names else []:
            arguments = _arguments(names, source)
            if arguments is None:
                continue
            try:
                return cls(**arguments)
            except Exception:  # noqa: BLE001, S112 - the next configuration may be the one
                continue
        raise


def _built_from(cls: type, config: Any, settings: BuildSettings) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(settings.seed)
        return MainOutput(_construct(cls, config).to(torch_dtype(settings.dtype)))

    return build


def part_classes(
    unreached: list[Any], hosts: dict[str, list[str]], models: list[str]
) -> dict[str, set[str]]:
    """The module classes to check on their own, nearest first, each with the keys of the
    ``unreached`` sites it may run: a site's own class, then the classes whose code reaches it
    (``hosts``, by site key, nearest first: the attention module that calls a processor, the
    block that holds it); never a model class (``models``: the adapter builds and drives
    those). Classes that are no module are left for :func:`parts_to_check` to pass over."""
    wanted: dict[str, set[str]] = {}
    distance: dict[str, int] = {}
    for site in unreached:
        reaching = [site.cls] if site.cls else []
        reaching += [cls for cls in hosts.get(site.key, []) if cls not in reaching]
        for rank, cls in enumerate(reaching):
            if cls and cls not in models:
                wanted.setdefault(cls, set()).add(site.key)
                distance[cls] = min(distance.get(cls, rank), rank)
    return {cls: wanted[cls] for cls in sorted(wanted, key=distance.__getitem__)}


def constructed_subject(
    whole: Subject, config: Any, classes: tuple[type, type], settings: BuildSettings
) -> Subject | Unbuildable:
    """The class (original, patched) built on its own from ``config``, the configuration of
    ``whole``'s model (where no model checked builds it: an option the defaults leave off, a
    head not checked), with inputs that run, or why there is none."""
    original, patched = classes
    try:
        part = _built_from(original, config, settings)().part
    except Exception as exc:  # noqa: BLE001 - the class does not take the model's config
        return Unbuildable(
            f"no model checked builds {original.__name__}, and building it "
            f"from {whole.name}'s configuration raised {type(exc).__name__}"
        )
    found = runnable_inputs(part, settings)
    if found is None:
        return Unbuildable(
            f"{original.__name__} built from {whole.name}'s configuration "
            "runs on none of the input shapes tried"
        )
    quiet = whole.quiet

    def quiet_parts() -> tuple[Callable[[], Any], Callable[[], Any]]:
        assert quiet is not None
        silent = quiet()[0]().config
        return _built_from(original, silent, settings), _built_from(patched, silent, settings)

    shape, inputs = found
    label = f"built from {whole.name}'s configuration, input {shape}"
    sides = (_built_from(original, config, settings), _built_from(patched, config, settings))
    quiet_sides = None if quiet is None else quiet_parts
    return _part_of(whole, original.__name__, label, inputs, sides, quiet_sides)


def parts_to_check(
    builds: list[tuple[str, Callable[[], Any]]],
    classes: list[str],
    wanted: Callable[[str], bool],
    modules: tuple[Any, Any],
    settings: BuildSettings,
    more_inputs: Callable[[nn.Module], Iterable[tuple[str, Any]]] | None = None,
) -> Iterator[tuple[str, Subject | Unbuildable]]:
    """Parts to check for the ``classes`` (defined in the original module of ``modules``) that
    are still ``wanted``: in each model ``builds`` make (a name, and a builder of its subject;
    at most ``MAX_PART_MODELS``), each such class's first part, as a subject with inputs that
    run or why it has none; then each class no model holds, built on its own from the
    configuration (or one it holds) of the first of those models whose configuration builds
    it, or, for a class that is no module, an object of it standing in for one a built model's
    module calls with the same arguments (:func:`_stand_in`). A class is tried again in a
    later model while it is wanted (the site's code path may depend on how the model was
    configured: eager attention). A part runs on the shapes its first layers suggest (given
    to every argument a processor it holds requires), else on ``more_inputs`` of it (the
    library adapter's own, by role)."""
    configured: list[tuple[Subject, Any]] = []  # each model checked, with its configuration
    built: list[tuple[Subject, nn.Module, str]] = []
    held: set[str] = set()
    taken: set[tuple[str, str]] = set()  # (model, path) of the parts tried already
    for name, build in builds[:MAX_PART_MODELS]:
        if not any(wanted(cls) for cls in classes):
            return
        whole = build()
        if isinstance(whole, Unbuildable):
            continue
        model = whole.build_original()
        built.append((whole, model, name))
        if getattr(model, "config", None) is not None:
            configured.append((whole, model.config))
        for cls in classes:
            paths = part_paths(model, cls, modules[0].__name__)
            if paths or _of_class(model, cls, modules[0].__name__):
                held.add(cls)  # a part of it, or the model itself: no part to build alone
            if not paths or not wanted(cls) or (name, paths[0]) in taken:
                continue  # (a processor's holder is its attention module's part too)
            taken.add((name, paths[0]))
            yield cls, _held_part((whole, model, name), cls, paths[0], settings, more_inputs)
    unheld = [cls for cls in classes if cls not in held]
    yield from _unheld_parts(unheld, wanted, modules, (configured, built), settings, more_inputs)


def _unheld_parts(
    classes: list[str],
    wanted: Callable[[str], bool],
    modules: tuple[Any, Any],
    models: tuple[list[tuple[Subject, Any]], list[tuple[Subject, nn.Module, str]]],
    settings: BuildSettings,
    more_inputs: Callable[[nn.Module], Iterable[tuple[str, Any]]] | None,
) -> Iterator[tuple[str, Subject | Unbuildable]]:
    """Parts for the ``classes`` no model built holds, while wanted: a module class built from
    a checked model's configuration (``models``: each with its configuration, and each built
    with its name), an object's class standing in for one a built model's module calls."""
    configured, built = models
    for cls in classes:
        if not wanted(cls):  # asked as each comes: a check may have run it
            continue
        pair = (getattr(modules[0], cls, None), getattr(modules[1], cls, None))
        if not all(isinstance(c, type) for c in pair):
            continue
        if configured and all(issubclass(c, nn.Module) for c in pair):  # type: ignore[arg-type]
            yield cls, _constructed_from_any(configured, pair, settings)  # type: ignore[arg-type]
        elif not any(issubclass(c, nn.Module) for c in pair):  # type: ignore[arg-type]
            stand_in = _stand_in(built, pair[0])  # type: ignore[arg-type]
            if stand_in is not None:
                yield cls, _swapped_part(stand_in, pair, settings, more_inputs)  # type: ignore[arg-type]


def _held_part(
    built: tuple[Subject, nn.Module, str],
    cls: str,
    path: str,
    settings: BuildSettings,
    more_inputs: Callable[[nn.Module], Iterable[tuple[str, Any]]] | None,
) -> Subject | Unbuildable:
    """The part at ``path`` of a model built (its subject, the original model, its name) with
    the first inputs it runs on, named for the module checked (the holder of a processor
    object is checked); or why it runs on none."""
    whole, model, name = built
    part = model.get_submodule(path)
    held = [type(v) for v in vars(part).values() if type(v).__name__ == cls]
    found = _part_inputs(part, held[0] if held else None, settings, more_inputs)
    if found is None:
        return Unbuildable(f"{cls} at {name}.{path} runs on none of the input shapes tried")
    return part_subject(whole, name, type(part).__name__, path, found)


def _part_inputs(
    part: nn.Module,
    called: type | None,
    settings: BuildSettings,
    more_inputs: Callable[[nn.Module], Iterable[tuple[str, Any]]] | None,
) -> tuple[str, Any] | None:
    """The first inputs ``part`` runs on: the shapes its first layers take, then those given
    to every argument an object of ``called`` it calls requires, then ``more_inputs`` of it."""
    tried = input_candidates(part, settings)
    by_call = _called_with(part, called, settings) if called is not None else ()
    further = more_inputs(part) if more_inputs is not None else ()
    return runnable_inputs(part, settings, itertools.chain(tried, by_call, further))


def _call_parameters(cls: type) -> tuple[set[str], set[str]] | None:
    """The parameters of ``cls.__call__`` (``self`` left out), all and required, or ``None``
    where it has no signature to read."""
    try:
        parameters = list(inspect.signature(cls.__call__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = {p.name for p in parameters if p.kind in (*positional, inspect.Parameter.KEYWORD_ONLY)}
    required = {
        p.name for p in parameters if p.kind in positional and p.default is inspect.Parameter.empty
    }
    return names, required


def _called_with(
    part: nn.Module, called: type, settings: BuildSettings
) -> Iterator[tuple[str, Any]]:
    """Inputs for a module that hands its work to an object of ``called`` (an attention module
    and its processor): each shape its first layers take, given to every parameter of its
    ``forward`` that the object's call requires (``encoder_hidden_states``: optional for the
    module, required by a joint or cross-attention processor)."""
    found = _call_parameters(called)
    if found is None:
        return
    try:
        parameters = list(inspect.signature(part.forward).parameters)
    except (TypeError, ValueError):
        return
    names = [name for name in parameters if name in found[1]]
    if len(names) < 2:  # one tensor: what input_candidates tries already
        return
    dtype = torch_dtype(settings.dtype)
    for shape in _shapes(part):
        generator = torch.Generator().manual_seed(settings.seed)
        label = f"{'x'.join(map(str, shape))} as {', '.join(names)}"
        yield label, {name: torch.randn(shape, generator=generator, dtype=dtype) for name in names}


def _interchangeable(held: type, wanted: type) -> bool:
    """Whether an object of ``wanted`` can stand in for the ``held`` one a module calls (an
    attention module's processor): each takes every argument the other requires."""
    if held is wanted or "__call__" not in vars(wanted):
        return False
    ours, theirs = _call_parameters(held), _call_parameters(wanted)
    if ours is None or theirs is None or not ours[1]:
        return False
    return theirs[1] <= ours[0] and ours[1] <= theirs[0]


def _stand_in(
    built: list[tuple[Subject, nn.Module, str]], wanted: type
) -> tuple[Subject, str, str, str] | None:
    """A module of a built model that calls an object ``wanted`` can stand in for, held as an
    attribute (a processor no model sets by default: a perturbed or training variant the user
    installs on an attention module): (the model's subject, its name, the module's path, the
    attribute); one whose object's class is defined beside ``wanted`` first."""
    found: list[tuple[bool, Subject, str, str, str]] = []
    for whole, model, name in built:
        for path, module in model.named_modules():
            for attribute, value in vars(module).items():
                held = type(value)
                if isinstance(value, nn.Module) or not _interchangeable(held, wanted):
                    continue
                found.append((held.__module__ != wanted.__module__, whole, name, path, attribute))
    if not found:
        return None
    _, whole, name, path, attribute = min(found, key=lambda entry: entry[0])
    return whole, name, path, attribute


def _holding(
    build: Callable[[], nn.Module], path: str, attribute: str, cls: type
) -> Callable[[], nn.Module]:
    """A builder of the module at ``path`` with a new ``cls()`` as its ``attribute``."""

    def swapped() -> nn.Module:
        part = build().get_submodule(path)
        setattr(part, attribute, cls())
        return part

    return swapped


def _swapped_part(
    stand_in: tuple[Subject, str, str, str],
    classes: tuple[type, type],
    settings: BuildSettings,
    more_inputs: Callable[[nn.Module], Iterable[tuple[str, Any]]] | None,
) -> Subject | Unbuildable:
    """The module found by :func:`_stand_in`, on each side given a new object of that side's
    class of ``classes`` in place of the one it holds, with the first inputs it runs on."""
    whole, name, path, attribute = stand_in
    original, patched = classes
    try:
        probe = _holding(whole.build_original, path, attribute, original)()
    except Exception as exc:  # noqa: BLE001 - a class that needs arguments, or a package
        return Unbuildable(f"{original.__name__}() could not stand in at {name}.{path}: {exc!r}")
    found = _part_inputs(probe, original, settings, more_inputs)
    if found is None:
        return Unbuildable(
            f"{name}.{path} with {original.__name__}() as its {attribute} runs on none of the "
            "input shapes tried"
        )
    quiet = whole.quiet

    def quiet_parts() -> tuple[Callable[[], Any], Callable[[], Any]]:
        assert quiet is not None
        builders = quiet()
        return tuple(  # type: ignore[return-value]
            _wrapped(_holding(b, path, attribute, c))
            for b, c in zip(builders, classes, strict=True)
        )

    sides = tuple(
        _wrapped(_holding(b, path, attribute, c))
        for b, c in zip((whole.build_original, whole.build_patched), classes, strict=True)
    )
    label = f"{name}.{path} with {original.__name__}() as its {attribute}, input {found[0]}"
    quiet_sides = None if quiet is None else quiet_parts
    return _part_of(whole, original.__name__, label, found[1], sides, quiet_sides)  # type: ignore[arg-type]


def _wrapped(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    return lambda: MainOutput(build())


def _constructed_from_any(
    configured: list[tuple[Subject, Any]], classes: tuple[type, type], settings: BuildSettings
) -> Subject | Unbuildable:
    """The class built from the first checked model's configuration that builds it with
    inputs that run (a vision model's for a vision part, a text model's for a text part), or
    why the first model's does not."""
    outcomes = (
        constructed_subject(whole, config, classes, settings) for whole, config in configured
    )
    first = None
    for outcome in outcomes:
        if not isinstance(outcome, Unbuildable):
            return outcome
        first = first or outcome
    assert first is not None
    return first


STANDALONE_WIDTH = 32
"""The size a class built on its own is given for each required size argument: divisible by the
head counts and reduction divisors layer classes default to (8 heads, a divisor of 8)."""

# Required constructor arguments that are a layer's width, by name.
_WIDTH_ARGUMENTS = re.compile(
    r"(channels|in_chs|dim|d_model|in_features|num_features|hidden_size|embed_dim|width)$"
)


def standalone_part(
    cls: type, settings: BuildSettings, keywords: dict[str, Any]
) -> tuple[nn.Module, tuple[str, Any]]:
    """``cls`` built on its own (a layer class no model of its library builds), seeded: each
    required argument a width by its name (``channels``, ``dim``, ``d_model``:
    :data:`STANDALONE_WIDTH`), ``keywords`` on top, wrapped in :class:`MainOutput`; with the
    first input it runs on (its shape, the inputs): those its layers suggest
    (:func:`runnable_inputs`), else channels-first maps, tokens or vectors of that width.
    Raises ``ValueError`` saying why where it cannot be built or run."""
    arguments = {}
    for name in _required(cls):
        if not _WIDTH_ARGUMENTS.search(name):
            raise ValueError(f"{cls.__name__} requires {name!r}, which is no width to guess")
        arguments[name] = STANDALONE_WIDTH
    torch.manual_seed(settings.seed)
    part = cls(**arguments, **keywords).to(torch_dtype(settings.dtype))
    tried = itertools.chain(input_candidates(part, settings), _width_candidates(settings))
    found = runnable_inputs(part, settings, tried)
    if found is None:
        raise ValueError(f"{cls.__name__} built on its own runs on none of the inputs tried")
    return MainOutput(part), found


def _width_candidates(settings: BuildSettings) -> Iterator[tuple[str, Any]]:
    """Channels-first maps, tokens and vectors of :data:`STANDALONE_WIDTH`, with their shapes."""
    width, dtype = STANDALONE_WIDTH, torch_dtype(settings.dtype)
    for shape in ((2, width, *_SPATIAL[2]), (2, _TOKENS, width), (2, width)):
        generator = torch.Generator().manual_seed(settings.seed)
        yield "x".join(map(str, shape)), (torch.randn(shape, generator=generator, dtype=dtype),)
