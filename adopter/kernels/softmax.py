"""Drop-in ``softmax`` with a fused up-cast.

``torch.nn.functional.softmax(x, dim, dtype=torch.float32)`` on a half / bfloat16 tensor first
materialises ``x.to(torch.float32)`` (a full read + write of a tensor twice the input's size) and
only then runs the softmax kernel; ATen fuses the cast only for fp16 on CUDA. The same pattern
written by hand (``softmax(x.float(), -1).type_as(x)``, as T5 does) adds one more round trip.
:func:`softmax` avoids the intermediate copy where a kernel exists:

* **CUDA + Triton** (last dim, contiguous input, fp16/bf16/fp32, at most 16384 columns): a
  Triton row kernel reads the input in its storage dtype, accumulates in fp32 registers and
  writes the requested output dtype directly; its backward needs only the saved output.
* **CUDA without Triton**: ``fp16 -> fp32`` goes through ``torch._softmax(x, dim,
  half_to_float=True)`` (one kernel, no fp32 copy of the input).
* **CPU / everything else**: ATen's fused ``_softmax`` kernel is dispatched directly (it already
  accumulates half / bfloat16 in fp32 internally). There is nothing further to fuse on CPU, so
  this path is numerically and performance-wise the same as ``F.softmax``; it exists so that a
  rewritten model keeps working on every device.

Semantics are those of ``torch.nn.functional.softmax``: output dtype is ``dtype`` when given
(else the input dtype), gradients flow back in the input dtype. Autograd is supported on every
path (the Triton backward is ``once_differentiable``: double backward through the Triton path
raises instead of silently returning wrong values).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _backend
from ._util import runs_original

__all__ = ["softmax"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def softmax(
    input: torch.Tensor, dim: int | None = -1, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Softmax over ``dim``, identical in result to ``F.softmax(input, dim, dtype=dtype)``.

    Falls back to ``F.softmax`` for a ``dim`` that is not an ``int`` (``None`` = legacy
    implicit dimension, named dimensions) and for tensor subclasses (``__torch_function__``
    overrides must see the public op).
    """
    # Under torch.compile F.softmax: the Triton row kernel is launched outside a registered
    # op, which Dynamo cannot put in its graph; Inductor generates its own fused softmax.
    if (
        runs_original()
        or not isinstance(dim, int)
        or isinstance(dim, bool)
        or type(input) not in _PLAIN
    ):
        return F.softmax(input, dim=dim, dtype=dtype)
    out_dtype = input.dtype if dtype is None else dtype
    if input.is_cuda:
        if _backend.use_triton(input):
            from . import _triton_softmax

            if _triton_softmax.supported(input, dim, out_dtype):
                return _triton_softmax.triton_softmax(input, out_dtype)
        if input.dtype == torch.float16 and out_dtype == torch.float32:
            return torch._softmax(input, dim, True)
    if out_dtype != input.dtype:
        input = input.to(out_dtype)
    return torch._softmax(input, dim, False)
