"""The token embedding's lookup gradient added straight into the tied output layer's weight gradient.

Reference: ``tok_emb(idx)`` (``F.embedding``) and the output layer's product against the same weight
(gptcli/model/tied.py). Why: autograd computes two vocabulary-sized gradients for the shared weight and adds them,
three passes over vocabulary-sized tensors to add a micro-batch's few rows (docs/performance.md, "Kernels"). Here
the lookup (:func:`lookup`) returns a :class:`Link` beside the embeddings; the output layer's backward in
``tied.py`` offers the weight gradient it returns to the link by weak reference (:meth:`Link.offer`), and the
lookup's backward, which runs after it, adds its rows into that tensor in place (``index_add_``) and returns none.

Safe because autograd sums a leaf's gradients in a buffer only after every node feeding it has run: while the weak
reference lives, the offered tensor is what that buffer holds. Had autograd summed it into another tensor, it was
freed and the lookup returns its own dense gradient, as when nothing was offered; the offer is withdrawn when its
pass ends. The rounding differs from the reference's within fp32's. Only in training (gradients enabled, the weight
a leaf that requires them) and never inside ``torch.compile``.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable


class Link:
    """The output layer's weight gradients returned in the current backward pass, by weak reference (module
    docstring)."""

    def __init__(self) -> None:
        self.offered: list[weakref.ref] = []

    def offer(self, grad: torch.Tensor) -> None:
        """Called by the output layer's backward with the gradient it returns for the lookup's (leaf) weight: the
        lookup may add into it until the current backward pass ends."""
        if not self.offered:
            torch.autograd.Variable._execution_engine.queue_callback(self.withdraw)
        self.offered.append(weakref.ref(grad))

    def withdraw(self) -> None:
        self.offered = []

    def take(self) -> torch.Tensor | None:
        """An offered gradient still alive (the one autograd's buffer holds), else None; the offers are spent."""
        alive = [t for t in (ref() for ref in self.offered) if t is not None]
        self.offered = []
        return alive[0] if alive else None


def applies(weight: torch.Tensor) -> bool:
    """Whether :func:`lookup` links: in training, for a leaf weight, outside ``torch.compile``."""
    return torch.is_grad_enabled() and weight.requires_grad and weight.is_leaf and not torch.compiler.is_compiling()


def lookup(idx: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, Link | None]:
    """``F.embedding(idx, weight)`` and the :class:`Link` its backward reads (``None`` where it does not apply:
    the plain lookup)."""
    if not applies(weight):
        return F.embedding(idx, weight), None
    link = Link()
    return _LinkedLookup.apply(idx, weight, link), link


class _LinkedLookup(torch.autograd.Function):
    """``F.embedding(idx, weight)``; the weight's gradient added into the linked output layer's where one was
    offered and is alive, else autograd's own (``embedding_dense_backward``, bit for bit)."""

    @staticmethod
    def forward(ctx, idx: torch.Tensor, weight: torch.Tensor, link: Link) -> torch.Tensor:
        ctx.save_for_backward(idx)
        ctx.link, ctx.shape = link, weight.shape
        return F.embedding(idx, weight)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (idx,) = ctx.saved_tensors
        target = ctx.link.take()
        if target is not None and target.shape == ctx.shape and target.dtype == grad.dtype:
            target.index_add_(0, idx.reshape(-1), grad.reshape(-1, grad.size(-1)))
            return None, None, None
        return None, torch.ops.aten.embedding_dense_backward(grad, idx, ctx.shape[0], -1, False), None
