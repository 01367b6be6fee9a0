"""Packed evaluation's forward pass: the final hidden states of a few positions of a packed row.

An evaluation reads only some positions' final states (a task head its extract tokens, scoring the tokens that
predict a continuation). Every earlier block's states feed the later keys and values, so the last block is the one
with work to skip: :func:`final_states_at` runs the blocks of ``GPT.forward`` itself and computes the last block's
output projection and everything after it at those positions alone. The states it returns are the full forward
pass's at ``rows``, so the model keeps a single forward path.
"""

from __future__ import annotations

from typing import cast

import torch

from gptcli.model.gpt import GPT, Block
from gptcli.model.packed import Packing


def final_states_at(gpt: GPT, ids: torch.Tensor, packing: Packing, rows: torch.Tensor) -> torch.Tensor:
    """The last block's hidden states (1, R, d) at positions ``rows`` (R,) of the packed row ``ids`` (1, N):
    ``gpt(ids, packing=packing)[:, rows]``, with the last block's row-wise layers run on ``rows`` only."""
    if ids.size(0) != 1:
        raise ValueError(f"rows: states are selected from one row (a packed batch), got {ids.size(0)} rows")
    h, attend = gpt.inputs(ids, packing=packing)
    *body, last = cast(list[Block], list(gpt.blocks))
    for i, block in enumerate(body):
        h = block(h, attend, i)
    y = last.attn.heads(h, attend, len(body)).index_select(1, rows)
    return last.after_attention(h.index_select(1, rows), last.attn.project(y))


__all__ = ["final_states_at"]
