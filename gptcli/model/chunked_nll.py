"""The tied output layer and its training loss over blocks of rows, never the whole logits: a candidate for CUDA.

Why: the plain training loss writes the whole ``positions × 40,478`` logits, reads them for the softmax, writes
their gradient and reads it again for the two gradient products. Here the loss of each block of ``CHUNK_ROWS``
positions is taken right after its logits, and so are its gradients: the block's softmax minus the one-hot target
is the logits' gradient, which gives the block's input gradient (``g · W``) and its share of the weight gradient
(``gᵀ · h``, summed in fp32) at once. The backward pass only scales them by the loss's incoming gradient: the same
mathematics (``F.cross_entropy`` of ``F.linear``) without the vocabulary-wide tensors, the idea of Liger Kernel's
fused linear cross-entropy in plain PyTorch.

Only for a mean over the targets (``lm_nll``, pretraining's loss) with gradients wanted, in bf16 or fp32 (fp16's
range is too narrow for gradients made before the loss scale reaches them: :func:`applies`), on the devices of
:data:`CHUNKED_LOSS_DEVICES`: none until a GPU measures it (``benchmarks/gpu_check``'s ``chunked_loss``). The CPU
has its own blockwise loss (``kernels/losses.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from gptcli.model.losses import IGNORE
from gptcli.padding import pad_rows
from gptcli.system.runtime import product_dtype

CHUNKED_LOSS_DEVICES: tuple[str, ...] = ()
"""Device types whose training loss (``TiedEmbeddingLM.lm_nll``, outside the CPU kernels) is :func:`chunked_nll`.
Empty until a GPU measures it against the padded product (``benchmarks/gpu_check``'s ``chunked_loss``)."""

CHUNK_ROWS = 4096
"""Positions per block: ``4096 × 40,512`` fp32 logits are 0.66 GB, a quarter of the whole bf16 logits at 64 × 512,
and each block's products (4,096 × 768 × 40,512) are still large enough to run at a GPU's matrix peak."""


def applies(h: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the training loss of ``h`` against ``w`` takes :func:`chunked_nll`: a device it is named for,
    gradients wanted (validation takes the plain loss, which computes no gradients), and products in bf16 or fp32.
    Not fp16: its gradients are made in the forward pass, before a GradScaler's scale reaches them, and a token's
    softmax gradient over 32,768 positions (about 1e-9) is below fp16's smallest value; the plain loss's backward
    gets the scale first."""
    return (
        w.device.type in CHUNKED_LOSS_DEVICES
        and product_dtype(w) != torch.float16
        and torch.is_grad_enabled()
        and (h.requires_grad or w.requires_grad)
    )


def chunked_nll(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, chunk_rows: int = CHUNK_ROWS) -> torch.Tensor:
    """Mean cross-entropy of ``targets`` (``IGNORE`` skipped) under ``h · wᵀ``: the value and gradients of
    ``F.cross_entropy(F.linear(h, w).float(), targets, ignore_index=IGNORE)``, over blocks of ``chunk_rows``
    positions. Under autocast the products take autocast's dtype, as ``F.linear`` would; the softmax is fp32."""
    h2 = h.reshape(-1, h.size(-1))
    return _ChunkedNLL.apply(h2, w, targets.reshape(-1), product_dtype(w), chunk_rows)


class _ChunkedNLL(torch.autograd.Function):
    """Loss and both gradients in the forward pass, block by block (module docstring); backward scales them."""

    @staticmethod
    def forward(
        ctx: Any, h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype, chunk_rows: int
    ) -> torch.Tensor:
        with torch.autocast(w.device.type, enabled=False):  # explicit dtypes below
            loss, dh, dw = _blocks(h.to(dtype), pad_rows(w.to(dtype)), targets, w.size(0), chunk_rows)
        ctx.save_for_backward(dh.to(h.dtype), dw[: w.size(0)].to(w.dtype))
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        dh, dw = ctx.saved_tensors
        return dh * grad.to(dh.dtype), dw * grad.to(dw.dtype), None, None, None


def _blocks(
    h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, classes: int, chunk_rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean loss, its gradient for ``h``, for the padded ``w`` in fp32) of ``h · wᵀ``'s first ``classes`` columns.
    The count of targets stays a tensor: nothing here waits on the device."""
    valid = targets != IGNORE
    # Each counted target's share of the mean, 0 for an ignored one; with none counted, nan, as F.cross_entropy's
    # mean over nothing is (the run's non-finite watch then stops it, as it would the plain loss).
    weight = valid.float() / valid.sum()
    # gather and scatter take int64 indices only (a corpus's ids may come as int32); an ignored target's row is
    # zeroed by its weight
    picked = targets.long().clamp_min(0).unsqueeze(1)
    loss = torch.zeros((), dtype=torch.float32, device=h.device)
    dh = torch.empty_like(h)
    dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
    for start in range(0, h.size(0), chunk_rows):
        rows = slice(start, start + chunk_rows)
        logits = (h[rows] @ w.t()).float()
        if classes < w.size(0):
            logits[:, classes:] = float("-inf")  # the padding: no probability, so no gradient
        lse = torch.logsumexp(logits, dim=1, keepdim=True)
        loss = loss + ((lse - logits.gather(1, picked[rows])).squeeze(1) * weight[rows]).sum()
        g = logits.sub_(lse).exp_()  # the softmax, in the logits' memory
        g.scatter_add_(1, picked[rows], torch.full_like(picked[rows], -1, dtype=g.dtype))  # minus the one-hot
        g = (g * weight[rows].unsqueeze(1)).to(h.dtype)
        dh[rows] = g @ w
        dw += (g.t() @ h[rows]).float()
    return loss, dh, dw


__all__ = ["CHUNKED_LOSS_DEVICES", "CHUNK_ROWS", "applies", "chunked_nll"]
