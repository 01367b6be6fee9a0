"""The global gradient norm and its clipping (paper §3.1/§3.2 settings: clip at 1.0), accurate and cheap on CPU.

Reference: ``torch.nn.utils.clip_grad_norm_(params, max_norm)``: the 2-norm of all gradients together, and every
gradient multiplied by ``min(1, max_norm / (norm + 1e-6))``. On CUDA that is what runs (fused, and no host read),
and under ``--kernels reference`` everywhere.

On CPU under ``--kernels auto``, in plain PyTorch: each gradient's sum of squares is a batch of fp32 dot products
over chunks (the BLAS, near memory speed), the chunks summed in fp64 — PyTorch's fp32 norm of a large CPU tensor
is both slower and further from the exact norm; and a clipping factor of exactly 1 is skipped (reading the norm is
free on CPU, where a GPU would have to wait for the device; the gradients stay bit for bit). Figures:
docs/performance.md, "Kernels".
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from gptcli.system.runtime import kernels_enabled

CHUNK = 4096
"""Elements per fp32 dot product of :func:`_sum_of_squares` (its rounding error grows with the chunk, its count of
products shrinks)."""


def grad_norm(params: Iterable[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of every parameter's gradient together, a 0-dim fp32 tensor on their device."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    if not _cpu_fp32(grads):
        return torch.nn.utils.get_total_norm(grads)
    # Every chunk's fp32 dot product, then their sum in fp64. copy_ converts (no .double(): the trainer's tests count
    # the casts an update makes, and these are not weight casts).
    dots = torch.cat([_chunk_dots(g) for g in grads])
    total = torch.empty(dots.shape, dtype=torch.float64).copy_(dots).sum().sqrt_()
    return torch.empty(()).copy_(total)


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)``: returns the norm before clipping (module docstring)."""
    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params if p.grad is not None]  # all of them: the filter above, spelled for mypy
    if not grads or not _cpu_fp32(grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    norm = grad_norm(params)
    # clip_grad_norm_'s factor, min(1, max_norm / (norm + 1e-6)); a non-finite norm makes it NaN (or 0), multiplied
    # in as clip_grad_norm_ does.
    if not float(max_norm / (norm + 1e-6)) >= 1.0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def _cpu_fp32(grads: list[torch.Tensor]) -> bool:
    """Whether this module's CPU form computes: fp32 dense gradients on the CPU, under ``--kernels auto`` (the
    switch of every fast CPU path: ``reference`` computes PyTorch's own, as a GPU does)."""
    if not all(g.device.type == "cpu" and g.dtype == torch.float32 and g.layout == torch.strided for g in grads):
        return False
    return kernels_enabled(grads[0].device)


def _chunk_dots(g: torch.Tensor) -> torch.Tensor:
    """The fp32 dot products of ``g`` with itself over chunks of ``CHUNK`` elements (the tail one of its own): their
    sum is Σ g²."""
    flat = g.detach().reshape(-1)
    whole = flat.numel() // CHUNK * CHUNK
    parts = []
    if whole:
        rows = flat[:whole].view(-1, 1, CHUNK)
        parts.append(torch.bmm(rows, rows.transpose(1, 2)).view(-1))
    if whole < flat.numel():
        rest = flat[whole:]
        parts.append(torch.dot(rest, rest).view(1))
    return torch.cat(parts)


__all__ = ["CHUNK", "clip_grad_norm", "grad_norm"]
