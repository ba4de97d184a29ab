"""The transformers adapter: model classes of a modeling file, shrunk configurations, inputs.

A modeling file names everything needed: its ``PreTrainedModel`` subclasses carry
``config_class`` and ``main_input_name``, and their ``forward`` signatures say which inputs
exist. The functions below are the adapter interface of :mod:`adopter.models.interface`;
importing this package imports neither torch nor transformers (the functions do, inside
verify's worker).

Modules: :mod:`.discovery` (which classes), :mod:`.config` with :mod:`.shrink` and
:mod:`.config_repair` (small configurations), :mod:`.inputs`, :mod:`.tokens` and
:mod:`.patch_grid` (inputs), :mod:`.repairs` (what an error text asks to change),
:mod:`.build` (the recipe loop), :mod:`.reach` (options that guard a site).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..interface import BuildSettings, Subject, Unbuildable

__all__ = [
    "NO_MODELS",
    "may_define_models",
    "model_classes",
    "planned",
    "reach_attempts",
    "reach_context",
    "subject",
    "unrun_subject",
]

NO_MODELS = (
    "no transformers model classes (PreTrainedModel subclasses with a config_class) "
    "in this file; check plain nn.Module code with verify_factory"
)


def may_define_models(source: str) -> bool:
    """Whether the text of a file may define a model class of this adapter (static: a class
    with a ``config_class`` or a base named ``...PreTrainedModel``). A file of another library
    (diffusers' Kolors text encoder, LDM-BERT) can hold transformers models no model of its
    own library uses; :func:`model_classes` decides on the imported module."""
    import ast

    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
        if any(base.lower().endswith("pretrainedmodel") for base in bases):
            return True
        for statement in node.body:
            targets = statement.targets if isinstance(statement, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == "config_class" for t in targets):
                return True
    return False


def model_classes(module: ModuleType) -> list[str]:
    """The public, concrete model classes defined in ``module``, in file order."""
    from .discovery import find_model_classes

    return [cls.__name__ for cls in find_model_classes(module)]


def planned(module: ModuleType, names: list[str], max_heads: int) -> list[str]:
    """The base model plus up to ``max_heads`` head classes among ``names``."""
    from .discovery import select_classes

    classes = [getattr(module, name) for name in names]
    return [cls.__name__ for cls in select_classes(classes, max_heads)]


def subject(
    name: str,
    original_module: ModuleType,
    patched_module: ModuleType,
    overrides: dict[str, Any],
    settings: BuildSettings,
) -> Subject | Unbuildable:
    """Both sides of class ``name`` at a small configuration, with inputs that run."""
    from .build import subject as build_subject

    return build_subject(name, original_module, patched_module, overrides, settings)


def unrun_subject(
    name: str, original_module: ModuleType, patched_module: ModuleType, settings: BuildSettings
) -> Subject | Unbuildable:
    """Both sides of class ``name`` built small but not run (no inputs found run it): a host
    of part checks."""
    from .build import unrun_subject as build_unrun

    return build_unrun(name, original_module, patched_module, settings)


def reach_context(module: ModuleType, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each class's configuration defaults, as :func:`reach_attempts` reads them."""
    from .reach import config_defaults

    return config_defaults(module, names)


def reach_attempts(
    site: Any,
    checked: list[str],
    available: list[str],
    fixed: bool,
    context: dict[str, dict[str, Any]],
    broken: frozenset[str] = frozenset(),
) -> list[tuple[str, dict[str, Any]]]:
    """(class, overrides) pairs that may run ``site``, most promising first."""
    from .reach import reach_attempts as attempts

    return attempts(site, checked, available, fixed, context, broken)
