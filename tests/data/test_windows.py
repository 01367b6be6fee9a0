"""The pretraining window sampler: without replacement per epoch, exact resume, disjoint ranks."""

from __future__ import annotations

import numpy as np
import pytest

from gptcli.data.windows import WindowSampler
from gptcli.errors import GPT1Error

L = 8


def _arrays():
    # Three "shards" of distinct token ranges so a window's content identifies where it came from.
    return [
        np.arange(0, 100, dtype=np.uint16),
        np.arange(1000, 1037, dtype=np.uint16),
        np.arange(2000, 2091, dtype=np.uint16),
    ]


def _epoch_windows(s: WindowSampler) -> list[tuple[int, int]]:
    out = []
    for _ in range(s.steps_per_epoch):
        idx, offset = s.next_indices()
        out += s.window_starts(idx, offset)
    return out


def test_windows_are_contiguous_slices():
    arrays = _arrays()
    s = WindowSampler(arrays, L, batch_size=4, seed=3)
    batch = s.next_batch().numpy()
    assert batch.shape == (4, L + 1)
    for row in batch:
        assert np.all(np.diff(row) == 1)  # contiguous tokens of one shard
        base = row[0] // 1000 * 1000
        assert row[-1] < base + {0: 100, 1000: 37, 2000: 91}[base]


def test_epoch_without_replacement_and_fixed_length():
    arrays = _arrays()
    s = WindowSampler(arrays, L, batch_size=3, seed=1)
    assert s.num_windows == (100 // L - 1) + (37 // L - 1) + (91 // L - 1) == 24
    assert s.steps_per_epoch == 8
    first = _epoch_windows(s)
    assert len(first) == len(set(first)) == 24  # every window exactly once
    second = _epoch_windows(s)
    assert s.epoch == 1 and len(set(second)) == 24
    assert first != second  # another order (and grid offset) in the next epoch
    # Windows of one epoch share a grid offset and never overlap except the shared boundary token.
    for shard in range(3):
        starts = sorted(st for sh, st in first if sh == shard)
        assert all(b - a == L for a, b in zip(starts, starts[1:]))


def test_resume_position_is_exact():
    arrays = _arrays()
    a = WindowSampler(arrays, L, batch_size=4, seed=7)
    for _ in range(9):  # crosses an epoch boundary (6 steps per epoch)
        a.next_batch()
    state = a.state_dict()
    assert state == {"seed": 7, "epoch": 1, "position": 12}
    b = WindowSampler(arrays, L, batch_size=4, seed=7)
    b.load_state_dict(dict(state))
    for _ in range(8):
        assert np.array_equal(a.next_batch().numpy(), b.next_batch().numpy())
    with pytest.raises(GPT1Error, match="seed"):
        WindowSampler(arrays, L, batch_size=4, seed=8).load_state_dict(state)


def test_ranks_draw_disjoint_windows_that_cover_the_epoch():
    arrays = _arrays()
    single = WindowSampler(arrays, L, batch_size=4, seed=5)
    ranks = [WindowSampler(arrays, L, batch_size=4, seed=5, rank=r, world_size=2) for r in range(2)]
    for _ in range(single.steps_per_epoch):
        whole = single.next_batch().numpy()
        parts = [r.next_batch().numpy() for r in ranks]
        assert parts[0].shape == (2, L + 1)
        assert np.array_equal(np.concatenate(parts), whole)  # rank slices of the same global batch
    r0 = set(map(tuple, _epoch_windows(WindowSampler(arrays, L, 4, 5, 0, 2))))
    r1 = set(map(tuple, _epoch_windows(WindowSampler(arrays, L, 4, 5, 1, 2))))
    assert not (r0 & r1) and len(r0 | r1) == 24
    # The state is global: a 2-rank position resumes a 1-process sampler at the same place.
    ranks[0].load_state_dict({"seed": 5, "epoch": 0, "position": 8})
    single.load_state_dict(ranks[0].state_dict())
    assert np.array_equal(ranks[0].next_batch().numpy(), single.next_batch().numpy()[:2])


def test_too_small_corpus_is_a_user_error():
    with pytest.raises(GPT1Error, match="fewer than one batch"):
        WindowSampler([np.arange(20)], 8, batch_size=4)
    with pytest.raises(GPT1Error, match="divisible"):
        WindowSampler(_arrays(), 8, batch_size=3, world_size=2)
