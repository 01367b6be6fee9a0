"""The language-modelling loss, in one place (paper §3.1, L1; and the auxiliary L1 of §3.2, L3 = L2 + λ·L1).

Pretraining, the validation perplexity, the fine-tuning auxiliary loss and ``GPT.lm_loss`` all score next tokens
with :func:`next_token_nll`; the fine-tuning form that averages per sequence first is
:func:`lm_loss_per_sequence`. The softmax is taken in fp32 whatever the logits' dtype, so a bf16 run's loss is the
fp32 loss of its bf16 logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from gptcli.model.packed import Packing

IGNORE = -100
"""Target id that contributes nothing (a window's overlap with the previous one, padding)."""


def next_token_nll(
    logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean", classes: int | None = None
) -> torch.Tensor:
    """Cross-entropy of ``targets`` (already shifted; ``IGNORE`` skipped) under ``logits`` of shape ``(..., V)``:
    ``F.cross_entropy`` of the fp32 logits, with ``reduction`` "mean", "sum" or "none" (0 for ignored targets).

    ``classes``: only the first ``classes`` columns are logits, the rest padding (an output product padded for
    speed, ``gptcli.model.tied``); the padding gets a zero gradient."""
    logits, targets = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    return F.cross_entropy(logits[:, :classes].float(), targets, ignore_index=IGNORE, reduction=reduction)


def lm_loss_per_sequence_packed(
    hidden: torch.Tensor,
    ids: torch.Tensor,
    packing: Packing,
    token_nll: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """:func:`lm_loss_per_sequence` of a packed row (``gptcli.model.packed``): the same targets — every token after
    each sequence's first — and the same per-sequence means, read through the packing's host-built indices (no
    mask to count on the device). ``token_nll(h, targets)`` is each target's cross-entropy given its hidden state:
    a tied LM's ``lm_token_nll`` (as fine-tuning passes it), which takes its training product.

    A shared-prefix row (``Packing.shared``, ``--layout shared``) returns the same value per full sequence
    ``prefix + answer``: each target's cross-entropy is computed once — a prefix's own targets once for all its
    answers, through the vocabulary-wide output layer once — summed per segment, and each sequence's loss is its
    prefix's sum plus its answer's (whose first target is the prefix's last token predicting the answer's first)
    over its own count. A prefix target's gradient is then Σ over the sequences holding it of 1/(count·S): the
    weight it has in the packed row, where each sequence holds its own copy."""
    h = hidden[0].index_select(0, packing.lm_inputs)
    next_rows = packing.lm_inputs + 1 if packing.lm_targets is None else packing.lm_targets
    nll = token_nll(h, ids[0].index_select(0, next_rows))
    # Summed per segment: a sequence of a plain packed row, a prefix or an answer of a shared-prefix row.
    total = torch.zeros(len(packing.lengths), device=ids.device, dtype=nll.dtype).index_add_(0, packing.lm_rows, nll)
    if packing.sequences is not None:  # each full sequence: its prefix's sum plus its answer's
        total = total.index_select(0, packing.sequences[:, 0]) + total.index_select(0, packing.sequences[:, 1])
    return total / packing.lm_counts.to(nll.dtype)


def lm_positions(mask: torch.Tensor) -> torch.Tensor:
    """Flat indices into a right-padded (rows, T) batch of the positions whose next token is a real one: the inputs
    of :func:`lm_loss_per_sequence`. Its size depends on the mask's values, so on a GPU it makes the host wait for
    the device; a batch made on the host counts them there (``gptcli.data.batching.collate``)."""
    has_next = torch.zeros_like(mask, dtype=torch.bool)
    has_next[:, :-1] = mask[:, 1:] > 0
    return has_next.reshape(-1).nonzero().squeeze(1)


def lm_loss_per_sequence(
    hidden: torch.Tensor,
    ids: torch.Tensor,
    mask: torch.Tensor,
    lm_logits: Callable[[torch.Tensor], torch.Tensor],
    positions: torch.Tensor | None = None,
    loss: Callable[..., torch.Tensor] = next_token_nll,
) -> torch.Tensor:
    """The released code's auxiliary LM loss, one value per sequence.

    Targets are ``ids[:, 1:]`` where ``mask[:, 1:]`` is 1: every real token after the first, so the delimiter and
    the extract token are predicted too and the start token is not. Each sequence's loss is the mean over its
    targets; the caller averages over sequences (``lm_losses.mean()``), as ``tf.reduce_mean(lm_losses)`` does.

    Only the positions that have a target go through the (vocabulary-wide) output layer ``lm_logits``: pad
    positions would cost a 40k-wide projection each for nothing. They are ``positions`` (:func:`lm_positions`),
    counted on the host when the batch was made; found here from ``mask`` when not given, which on a GPU waits for
    the device to say how many there are. ``loss(logits, targets, reduction=)``: the loss of those logits (the
    model's own, ``TiedEmbeddingLM.next_token_nll``, where the CPU kernels replaced it).
    """
    n, width = ids.shape
    if width < 2:
        return torch.zeros(n, device=ids.device)
    if positions is None:
        positions = lm_positions(mask)
    h = hidden.reshape(-1, hidden.size(-1)).index_select(0, positions)
    targets = ids.reshape(-1).index_select(0, positions + 1)  # the next token: same row, as the position has one
    nll = loss(lm_logits(h), targets, reduction="none")
    total = torch.zeros(n, device=ids.device, dtype=nll.dtype).index_add_(0, positions // width, nll)
    return total / (mask[:, 1:] > 0).sum(1).clamp_min(1).to(nll.dtype)
