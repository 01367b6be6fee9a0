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


def stacked_causal_attention(x: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
    """:func:`causal_attention` of q, k, v stacked in ``x`` (3, B, H, T, d), any strides: the kernel then takes
    them without a stacking copy, and returns the gradient in ``x``'s layout (kernels/attention.py)."""
    if kernels.enabled(x.device):
        from gptcli.model.kernels.attention import stacked_causal_attention as written_out

        return written_out(x, dropout)
    return F.scaled_dot_product_attention(*x.unbind(0), dropout_p=dropout, is_causal=True)


def causal_self_attention(qkv: torch.Tensor, n_head: int, dropout: float = 0.0) -> torch.Tensor:
    """Causal attention over the fused projections ``qkv`` (B, T, 3·C), q, k, v in that order, ``n_head`` heads:
    (B, T, C). The kernel reads q, k and v as views of ``qkv`` and writes its gradient whole; SDPA takes the
    three split views (its backward then concatenates their gradients, as autograd's split does)."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    if kernels.enabled(qkv.device):
        y = stacked_causal_attention(qkv.view(B, T, 3, n_head, C // n_head).permute(2, 0, 3, 1, 4), dropout)
    else:
        q, k, v = (x.view(B, T, n_head, C // n_head).transpose(1, 2) for x in qkv.split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    return y.transpose(1, 2).reshape(B, T, C)
