"""Dropout with the same law as ``torch.nn.functional.dropout``, drawn faster on CPU.

GPT-1 drops out four places per block pass (the embedding, the attention probabilities, both residual branches) at
p = 0.1, and the attention probabilities alone are B·H·T²/2 values per layer. On CPU, ``F.dropout`` draws each
Bernoulli from a double-precision uniform, one at a time on one core (PyTorch's fast MKL path is taken only on
Intel CPUs): it was 13% of a bf16 GPT-1 training step on a 2-core AMD Zen 4, more than every op but the matmuls.

Here the mask comes from 32-bit random integers instead, two per 64-bit draw of the same generator, compared
against a threshold: unit ``i`` is kept when ``bits[i] ≥ -2³¹ + round(p·2³²)``, i.e. with probability
``1 − p`` to within 2⁻³³ (CUDA's own dropout compares a 24-bit uniform float), and kept values are scaled by
``1/(1 − p)`` as ``F.dropout`` does. So the model, the expected activations and the regularisation are the
paper's; only which units a given seed drops differs from ``F.dropout``'s choice. The mask is a ``bool`` tensor
(one byte per unit, where ``F.dropout`` keeps a mask in the activation's dtype for the backward pass).

PyTorch's CPU generator is one stream drawn by one thread, so on a many-core CPU the masks would cost more than the
matmuls. Masks of more than ``BLOCK`` draws are cut into blocks of ``BLOCK``, each from its own generator seeded by
a draw of the default one, and the blocks are filled by ``torch.get_num_threads()`` threads. The blocks and seeds
depend only on the mask's size and the default generator's state, never on the thread count, so
``torch.manual_seed`` reproduces a run on any machine.

Other devices keep ``F.dropout``: CUDA's is a fused kernel, and attention dropout there happens inside SDPA.
Measured by benchmarks/train_throughput.py (docs/performance.md).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn
import torch.nn.functional as F


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """A ``bool`` tensor of ``shape``, each entry independently True with probability ``1 − p`` (module docstring).

    Draws from the default generator of ``device``, so ``torch.manual_seed`` makes it reproducible."""
    n = 1
    for s in shape:
        n *= s
    # Viewed as int32, each 64-bit draw gives two independent uniform 32-bit integers.
    bits = random_words((n + 1) // 2, torch.device(device))
    threshold = -(2**31) + round(p * 2**32)
    return (bits.view(torch.int32)[:n] >= threshold).view(shape)


BLOCK = 1 << 16
"""64-bit draws per independently seeded block (512 KiB): 1.6–1.9× the single stream's speed on 2 cores for a
GPT-1 attention mask (benchmarks measured in docs/performance.md); smaller blocks cost more in per-block overhead."""

_POOL: dict[tuple[int, int], ThreadPoolExecutor] = {}


def random_words(n: int, device: torch.device) -> torch.Tensor:
    """``n`` uniform 64-bit integers (the full range: ``random_()`` without bounds leaves the sign bit 0)."""
    out = torch.empty(n, dtype=torch.int64, device=device)
    if n <= BLOCK or device.type != "cpu" or torch.compiler.is_compiling():
        return out.random_(-(2**63), None)
    starts = range(0, n, BLOCK)
    seeds = torch.randint(0, 2**62, (len(starts),)).tolist()

    def fill(i: int) -> None:
        gen = torch.Generator().manual_seed(seeds[i])
        out[starts[i] : starts[i] + BLOCK].random_(-(2**63), None, generator=gen)

    workers = min(torch.get_num_threads(), len(starts))
    if workers < 2:
        for i in range(len(starts)):
            fill(i)
    else:
        list(_pool(workers).map(fill, range(len(starts))))
    return out


def _pool(workers: int) -> ThreadPoolExecutor:
    # Keyed by process id too: a forked child inherits the executor but not its threads.
    key = (os.getpid(), workers)
    if key not in _POOL:
        _POOL[key] = ThreadPoolExecutor(workers, thread_name_prefix="gpt1-dropout")
    return _POOL[key]


def dropout(x: torch.Tensor, p: float, training: bool = True, *, scale: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)``, drawn by :func:`keep_mask` on CPU.

    ``scale=False`` leaves the kept values unscaled, for a caller that applies ``1/(1 − p)`` later on a smaller
    tensor (attention scales its output rather than its T×T probabilities)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or p < 0.0:
        out = F.dropout(x, p, True)  # also raises F.dropout's error for p outside [0, 1]
        return out if scale else out * (1.0 - p)
    # A bool factor: autograd saves only the mask for the backward pass (grad · mask).
    kept = x * keep_mask(x.shape, p, x.device)
    return kept * (1.0 / (1.0 - p)) if scale else kept


class Dropout(nn.Dropout):
    """``nn.Dropout`` drawing its masks by :func:`dropout` (same parameters, state and ``repr``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
