"""The language-model loss of gptcli/model/losses.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gptcli.model.losses import lm_loss_per_sequence


def test_per_sequence_loss_matches_the_direct_computation():
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 16)
    ids = torch.randint(0, 50, (3, 7))
    mask = torch.ones(3, 7)
    mask[1, 4:] = 0
    head = torch.randn(50, 16)
    got = lm_loss_per_sequence(hidden, ids, mask, lambda h: h @ head.T)
    for row in range(3):
        n = int(mask[row].sum())
        want = F.cross_entropy(hidden[row, : n - 1] @ head.T, ids[row, 1:n])
        torch.testing.assert_close(got[row], want)
