"""Dropout with the same law as ``torch.nn.functional.dropout`` (the reference, gptcli/model/dropout.py), drawn
faster on CPU.

Why: on CPU ``F.dropout`` draws each Bernoulli from a double-precision uniform, one at a time on one core, and GPT-1
drops out four places per block pass, the attention probabilities alone B·H·T²/2 values per layer: a large share of
a bf16 training step (docs/performance.md, "Kernels"). Here unit ``i`` is kept when its 32-bit uniform
``U = byte·2²⁴ + low`` is ``≥ round(p·2³²)``, the byte from eight per 64-bit draw of the same generator; only units
whose byte ties the threshold's top byte (one in 256) draw their 24 low bits. A unit is dropped with probability
``p`` to within 2⁻³³, kept values are scaled by ``1/(1 − p)``: the paper's model; only which units a seed drops
differs from ``F.dropout``'s. The draws stay on PyTorch's one CPU stream (per-thread generators gained nothing).

Where the compiled kernels can be built (``native.py``), a float32 or bf16 mask is never a tensor: :class:`Mask`
takes one 64-bit seed and ``dropout.cpp`` decides each unit by a hash of (seed, index) with the same threshold, in
one vectorised pass, and the backward recomputes it. :func:`keep_mask` remains the mask elsewhere, and the
broadcast mask of ``noise_shape``.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from gptcli.model.kernels import native


def keep_mask(
    shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bool
) -> torch.Tensor:
    """A tensor of ``shape``, each entry independently 1 (True) with probability ``1 − p`` and 0 otherwise (module
    docstring), in ``dtype``: a float mask multiplies an activation of its dtype in one vectorised pass, where a
    ``bool`` one is converted element by element on every use (several times slower in bf16).

    Draws from the default generator of ``device``, so ``torch.manual_seed`` makes it reproducible."""
    n = 1
    for s in shape:
        n *= s
    words = (n + 7) // 8
    # random_(-2**63, None) draws the full 64-bit range (plain random_() leaves the sign bit 0): eight uniform bytes.
    byte = torch.empty(words, dtype=torch.int64, device=device).random_(-(2**63), None).view(torch.uint8)
    top, low = divmod(threshold(p), 2**24)
    mask = torch.gt(byte, top, out=torch.empty(8 * words, dtype=dtype, device=device))
    # Units whose byte equals the threshold's top byte: their next 24 bits decide. They are found word by word (a
    # uint8 comparison read as int64 words, about one word in 32 holding a tie), faster than ``nonzero`` over
    # every unit, and those 1-in-256 units alone draw their bits.
    tie = torch.eq(byte, top, out=torch.empty(8 * words, dtype=torch.uint8, device=device))
    hit = tie.view(torch.int64).nonzero().squeeze(1)
    if hit.numel():
        at = tie.view(words, 8)[hit].nonzero()
        unit = hit[at[:, 0]] * 8 + at[:, 1]
        mask[unit] = (torch.empty(unit.numel(), dtype=torch.int32, device=device).random_(0, 2**24) >= low).to(dtype)
    return mask[:n].view(shape)


@torch.compiler.disable  # under torch.compile (--compile), run eagerly between graphs: a pybind call is opaque to it
def dropout(
    x: torch.Tensor, p: float, training: bool = True, noise_shape: torch.Size | tuple[int, ...] | None = None
) -> torch.Tensor:
    """``F.dropout(x, p, training)`` with the mask drawn by ``dropout.cpp`` from a seed where the compiled library
    is built (:class:`Mask`), else by :func:`keep_mask`; ``noise_shape``: one :func:`keep_mask` of that shape
    broadcast over ``x`` (the reference's ``noise_shape``, gptcli/model/dropout.py)."""
    if not training or p == 0.0:
        return x
    if p >= 1.0 or p < 0.0:
        return F.dropout(x, p, True)  # also raises F.dropout's error for p outside [0, 1]
    if noise_shape is not None:
        return x * keep_mask(noise_shape, p, x.device, x.dtype) / (1 - p)
    if native.library_for(x.device, x.dtype) is not None:
        return _SeededDropout.apply(x, p)
    return (x * keep_mask(x.shape, p, x.device, x.dtype)).mul_(1.0 / (1.0 - p))


def threshold(p: float) -> int:
    """The 32-bit threshold under which a unit is dropped: ``round(p·2³²)`` (module docstring)."""
    return round(p * 2**32)


def draw_seed(device: torch.device | str) -> int:
    """One 63-bit seed from the default generator of ``device`` (``torch.manual_seed`` makes it reproducible)."""
    return int(torch.empty((), dtype=torch.int64, device=device).random_().item())


class Mask:
    """A dropout mask of one shape, drawn once and applied to tensors of that shape: an activation in the forward
    pass, its gradient in the backward. By ``dropout.cpp`` from a seed where the compiled library can (nothing
    else is kept), else by :func:`keep_mask` as a tensor."""

    @torch.compiler.disable
    def __init__(
        self, shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str, dtype: torch.dtype
    ) -> None:
        self.shape, self.p, self.dtype = torch.Size(shape), p, dtype
        self._lib = native.library_for(device, dtype)
        self.seed = draw_seed(device) if self._lib is not None else None
        self.tensor = keep_mask(shape, p, device, dtype) if self._lib is None else None

    @torch.compiler.disable
    def apply(self, x: torch.Tensor, scale: float = 1.0, inplace: bool = False) -> torch.Tensor:
        """``x · mask · scale``, into ``x`` itself if ``inplace``."""
        if self._lib is None:
            mask = cast(torch.Tensor, self.tensor)  # drawn by __init__ wherever there is no library
            y = x.mul_(mask) if inplace else x * mask
            return y if scale == 1.0 else y.mul_(scale)
        x = x.contiguous()
        out = x if inplace else torch.empty_like(x, memory_format=torch.contiguous_format)
        return self._lib.dropout_apply(x, self.seed, threshold(self.p), scale, out)

    def dense(self) -> torch.Tensor:
        """The mask as a tensor of ones and zeros in its dtype (what :meth:`apply` multiplies by)."""
        if self._lib is None:
            return cast(torch.Tensor, self.tensor)
        out = torch.empty(self.shape, dtype=self.dtype)
        return self._lib.dropout_mask(out, self.seed, threshold(self.p))


class _SeededDropout(torch.autograd.Function):
    """Dropout by one :class:`Mask` drawn from a seed: the backward pass recomputes the mask instead of keeping it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        ctx.mask = Mask(x.shape, p, x.device, x.dtype)
        ctx.scale = 1.0 / (1.0 - p)
        return ctx.mask.apply(x, ctx.scale)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        return ctx.mask.apply(grad.to(ctx.mask.dtype), ctx.scale), None
