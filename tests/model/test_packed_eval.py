"""Packed evaluation's forward pass: the last block at a few rows gives the full pass's states there."""

from __future__ import annotations

import pytest
import torch

from gptcli.model.gpt import GPT, ModelConfig
from gptcli.model.packed import Packing
from gptcli.model.packed_eval import final_states_at

SMALL = ModelConfig(vocab_size=300, n_ctx=32, n_embd=48, n_layer=3, n_head=4, n_inner=192)


def _row(extract_id: int = 7) -> tuple[torch.Tensor, Packing]:
    seqs = [[5, 9, 11, extract_id], [3, 4, extract_id], [8, 1, 2, 6, extract_id]]
    return torch.tensor([[t for s in seqs for t in s]]), Packing.of(seqs, extract_id=extract_id)


def test_final_states_at_rows_are_the_full_pass_states_there():
    torch.manual_seed(0)
    gpt = GPT(SMALL).eval()
    ids, packing = _row()
    rows = torch.tensor([0, 3, 5, 11])
    with torch.no_grad():
        full = gpt(ids, packing=packing)
        some = final_states_at(gpt, ids, packing, rows)
    assert some.shape == (1, 4, SMALL.n_embd)
    torch.testing.assert_close(some[0], full[0].index_select(0, rows), rtol=1e-5, atol=1e-5)


def test_final_states_at_reads_one_row_only():
    gpt = GPT(SMALL).eval()
    ids, packing = _row()
    with pytest.raises(ValueError, match="one row"):
        final_states_at(gpt, ids.expand(2, -1), packing, torch.tensor([0]))
