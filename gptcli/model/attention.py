"""Causal self-attention's inner product: ``softmax(q·kᵀ/√d + causal mask) · v``, dropout on the probabilities.

The reference is PyTorch's fused ``F.scaled_dot_product_attention``: on CUDA its flash and memory-efficient kernels
fuse the mask, the softmax and the dropout. On CPU there is no fused kernel with dropout, and the written-out
attention of ``kernels/attention.py`` is faster; it runs when the kernels are on (``gptcli.model.kernels``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gptcli.model import kernels


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
    """Causal attention of ``q``, ``k``, ``v`` (B, H, T, d) with dropout ``dropout`` on the probabilities.

    ``dropout`` is applied as given (the caller passes 0 outside training)."""
    if kernels.enabled(q.device):
        from gptcli.model.kernels.attention import causal_attention as written_out

        return written_out(q, k, v, dropout)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
