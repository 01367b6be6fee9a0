"""The loss of a fine-tuning update (paper eq. 5: L3 = L2 + λ·L1), exactly the mean over its global batch however
the batch is split into micro-batches and processes, and the figures that are logged of it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from gptcli.data.batching import Batch
from gptcli.model.losses import lm_loss_per_sequence, lm_loss_per_sequence_packed
from gptcli.train.trainer import Parallel, unwrap


class TaskLoss:
    """L3 = L2 + λ·L1 (paper eq. 5) of one micro-batch; keeps each term per micro-batch of the current update
    so the log can show them apart. With λ = 0 the LM head's forward is skipped altogether.

    The update's loss is the mean over its whole (global) batch, whatever the micro-batches and processes it is
    split into: :meth:`start_update` gives each micro-batch its ``(factor, share)`` (see :func:`micro_batches`),
    the loss returned is scaled by ``factor`` (1 when the micro-batches are equal in one process) and each term is
    logged as its ``share``-weighted sum."""

    def __init__(self, lm_weight: float) -> None:
        self.lm_weight = lm_weight
        self.parts: dict[str, list[torch.Tensor]] = {"clf_loss": [], "lm_loss": []}
        """Each term per micro-batch of the current update, on the device: read only when the update is logged."""
        self.weights: list[tuple[float, float]] = []
        self.reduced: dict[str, float] | None = None
        """The terms over the global batch, when the ranks' shares were added up (:func:`global_figures`)."""

    def __call__(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        bare = unwrap(model)  # the forward goes through ``model`` (a DDP wrapper sees it); attributes from the bare one
        factor = self.weights[len(self.parts["clf_loss"])][0] if self.weights else 1.0
        out, hidden = model(batch.ids, batch.n_seqs, batch.packing)
        clf = bare.head.loss(out, batch.labels)
        self.parts["clf_loss"].append(clf.detach().float())
        if self.lm_weight == 0:
            return clf if factor == 1.0 else clf * factor
        if batch.packing is not None:
            lm = lm_loss_per_sequence_packed(hidden, batch.ids, batch.packing, bare.gpt.lm_token_nll).mean()
        else:
            lm = lm_loss_per_sequence(
                hidden, batch.ids, batch.mask, bare.gpt.lm_logits, batch.lm_positions, bare.gpt.next_token_nll
            ).mean()
        self.parts["lm_loss"].append(lm.detach().float())
        loss = clf + self.lm_weight * lm
        return loss if factor == 1.0 else loss * factor

    def start_update(self, weights: Sequence[tuple[float, float]] = ()) -> None:
        self.parts = {k: [] for k in self.parts}
        self.weights = list(weights)
        self.reduced = None

    def snapshot(self) -> tuple[dict[str, list[torch.Tensor]], list[tuple[float, float]]]:
        """The current update's terms (device tensors, per micro-batch) and weights, to read at the next sync."""
        return {k: v for k, v in self.parts.items() if v}, self.weights

    def means(self) -> dict[str, float]:
        """Each term of the last update read (:meth:`gptcli.train.finetune_job.FinetuneJob.read`) over the global batch."""
        return dict(self.reduced or {})


def combine_terms(parts: dict[str, list[float]], weights: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Each term over one update: this process's micro-batches weighted by their share of the global batch (a
    plain mean of the micro-batches when no shares were given)."""
    if weights:
        return {k: sum(x * w[1] for x, w in zip(v, weights)) for k, v in parts.items()}
    return {k: sum(v) / len(v) for k, v in parts.items()}


def rank_share(idx: Sequence[int], rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s part of the global batch ``idx`` (the same seeded order on every rank): contiguous, and the
    parts differ by at most one example (an epoch's last batch may be short; the batch need not divide evenly)."""
    n = len(idx)
    return list(idx[rank * n // world_size : (rank + 1) * n // world_size])


def micro_batches(
    idx: Sequence[int], rank: int, world_size: int, micro: int | None
) -> list[tuple[list[int], float, float]]:
    """This rank's micro-batches of the global batch ``idx``, each as (examples, loss factor, share of the batch).

    The update must follow the mean loss over the whole global batch. The trainer divides each micro-batch's loss by
    their number ``n`` on this rank and DDP averages the ``W`` ranks' gradients, so a micro-batch of ``b`` of the
    batch's ``B`` examples is scaled by ``n·W·b/B``: exactly 1 for equal micro-batches in one process, and example
    counts (not a plain mean of means) weigh uneven ones. A rank left without examples (a short last batch) still
    runs one example, with factor 0: every rank must join the gradient all-reduce."""
    mine = rank_share(idx, rank, world_size)
    size = micro or len(mine) or 1
    chunks = [mine[j : j + size] for j in range(0, len(mine), size)]
    if not chunks:
        return [(list(idx[:1]), 0.0, 0.0)]
    n, total = len(chunks), len(idx)
    return [(chunk, n * world_size * len(chunk) / total, len(chunk) / total) for chunk in chunks]


def global_figures(
    par: Parallel, updates: list[tuple[float, int, dict[str, float]]]
) -> list[tuple[float, int, dict[str, float]]]:
    """Each update's (loss, real tokens, loss terms) over the global batch from this process's figures, added up
    over the ranks in one collective for all of them."""
    if par.world_size == 1:
        return updates
    sums = par.sum([x for loss, n_tok, terms in updates for x in (loss, n_tok, *terms.values())])
    out, at = [], 0
    for _, _, terms in updates:
        mine = sums[at : at + 2 + len(terms)]
        at += len(mine)
        # Each rank's loss is W times its share of the global mean (see micro_batches).
        out.append((mine[0] / par.world_size, round(mine[1]), dict(zip(terms, mine[2:]))))
    return out
