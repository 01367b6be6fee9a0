"""Float32 products by oneDNN on an AMD Zen 5, where MKL runs them at half the CPU's speed.

Reference: ``F.linear`` and autograd's ``mm`` in float32, which PyTorch's x86 builds hand to MKL's sgemm. On AMD
CPUs MKL takes its AVX2 code. A Zen 4's FMA units are 256 bits wide (an AVX-512 instruction issues twice), so
there the two codes share one peak; a Zen 5's are 512 bits wide, and the AVX2 code leaves half of its float32 peak
unused. oneDNN, which
PyTorch ships for its bf16 products, has AVX-512 float32 code chosen by the CPU's features, not its vendor. At
GPT-1's shapes (2,048 positions, AMD EPYC Zen 5, 2 cores, one-off probe): the forward product at 450-456 GFLOP/s
against MKL's 193-203, the input gradient ``g·w`` at 391-458 against 203-209, the weight gradient ``gᵀ·x`` (a
product over the positions, from transposed views) at 302-346 against 202-207; the tied output layer's 40,478-row
products at 241-348 against 154-209 (docs/performance.md).

The entry point is ``torch.ops.mkldnn._linear_pointwise``, the op PyTorch's own Inductor CPU backend emits for a
linear layer: ``x·wᵀ (+ b)`` for float32 ``x`` and ``w``, a fresh row-major result. It takes both dense, copying
a transposed view by PyTorch's strided copy, so the gradients' products get their transposed operands from
``transpose.cpp`` instead (``transpose.py``): per GPT-1 layer at 2,048 positions the weight gradient 1.2-1.4×
faster than from views (the tied output layer's 616 → 443 ms), the input gradient 1.0-1.15×. oneDNN's default math mode is strict, so the products are float32 through and through, summed in
another order than MKL's: within float32 rounding of the reference (tests/model/test_onednn.py).

Which CPU takes it is ``cpu.onednn_fp32()``: a flag read from /proc/cpuinfo, never a timing. A Zen 4 keeps MKL
(not measured with oneDNN; the same 256-bit units either way), as does an Intel CPU, where MKL's AVX-512 code ran
the float32 products at 83 % of the AMX Xeon's measured peak. Only float32 tensors on CPU, outside autocast and
``torch.compile``.
"""

from __future__ import annotations

import functools

import torch

from gptcli.model.kernels import cpu
from gptcli.model.kernels.transpose import transposed


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this PyTorch build has oneDNN and the op (every x86 CPU wheel has)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def applies(*tensors: torch.Tensor) -> bool:
    """Whether the float32 products of ``tensors`` run here: the CPU takes oneDNN's (``cpu.onednn_fp32()``),
    all are float32 CPU tensors, outside autocast and ``torch.compile``."""
    return (
        cpu.onednn_fp32()
        and available()
        and not torch.is_autocast_enabled("cpu")
        and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
        and not torch.compiler.is_compiling()
    )


def inference_applies(x: torch.Tensor, weight: torch.Tensor, min_positions: int) -> bool:
    """Whether ``F.linear(x, weight)`` without gradients (evaluation, scoring, a prompt) runs here: :func:`applies`,
    from ``min_positions`` rows of ``x`` (a decoding step's few rows keep MKL's)."""
    return (
        not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and x.numel() >= min_positions * x.size(-1)
        and applies(x, weight)
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` (no autograd: inside a kernel's own backward, or without gradients)."""
    flat = x.reshape(-1, x.size(-1))
    y = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return y.view(*x.shape[:-1], weight.size(0))


def input_grad(g: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``g·weight`` (autograd's input gradient of ``F.linear``) for 2-D ``g``, a fresh row-major result."""
    return _product(g.contiguous(), transposed(weight))


def weight_grad(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``gᵀ·x`` (autograd's weight gradient) for 2-D ``g`` (positions × out) and ``x`` (positions × in), a fresh
    row-major (out × in) result."""
    return _product(transposed(g), transposed(x))


def _product(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """``a·b`` from dense ``a`` and a dense ``b_t = bᵀ`` (the op's weight layout, out × in)."""
    return torch.ops.mkldnn._linear_pointwise(a, b_t, None, "none", [], "")
