"""Started by every Python under ``adopter run``: this folder is first on ``PYTHONPATH``.

Installs Adopter's import hook (as ``import adopter.auto`` does), then runs the
``sitecustomize`` module this one shadows, if the environment has one. Never stops the program:
when Adopter cannot be imported here (another interpreter), it says so and the program runs
unpatched.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _install_hook() -> None:
    if os.environ.get("ADOPTER_RUNTIME_DISABLED"):
        return
    try:
        from adopter.runtime import install_from_environment
    except Exception as error:
        print(f"adopter run: {sys.executable} cannot import adopter ({error})", file=sys.stderr)
        return
    try:
        install_from_environment()
    except Exception as error:
        print(f"adopter run: import hook not installed: {error}", file=sys.stderr)


def _run_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    search = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", search)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_install_hook()
_run_shadowed_sitecustomize()
