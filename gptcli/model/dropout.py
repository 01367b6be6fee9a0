"""Dropout: ``F.dropout``, and its broadcast form (one mask shared along some dimensions, TF's ``noise_shape``).

On CPU, ``F.dropout`` draws each Bernoulli from a double-precision uniform, one at a time; the masks of
``kernels/dropout.py`` come from random bytes, with the same law, and are drawn when the kernels are on
(``gptcli.model.kernels``). The two draw different masks for the same seed.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.model import kernels


def dropout(
    x: torch.Tensor, p: float, training: bool = True, noise_shape: torch.Size | tuple[int, ...] | None = None
) -> torch.Tensor:
    """``F.dropout(x, p, training)``. ``noise_shape``: one mask of that shape (1 along the shared dimensions),
    broadcast over ``x``, as the released code's multiple-choice head shares a mask between an example's answers."""
    if kernels.enabled(x.device):
        from gptcli.model.kernels.dropout import dropout as byte_drawn

        return byte_drawn(x, p, training, noise_shape)
    if noise_shape is None or not training or p == 0.0:
        return F.dropout(x, p, training)
    return x * F.dropout(torch.ones(noise_shape, device=x.device, dtype=x.dtype), p, True)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same parameters, state and ``repr``) that draws its masks by :func:`dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
