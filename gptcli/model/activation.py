"""GPT-1's activation: GELU in its tanh form, as the released code computes it (the exact erf-GELU misses parity
with it by ~1e-3).

Reference: ``F.gelu(x, approximate="tanh")``. On CPU with the kernels on (``gptcli.model.kernels``) the compiled
kernel of ``kernels/gelu.py`` computes it: the same function to float rounding, about 3× faster; where that
kernel cannot run (another dtype, or no C++ compiler to build it) the reference does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gptcli.model import kernels


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh form: ``x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))``."""
    if kernels.enabled(x.device):
        from gptcli.model.kernels.gelu import gelu as compiled

        y = compiled(x)
        if y is not None:
            return y
    return F.gelu(x, approximate="tanh")
