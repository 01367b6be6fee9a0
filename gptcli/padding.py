"""The tied output layer's weight padded to aligned rows, in plain PyTorch.

GPT-1's 40,478 vocabulary rows are not a multiple of the alignment matrix libraries want (a row of bf16 values is not
16-byte aligned); 40,512 rows are. The padded product is the same product with zero rows appended: the loss drops
the extra columns (``classes``), and they get no gradient. The model takes it on the devices named in
``gptcli.model.tied.PADDED_HEAD_DEVICES`` and in its blockwise loss (``model/chunked_nll.py``); the CPU kernels
(``model/kernels/tied.py``) decide for themselves when it pays. It lives on the ground floor because both use it:
the model must not import the kernels' room outside the ``--kernels`` switch, and the kernels import nothing of the
model (tests/test_architecture.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gptcli.system.runtime import product_dtype

PAD_ROWS_TO = 64
"""Vocabulary rows are padded to a multiple of this for the output product."""


def padded_rows(rows: int) -> int:
    """``rows`` rounded up to a multiple of :data:`PAD_ROWS_TO`."""
    return rows + (-rows % PAD_ROWS_TO)


def pad_rows(w: torch.Tensor) -> torch.Tensor:
    """``w`` with zero rows appended up to a multiple of :data:`PAD_ROWS_TO`."""
    return F.pad(w, (0, 0, 0, padded_rows(w.size(0)) - w.size(0)))


def padded_product(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``F.linear(h, pad_rows(w))``, under autocast with the weight cast to autocast's dtype before it is padded (the
    pad then copies the narrow embedding, not the fp32 one)."""
    return F.linear(h, pad_rows(w.to(product_dtype(w))))


__all__ = ["PAD_ROWS_TO", "pad_rows", "padded_product", "padded_rows"]
