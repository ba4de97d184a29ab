"""Optimized kernels that rewritten model code calls instead of the unfused originals.

Every kernel takes the model's *existing* modules (so parameter names and ``state_dict`` keys
never change), returns what the original code computed, and falls back to the original
computation whenever a fast path cannot reproduce it. Only ``torch`` is required; Triton is used
lazily on CUDA when installed. See :func:`describe_backends` for what runs on this machine.

Tracing convention (every kernel follows it, new ones too): a kernel's first check is
``adopter.kernels._util.tracing()``, true while ``torch.jit.trace`` or ``torch.fx`` symbolic
tracing (``torch.fx.symbolic_trace``, transformers' ``HFTracer``) records the model; when it
holds, the kernel runs the original computation it replaces - the same module calls and
functional ops, in the same order, taking no path from grad mode, parameter values, devices or
data - so the recorded graph is the original model's graph and is the same in every trace
(``torch.jit.trace``'s check re-traces under ``no_grad``; an fx ``Proxy`` cannot drive a Python
branch or be iterated). An attention subclass calls its ``original()`` forward.
``tests/kernels/test_kernels_tracing.py`` checks every public kernel (the list is ``__all__``,
derived from :mod:`adopter.kernels.registry`) under both tracers.

Compile convention: ``torch.compile`` and ``torch.export`` (Dynamo) are not "tracing" - Dynamo
follows Python branches - but a kernel whose fused eager path Dynamo cannot capture (``out=``
into views, ``torch.result_type``, storage pointers, data-dependent checks, Triton launches)
checks ``adopter.kernels._util.runs_original()`` (a tracer, or Dynamo compiling) and runs the
original computation, which Inductor fuses itself; the others keep a fused path Dynamo captures
whole. Either way a compiled patched model has no graph break its original lacks and computes
the original's values: ``tests/kernels/test_compile_graph_breaks.py`` counts the breaks of every
kernel of the registry with ``torch._dynamo.explain`` and compiles each with ``fullgraph=True``.
"""

from importlib import import_module

from .registry import ENTRIES

# Each public name is imported from the module its registry entry names: the registry is the
# one list of kernels (adding one is its module plus an entry there).
for _entry in ENTRIES:
    globals()[_entry.name] = getattr(import_module(f"{__name__}.{_entry.module}"), _entry.name)
del _entry

__all__ = sorted(entry.name for entry in ENTRIES)
