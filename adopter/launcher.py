"""The ``adopter`` console script: starts the CLI without loading help rendering nobody asked for.

Typer imports its Rich help renderer, and through it a Markdown parser, whenever Rich is
installed: about 0.1 s, a quarter of a one-file ``adopter scan``. Outside ``--help`` that renderer
is only used to draw usage errors in a panel, so for those runs Typer is loaded while Rich is
hidden from it and falls back to click's plain one-line messages. Rich stays importable for
Adopter's own tables, progress bars and diffs.
"""

from __future__ import annotations

import sys

_HELP_FLAGS = frozenset({"--help", "-h"})


def wants_help(arguments: list[str]) -> bool:
    """Whether the command line asks for help (no arguments at all shows help too)."""
    return not arguments or bool(_HELP_FLAGS.intersection(arguments))


def _import_typer_without_rich() -> None:
    if "typer" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # makes `import rich` fail inside typer
    try:
        import typer  # noqa: F401
    finally:
        del sys.modules["rich"]


def main() -> None:
    if not wants_help(sys.argv[1:]):
        _import_typer_without_rich()
    from .cli import app

    app()
