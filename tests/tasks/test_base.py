"""What every task shares (gptcli/tasks/base.py): the seeded subsets of a split."""

from __future__ import annotations

from gptcli.tasks.base import subsample


def test_subsample_is_seeded_and_keeps_the_order():
    items = list(range(100))
    a = subsample(items, 10, seed=3)
    assert len(a) == 10 and a == sorted(a) and a == subsample(items, 10, seed=3)
    assert a != subsample(items, 10, seed=4)
    assert (
        subsample(items, None, 0) is items and subsample(items, 100, 0) is items and subsample(items, 500, 0) is items
    )
    assert subsample(items, 0, 0) == []
