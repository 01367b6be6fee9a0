"""Dropout: ``F.dropout``, and its broadcast form (one mask shared along some dimensions, TF's ``noise_shape``).

The model's dropout layers are :class:`Dropout` modules, so ``gptcli.model.kernels.apply`` can give them the CPU
kernels' masks drawn from random bytes (the same law; other units dropped for a given seed).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def dropout(
    x: torch.Tensor, p: float, training: bool = True, noise_shape: torch.Size | tuple[int, ...] | None = None
) -> torch.Tensor:
    """``F.dropout(x, p, training)``. ``noise_shape``: one mask of that shape (1 along the shared dimensions),
    broadcast over ``x``, as the released code's multiple-choice head shares a mask between an example's answers."""
    if noise_shape is None or not training or p == 0.0:
        return F.dropout(x, p, training)
    return x * F.dropout(torch.ones(noise_shape, device=x.device, dtype=x.dtype), p, True)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same parameters, state and ``repr``) whose forward also takes :func:`dropout`'s
    ``noise_shape``."""

    def forward(self, x: torch.Tensor, noise_shape: torch.Size | tuple[int, ...] | None = None) -> torch.Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training, noise_shape)


__all__ = ["Dropout", "dropout"]
