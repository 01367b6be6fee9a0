"""The language-modelling loss, in one place (paper §3.1, L1; and the auxiliary L1 of §3.2, L3 = L2 + λ·L1).

Pretraining, the validation perplexity, the fine-tuning auxiliary loss and ``GPT.lm_loss`` all score next tokens
with :func:`next_token_nll`; the fine-tuning form that averages per sequence first is
:func:`lm_loss_per_sequence`. The softmax is taken in fp32 whatever the logits' dtype, so a bf16 run's loss is the
fp32 loss of its bf16 logits.

On CPU the cross-entropy is computed a few rows at a time (:class:`_ChunkedNLL`) instead of by
``F.cross_entropy(logits.float())``: that upcast writes a fp32 copy of all B·T × 40,478 logits, the log-softmax
another, and its backward two more, each far bigger than the CPU's caches. Row by row the fp32 values live only in
cache, and the gradient is written once, in the logits' dtype. Same value and gradient to rounding
(tests/model/test_losses.py); measured in docs/performance.md.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

IGNORE = -100
"""Target id that contributes nothing (a window's overlap with the previous one, padding)."""


CHUNK_ELEMENTS = 2**20
"""Logits per chunk of :class:`_ChunkedNLL` (4 MiB in fp32: within a core's share of cache; 8 to 32 rows of a
40k vocabulary measured alike)."""


def next_token_nll(logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of ``targets`` (already shifted; ``IGNORE`` skipped) under ``logits`` of shape ``(..., V)``.

    ``reduction``: ``"mean"`` over the targets not ignored, ``"sum"``, or ``"none"`` (one value per target, 0 where
    ignored), as ``F.cross_entropy``."""
    flat, t = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    if flat.device.type != "cpu":
        return F.cross_entropy(flat.float(), t, ignore_index=IGNORE, reduction=reduction)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"unknown reduction {reduction!r} (known: mean, sum, none)")
    nll = _ChunkedNLL.apply(flat, t)
    if reduction == "none":
        return nll
    return nll.sum() if reduction == "sum" else nll.sum() / (t != IGNORE).sum()


class _ChunkedNLL(torch.autograd.Function):
    """Per-row ``-log softmax(logits)[target]`` in fp32 (0 for ``IGNORE``), computed ``CHUNK_ELEMENTS`` at a time.

    Forward keeps only the per-row log-sum-exp; backward recomputes each chunk's softmax from it:
    ``∂nll/∂logits = softmax(logits) − onehot(target)``, times the incoming gradient of the row."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        rows = _row_chunks(logits)
        lse = torch.cat([torch.logsumexp(logits[a:b].float(), dim=-1) for a, b in rows])
        valid = targets != IGNORE
        safe = targets.masked_fill(~valid, 0)
        picked = logits.gather(1, safe.unsqueeze(1)).squeeze(1).float()
        ctx.save_for_backward(logits, lse, safe, valid)
        return torch.where(valid, lse - picked, 0.0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, lse, safe, valid = ctx.saved_tensors
        weight = torch.where(valid, grad.float(), 0.0).unsqueeze(1)
        out = torch.empty_like(logits)
        for a, b in _row_chunks(logits):
            # Out of place first: with fp32 logits .float() is the saved tensor itself.
            g = torch.sub(logits[a:b].float(), lse[a:b].unsqueeze(1)).exp_().mul_(weight[a:b])
            out[a:b] = g.scatter_add_(1, safe[a:b].unsqueeze(1), -weight[a:b])
        return out, None


def _row_chunks(logits: torch.Tensor) -> list[tuple[int, int]]:
    n, width = logits.shape
    step = max(1, CHUNK_ELEMENTS // max(1, width))
    return [(a, min(a + step, n)) for a in range(0, max(n, 1), step)]  # one empty chunk when there are no rows


def lm_loss_per_sequence(
    hidden: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, lm_logits: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """The released code's auxiliary LM loss, one value per sequence.

    Targets are ``ids[:, 1:]`` where ``mask[:, 1:]`` is 1: every real token after the first, so the delimiter and
    the extract token are predicted too and the start token is not. Each sequence's loss is the mean over its
    targets; the caller averages over sequences (``lm_losses.mean()``), as ``tf.reduce_mean(lm_losses)`` does.

    Only the positions that have a target go through the (vocabulary-wide) output layer ``lm_logits``: pad
    positions would cost a 40k-wide projection each for nothing.
    """
    n = ids.size(0)
    if ids.size(1) < 2:
        return torch.zeros(n, device=ids.device)
    m = mask[:, 1:] > 0
    rows = torch.arange(n, device=ids.device).unsqueeze(1).expand_as(m)[m]
    nll = next_token_nll(lm_logits(hidden[:, :-1][m]), ids[:, 1:][m], reduction="none")
    total = torch.zeros(n, device=ids.device, dtype=nll.dtype).index_add_(0, rows, nll)
    return total / m.sum(1).clamp_min(1).to(nll.dtype)
