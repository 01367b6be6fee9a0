"""What every gpt1 language model shares: an output layer tied to the token embedding, and the special-token rows
fine-tuning appends to it.

Both architectures (the Transformer of ``gpt.py`` and the LSTM baseline of ``lstm.py``) are mixed with
:class:`TiedEmbeddingLM`, so the tied softmax, the LM loss and the special tokens are written once. A subclass
has ``self.tok_emb`` (an ``nn.Embedding``), ``self.config`` with ``init_std`` and ``n_special``, and a ``forward``
that returns hidden states of the embedding's width.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.model import chunked_nll
from gptcli.model.losses import next_token_nll
from gptcli.padding import padded_product, padded_rows

PADDED_HEAD_DEVICES: tuple[str, ...] = ("cuda",)
"""Device types whose training losses take the output product against the embedding padded to aligned rows
(:meth:`TiedProducts.training_logits`): the same loss and, within rounding, the same gradients; the padding's
columns get none. Why: a row of GPT-1's 40,478 bf16 embedding values is not 16-byte aligned, and cuBLAS then runs
the vocabulary-wide products with slower kernels (docs/performance.md, the GPU table's ``padded_head``). Remove
``"cuda"`` to take the plain product there."""


class TiedProducts:
    """The tied layer's computations, in plain PyTorch: the token lookup, the output product and the loss over it.
    A model holds one as its ``tied`` attribute, the seam ``gptcli.model.kernels.apply`` replaces with the CPU
    kernels' forms. Stateless."""

    def embed(self, emb: nn.Embedding, idx: torch.Tensor) -> torch.Tensor:
        """The token lookup ``emb(idx)``."""
        return emb(idx)

    def logits(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The output product ``h · wᵀ``."""
        return F.linear(h, w)

    def training_logits(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
        """The training loss's logits against ``w`` padded to aligned rows, the padding's columns included (the loss
        takes ``classes``), on a device of :data:`PADDED_HEAD_DEVICES`; ``None`` elsewhere (the plain product)."""
        if w.device.type in PADDED_HEAD_DEVICES and padded_rows(w.size(0)) != w.size(0):
            return padded_product(h, w)
        return None

    def nll(
        self,
        logits: torch.Tensor,
        targets: torch.Tensor,
        reduction: str = "mean",
        classes: int | None = None,
        consume: bool = False,
    ) -> torch.Tensor:
        """:func:`~gptcli.model.losses.next_token_nll` of ``logits``. ``consume``: the logits are the caller's own
        temporary, read by nothing after this loss (a form that can write their gradient over them may)."""
        return next_token_nll(logits, targets, reduction=reduction, classes=classes)


class SpecialTokenConfig(Protocol):
    """What :meth:`TiedEmbeddingLM.add_special_tokens` reads and updates in a model's config."""

    init_std: float
    n_special: int


class TiedEmbeddingLM(nn.Module):
    """The output side of a language model whose softmax weights are its token embedding (paper §3.1: ``W_e``)."""

    tok_emb: nn.Embedding
    config: SpecialTokenConfig
    tied: TiedProducts = TiedProducts()
    """The lookup, output product and loss (a seam: ``gptcli.model.kernels.apply`` gives a model its own)."""

    def embed_tokens(self, idx: torch.Tensor) -> torch.Tensor:
        """``self.tok_emb(idx)``."""
        return self.tied.embed(self.tok_emb, idx)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Tied output layer: logits over vocabulary + special tokens, ``h · Weᵀ``."""
        return self.tied.logits(h, self.tok_emb.weight)

    def next_token_nll(self, logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """The loss of logits this model's :meth:`lm_logits` made (``gptcli.model.losses.next_token_nll``)."""
        return self.tied.nll(logits, targets, reduction)

    def lm_nll(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of ``targets`` (already shifted; -100 = ignored) given hidden states ``h``:
        ``next_token_nll(self.lm_logits(h), targets)``, the training loss. On a device named in
        ``chunked_nll.CHUNKED_LOSS_DEVICES``, in training, the product and loss over blocks of rows instead
        (:func:`~gptcli.model.chunked_nll.chunked_nll`): the same loss and gradients without the whole logits."""
        w = self.tok_emb.weight
        if chunked_nll.applies(h, w):
            return chunked_nll.chunked_nll(h, w, targets)
        padded = self.tied.training_logits(h, w)
        if padded is not None:
            return self.tied.nll(padded, targets, classes=w.size(0), consume=True)
        return self.tied.nll(self.lm_logits(h), targets, consume=True)

    def lm_token_nll(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy of each of ``targets`` (reduction "none") given hidden states ``h``: fine-tuning's
        auxiliary loss, averaged per sequence by its caller. Takes the padded training product where :meth:`lm_nll`
        does."""
        w = self.tok_emb.weight
        padded = self.tied.training_logits(h, w)
        if padded is not None:
            return self.tied.nll(padded, targets, reduction="none", classes=w.size(0), consume=True)
        return self.tied.nll(self.lm_logits(h), targets, reduction="none", consume=True)

    def lm_loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of ``targets`` (already shifted; -100 = ignored) given ``idx``."""
        return self.lm_nll(self(idx), targets)

    @torch.no_grad()
    def add_special_tokens(self, n: int) -> None:
        """Append ``n`` token rows drawn from N(0, init_std) (fine-tuning's start/delimiter/extract tokens)."""
        if n <= 0:
            return
        old = self.tok_emb.weight
        new = torch.empty(n, old.size(1), device=old.device, dtype=old.dtype).normal_(0.0, self.config.init_std)
        emb = nn.Embedding(old.size(0) + n, old.size(1), device=old.device, dtype=old.dtype)
        emb.weight.copy_(torch.cat([old, new], dim=0))
        self.tok_emb = emb
        self.config.n_special += n
