"""GPT-1's GELU (the tanh form) by the compiled loops of ``gelu.cpp``: one vectorised pass forward, one backward.

Reference: ``F.gelu(x, approximate="tanh")`` (gptcli/model/activation.py). PyTorch's kernel spends most of its
time in a precise vectorised ``tanh``; ``gelu.cpp`` evaluates the same formulas with a rational ``tanh`` a few
float ulps from it, so outputs and gradients agree with the reference to fp32 rounding and, in bf16, to within one
bf16 ulp (tests/model/test_native.py), several times faster forward and backward on GPT-1's bf16 activations
(docs/performance.md, "Kernels").
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from gptcli.model.kernels import native


@torch.compiler.disable  # under torch.compile (--compile), run eagerly between graphs: a pybind call is opaque to it
def gelu(x: torch.Tensor) -> torch.Tensor | None:
    """``F.gelu(x, approximate="tanh")`` by the compiled kernel; ``None`` when it cannot compute it here (another
    dtype or device, or the library could not be built: gptcli/model/kernels/native.py)."""
    lib = native.library_for(x.device, x.dtype)
    if lib is None:
        return None
    if torch.is_grad_enabled() and x.requires_grad:
        return _Gelu.apply(x)
    return lib.gelu_forward(x)


class _Gelu(torch.autograd.Function):
    """The compiled forward, and the compiled backward from the saved input (recomputing ``tanh`` there costs less
    than keeping a second activation-sized tensor, as PyTorch's own GELU does)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return native.built().gelu_forward(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return native.built().gelu_backward(grad.to(x.dtype), x)
