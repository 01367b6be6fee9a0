"""Language-model loss and perplexity of a model on a prepared corpus split.

Every token of the split except the first of each shard is predicted exactly once: shards are read in windows of
``seq_len + 1`` tokens on a stride of ``seq_len`` (the first ``seq_len`` tokens are the context, the last
``seq_len`` the targets), and the tail shorter than a window is covered by one last window aligned to the shard's
end whose already-scored targets are masked out. Perplexity is ``exp`` of the mean token negative log-likelihood
(token-level, over the corpus's own BPE tokens — the paper's 18.4 is of that kind, on BooksCorpus).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from gptcli.model.losses import IGNORE, next_token_nll
from gptcli.runtime import Precision, autocast



@dataclass
class LMEval:
    loss: float
    """Mean next-token negative log-likelihood (nats)."""
    tokens: int
    """Number of predicted tokens."""

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss) if self.loss < 700 else float("inf")


def eval_windows(arrays: Sequence[np.ndarray], seq_len: int) -> Iterator[tuple[np.ndarray, int]]:
    """Yield ``(window of ≤ seq_len+1 tokens, number of leading targets to ignore)`` covering every shard."""
    for a in arrays:
        n = len(a)
        if n < 2:
            continue
        if n <= seq_len + 1:
            yield np.asarray(a, dtype=np.int64), 0
            continue
        start = 0
        while start + seq_len + 1 <= n:
            yield np.asarray(a[start : start + seq_len + 1], dtype=np.int64), 0
            start += seq_len
        scored_until = start  # targets 1..start are scored (target index = token index)
        if scored_until < n - 1:
            s = n - seq_len - 1
            yield np.asarray(a[s:], dtype=np.int64), scored_until - s


@torch.no_grad()
def evaluate_lm(
    model: torch.nn.Module,
    arrays: Sequence[np.ndarray],
    seq_len: int,
    batch_size: int = 8,
    *,
    device: torch.device | str = "cpu",
    precision: Precision = "fp32",
    max_batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> LMEval:
    """Mean loss over the split (or over its first ``max_batches`` batches).

    With ``world_size > 1`` this process scores only batches ``rank, rank + world_size, …`` of that same sequence
    (data-parallel validation); combine the ranks' results weighted by ``tokens``."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    batches = 0
    pending: list[tuple[np.ndarray, int]] = []

    def run(items: list[tuple[np.ndarray, int]]) -> None:
        nonlocal total, count
        x = torch.stack([torch.from_numpy(w[:-1]) for w, _ in items]).to(device)
        y = torch.stack([torch.from_numpy(w[1:]) for w, _ in items]).clone()
        for row, (_, skip) in enumerate(items):
            y[row, :skip] = IGNORE
        y = y.to(device)
        with autocast(device, precision):
            logits = model.lm_logits(model(x))
        nll = next_token_nll(logits, y, reduction="sum")
        total += nll.double()
        count += int((y != IGNORE).sum())

    def flush(items: list[tuple[np.ndarray, int]]) -> None:
        nonlocal batches
        if batches % world_size == rank:
            run(items)
        batches += 1

    for w, skip in eval_windows(arrays, seq_len):
        # Windows of unequal length (a short shard) are run on their own.
        if pending and len(w) != len(pending[0][0]):
            flush(pending)
            pending = []
        pending.append((w, skip))
        if len(pending) == batch_size:
            flush(pending)
            pending = []
        if max_batches is not None and batches >= max_batches:
            pending = []
            break
    if pending:
        flush(pending)
    model.train(was_training)
    if count == 0:
        return LMEval(float("nan"), 0)
    return LMEval(float(total.item() / count), count)
