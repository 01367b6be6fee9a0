"""What every gpt1 language model shares: an output layer tied to the token embedding, and the special-token rows
fine-tuning appends to it.

Both architectures (the Transformer of ``gpt.py`` and the LSTM baseline of ``lstm.py``) are mixed with
:class:`TiedEmbeddingLM`, so the tied softmax, the LM loss and the special tokens are written once. A subclass
has ``self.tok_emb`` (an ``nn.Embedding``), ``self.config`` with ``init_std`` and ``n_special``, and a ``forward``
that returns hidden states of the embedding's width.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.model import chunked_nll, kernels
from gptcli.model.losses import next_token_nll
from gptcli.padding import padded_product, padded_rows

PADDED_HEAD_DEVICES: tuple[str, ...] = ("cuda",)
"""Device types whose training losses (outside the CPU kernels, which decide for themselves) take the output product
against the embedding padded to aligned rows (:meth:`TiedEmbeddingLM._padded_training_logits`): the same loss and,
within rounding, the same gradients; the padding's columns get none.

Why CUDA: a row of GPT-1's 40,478 bf16 embedding values is not 16-byte aligned, so cuBLAS ran the 40,478-wide
products (the forward one and both gradients') as CUTLASS sm80 kernels with 2-element alignment, about a quarter of
an H200's bf16 peak, where every other product ran Hopper's own kernels; 40,512 rows are aligned. Measured on one
H200 (torch 2.11, bf16, ``benchmarks/gpu_check.py``'s ``padded_head``, the same weights and batch): an update 1.12×
faster eager at 64 × 512, 1.01× at 8 × 512 and 1.01× compiled at 64 × 512 (inductor's own choice of kernels
gains less), equal losses (docs/performance.md, "NVIDIA H200, eighteenth session"). Remove ``"cuda"`` to take the
plain product there."""


class TiedEmbeddingLM(nn.Module):
    """The output side of a language model whose softmax weights are its token embedding (paper §3.1: ``W_e``)."""

    tok_emb: nn.Embedding

    _tied_link: object | None = None
    """With the kernels on, the last training forward pass's link between its token lookup and the output layer
    (``kernels/tied_lookup.py``): the output layer's products hand their weight gradient to it, and the lookup's
    backward adds its rows into that gradient instead of making a vocabulary-sized one of its own. Per forward pass;
    ``None`` otherwise."""

    def embed_tokens(self, idx: torch.Tensor) -> torch.Tensor:
        """``self.tok_emb(idx)``; with the kernels on (CPU), in training, linked to the output layer's weight
        gradient (``_tied_link``): the same embeddings and, within fp32 rounding, the same gradient."""
        w = self.tok_emb.weight
        self._tied_link = None
        if kernels.enabled(w.device):
            from gptcli.model.kernels.tied_lookup import lookup

            emb, self._tied_link = lookup(idx, w)
            return emb
        return self.tok_emb(idx)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Tied output layer: logits over vocabulary + special tokens, ``h · Weᵀ``.

        With the kernels on (CPU), a large fp32 batch takes the product against the embedding padded to aligned
        rows (``kernels/tied.py``): the same logits, faster."""
        w = self.tok_emb.weight
        if kernels.enabled(w.device):
            from gptcli.model.kernels.tied import output_logits

            return output_logits(h, w, self._tied_link)
        return F.linear(h, w)

    def lm_nll(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of ``targets`` (already shifted; -100 = ignored) given hidden states ``h``:
        ``next_token_nll(self.lm_logits(h), targets)``, the training loss.

        With the kernels on (CPU), a large batch's loss takes the padded product's logits whole, padding included
        (``kernels/tied.py``): no slice to scatter back, and an aligned weight-gradient product. On a device named in
        ``chunked_nll.CHUNKED_LOSS_DEVICES``, in training, the product and loss over blocks of rows instead
        (:func:`~gptcli.model.chunked_nll.chunked_nll`): the same loss and gradients without the whole logits."""
        w = self.tok_emb.weight
        if not kernels.enabled(w.device) and chunked_nll.applies(h, w):
            return chunked_nll.chunked_nll(h, w, targets)
        padded = self._padded_training_logits(h)
        if padded is not None:
            return next_token_nll(padded, targets, classes=w.size(0), consume=True)
        return next_token_nll(self.lm_logits(h), targets, consume=True)

    def lm_token_nll(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy of each of ``targets`` (reduction "none") given hidden states ``h``: fine-tuning's
        auxiliary loss, averaged per sequence by its caller.

        With the kernels on (CPU), a batch large enough takes the padded product's logits whole where that product is
        the faster one (``kernels/tied.py`` ``padding_is_faster``), as :meth:`lm_nll` does: the padding's columns get a
        zero gradient, where the sliced logits of :meth:`lm_logits` send back a zero-filled copy of the whole padded
        product's gradient. Under bf16 autocast too: without AMX the padded bf16 product at any size (its weight
        gradient's product, the slow one unpadded, 1.5× faster at fine-tuning's thousand positions on an AMD Zen 5),
        on AMX :class:`_AmxPaddedProduct` from ``PAD_MIN_POSITIONS`` (1.0-1.3× the plain one's speed for the head and
        loss at 1,100-2,000 positions; docs/performance.md)."""
        padded = self._padded_training_logits(h)
        if padded is not None:
            classes = self.tok_emb.weight.size(0)
            return next_token_nll(padded, targets, reduction="none", classes=classes, consume=True)
        return next_token_nll(self.lm_logits(h), targets, reduction="none", consume=True)

    def _padded_training_logits(self, h: torch.Tensor) -> torch.Tensor | None:
        """The training losses' logits of ``h`` against the embedding padded to aligned rows, the padding's columns
        included (the loss takes ``classes``), where a padded product applies; ``None`` elsewhere (the plain one).
        With the kernels on (CPU), where ``kernels/tied.py`` finds the padded product the faster one; elsewhere on a
        device named in :data:`PADDED_HEAD_DEVICES` (``gptcli/padding.py``'s ``padded_product``)."""
        w = self.tok_emb.weight
        if kernels.enabled(w.device):
            from gptcli.model.kernels.tied import training_logits

            return training_logits(h, w, self._tied_link)
        if w.device.type in PADDED_HEAD_DEVICES:
            return padded_product(h, w) if padded_rows(w.size(0)) != w.size(0) else None
        return None

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
