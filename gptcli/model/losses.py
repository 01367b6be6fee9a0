"""The language-modelling loss, in one place (paper §3.1, L1; and the auxiliary L1 of §3.2, L3 = L2 + λ·L1).

Pretraining, the validation perplexity, the fine-tuning auxiliary loss and ``GPT.lm_loss`` all score next tokens
with :func:`next_token_nll`; the fine-tuning form that averages per sequence first is
:func:`lm_loss_per_sequence`. The softmax is taken in fp32 whatever the logits' dtype, so a bf16 run's loss is the
fp32 loss of its bf16 logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

if TYPE_CHECKING:
    from gptcli.model.packed import Packing

IGNORE = -100
"""Target id that contributes nothing (a window's overlap with the previous one, padding)."""


CHUNK_ELEMENTS = 2**20
"""Logits per block of :class:`_RowBlockNLL` (2,048 × 40,478 logits: 82 blocks of 25 rows, 4 MB each in fp32).
2¹⁹–2²⁰ measured fastest; one row per block took twice as long."""


def next_token_nll(logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean",
                   classes: int | None = None) -> torch.Tensor:
    """Cross-entropy of ``targets`` (already shifted; ``IGNORE`` skipped) under ``logits`` of shape ``(..., V)``:
    ``F.cross_entropy`` of the fp32 logits, with ``reduction`` "mean", "sum" or "none" (0 for ignored targets).

    ``classes``: only the first ``classes`` columns are logits, the rest padding (a product padded for speed,
    ``TiedEmbeddingLM.lm_nll``); the padding gets a zero gradient."""
    logits, targets = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    if logits.device.type != "cpu" or reduction not in ("mean", "sum", "none"):
        return F.cross_entropy(logits[:, :classes].float(), targets, ignore_index=IGNORE, reduction=reduction)
    with torch.autocast("cpu", enabled=False):
        nll = _RowBlockNLL.apply(logits, targets, classes or logits.size(1))
    if reduction == "none":
        return nll
    total = nll.sum()
    return total if reduction == "sum" else total / (targets != IGNORE).sum()


def _block_rows(classes: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, classes))


class _RowBlockNLL(torch.autograd.Function):
    """Per-row ``-log softmax(logits)[target]`` in fp32 (0 where the target is ``IGNORE``), over blocks of rows.

    On CPU, ``F.cross_entropy(logits.float())`` writes four vocabulary-wide fp32 tensors per step (the fp32 copy,
    its log-softmax, the loss's one-hot gradient and the softmax's gradient: 1.3 GB for a 4 × 512 GPT-1 batch) and
    reads them back, and a step that has to fault fresh pages in for one of them loses ≈ 0.4 s. Here each block of
    rows is converted and normalised while it is in cache; the backward pass recomputes the block's softmax and
    writes the gradient, ``softmax − one_hot(target)`` times the row's weight, straight into the logits' dtype.
    The values are ``F.cross_entropy``'s (tests/model/test_losses.py)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, classes: int) -> torch.Tensor:
        valid = targets != IGNORE
        safe = targets.masked_fill(~valid, 0).unsqueeze(1)
        nll = torch.empty(logits.size(0), device=logits.device)
        rows = _block_rows(classes)
        for a in range(0, logits.size(0), rows):
            logp = torch.log_softmax(logits[a : a + rows, :classes].float(), dim=-1)
            nll[a : a + rows] = logp.gather(1, safe[a : a + rows]).squeeze(1).neg_()
        ctx.save_for_backward(logits, safe, valid)
        ctx.classes = classes
        return nll.masked_fill_(~valid, 0.0)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        logits, safe, valid = ctx.saved_tensors
        classes = ctx.classes
        weight = (grad.float() * valid).unsqueeze(1)
        out = torch.empty(logits.shape, device=logits.device, dtype=logits.dtype)
        out[:, classes:] = 0.0
        rows = _block_rows(classes)
        for a in range(0, logits.size(0), rows):
            p = torch.softmax(logits[a : a + rows, :classes].float(), dim=-1)
            p.scatter_add_(1, safe[a : a + rows], torch.full_like(safe[a : a + rows], -1, dtype=p.dtype))
            out[a : a + rows, :classes] = p.mul_(weight[a : a + rows])
        return out, None, None


def lm_loss_per_sequence_packed(
    hidden: torch.Tensor, ids: torch.Tensor, packing: "Packing", lm_logits: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """:func:`lm_loss_per_sequence` of a packed row (``gptcli.model.packed``): the same targets — every token after
    each sequence's first — and the same per-sequence means, read through the packing's host-built indices (no
    mask to count on the device)."""
    h = hidden[0].index_select(0, packing.lm_inputs)
    nll = next_token_nll(lm_logits(h), ids[0].index_select(0, packing.lm_inputs + 1), reduction="none")
    total = torch.zeros(len(packing.lengths), device=ids.device, dtype=nll.dtype).index_add_(0, packing.lm_rows, nll)
    return total / packing.lm_counts.to(nll.dtype)


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
