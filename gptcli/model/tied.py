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

from gptcli.model.losses import next_token_nll


PAD_ROWS_TO = 64
"""Vocabulary rows are padded to a multiple of this for the output product (:meth:`TiedEmbeddingLM.lm_logits`)."""

PAD_MIN_POSITIONS = 1024
"""Positions from which the padded product pays for its copy of the embedding (a 4 × 512 training batch is 2,048)."""


def _pad_pays(h: torch.Tensor, w: torch.Tensor, training: bool = False) -> bool:
    """Whether the product against the padded embedding is the faster one: a large fp32 CPU batch, or in training
    (:meth:`TiedEmbeddingLM.lm_nll`) also a bf16-autocast one (there the gain is in the weight gradient's product)."""
    if w.device.type != "cpu" or w.size(0) % PAD_ROWS_TO == 0 or h.numel() < PAD_MIN_POSITIONS * h.size(-1):
        return False
    if torch.is_autocast_enabled("cpu"):
        return training and torch.get_autocast_dtype("cpu") == torch.bfloat16
    return w.dtype == torch.float32


def _padded(w: torch.Tensor) -> torch.Tensor:
    """``w`` with zero rows appended up to a multiple of ``PAD_ROWS_TO``."""
    return F.pad(w, (0, 0, 0, -w.size(0) % PAD_ROWS_TO))


class TiedEmbeddingLM(nn.Module):
    """The output side of a language model whose softmax weights are its token embedding (paper §3.1: ``W_e``)."""

    tok_emb: nn.Embedding

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Tied output layer: logits over vocabulary + special tokens, ``h · Weᵀ``.

        For a large fp32 batch on CPU the product is taken against the embedding padded with zero rows to a multiple
        of ``PAD_ROWS_TO`` and the padding's columns are sliced off: the same logits, as a view whose rows are
        ``PAD_ROWS_TO``-aligned. The BLAS runs a 40,478-wide product at 0.7× the speed of a 40,480-wide one (2,048
        rows, 2-core Zen 4: 1.01 vs 0.71 s), which is worth one copy of the embedding per forward: a GPT-1 fp32
        training step took 0.97× the time. Under bf16 autocast the forward product alone measured no different (the
        training loss, :meth:`lm_nll`, pads bf16 too, for its weight gradient), and for a few rows (decoding) the copy
        would cost more than the product, so those keep the plain product."""
        w = self.tok_emb.weight
        if _pad_pays(h, w):
            return F.linear(h, _padded(w))[..., : w.size(0)]
        return F.linear(h, w)

    def lm_nll(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of ``targets`` (already shifted; -100 = ignored) given hidden states ``h``:
        ``next_token_nll(self.lm_logits(h), targets)``, the training loss.

        Here the padded product also pays under bf16 autocast: the loss takes the padded logits whole (the padding's
        columns get a zero gradient, ``next_token_nll(classes=…)``), so no slice has to be scattered back, and the
        weight gradient's product, 40,478 rows long, is the one the BLAS runs slowly (bf16, 2-core Zen 4: 392 vs
        325 ms at 40,480). Alternating steady-state bf16 GPT-1 steps: 4.90 vs 5.02 s (median of 12, 9 of 12 pairs
        faster)."""
        w = self.tok_emb.weight
        if not _pad_pays(h, w, training=True):
            return next_token_nll(self.lm_logits(h), targets)
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else w.dtype
        # Cast before padding: the pad then copies the bf16 embedding, not the fp32 one.
        return next_token_nll(F.linear(h, _padded(w.to(dtype))), targets, classes=w.size(0))

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
