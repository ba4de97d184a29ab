"""The package reads left to right as the pipeline, and no stage imports a later one.

Every import in ``adopter/`` counts, at module level or inside a function (a lazy import is a
dependency all the same). Stages, in order: ``dsl``, ``extract``, ``match``, ``rewrite``,
``models`` (the model-library adapters: ``verify`` and ``bench`` build models through them, so
they come first and never import either), ``verify``, ``gate`` (``apply --verify`` and the
runtime keep only what verify proved), ``bench``, ``runtime``, ``auto``, ``cli``, ``launcher``,
``__main__``. ``kernels``, ``files``, ``corpus`` and ``executor`` are leaves: anything may
import them and they import nothing else of ``adopter`` (nor does anything count the package
root, which offers its ``__version__`` and loads ``patch`` lazily). ``rules`` holds the rule
files and their loader, written in the DSL: it imports ``dsl`` and nothing else.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "adopter"
ORDER = [
    "dsl",
    "extract",
    "match",
    "rewrite",
    "learn",
    "models",
    "verify",
    "gate",
    "bench",
    "runtime",
    "auto",
    "cli",
    "launcher",
    "__main__",
]
LEAVES = {"kernels", "files", "corpus", "executor"}
ALLOWED = {"rules": {"dsl"}}
LIBRARIES = ("transformers", "timm", "diffusers")
# What the harness may use of the adapters' package: the interface and the shared helpers.
HARNESS_MAY_IMPORT = {
    "adopter.models.interface",
    "adopter.models.common",
    "adopter.models.config_names",
    "adopter.models.config_reads",
    "adopter.models.dropout",  # where a model keeps its dropout, to switch it off
    "adopter.models.loading",
    "adopter.models.origin",  # which installed module a file is (a copy of)
    "adopter.models.factories",
    "adopter.models.factory_models",  # a factory pair's models built alike, the sites they use
    "adopter.models.library_sides",  # both sides of a library's model, built by its adapter
    "adopter.models.base",  # the protocol of the library adapters
    "adopter.models.registry",  # which adapters there are, by library name
    "adopter.models.sites",  # the kernel calls of a patched text, what reaches and guards each
    "adopter.models.parts",  # a part of a built model (a module that holds a site) on its own
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in ``path``, relative ones resolved."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.append((target, node.lineno))
            # ``from . import worker`` imports a submodule
            found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
    return [(name, line) for name, line in found if name.split(".")[0] == "adopter"]


def _graph() -> list[tuple[str, str, str, int]]:
    """(importing module, imported module, file, line) across ``adopter/``."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for target, line in _imports(path):
            edges.append((_module_name(path), target, str(path.relative_to(PACKAGE.parent)), line))
    return edges


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "adopter"


def _known(target: str) -> bool:
    """Whether ``target`` is a module or package of ``adopter`` (``from .x import name``
    yields ``x.name`` candidates that are names, not modules)."""
    relative = Path(*target.split(".")[1:])
    root = PACKAGE / relative
    return target == "adopter" or root.with_suffix(".py").exists() or root.is_dir()


def test_every_stage_of_the_package_is_placed() -> None:
    stages = {_stage(_module_name(path)) for path in PACKAGE.rglob("*.py")}
    placed = set(ORDER) | LEAVES | set(ALLOWED) | {"adopter"}
    assert stages <= placed, f"place these in tests/test_layering.py: {stages - placed}"


def test_no_stage_imports_a_later_one_and_leaves_import_nothing() -> None:
    wrong = []
    for source, target, file, line in _graph():
        if not _known(target):
            continue
        here, there = _stage(source), _stage(target)
        if here == there or there in LEAVES or "adopter" in (here, there):
            continue  # the root: its __version__ for all; patch and unpatch load on first use
        if here in LEAVES:
            wrong.append(f"{file}:{line}: the leaf {here} imports {target}")
        elif here in ALLOWED:
            if there not in ALLOWED[here]:
                wrong.append(f"{file}:{line}: {here} may import only {ALLOWED[here]}: {target}")
        elif there in ALLOWED:
            continue  # rules comes right after dsl: every later stage may use it
        elif ORDER.index(there) > ORDER.index(here):
            wrong.append(f"{file}:{line}: {here} imports the later stage {target}")
    assert wrong == []


def test_the_proof_harness_knows_no_model_library() -> None:
    """``verify`` neither imports nor names transformers, timm or diffusers; of the adapters'
    package it uses only the interface and the shared helpers (adapters are found by name, from
    the job)."""
    wrong = []
    for path in sorted((PACKAGE / "verify").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for library in LIBRARIES:
            if library in text.lower():
                wrong.append(f"{path.name} names {library}")
        for target, line in _imports(path):
            if target.startswith("adopter.models") and _known(target):
                if target not in HARNESS_MAY_IMPORT and target != "adopter.models":
                    wrong.append(f"{path.name}:{line} imports {target}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            wrong += [f"{path.name} imports {n}" for n in names if n.split(".")[0] in LIBRARIES]
    assert wrong == []


def test_the_adapters_do_not_import_the_harness_and_bench_does_not_import_verify() -> None:
    wrong = [
        f"{file}:{line}: {target}"
        for source, target, file, line in _graph()
        if (_stage(source) in ("models", "bench") and _stage(target) == "verify")
    ]
    assert wrong == []
