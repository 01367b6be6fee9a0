"""The kernels as replacements for the model's seams, and :func:`install`, which swaps them into a built model.

The reference model (gptcli/model/) is plain PyTorch with small seams: its dropout layers (``nn.Dropout``), the
Transformer blocks' ``nn.Linear`` layers, the MLP's ``nn.GELU``, each attention layer's ``attention`` and the tied
layer's ``tied`` (lookup, output product, loss). :func:`install` replaces each with the form here, which computes
by this folder's kernels where :func:`~gptcli.system.runtime.kernels_enabled` says so (``auto``, on CPU) and by the
reference everywhere else: a model moved to a GPU, or run inside ``use_kernels("reference")``, computes as one that
was never given them. Why: the model reads like nanoGPT's, and the fast paths are one opt-in call away
(``kernels.apply``), as liger-kernel and torchtitan do it. Nothing here is imported under ``reference``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.model.kernels import attention, cpu, dropout, gelu, linear, losses, tied, tied_lookup
from gptcli.system.runtime import kernels_enabled as enabled

IGNORE = -100
"""The target id the reference loss ignores (``gptcli.model.losses.IGNORE``)."""


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose masks come from ``dropout.py`` (random bytes: the same law, other units for a seed);
    ``noise_shape``: one mask of that shape broadcast over the input, as the reference's."""

    def forward(self, x: torch.Tensor, noise_shape: torch.Size | tuple[int, ...] | None = None) -> torch.Tensor:
        if self.inplace:
            return super().forward(x)
        if enabled(x.device):
            return dropout.dropout(x, self.p, self.training, noise_shape)
        # The reference's own (gptcli/model/dropout.py), which the kernels do not import.
        if noise_shape is None or not self.training or self.p == 0.0:
            return F.dropout(x, self.p, self.training)
        return x * F.dropout(torch.ones(noise_shape, device=x.device, dtype=x.dtype), self.p, True)


class GELU(nn.GELU):
    """``nn.GELU(approximate="tanh")`` by ``gelu.cpp``'s loops where the library serves the input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if enabled(x.device):
            y = gelu.gelu(x)
            if y is not None:
                return y
        return super().forward(x)


class Linear(nn.Linear):
    """``nn.Linear``; a training product's weight gradient (AMX bf16) and bias gradient (float32 column sums), and
    on CPUs with full-width AVX-512 (``cpu.onednn_fp32``) the float32 products, by ``linear.py``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if enabled(x.device):
            y = linear.amx_linear(x, self.weight, self.bias) if cpu.amx() else None
            if y is None:
                y = linear.fp32_linear(x, self.weight, self.bias)
            if y is None:
                y = linear.fp32_inference_linear(x, self.weight, self.bias)
            if y is not None:
                return y
        return super().forward(x)


class WrittenOutAttention:
    """An attention layer's ``attention`` (``gptcli.model.attention.SDPAttention``'s methods) by ``attention.py``'s
    written-out causal attention; ``reference``: the layer's own, for what the kernels do not compute."""

    def __init__(self, reference: Any) -> None:
        self.reference = reference

    def causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
        if enabled(q.device):
            return attention.causal_attention(q, k, v, dropout)
        return self.reference.causal(q, k, v, dropout)

    def stacked(self, x: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
        if enabled(x.device):
            return attention.stacked_causal_attention(x, dropout)
        return self.reference.stacked(x, dropout)

    def fused(self, qkv: torch.Tensor, n_head: int, dropout: float = 0.0) -> torch.Tensor:
        """The kernel reads q, k and v as views of ``qkv`` and writes its gradient whole."""
        if not enabled(qkv.device):
            return self.reference.fused(qkv, n_head, dropout)
        B, T, C3 = qkv.shape
        C = C3 // 3
        y = attention.stacked_causal_attention(qkv.view(B, T, 3, n_head, C // n_head).permute(2, 0, 3, 1, 4), dropout)
        return y.transpose(1, 2).reshape(B, T, C)

    def runs_grids(self, device: torch.device) -> bool:
        return enabled(device)

    def masked(self, x: torch.Tensor, bias: torch.Tensor, dropout: float = 0.0) -> torch.Tensor | None:
        return attention.masked_attention(x, bias, dropout)


class TiedKernels:
    """A tied layer's ``tied`` (``gptcli.model.tied.TiedProducts``'s methods) by ``tied_lookup.py``, ``tied.py``
    and ``losses.py``; ``reference``: the model's own. Holds the last training forward pass's :class:`Link`
    between its token lookup and the output products (``tied_lookup.py``)."""

    def __init__(self, reference: Any) -> None:
        self.reference = reference
        self.link: tied_lookup.Link | None = None

    def embed(self, emb: nn.Embedding, idx: torch.Tensor) -> torch.Tensor:
        self.link = None
        if not enabled(emb.weight.device):
            return self.reference.embed(emb, idx)
        out, self.link = tied_lookup.lookup(idx, emb.weight)
        return out

    def logits(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if enabled(w.device):
            return tied.output_logits(h, w, self.link)
        return self.reference.logits(h, w)

    def training_logits(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
        if enabled(w.device):
            return tied.training_logits(h, w, self.link)
        return self.reference.training_logits(h, w)

    def nll(
        self,
        logits: torch.Tensor,
        targets: torch.Tensor,
        reduction: str = "mean",
        classes: int | None = None,
        consume: bool = False,
    ) -> torch.Tensor:
        if enabled(logits.device) and reduction in losses.REDUCTIONS:
            flat, flat_targets = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
            return losses.next_token_nll(flat, flat_targets, reduction, classes, IGNORE, consume)
        return self.reference.nll(logits, targets, reduction, classes, consume)


def install(model: nn.Module) -> None:
    """Replace every seam of ``model`` (and of the models inside it) by its kernel form, in place: the parameters,
    their names and the state dict are untouched. Installing twice changes nothing."""
    for module in model.modules():
        for child in _transformer_linears(module):
            child.__class__ = Linear
        if isinstance(module, nn.Dropout) and not isinstance(module, Dropout):
            module.__class__ = Dropout
        elif type(module) is nn.GELU and module.approximate == "tanh":
            module.__class__ = GELU
        seam = getattr(module, "attention", None)
        if seam is not None and hasattr(seam, "fused") and not isinstance(seam, WrittenOutAttention):
            setattr(module, "attention", WrittenOutAttention(seam))  # noqa: B010 (a plain attribute, not a submodule)
        seam = getattr(module, "tied", None)
        if _is_tied_seam(seam) and not isinstance(seam, TiedKernels):
            setattr(module, "tied", TiedKernels(seam))  # noqa: B010


def holds_gpt1_model(model: nn.Module) -> bool:
    """Whether ``model`` holds a gpt1 language model (its tied seam, ``model/tied.py``), the one kind
    :func:`install` is meant for."""
    return any(_is_tied_seam(getattr(m, "tied", None)) for m in model.modules())


def _is_tied_seam(seam: object) -> bool:
    """Whether ``seam`` is a gpt1 language model's tied embedding and output layer (``model/tied.py``)."""
    return seam is not None and hasattr(seam, "training_logits")


def _transformer_linears(module: nn.Module) -> list[nn.Module]:
    """The plain ``nn.Linear`` children of a Transformer's attention layer (it holds an ``attention`` seam) or MLP
    (it holds a tanh GELU): the layers the kernels' :class:`Linear` was measured on, not a task head's or the LSTM's."""
    children = list(module.children())
    transformer = hasattr(getattr(module, "attention", None), "fused") or any(
        isinstance(c, nn.GELU) and c.approximate == "tanh" for c in children
    )
    return [c for c in children if type(c) is nn.Linear] if transformer else []


__all__ = ["GELU", "Dropout", "Linear", "TiedKernels", "WrittenOutAttention", "holds_gpt1_model", "install"]
