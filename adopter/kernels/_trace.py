"""Is a graph tracer recording the current call?

``torch.jit.trace`` / ``torch.jit.script`` and ``torch.fx.symbolic_trace`` record the operations a
function runs instead of (or besides) running them. A custom ``autograd.Function`` or a
data-dependent fast-path choice would put a graph into the trace that differs from the
original code's (and from trace to trace, with the grad mode or the input), so the kernels of
this package run their original composite code whenever :func:`tracing` is true. Under
``torch.fx`` the arguments are ``Proxy`` objects that cannot even be inspected.

``torch.compile`` (Dynamo) is *not* tracing in this sense: it traces custom autograd
functions faithfully, so the kernels keep their fast paths there.

Note for the maintainers: ``adopter.kernels._util`` is getting a ``tracing()`` with this
meaning; once it lands this module should defer to it.
"""

from __future__ import annotations

import torch

__all__ = ["tracing"]


def _fx_symbolic_tracing() -> bool:
    # ``is_fx_symbolic_tracing`` is true for fx.symbolic_trace only (not torch.export/compile);
    # older releases only have the flag itself.
    from torch.fx import _symbolic_trace

    probe = getattr(_symbolic_trace, "is_fx_symbolic_tracing", None)
    if probe is not None:
        return bool(probe())
    return bool(getattr(_symbolic_trace, "_is_fx_tracing_flag", False))


def tracing(*values: object) -> bool:
    """True under ``torch.jit`` tracing/scripting or ``torch.fx`` symbolic tracing.

    ``values`` are checked for ``torch.fx.Proxy`` too, which also catches proxies handed over
    by a custom tracer that does not set the global flag.
    """
    if torch.jit.is_tracing() or torch.jit.is_scripting():
        return True
    if any(isinstance(v, torch.fx.Proxy) for v in values):
        return True
    return _fx_symbolic_tracing()
