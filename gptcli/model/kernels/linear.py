"""A linear layer's bf16 training product on an AMX CPU, its weight gradient from a dense transposed operand.

Reference: ``F.linear(x, w, b)`` under bf16 autocast (gptcli/model/linear.py). Autograd computes the weight
gradient as ``gᵀ·x``: a product contracting over the positions, which are the rows of both operands, so its left
operand is a transposed view. oneDNN, which runs PyTorch's bf16 products on CPU, runs that product at about 60 %
of the speed it reaches on a dense left operand (the four GPT-1 layer shapes, 2,048 positions, AMX Xeon:
docs/performance.md). :class:`_AmxLinear` lays out the narrower of the two operands transposed and dense first
(``transpose.cpp``: 0.6 ms for a 2,048 × 768 bf16 matrix, where PyTorch's ``.t().contiguous()`` takes 2.4-4.5 ms):

- a layer wider out than in (the q, k, v projection, the MLP's first layer): ``(xᵀ·g)ᵀ``, from a transposed copy
  of the input; the product's (in × out) result is written transposed into the weight's dtype by the same kernel,
  in the pass autocast's cast back to float32 would have made anyway;
- a layer wider in than out (the MLP's second layer): ``gᵀ·x`` from a transposed copy of the output gradient;
- a square one (the attention's output projection): autograd's own form, which measured faster there (4.7 against
  6.5 ms from a dense operand).

The forward pass is autocast's: the input, weight and bias cast to bf16 and ``F.linear``. The input gradient is
autograd's (``g·w``, a dense product already), bit for bit. The weight gradient is the same products on the same
values laid out otherwise, each rounded to bf16 once as autocast's is: within one bf16 rounding of autocast's
(bit-identical at GPT-1's shapes in the probe; tests/model/test_linear.py). The bias gradient is the output
gradient's sum over the positions in float32 by ``column_sums.cpp`` (0.7 ms for 2,048 × 3,072, where PyTorch's bf16
sum, autocast's, took 4.3 ms and rounds its result to bf16): autocast's within its bf16 rounding, and closer to the
exact sum.

A float32 training product (any CPU whose library has the AVX-512 loops) is :class:`_Fp32Linear`: autograd's own
products, bit for bit, and the bias gradient as the same float32 column sums (a block's four bias gradients at
2,048 positions on the AMX Xeon: 4.9 ms by PyTorch's float32 sum, 3.5 ms here). On an AMD Zen 5 its three
products, and a float32 product without gradients (:func:`fp32_inference_linear`), are oneDNN's (``onednn.py``).

Only training takes either form (a weight that requires a gradient, gradients enabled), only with the compiled
library built with AVX-512, and never inside ``torch.compile``, whose graph keeps the reference's form; the AMX form
only under bf16 autocast on an AMX CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from gptcli.model.kernels import casts, cpu, native, onednn
from gptcli.model.kernels.transpose import transposed

MIN_POSITIONS = 256
"""Positions (rows of the flattened input) from which the transposed copies pay; fewer (decoding, tiny batches)
take autocast's form."""


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`amx_linear` computes this product (module docstring)."""
    return (
        torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
        and cpu.amx()
        and x.device.type == "cpu"
        and torch.is_grad_enabled()
        and weight.requires_grad
        and weight.dtype in (torch.float32, torch.bfloat16)
        and x.numel() >= MIN_POSITIONS * x.size(-1)
        and not torch.compiler.is_compiling()
    )


def amx_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``F.linear(x, weight, bias)`` under bf16 autocast by :class:`_AmxLinear`; ``None`` where it does not apply
    (:func:`applies`) or the compiled library lacks its AVX-512 transpose."""
    if not applies(x, weight):
        return None
    lib = native.library_for(x.device, torch.bfloat16)
    if lib is None or lib.vector_isa() != "avx512":
        return None
    with torch.autocast("cpu", enabled=False):
        return _AmxLinear.apply(x.to(torch.bfloat16), weight, bias)


def fp32_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``F.linear(x, weight, bias)`` in float32 training by :class:`_Fp32Linear`: autograd's products, and the bias
    gradient as :func:`column_sums` (module docstring); ``None`` where it does not apply (no bias, autocast, evaluation, few positions, ``torch.compile``) or
    the library lacks its AVX-512 loops (the only build measured)."""
    if (
        bias is None
        or torch.is_autocast_enabled("cpu")
        or x.device.type != "cpu"
        or not torch.is_grad_enabled()
        or not (weight.requires_grad or bias.requires_grad)
        or x.numel() < MIN_POSITIONS * x.size(-1)
        or not x.dtype == weight.dtype == bias.dtype == torch.float32
        or torch.compiler.is_compiling()
    ):
        return None
    lib = native.library_for(x.device, torch.float32)
    if lib is None or lib.vector_isa() != "avx512":
        return None
    return _Fp32Linear.apply(x, weight, bias, onednn.applies(x, weight, bias))


def fp32_inference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``F.linear(x, weight, bias)`` without gradients by oneDNN where its float32 products are the faster
    (``onednn.py``: an AMD Zen 5), for at least ``MIN_POSITIONS`` positions (evaluation, scoring, a prompt; a
    decoding step's few rows keep MKL's); ``None`` elsewhere."""
    if not onednn.inference_applies(x, weight, MIN_POSITIONS):
        return None
    return onednn.linear(x, weight, bias)


def weight_grad(g: torch.Tensor, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``gᵀ·x`` (out × in) in ``dtype``, row-major, for 2-D bf16 ``g`` (positions × out) and ``x`` (positions × in),
    the narrower operand transposed dense first (module docstring)."""
    out_features, in_features = g.size(1), x.size(1)
    if in_features < out_features:
        return transposed(torch.mm(transposed(x), g), dtype)
    if out_features < in_features:
        return torch.mm(transposed(g), x).to(dtype)
    return torch.mm(g.t(), x).to(dtype)


def column_sums(g: torch.Tensor) -> torch.Tensor:
    """``g.sum(0)`` of a 2-D bf16 or float32 CPU ``g`` in float32, unrounded, by ``column_sums.cpp`` (PyTorch's
    float32 sum where the library is not built)."""
    lib = native.library_for(g.device, g.dtype)
    if lib is None:
        return g.float().sum(0)
    return lib.column_sums(g.contiguous(), torch.empty(g.size(1), dtype=torch.float32, device=g.device))


def _bf16(weight: torch.Tensor) -> torch.Tensor:
    return weight.to(torch.bfloat16)


class _AmxLinear(torch.autograd.Function):
    """``F.linear`` of bf16 ``x`` against ``weight`` and ``bias`` cast to bf16 (autocast's forward; the weight's
    copy made once per update inside the trainer's region, ``casts.py``), with the weight gradient of
    :func:`weight_grad`, handed back in the weight's and bias's own dtypes."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        w = casts.copy_of(weight, "bf16", _bf16)
        y = F.linear(x, w, None if bias is None else bias.to(torch.bfloat16))
        ctx.save_for_backward(x, w)
        ctx.dtypes = weight.dtype, None if bias is None else bias.dtype
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        g = grad.reshape(-1, grad.size(-1)).to(torch.bfloat16)
        dx = torch.mm(g, w).view(x.shape) if ctx.needs_input_grad[0] else None
        dw = weight_grad(g, x.reshape(-1, x.size(-1)), ctx.dtypes[0]) if ctx.needs_input_grad[1] else None
        db = column_sums(g).to(ctx.dtypes[1]) if ctx.needs_input_grad[2] else None
        return dx, dw, db


class _Fp32Linear(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` in float32 with autograd's own products (``x·wᵀ + b``; ``dx = g·w``; ``dw = gᵀ·x``,
    the very calls autograd's ``addmm`` backward makes, so bit for bit) and the bias gradient by
    :func:`column_sums` (each column in row order: within float32 rounding of PyTorch's sum). With ``dnn`` (an
    AMD Zen 5, ``onednn.py``) the same three products by oneDNN, the gradients' from dense transposed operands:
    within float32 rounding."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dnn: bool = False) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.dnn = dnn
        return onednn.linear(x, weight, bias) if dnn else F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        g = grad.reshape(-1, grad.size(-1))
        flat = x.reshape(-1, x.size(-1))
        if ctx.dnn:
            dx = onednn.input_grad(g, w).view(x.shape) if ctx.needs_input_grad[0] else None
            dw = onednn.weight_grad(g, flat) if ctx.needs_input_grad[1] else None
        else:
            dx = torch.mm(g, w).view(x.shape) if ctx.needs_input_grad[0] else None
            dw = torch.mm(g.t(), flat) if ctx.needs_input_grad[1] else None
        db = column_sums(g) if ctx.needs_input_grad[2] else None
        return dx, dw, db, None
