"""Several sequences packed end to end into one row, so that no layer computes on padding.

A fine-tuning batch pads every sequence to its longest: on RTE with the paper's random batches 61% of the positions
are padding, and every linear layer, the LM head and the loss would multiply them. Packed, the batch is one row of
its ``N`` real tokens; each sequence keeps its own positions (restarting at 0) and attends causally within itself
only, so every real token's hidden state is the one the padded batch computes (tests/model/test_packed.py: equal
logits, losses and gradients). Dropout still draws one mask entry per position, now per real position only.

:class:`Packing` describes the row — built once on the host by the batching code, moved to the device with the
ids — and :func:`segment_attention` is the attention over it: causal attention per sequence, each by the path
:func:`gptcli.model.attention.causal_attention` picks for its length.

At evaluation, a multiple-choice example's answers share their context: ``<s> story $`` is the same for every
ending, and with causal attention so are its hidden states. :meth:`Packing.shared` packs that prefix once and each
answer after it as a segment that attends to the prefix and causally to itself, at the positions it has in the full
sequence: the answers' hidden states are the full sequences' (tests/model/test_packed.py), for a fraction of the
work (Story Cloze: about 60% of the tokens; RACE: about a third).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F

from gptcli.model.attention import causal_attention


@dataclass
class Packing:
    """Where each sequence of a packed row starts and ends, and the index tensors the model and losses read."""

    lengths: list[int]
    """Tokens of each sequence, in row order (host ints: splitting by them needs no device read)."""
    positions: torch.Tensor
    """(N,) each token's position within its own sequence."""
    extract: torch.Tensor
    """(S,) row index of each sequence's first extract token (what a task head reads)."""
    lm_inputs: torch.Tensor
    """(M,) row indices of the tokens that have a next token in their own sequence (all but each sequence's last)."""
    lm_rows: torch.Tensor
    """(M,) the sequence each of those tokens belongs to."""
    lm_counts: torch.Tensor
    """(S,) next-token targets per sequence (its length − 1, at least 1 for the mean)."""
    parents: list[int] | None = None
    """For a shared-prefix row (:meth:`shared`): the segment each segment continues (-1: none). None: every segment
    stands alone."""
    _grids: dict = field(default_factory=dict, repr=False, compare=False)
    """:meth:`grid` per device, made once per batch and shared by every layer."""

    @staticmethod
    def of(seqs: Sequence[Sequence[int]], extract_id: int | None = None) -> "Packing":
        """The packing of ``seqs`` end to end (host tensors); ``extract_id`` locates each sequence's first extract
        token (0 where a sequence has none: only evaluation without a head reads without one)."""
        lengths = [len(s) for s in seqs]
        starts = [0]
        for n in lengths[:-1]:
            starts.append(starts[-1] + n)
        positions = torch.cat([torch.arange(n) for n in lengths]) if lengths else torch.zeros(0, dtype=torch.long)
        first = [list(s).index(extract_id) if extract_id is not None and extract_id in s else 0 for s in seqs]
        inputs = [start + j for start, n in zip(starts, lengths) for j in range(n - 1)]
        rows = [r for r, n in enumerate(lengths) for _ in range(n - 1)]
        return Packing(
            lengths=lengths,
            positions=positions,
            extract=torch.tensor([s + f for s, f in zip(starts, first)], dtype=torch.long),
            lm_inputs=torch.tensor(inputs, dtype=torch.long),
            lm_rows=torch.tensor(rows, dtype=torch.long),
            lm_counts=torch.tensor([max(1, n - 1) for n in lengths], dtype=torch.float32),
        )

    @staticmethod
    def shared(prefixes: Sequence[Sequence[int]], answers: Sequence[Sequence[Sequence[int]]],
               extract_id: int) -> tuple[list[int], "Packing"]:
        """(row ids, packing) of examples whose sequences are ``prefix + answer`` for each of their answers: every
        prefix once, followed by its answers, each answer attending to its prefix (evaluation only: no LM targets).
        ``extract`` lists the answers' extract tokens, example by example, as the padded batch's rows."""
        ids: list[int] = []
        lengths, parents, positions, extract = [], [], [], []
        for prefix, group in zip(prefixes, answers):
            parent = len(lengths)
            lengths.append(len(prefix))
            parents.append(-1)
            positions.extend(range(len(prefix)))
            ids.extend(prefix)
            for answer in group:
                row = len(ids)
                lengths.append(len(answer))
                parents.append(parent)
                positions.extend(range(len(prefix), len(prefix) + len(answer)))
                extract.append(row + (list(answer).index(extract_id) if extract_id in answer else 0))
                ids.extend(answer)
        empty = torch.zeros(0, dtype=torch.long)
        return ids, Packing(lengths, torch.tensor(positions, dtype=torch.long), torch.tensor(extract, dtype=torch.long),
                            empty, empty, torch.zeros(0), parents)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def grid(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(gather, scatter) indices between the row and a (S, Lmax) grid of its sequences: ``gather`` (S·Lmax,)
        picks each grid cell's token from the row (a cell past a sequence's end repeats its first token), ``scatter``
        (N,) is each token's cell. Attention runs over the grid in one batched call; pads sit after every real token
        of their sequence, so causal attention never lets a real query see one."""
        if device not in self._grids:
            width = max(self.lengths)
            gather, scatter, start = [], [], 0
            for s, n in enumerate(self.lengths):
                gather.extend([start + j for j in range(n)] + [start] * (width - n))
                scatter.extend(s * width + j for j in range(n))
                start += n
            self._grids[device] = (torch.tensor(gather, dtype=torch.long).to(device),
                                   torch.tensor(scatter, dtype=torch.long).to(device))
        return self._grids[device]

    @property
    def span(self) -> int:
        """The longest sequence the row holds, its shared prefixes included (what the position table must cover)."""
        if self.parents is None:
            return max(self.lengths, default=0)
        return max((n + (self.lengths[p] if p >= 0 else 0) for n, p in zip(self.lengths, self.parents)), default=0)

    def to(self, device: torch.device | str) -> "Packing":
        moved = [to_device(t, device) for t in (self.positions, self.extract, self.lm_inputs, self.lm_rows,
                                                 self.lm_counts)]
        return Packing(self.lengths, *moved, self.parents)


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``; to a GPU from pinned memory and without waiting, so the host goes on preparing the next
    batch meanwhile (used for every tensor of a batch: gptcli.data.batching.Batch.to)."""
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


_CAUSAL: dict[torch.device, torch.Tensor] = {}


def _causal(t: int, device: torch.device) -> torch.Tensor:
    """A (≥ t, ≥ t) lower-triangular bool mask, one per device as long as the longest asked for (sliced after)."""
    mask = _CAUSAL.get(device)
    if mask is None or mask.size(0) < t:
        mask = _CAUSAL[device] = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    return mask[:t, :t]


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float,
                      packing: Packing) -> torch.Tensor:
    """Causal attention of a packed row, ``(1, H, N, hd)`` each: every sequence attends to itself only (and, in a
    shared-prefix row, to its prefix first).

    Sequences that stand alone are gathered into a (S, H, Lmax, hd) grid and attended in one batched call (one call
    per sequence cost more in per-op overhead than the grid's padded attention: only the attention sees padding,
    a few percent of a layer's work, never the linear layers). A shared-prefix row (evaluation) takes one attention
    per answer, over its prefix's keys and its own."""
    if packing.parents is None:
        gather, scatter = packing.grid(q.device)
        H, hd, S, width = q.size(1), q.size(3), len(packing.lengths), max(packing.lengths)
        grid = [t[0].index_select(1, gather).view(H, S, width, hd).transpose(0, 1) for t in (q, k, v)]
        y = causal_attention(*grid, dropout)  # (S, H, Lmax, hd)
        return y.transpose(0, 1).reshape(H, S * width, hd).index_select(1, scatter).unsqueeze(0)
    qs, ks, vs = (t.split(packing.lengths, dim=2) for t in (q, k, v))
    out = []
    for s, parent in enumerate(packing.parents):
        if parent < 0:
            out.append(causal_attention(qs[s], ks[s], vs[s], dropout))
            continue
        past, n = packing.lengths[parent], packing.lengths[s]
        # The answer's queries see the whole prefix and, causally, themselves: the KV-cache continuation's mask,
        # rows past … past+n of one causal square.
        mask = _causal(past + n, q.device)[past:, : past + n]
        out.append(F.scaled_dot_product_attention(qs[s], torch.cat([ks[parent], ks[s]], 2),
                                                  torch.cat([vs[parent], vs[s]], 2), attn_mask=mask, dropout_p=dropout))
    return torch.cat(out, dim=2)


__all__ = ["Packing", "segment_attention"]
