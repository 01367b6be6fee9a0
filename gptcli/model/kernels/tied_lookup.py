"""The token embedding's lookup gradient added straight into the tied output layer's weight gradient.

Reference: ``tok_emb(idx)`` (``F.embedding``) and the output layer's product against the same weight
(gptcli/model/tied.py). The weight is used twice, so autograd computes two weight-sized gradients and adds them: the
lookup's backward fills a zero tensor as large as the vocabulary (40,481 × 768 floats, 124 MB) and adds the rows of
the positions it looked up, then autograd adds that tensor to the output layer's, also 124 MB, into a third one
where the output layer's is a view (the plain fp32 product's is: autograd's ``mm`` backward hands it transposed
twice). For a micro-batch of a thousand positions that is three passes over 124-372 MB to add a thousand rows:
about 100 ms per micro-batch on the AMX Xeon in fp32 (docs/performance.md).

Here the two ends are linked. The lookup (:func:`lookup`) returns a :class:`Link` beside the embeddings; the
output layer's products in ``tied.py`` take it, and their backward hands the weight gradient they return to
autograd to the link as well (:meth:`Link.offer`), by weak reference. The lookup's backward, which runs after
theirs (the output layer is downstream of the lookup), adds its rows into that tensor in place (``index_add_``:
no zero tensor, no vocabulary-wide pass) and returns no weight gradient, so autograd receives the sum as the
weight's one gradient.

Why this is safe. Autograd sums the gradients a leaf receives in a backward pass in a buffer and accumulates the
sum only after every node that feeds the leaf has run, the lookup's included. The offered tensor is referenced by
nothing but that buffer (the link's reference is weak), so while it is alive it is what the buffer holds: the
output layer's gradient alone, or the sum autograd formed in it in place. If autograd summed it into another
tensor instead (a second use of the weight whose gradient arrived first, or an out-of-place sum), it was freed,
the weak reference is dead, and the lookup returns its own dense gradient, as it does when nothing was offered.
The offer is withdrawn when its pass ends (a callback queued on the engine), so a lookup whose backward runs in a
later pass computes its own gradient too. The sum's rounding differs from the reference's (the output layer's
gradient plus each looked-up row in turn, against the output layer's gradient plus the rows' sum): equal within
fp32's. (A sparse gradient, as ``nn.Embedding(sparse=True)`` returns, would be as safe, but autograd adds a sparse
gradient out of place: a copy of the whole dense one.)

Only in training (gradients enabled, the weight a leaf that requires them) and never inside ``torch.compile``.
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
