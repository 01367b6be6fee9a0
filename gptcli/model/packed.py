"""Several sequences packed end to end into one row, so that no layer computes on padding.

Packed, a fine-tuning batch is one row of its real tokens; each sequence keeps its own positions and attends
causally within itself only, so every real token's hidden state is the one the padded batch computes
(tests/model/test_packed.py). :class:`Packing` describes the row (built on the host by the batching code) and
:func:`segment_attention` attends over it with the layer's attention, the sequences gathered into one batched grid
(:class:`Grid`), or as jagged nested tensors on a device of :data:`JAGGED_DEVICES`.

:meth:`Packing.shared` packs a multiple-choice example's shared prefix once and each answer after it as a segment
that attends to the prefix and causally to itself (:class:`SharedGrid`): the answers' hidden states are the full
sequences', for a fraction of the work. Training can take it too (``gpt1 finetune --layout shared``, off by
default; the auxiliary LM loss is the full sequences', ``losses.lm_loss_per_sequence_packed``): a deviation from the
paper, as all the answers of an example then see the same dropout masks on the prefix. Why pack: padding would be
multiplied by every linear layer, the LM head and the loss (docs/performance.md, "Layout").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from gptcli.model.attention import SDPAttention

JAGGED_DEVICES: tuple[str, ...] = ()
"""Device types on which a packed row's standalone sequences attend by ``F.scaled_dot_product_attention`` over jagged
nested tensors (:func:`_jagged_attention`) rather than over the grid, unless the layer's attention runs the grid
itself (the CPU kernels'). Empty: measured slower than the grid on a GPU (docs/performance.md, the GPU table); put
``"cuda"`` here if a later PyTorch or GPU makes the jagged path the faster one (``benchmarks/gpu_check``'s
``packed_finetune``)."""


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
    lm_targets: torch.Tensor | None = None
    """Shared-prefix rows: (M,) row index of each ``lm_inputs`` token's next token (a prefix's last token is listed
    once per answer, each time with that answer's first token); None: the next row (``lm_inputs + 1``)."""
    sequences: torch.Tensor | None = None
    """Shared-prefix rows: (S, 2) the prefix segment and the answer segment each full sequence is made of, in the
    head's order; ``lm_rows`` then names the segment a target belongs to (its prefix's or its answer's) and
    ``lm_counts`` counts each full sequence's targets."""
    _grids: dict = field(default_factory=dict, repr=False, compare=False)
    """:meth:`grid` per device, made once per batch and shared by every layer."""

    @staticmethod
    def of(seqs: Sequence[Sequence[int]], extract_id: int | None = None) -> Packing:
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
    def shared(
        prefixes: Sequence[Sequence[int]], answers: Sequence[Sequence[Sequence[int]]], extract_id: int
    ) -> tuple[list[int], Packing]:
        """(row ids, packing) of examples whose sequences are ``prefix + answer`` for each of their answers: every
        prefix once, followed by its answers, each answer attending to its prefix. ``extract`` lists the answers'
        extract tokens, example by example, as the padded batch's rows; the LM targets are every full sequence's
        (each token after its first), a prefix's own targets listed once for all its answers."""
        ids: list[int] = []
        lengths: list[int] = []
        parents: list[int] = []
        positions: list[int] = []
        extract: list[int] = []
        sequences: list[tuple[int, int]] = []
        inputs: list[int] = []
        targets: list[int] = []
        owners: list[int] = []
        counts: list[int] = []
        for prefix, group in zip(prefixes, answers):
            parent, start = len(lengths), len(ids)
            lengths.append(len(prefix))
            parents.append(-1)
            positions.extend(range(len(prefix)))
            ids.extend(prefix)
            _targets_within(start, len(prefix), parent, inputs, targets, owners)
            for answer in group:
                row, seg = len(ids), len(lengths)
                lengths.append(len(answer))
                parents.append(parent)
                positions.extend(range(len(prefix), len(prefix) + len(answer)))
                extract.append(row + (list(answer).index(extract_id) if extract_id in answer else 0))
                ids.extend(answer)
                if prefix:  # the prefix's last token predicts this answer's first
                    inputs.append(start + len(prefix) - 1)
                    targets.append(row)
                    owners.append(seg)
                _targets_within(row, len(answer), seg, inputs, targets, owners)
                sequences.append((parent, seg))
                counts.append(max(1, len(prefix) + len(answer) - 1))
        long = torch.long
        return ids, Packing(
            lengths,
            torch.tensor(positions, dtype=long),
            torch.tensor(extract, dtype=long),
            torch.tensor(inputs, dtype=long),
            torch.tensor(owners, dtype=long),
            torch.tensor(counts, dtype=torch.float32),
            parents,
            torch.tensor(targets, dtype=long),
            torch.tensor(sequences, dtype=long).view(-1, 2),
        )

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def grid(self, device: torch.device) -> Grid:
        """The :class:`Grid` of this row's sequences on ``device``, made once per batch for every layer."""
        if device not in self._grids:
            self._grids[device] = Grid.of(self.lengths).to(device)
        return self._grids[device]

    def offsets(self, device: torch.device) -> torch.Tensor:
        """(S + 1,) where each sequence starts in the row, and the row's end, on ``device``: a jagged nested tensor's
        offsets (:func:`_jagged_attention`), made once per batch on the host and shared by every layer."""
        key = ("offsets", device)
        if key not in self._grids:
            self._grids[key] = to_device(torch.tensor([*_starts(self.lengths), self.tokens]), device)
        return self._grids[key]

    def shared_grid(self, device: torch.device) -> SharedGrid:
        """The :class:`SharedGrid` of a shared-prefix row on ``device``, made once per batch for every layer."""
        key = ("shared", device)
        if key not in self._grids:
            if self.parents is None:
                raise ValueError("shared_grid: this row has no shared prefixes")
            self._grids[key] = SharedGrid.of(self.lengths, self.parents).to(device)
        return self._grids[key]

    @property
    def span(self) -> int:
        """The longest sequence the row holds, its shared prefixes included (what the position table must cover)."""
        if self.parents is None:
            return max(self.lengths, default=0)
        return max((n + (self.lengths[p] if p >= 0 else 0) for n, p in zip(self.lengths, self.parents)), default=0)

    def to(self, device: torch.device | str) -> Packing:
        positions, extract, lm_inputs, lm_rows, lm_counts = (
            to_device(t, device) for t in (self.positions, self.extract, self.lm_inputs, self.lm_rows, self.lm_counts)
        )
        lm_targets, sequences = (None if t is None else to_device(t, device) for t in (self.lm_targets, self.sequences))
        return Packing(
            self.lengths, positions, extract, lm_inputs, lm_rows, lm_counts, self.parents, lm_targets, sequences
        )


def _targets_within(start: int, n: int, owner: int, inputs: list[int], targets: list[int], owners: list[int]) -> None:
    """Append the next-token pairs inside one segment of ``n`` tokens at row ``start`` (all but its last token)."""
    inputs.extend(range(start, start + n - 1))
    targets.extend(range(start + 1, start + n))
    owners.extend([owner] * max(0, n - 1))


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``; to a GPU from pinned memory and without waiting, so the host goes on preparing the next
    batch meanwhile (used for every tensor of a batch: gptcli.data.batching.Batch.to)."""
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _starts(lengths: Sequence[int]) -> list[int]:
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    return starts


def _layout(starts: Sequence[int], lengths: Sequence[int], groups: Sequence[Sequence[int]]) -> torch.Tensor:
    """(G, W) row index of every cell of a grid whose row g holds the segments ``groups[g]`` end to end, padded to
    the longest group with the group's first token (0 for an empty group): a pad cell's output is never read."""
    rows = [[starts[s] + j for s in group for j in range(lengths[s])] for group in groups]
    width = max(1, max((len(r) for r in rows), default=1))
    return torch.tensor([r + [r[0] if r else 0] * (width - len(r)) for r in rows], dtype=torch.long)


@dataclass
class Grid:
    """Where each sequence of a packed row sits in a (S, Lmax) grid, one sequence per grid row, and the way back.

    Attention runs over the grid in one batched call. A cell past its sequence's end repeats the sequence's first
    token; it sits after every real token of its row, so causal attention never lets a real query see it, and its
    own output is never read: its gradient is zero, which is why :class:`_ToGrid` may leave it out."""

    cells: torch.Tensor
    """(S, Lmax) row index of each cell's token."""
    back: torch.Tensor
    """(N,) each row token's cell in the flattened grid."""

    @staticmethod
    def of(lengths: Sequence[int]) -> Grid:
        cells = _layout(_starts(lengths), lengths, [[s] for s in range(len(lengths))])
        width = cells.size(1)
        back = [s * width + j for s, n in enumerate(lengths) for j in range(n)]
        return Grid(cells, torch.tensor(back, dtype=torch.long))

    def to(self, device: torch.device) -> Grid:
        return Grid(self.cells.to(device), self.back.to(device))


@dataclass
class SharedGrid:
    """A shared-prefix row (:meth:`Packing.shared`) laid out for attention in one batched call per layer.

    Each prefix and its answers (one example) form a row of a (G, W) grid: the prefix's tokens, then every answer's
    in turn, padded to the longest example. ``mask`` lets each query see the keys up to itself that belong to the
    prefix or to its own segment: a prefix token attends causally within the prefix, an answer's token to the
    whole prefix and causally to its own answer — what a KV-cache continuation computes, for all the answers of
    all the examples at once. A pad cell repeats its example's first token; no real query sees it and its output
    is never read, so its gradient is zero and a training row gathers into the grid as :class:`Grid` does."""

    cells: torch.Tensor
    """(G, W) row index of each cell's token."""
    mask: torch.Tensor
    """(G, 1, W, W) bool, True where a query may look (every query sees itself: no softmax row is empty)."""
    back: torch.Tensor
    """(N,) each row token's cell in the flattened grid."""
    _biases: dict = field(default_factory=dict, repr=False, compare=False)
    """:meth:`bias` per (heads, dtype), made once per batch and shared by every layer."""

    def bias(self, n_head: int, dtype: torch.dtype) -> torch.Tensor:
        """(G·H, W, W) ``mask`` as the additive bias the written-out attention adds to its scores (0 where a query
        may look, −inf elsewhere), one copy per head: a batched product's input cannot broadcast over heads."""
        key = (n_head, dtype)
        if key not in self._biases:
            G, _, W, _ = self.mask.shape
            bias = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
            bias.masked_fill_(~self.mask, float("-inf"))
            self._biases[key] = bias.expand(G, n_head, W, W).reshape(G * n_head, W, W)
        return self._biases[key]

    @staticmethod
    def of(lengths: Sequence[int], parents: Sequence[int]) -> SharedGrid:
        """The grid of a row of segments ``lengths`` whose answers name their prefix in ``parents`` (host)."""
        starts = _starts(lengths)
        roots = [s for s, p in enumerate(parents) if p < 0]
        answers: dict[int, list[int]] = {r: [] for r in roots}
        for s, p in enumerate(parents):
            if p >= 0:
                answers[p].append(s)
        cells = _layout(starts, lengths, [[r, *answers[r]] for r in roots])
        width = cells.size(1)
        owner = torch.full(cells.shape, -2, dtype=torch.long)  # each cell's segment (-1: the prefix; -2: a pad)
        back = torch.zeros(sum(lengths), dtype=torch.long)
        for g, r in enumerate(roots):
            at = 0
            for seg in (r, *answers[r]):
                n = lengths[seg]
                owner[g, at : at + n] = -1 if seg == r else seg
                back[starts[seg] : starts[seg] + n] = torch.arange(g * width + at, g * width + at + n)
                at += n
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        mask = causal & ((owner.unsqueeze(1) == -1) | (owner.unsqueeze(1) == owner.unsqueeze(2)))
        return SharedGrid(cells, mask.unsqueeze(1), back)

    def to(self, device: torch.device) -> SharedGrid:
        return SharedGrid(self.cells.to(device), self.mask.to(device), self.back.to(device))


def _shared_attention(qkv: torch.Tensor, n_head: int, s: SharedGrid, dropout: float) -> torch.Tensor:
    """:func:`segment_attention` of a shared-prefix row: (1, N, 3·C) → (1, N, C), by PyTorch's SDPA with the
    grid's mask (with ``dropout`` on the probabilities and autograd's backward when training).

    The grid gathers whole token rows of ``qkv`` (``index_select`` of contiguous rows: faster than gathering per head)
    and attention reads q, k and v as strided views of them, in one call to PyTorch's SDPA with the grid's mask.
    Measured against the alternatives (docs/performance.md, "Layout"): two calls (the prefixes causally, then the
    answers against them) and the written-out kernel of ``kernels/attention.py`` were both slower on these
    grids at evaluation, even for RACE's long passages (training, with a backward, takes the kernel:
    :func:`segment_attention`)."""
    x, C = qkv[0], qkv.size(2) // 3
    G, W = s.cells.shape
    g = x.index_select(0, s.cells.view(-1)).view(G, W, 3, n_head, C // n_head).permute(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(g[0], g[1], g[2], attn_mask=s.mask, dropout_p=dropout)  # (G, H, W, hd)
    return y.transpose(1, 2).reshape(G * W, C).index_select(0, s.back).unsqueeze(0)


def _shared_training_attention(
    x: torch.Tensor, n_head: int, s: SharedGrid, dropout: float, attention: SDPAttention
) -> torch.Tensor | None:
    """``attention``'s own masked form over a shared-prefix grid (the CPU kernels' written-out attention, with its
    hand-written backward and the grid's mask as an additive bias): (N, 3, H, hd) → (N, H, hd); None where it has
    no path for the dtype (SDPA then). With a backward to run it beat SDPA with a mask on these grids, most with
    dropout, where SDPA on CPU has no fused kernel (docs/performance.md, "Layout")."""
    y = attention.masked(_ToGrid.apply(x, s.cells, s.back), s.bias(n_head, x.dtype), dropout)
    return None if y is None else _FromGrid.apply(y, s.back)


class _ToGrid(torch.autograd.Function):
    """Rows ``x`` (N, 3, H, hd) (each token's q, k and v, a view of the fused projection) gathered at ``cells``
    (G, W): (3, G, H, W, hd), a permuted view of the (G, W, 3, H, hd) gather of whole token rows, which attention
    reads as it reads the fused projection (any strides; the kernels lay out their own operands). Gathering whole
    rows (``index_select``: contiguous 3·C-wide copies) instead of each head's hd values into a contiguous grid made
    a packed attention layer faster in bf16 and fp32 (docs/performance.md, "Kernels"). The backward is a row
    gather too: every real token sits in one cell, and the pad cells' gradient is zero (:class:`Grid`), so no
    accumulation is needed (autograd's own backward of the indexing scatters with accumulation, slower on CPU)."""

    @staticmethod
    def forward(ctx, x, cells, back):
        N, _, H, hd = x.shape
        G, W = cells.shape
        ctx.save_for_backward(back)
        rows = x.reshape(N, 3 * H * hd).index_select(0, cells.view(-1))
        return rows.view(G, W, 3, H, hd).permute(2, 0, 3, 1, 4)

    @staticmethod
    def backward(ctx, grad):
        (back,) = ctx.saved_tensors
        _, G, H, W, hd = grad.shape
        rows = grad.permute(1, 3, 0, 2, 4).reshape(G * W, 3 * H * hd)  # no copy in the kernels' layout
        return rows.index_select(0, back).view(-1, 3, H, hd), None, None


class _FromGrid(torch.autograd.Function):
    """A (G, H, W, hd) grid's real cells back in row order (N, H, hd), by whole token rows (the kernels write the
    grid (G, W, H, hd)-contiguous); the backward writes each token's gradient into its cell (each cell at most
    once) over zeros."""

    @staticmethod
    def forward(ctx, y, back):
        G, H, W, hd = y.shape
        ctx.save_for_backward(back)
        ctx.shape = y.shape
        return y.transpose(1, 2).reshape(G * W, H * hd).index_select(0, back).view(-1, H, hd)

    @staticmethod
    def backward(ctx, grad):
        (back,) = ctx.saved_tensors
        G, H, W, hd = ctx.shape
        out = grad.new_zeros(G * W, H * hd)
        out.index_copy_(0, back, grad.reshape(-1, H * hd))
        return out.view(G, W, H, hd).transpose(1, 2), None


def _jagged_attention(x: torch.Tensor, dropout: float, packing: Packing) -> torch.Tensor:
    """Causal attention of a packed row's standalone sequences, ``x`` (N, 3, H, hd) → (N, H, hd), by SDPA over jagged
    nested tensors (:data:`JAGGED_DEVICES`): q, k and v each a nested tensor of the row's sequences (S, H, j, hd)
    over the packing's offsets, autograd's own backward. The shortest and longest lengths are given from the host's
    ``lengths``, so that nothing reads them back from the device. Each of q, k and v is made contiguous first, the
    form the GPU probe of ``benchmarks/gpu_check`` ran."""
    offsets, lo, hi = packing.offsets(x.device), min(packing.lengths), max(packing.lengths)
    q, k, v = (
        torch.nested.nested_tensor_from_jagged(t.contiguous(), offsets, min_seqlen=lo, max_seqlen=hi).transpose(1, 2)
        for t in x.unbind(1)
    )
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True).transpose(1, 2).values()


def segment_attention(
    qkv: torch.Tensor, n_head: int, dropout: float, packing: Packing, attention: SDPAttention | None = None
) -> torch.Tensor:
    """Causal attention of a packed row from its fused projections ``qkv`` (1, N, 3·C): every sequence attends to
    itself only (and, in a shared-prefix row, to its prefix first); returns (1, N, C) in row order.

    Sequences that stand alone are gathered into a (S, H, Lmax, hd) grid and attended in one batched call (one call
    per sequence cost more in per-op overhead than the grid's padded attention: only the attention sees padding,
    a few percent of a layer's work, never the linear layers), or, on a device of :data:`JAGGED_DEVICES`, attended
    as jagged nested tensors with no grid. A shared-prefix row takes one batched call too,
    whatever its number of examples and answers (:class:`SharedGrid`): by SDPA at evaluation, and when training (a
    backward to run) by ``attention``'s masked form where it has one (the CPU kernels'). ``attention``: the layer's
    (default :class:`~gptcli.model.attention.SDPAttention`)."""
    attention = attention or SDPAttention()
    N, C = qkv.size(1), qkv.size(2) // 3
    x = qkv[0].view(N, 3, n_head, C // n_head)
    if packing.parents is None:
        if qkv.device.type in JAGGED_DEVICES and not attention.runs_grids(qkv.device):
            return _jagged_attention(x, dropout, packing).reshape(1, N, C)
        g = packing.grid(qkv.device)
        y = attention.stacked(_ToGrid.apply(x, g.cells, g.back), dropout)
        return _FromGrid.apply(y, g.back).view(1, N, C)
    s = packing.shared_grid(qkv.device)
    if qkv.requires_grad and attention.runs_grids(qkv.device):  # training: a backward to run
        trained = _shared_training_attention(x, n_head, s, dropout, attention)
        if trained is not None:
            return trained.view(1, N, C)
    return _shared_attention(qkv, n_head, s, dropout)


class PackedAttend:
    """How the layers attend over a packed row: each sequence causally within itself (:func:`segment_attention`), an
    attention strategy as :class:`~gptcli.model.attention.CausalAttend`."""

    def __init__(self, packing: Packing) -> None:
        self.packing = packing

    def __call__(
        self, qkv: torch.Tensor, n_head: int, dropout: float, attention: SDPAttention, layer: int
    ) -> torch.Tensor:
        return segment_attention(qkv, n_head, dropout, self.packing, attention)


__all__ = ["JAGGED_DEVICES", "Grid", "PackedAttend", "Packing", "SharedGrid", "segment_attention"]
