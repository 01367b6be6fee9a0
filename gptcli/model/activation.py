"""GPT-1's activation: GELU in its tanh form, as the released code computes it (the exact erf-GELU misses parity
with it by ~1e-3).

The model's MLP holds it as an ``nn.GELU(approximate="tanh")`` module, the seam ``gptcli.model.kernels.apply``
replaces with the CPU kernels' compiled loops.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh form: ``x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))``."""
    return F.gelu(x, approximate="tanh")


def GELU() -> nn.GELU:
    """The model's activation layer: ``nn.GELU`` in its tanh form."""
    return nn.GELU(approximate="tanh")


__all__ = ["GELU", "gelu"]
