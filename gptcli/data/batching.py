"""Encoded examples → padded tensors, with dynamic padding; random or length-bucketed training batches.

Padding is dynamic: a batch is padded to its own longest sequence, never to the model's 512, and sits on the right,
where it is causally invisible (no real token attends to a later position; pads are masked out of the loss).
Training batches are either i.i.d. shuffled minibatches (``"random"``, the paper's and the released code's) or drawn
from length buckets (``"length"``, the fast option: less padding, but a batch holds examples of similar length, which
on some tasks correlates with the label). Bucketing keeps the randomness an epoch needs: the shuffled examples are
cut into pools of ``pool`` batches, each pool sorted by length and cut, and the batch order shuffled again.
Evaluation sorts all examples by length; the caller restores their order through ``Batch.index``.

Quick runs see a seeded subset of a split (:func:`subsample`): the same subset for the same seed, in the split's
own order, so a run's dev score and a later ``gpt1 eval --max-examples`` with the same seed score the same examples.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from gptcli.data.transforms import Encoded
from gptcli.model.losses import lm_positions
from gptcli.model.packed import Packing, to_device

PAD_ID = 0
"""Any valid id works (padding is masked and causally after every real token); 0 is ``<unk>`` in the original vocab."""


@dataclass
class Batch:
    """``B`` examples of ``S`` sequences each, flattened to ``B·S`` rows of length ``T``."""

    ids: torch.Tensor
    """(B·S, T) token ids, right-padded with ``PAD_ID``."""
    mask: torch.Tensor
    """(B·S, T) float, 1 on real tokens (the released code's ``M``)."""
    labels: torch.Tensor | None
    """(B,) long class/choice index or float target; None when the examples are unlabeled."""
    index: torch.Tensor
    """(B,) position of each example in the encoded list (restores order after length sorting)."""
    n_seqs: int
    """S: sequences per example (1, 2 for both orders, or the number of answers)."""
    packing: Packing | None = None
    """Set for a packed batch (:func:`collate_packed`): ``ids`` and ``mask`` are then one row (1, N) of the
    sequences end to end, and this says where each one starts and ends."""
    lm_positions: torch.Tensor | None = None
    """A padded batch's positions that predict a next token (every real token but the last of its row), as flat
    indices into ``ids``, counted on the host by :func:`collate` (``losses.lm_positions``); None: found from
    ``mask``."""

    def to(self, device: torch.device | str) -> Batch:
        labels = None if self.labels is None else to_device(self.labels, device)
        positions = None if self.lm_positions is None else to_device(self.lm_positions, device)
        return Batch(
            to_device(self.ids, device),
            to_device(self.mask, device),
            labels,
            self.index,
            self.n_seqs,
            None if self.packing is None else self.packing.to(device),
            positions,
        )

    @property
    def size(self) -> int:
        return self.index.numel()

    @property
    def tokens(self) -> int:
        """Real (non-pad) tokens in the batch (read from the mask: count on the host copy, a device copy waits)."""
        return int(self.mask.sum().item())


def _rows(items: Sequence[Encoded]) -> tuple[int, list[list[int]]]:
    """(sequences per example, every example's sequences in order); the examples must agree on the first."""
    n_seqs = len(items[0].seqs)
    if any(len(it.seqs) != n_seqs for it in items):
        raise ValueError("examples in one batch must have the same number of sequences")
    return n_seqs, [s for it in items for s in it.seqs]


def _labels_and_index(items: Sequence[Encoded], regression: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The examples' labels (None unless every one has a label) and their positions in the encoded list."""
    labels = None
    if all(it.label is not None for it in items):
        labels = torch.tensor([it.label for it in items], dtype=torch.float32 if regression else torch.long)
    return labels, torch.tensor([it.index for it in items], dtype=torch.long)


def collate(items: Sequence[Encoded], regression: bool = False) -> Batch:
    """Pad a list of encoded examples (all with the same number of sequences) to their longest sequence."""
    n_seqs, rows = _rows(items)
    T = max(len(s) for s in rows)
    ids = torch.full((len(rows), T), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.float32)
    for r, s in enumerate(rows):
        ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[r, : len(s)] = 1.0
    # The LM loss's positions, counted here on the host: on a GPU, counting them would make the host wait every update.
    return Batch(ids, mask, *_labels_and_index(items, regression), n_seqs, lm_positions=lm_positions(mask))


def collate_packed(items: Sequence[Encoded], extract_id: int, regression: bool = False) -> Batch:
    """The examples' sequences end to end in one row, with no padding (``gptcli.model.packed``): the same
    sequences, labels and order as :func:`collate`, laid out so that no layer computes on a pad."""
    n_seqs, rows = _rows(items)
    ids = torch.tensor([t for s in rows for t in s], dtype=torch.long).unsqueeze(0)
    return Batch(
        ids,
        torch.ones_like(ids, dtype=torch.float32),
        *_labels_and_index(items, regression),
        n_seqs,
        Packing.of(rows, extract_id),
    )


def collate_shared(items: Sequence[Encoded], extract_id: int, regression: bool = False) -> Batch:
    """For evaluation: :func:`collate_packed` with each example's common prefix packed once (``Packing.shared``) —
    a multiple-choice example's context ahead of every answer, which causal attention reads the same for each.
    Examples of one sequence share nothing: they are plainly packed."""
    if len(items[0].seqs) == 1:
        return collate_packed(items, extract_id, regression)
    prefixes, answers = [], []
    for it in items:
        cut = _common_prefix(it.seqs)
        prefixes.append(it.seqs[0][:cut])
        answers.append([s[cut:] for s in it.seqs])
    ids, packing = Packing.shared(prefixes, answers, extract_id)
    row = torch.tensor(ids, dtype=torch.long).unsqueeze(0)
    return Batch(
        row,
        torch.ones_like(row, dtype=torch.float32),
        *_labels_and_index(items, regression),
        len(items[0].seqs),
        packing,
    )


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix all ``seqs`` share, leaving each at least one token of its own."""
    limit = min(len(s) for s in seqs) - 1
    n = 0
    while n < limit and all(s[n] == seqs[0][n] for s in seqs):
        n += 1
    return n


def check_batch_size(batch_size: int) -> None:
    """Refuse a batch size below 1, which no batching can cut examples into (a programming error: settings from
    a user are refused earlier, by ``gptcli.config.check_settings``)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")


def bucketed_batches(
    lengths: Sequence[int], batch_size: int, *, shuffle: bool, rng: random.Random | None = None, pool: int = 50
) -> list[list[int]]:
    """Index lists of batches grouped by length.

    ``shuffle=True`` (training): shuffle, sort within pools of ``pool·batch_size`` examples, shuffle the
    batches. ``shuffle=False`` (evaluation): one global sort, longest first so memory peaks at the start.
    Every example appears in exactly one batch; the last batch of a pool may be smaller.
    """
    check_batch_size(batch_size)
    order = list(range(len(lengths)))
    if not shuffle:
        order.sort(key=lambda i: -lengths[i])
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng = rng or random.Random(0)
    rng.shuffle(order)
    batches: list[list[int]] = []
    span = max(1, pool) * batch_size
    for p in range(0, len(order), span):
        chunk = sorted(order[p : p + span], key=lambda i: lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


BATCHINGS = ("random", "length")
"""Training batch orders: i.i.d. shuffled (the paper's and the released code's) or length-bucketed (fast)."""


def random_batches(n: int, batch_size: int, rng: random.Random) -> list[list[int]]:
    """Index lists of i.i.d. shuffled minibatches: one permutation of the ``n`` examples cut into consecutive
    batches of ``batch_size`` (the last one smaller when ``batch_size`` does not divide ``n``; the released code
    dropped that remainder instead)."""
    check_batch_size(batch_size)
    order = list(range(n))
    rng.shuffle(order)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def train_batches(lengths: Sequence[int], batch_size: int, batching: str, rng: random.Random) -> list[list[int]]:
    """One epoch's training batches (index lists) in the order ``batching`` ("random" or "length") draws them."""
    if batching == "random":
        return random_batches(len(lengths), batch_size, rng)
    if batching == "length":
        return bucketed_batches(lengths, batch_size, shuffle=True, rng=rng)
    raise ValueError(f"unknown batching {batching!r} (one of {', '.join(BATCHINGS)})")


def shared_tokens(e: Encoded) -> int:
    """Tokens of ``e`` in a :func:`collate_shared` row: its sequences' common prefix once, then each one's rest."""
    if len(e.seqs) == 1:
        return len(e.seqs[0])
    return sum(len(s) for s in e.seqs) - (len(e.seqs) - 1) * _common_prefix(e.seqs)


FILL_TOKENS = 2048
"""Tokens a filled evaluation batch grows to at most (:func:`filled_batches`): longer rows were no faster on
Story Cloze and slower on RACE-shaped batches, whose attention grid then leaves the caches (docs/performance.md)."""


def filled_batches(encoded: Sequence[Encoded], batch_size: int) -> list[list[int]]:
    """Evaluation batches for :func:`collate_shared`: longest first, as :func:`bucketed_batches` sorts them, each
    ``batch_size`` examples and then as many more as fit in the positions the padded batch of ``batch_size``
    examples starting there would hold (``batch_size`` × its sequences × the longest) and in :data:`FILL_TOKENS`.
    ``batch_size`` keeps bounding the activations' memory, and the positions padding and repeated contexts took
    hold real work: the linear layers multiply more rows per call, which is faster per row."""
    check_batch_size(batch_size)  # a budget of 0 would add empty batches for ever
    order = sorted(range(len(encoded)), key=lambda i: -encoded[i].length)
    batches: list[list[int]] = []
    at = 0
    while at < len(order):
        first = encoded[order[at]]
        budget, used = min(batch_size * len(first.seqs) * first.length, FILL_TOKENS), 0
        batch: list[int] = []
        while at < len(order) and (len(batch) < batch_size or used + shared_tokens(encoded[order[at]]) <= budget):
            used += shared_tokens(encoded[order[at]])
            batch.append(order[at])
            at += 1
        batches.append(batch)
    return batches


def iterate(
    encoded: Sequence[Encoded],
    batch_size: int,
    *,
    shuffle: bool,
    rng: random.Random | None = None,
    regression: bool = False,
    shared_extract: int | None = None,
    fill: bool = True,
) -> Iterator[Batch]:
    """Batches over ``encoded`` (see :func:`bucketed_batches`): padded, or for evaluation packed with shared
    prefixes (:func:`collate_shared`, reading the extract token ``shared_extract``) when that is given — then
    filled to the padded batch's positions (:func:`filled_batches`) unless ``fill`` is False."""
    if shared_extract is not None and not shuffle and fill:
        order = filled_batches(encoded, batch_size)
    else:
        order = bucketed_batches([e.length for e in encoded], batch_size, shuffle=shuffle, rng=rng)
    for idx in order:
        items = [encoded[i] for i in idx]
        yield (
            collate(items, regression) if shared_extract is None else collate_shared(items, shared_extract, regression)
        )


def num_batches(n: int, batch_size: int, pool: int = 50, batching: str = "length") -> int:
    """How many training batches ``batching`` makes from ``n`` examples per epoch (:func:`random_batches`, or
    :func:`bucketed_batches` when shuffling, whose pools may each end in a smaller batch)."""
    if batching == "random":
        return -(-n // batch_size)
    span = max(1, pool) * batch_size
    full, rest = divmod(n, span)
    return full * pool + -(-rest // batch_size)
