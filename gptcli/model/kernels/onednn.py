"""Float32 products by oneDNN on AMD CPUs whose AVX-512 FMA units are full width, where MKL leaves half unused.

Reference: ``F.linear`` and autograd's ``mm`` in float32, which PyTorch's x86 builds hand to MKL's sgemm. Why: on
AMD CPUs MKL takes its AVX2 code, which leaves half of a full-width AVX-512 float32 peak unused; oneDNN, which
PyTorch ships for its bf16 products, chooses its code by the CPU's features, not its vendor. The entry point is
``torch.ops.mkldnn._linear_pointwise``, the op PyTorch's Inductor CPU backend emits for a linear layer; it copies a
transposed view, so the gradients' products get dense transposed operands from ``transpose.py`` instead.

oneDNN's default math mode is strict: float32 products summed in another order than MKL's, within float32
rounding of the reference (tests/model/test_onednn.py). Which CPU takes it is ``cpu.onednn_fp32()``, a flag read
from /proc/cpuinfo, never a timing (cpu family ≥ 26); half-width AVX-512 and Intel CPUs keep MKL. Only float32
tensors on CPU, outside autocast and ``torch.compile``. Figures: docs/performance.md, "Kernels".
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
