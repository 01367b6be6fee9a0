"""A Transformer linear layer's training product on CPU, with faster weight and bias gradients.

Reference: ``nn.Linear`` (``F.linear``, under bf16 autocast too). Autograd's weight gradient ``gᵀ·x`` contracts
over the positions, so its left operand is a transposed view, which oneDNN's bf16 products run well below their
dense speed. :class:`_AmxLinear` (bf16 autocast on an AMX CPU) lays the narrower operand out transposed and dense
first (``transpose.cpp``) and keeps autocast's forward and input gradient; :class:`_Fp32Linear` (float32) keeps
autograd's products, bit for bit. Both take the bias gradient as float32 column sums (``column_sums.cpp``), within
autocast's bf16 rounding and closer to the exact sum. On CPUs with full-width AVX-512 the float32 products, and a
large one without gradients (:func:`fp32_inference_linear`), are oneDNN's (``onednn.py``).

Why a separate form rather than a flag on the reference: the same function, in another order of products, so
tests compare the two (tests/model/test_linear.py). Only training takes either form, only with the library built
with AVX-512, never inside ``torch.compile``. Figures: docs/performance.md, "Kernels".
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
    gradient as :func:`column_sums` (module docstring); ``None`` where it does not apply (no bias, autocast,
    evaluation, few positions, ``torch.compile``) or the library lacks its AVX-512 loops (the only build measured)."""
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
    (``onednn.py``: full-width AVX-512), for at least ``MIN_POSITIONS`` positions (evaluation, scoring, a prompt; a
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
    :func:`column_sums` (each column in row order: within float32 rounding of PyTorch's sum). With ``dnn`` (full-width
    AVX-512, ``onednn.py``) the same three products by oneDNN, the gradients' from dense transposed operands:
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
