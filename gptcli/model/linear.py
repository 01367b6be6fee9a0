"""The Transformer's linear layers: ``nn.Linear``, whose bf16 training product on an AMX CPU takes the kernels'
faster weight gradient.

Reference: ``nn.Linear.forward`` (``F.linear``), what runs everywhere else and under ``--kernels reference``. Under
bf16 autocast on a CPU with AMX, a training product takes ``kernels/linear.py``'s form instead: autocast's forward,
and a weight gradient computed from a dense transposed copy of the narrower operand rather than a transposed view
(the same function, within bf16 rounding; docs/performance.md has the measured gain). A float32 training product
keeps autograd's products and takes its bias gradient from the kernels' column sums (within float32 rounding); on
an AMD Zen 5, its products and a float32 product without gradients run on oneDNN (``kernels/onednn.py``). The
parameters, their names and their initialisation are ``nn.Linear``'s, so checkpoints and conversions see no
difference.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gptcli.model import kernels


class Linear(nn.Linear):
    """``nn.Linear``; with the kernels on, an AMX CPU's bf16 training product, and a float32 training product's bias
    gradient, by ``kernels/linear.py``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if kernels.enabled(x.device):
            from gptcli.model.kernels.linear import amx_linear, fp32_inference_linear, fp32_linear

            y = amx_linear(x, self.weight, self.bias) if kernels.amx() else None
            if y is None:
                y = fp32_linear(x, self.weight, self.bias)
            if y is None:
                y = fp32_inference_linear(x, self.weight, self.bias)
            if y is not None:
                return y
        return super().forward(x)
