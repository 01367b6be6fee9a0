"""Causal self-attention's inner product: ``softmax(q·kᵀ/√d + causal mask) · v``, dropout on the probabilities.

:class:`SDPAttention` is the model's attention, PyTorch's fused ``F.scaled_dot_product_attention``: on CUDA its
flash and memory-efficient kernels fuse the mask, the softmax and the dropout. Each attention layer holds one as its
``attention`` attribute, the seam that ``gptcli.model.kernels.apply`` replaces with the CPU kernels' written-out
attention (CPU has no fused kernel with dropout).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class SDPAttention:
    """Causal attention by ``F.scaled_dot_product_attention``, in the layouts the model calls it with. Stateless;
    ``dropout`` is applied as given (the caller passes 0 outside training)."""

    def causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
        """Causal attention of ``q``, ``k``, ``v`` (B, H, T, d)."""
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)

    def stacked(self, x: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
        """:meth:`causal` of q, k, v stacked in ``x`` (3, B, H, T, d), any strides."""
        q, k, v = x.unbind(0)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)

    def fused(self, qkv: torch.Tensor, n_head: int, dropout: float = 0.0) -> torch.Tensor:
        """Causal attention over the fused projections ``qkv`` (B, T, 3·C), q, k, v in that order, ``n_head`` heads:
        (B, T, C). SDPA takes the three split views (its backward then concatenates their gradients, as autograd's
        split does)."""
        B, T, C3 = qkv.shape
        C = C3 // 3
        q, k, v = (x.view(B, T, n_head, C // n_head).transpose(1, 2) for x in qkv.split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return y.transpose(1, 2).reshape(B, T, C)

    def runs_grids(self, device: torch.device) -> bool:
        """Whether this attention has its own form for a packed row's grids on ``device`` (never, here): the
        standalone sequences' grid wherever jagged tensors could run, and :meth:`masked` in training
        (``gptcli.model.packed``)."""
        return False

    def masked(self, x: torch.Tensor, bias: torch.Tensor, dropout: float = 0.0) -> torch.Tensor | None:
        """Attention of q, k, v stacked in ``x`` under the additive mask ``bias``, where this attention has a form
        for it (:meth:`runs_grids`); ``None`` here."""
        return None


class Attend(Protocol):
    """How a layer's positions attend to each other, built by the model's caller for one forward pass: plain causal
    attention (:data:`CAUSAL`), per packed sequence (``packed.PackedAttend``) or against a KV cache
    (``gpt.CachedAttend``). Called with the fused projections ``qkv`` (B, T, 3·C), the heads, the dropout, the
    layer's own ``attention`` (an :class:`SDPAttention`, or the kernels' form) and the layer's index: (B, T, C)."""

    def __call__(
        self, qkv: torch.Tensor, n_head: int, dropout: float, attention: SDPAttention, layer: int
    ) -> torch.Tensor: ...


class CausalAttend:
    """Every position attends causally to the ones before it in its row: the attention's fused form."""

    def __call__(
        self, qkv: torch.Tensor, n_head: int, dropout: float, attention: SDPAttention, layer: int
    ) -> torch.Tensor:
        return attention.fused(qkv, n_head, dropout)


CAUSAL = CausalAttend()
"""Plain causal attention (training, scoring, a prompt without a cache)."""


def causal_self_attention(qkv: torch.Tensor, n_head: int, dropout: float = 0.0) -> torch.Tensor:
    """:meth:`SDPAttention.fused`: the reference attention over a fused projection."""
    return SDPAttention().fused(qkv, n_head, dropout)


__all__ = ["CAUSAL", "Attend", "CausalAttend", "SDPAttention", "causal_self_attention"]
