"""The next-token cross-entropy on CPU over blocks of rows, with its own backward.

Reference: ``F.cross_entropy(logits.float(), targets, ignore_index=IGNORE)`` (gptcli/model/losses.py), the same
values and gradients (tests/model/test_losses.py). Where the compiled library is built with AVX-512 or AVX2, both passes
are its rows (``loss.cpp``: each row's log-sum-exp, then the gradient in one pass); elsewhere, blocks of rows of
PyTorch's ops.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from gptcli.model.kernels import native

CHUNK_ELEMENTS = 2**20
"""Logits per block of :class:`_RowBlockNLL` (2,048 × 40,478 logits: 82 blocks of 25 rows, 4 MB each in fp32).
2¹⁹–2²⁰ measured fastest; one row per block was far slower."""

REDUCTIONS = ("mean", "sum", "none")


@torch.compiler.disable  # under torch.compile (--compile), run eagerly between graphs: a pybind call is opaque to it
def next_token_nll(
    logits: torch.Tensor, targets: torch.Tensor, reduction: str, classes: int | None, ignore: int, consume: bool = False
) -> torch.Tensor:
    """``F.cross_entropy(logits[:, :classes].float(), targets, ignore_index=ignore, reduction=reduction)`` for 2-D
    ``logits`` and 1-D ``targets``; the padding columns past ``classes`` get a zero gradient. ``consume``: the
    backward pass writes the logits' gradient over the logits themselves (gptcli/model/losses.py)."""
    with torch.autocast("cpu", enabled=False):
        nll = _RowBlockNLL.apply(logits, targets, classes or logits.size(1), ignore, consume)
    if reduction == "none":
        return nll
    total = nll.sum()
    return total if reduction == "sum" else total / (targets != ignore).sum()


def _compiled(logits: torch.Tensor):
    """The compiled library when its two passes (``loss.cpp``: AVX-512 or AVX2) can take these logits (a matrix of
    contiguous rows, float32 or bf16, on the CPU), else ``None``: the blocks of PyTorch ops below then compute the
    same loss."""
    return native.vector_library_for(logits.device, logits.dtype) if logits.stride(1) == 1 else None


def _block_rows(classes: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, classes))


def _fp32_buffer(logits: torch.Tensor, rows: int, classes: int) -> torch.Tensor | None:
    """One fp32 block that low-precision logits are converted into, block after block (None for fp32 logits)."""
    if logits.dtype == torch.float32:
        return None
    return torch.empty(rows, classes, device=logits.device)


def _in_fp32(part: torch.Tensor, block: torch.Tensor | None) -> torch.Tensor:
    """``part`` (a block of rows, a column slice when the logits are padded) in fp32: itself when it is fp32, else
    copied into ``block``. The slice's ``.float()`` takes PyTorch's strided path and an operation mixing bf16 and fp32
    converts element by element: both several times slower than this copy into a contiguous buffer (docs/performance.md,
    "Kernels"), and the same values."""
    if block is None:
        return part
    return block[: part.size(0)].copy_(part)


class _RowBlockNLL(torch.autograd.Function):
    """Per-row ``-log softmax(logits)[target]`` in fp32 (0 where the target is ``ignore``), over blocks of rows.

    On CPU, ``F.cross_entropy(logits.float())`` writes four vocabulary-wide fp32 tensors per step (the fp32 copy, its
    log-softmax, the loss's one-hot gradient and the softmax's gradient: 1.3 GB for a 4 × 512 GPT-1 batch) and reads
    them back, and a step that has to fault fresh pages in for one of them stalls on the page faults
    (docs/performance.md, "Allocator"). Here each block of rows is converted and normalised while it is in cache; the
    forward pass keeps each row's log-sum-exp, and the backward pass writes the gradient, ``softmax − one_hot(target)``
    times the row's weight, straight into the logits' dtype as ``exp(logits − lse + log weight)``: two passes over
    the block where recomputing the softmax (a max, a sum and a division) and scaling it took five. The values are
    ``F.cross_entropy``'s (tests/model/test_losses.py)."""

    @staticmethod
    def forward(
        ctx, logits: torch.Tensor, targets: torch.Tensor, classes: int, ignore: int, consume: bool
    ) -> torch.Tensor:
        valid = targets != ignore
        # int64 indices: torch 2.6's gather and scatter_add_ refuse int32 ones (tests/model/test_losses.py)
        targets = targets.long()
        safe = targets.masked_fill(~valid, 0).unsqueeze(1)
        ctx.classes, ctx.lib, ctx.consume = classes, _compiled(logits), consume
        if ctx.lib is not None:
            nll, lse = ctx.lib.nll_forward(logits, targets, classes, ignore)
            ctx.save_for_backward(logits, safe, valid, lse)
            return nll
        nll = torch.empty(logits.size(0), device=logits.device)
        rows = _block_rows(classes)
        block = _fp32_buffer(logits, rows, classes)
        for a in range(0, logits.size(0), rows):
            logp = torch.log_softmax(_in_fp32(logits[a : a + rows, :classes], block), dim=-1)
            nll[a : a + rows] = logp.gather(1, safe[a : a + rows]).squeeze(1).neg_()
        # log-sum-exp of each row = its target's logit − that logit's log-probability (the ignored rows' too).
        lse = logits.gather(1, safe).squeeze(1).float().add_(nll)
        ctx.save_for_backward(logits, safe, valid, lse)
        return nll.masked_fill_(~valid, 0.0)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        logits, safe, valid, lse = ctx.saved_tensors
        classes = ctx.classes
        weight = (grad.float() * valid).unsqueeze(1)
        out = _gradient_buffer(logits, ctx.consume)
        if ctx.lib is not None:
            out = ctx.lib.nll_backward(logits, safe.squeeze(1), lse, weight.squeeze(1), classes, out)
            return out, None, None, None, None
        out[:, classes:] = 0.0
        rows = _block_rows(classes)
        # weight · softmax = exp(logits − (lse − log weight)); a zero weight gives exp(−inf) = 0. A negative one
        # has no logarithm: then the softmax is scaled after the exponential.
        signed = bool((weight < 0).any())
        shift = lse.unsqueeze(1) - (0.0 if signed else weight.log())
        block = _fp32_buffer(logits, rows, classes)
        for a in range(0, logits.size(0), rows):
            b = min(a + rows, logits.size(0))
            if block is None:
                dest = torch.sub(logits[a:b, :classes], shift[a:b], out=out[a:b, :classes])
            else:
                dest = _in_fp32(logits[a:b, :classes], block).sub_(shift[a:b])
            dest.exp_()
            if signed:
                dest.mul_(weight[a:b])
            dest.scatter_add_(1, safe[a:b], weight[a:b].neg().to(dest.dtype))
            if block is not None:
                out[a:b, :classes] = dest
        return out, None, None, None, None


def _gradient_buffer(logits: torch.Tensor, consume: bool) -> torch.Tensor:
    """Where the backward writes the logits' gradient: over the logits themselves when the caller gave them up
    (``consume``; each element is read before it is written, by the same step of either loop), else a new tensor.

    Over the logits, a training step allocates no second vocabulary-wide tensor: one whose pages the allocator has to
    take from the OS faults them in, a visible stall when it happens (docs/performance.md, "Allocator"). The logits'
    version is bumped, so a second backward through the same graph (``retain_graph``) fails loudly instead of reading a
    gradient as logits."""
    if not consume:
        return torch.empty(logits.shape, device=logits.device, dtype=logits.dtype)
    torch.autograd.graph.increment_version(logits)
    return logits
