"""The tied output product on CPU against the embedding padded to an aligned number of rows.

Reference: ``F.linear(h, tok_emb.weight)`` (``gptcli.model.tied.TiedProducts``). The BLAS runs a product as wide
as GPT-1's 40,478-row vocabulary markedly slower than one padded to a multiple of ``PAD_ROWS_TO``, in the forward
product and in the weight gradient's; for a large batch that is worth one padded copy of the embedding.
:func:`output_logits` slices the padding's columns off the padded product; :func:`training_logits` hands the padded
logits whole to the training loss, which gives the padding's columns a zero gradient (``classes``), so nothing is
scattered back. With the token lookup's link (``tied_lookup.py``) the products hand their weight gradient to it.
On an AMX CPU the bf16 training product is :class:`_AmxPaddedProduct`, its operands laid out for oneDNN's AMX
kernels. Which product runs is :func:`padding_is_faster`, by shape and CPU flags, never a timing.

Tests: tests/model/test_tied.py (the padded products give the plain ones' logits, loss and gradients).
Figures: docs/performance.md, "Kernels".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from gptcli.model.kernels import casts, cpu, onednn
from gptcli.model.kernels.tied_lookup import Link
from gptcli.model.kernels.transpose import transposed
from gptcli.padding import PAD_ROWS_TO, pad_rows, padded_product, padded_rows

PAD_MIN_POSITIONS = 1024
"""Positions from which the padded product pays for its copy of the embedding (a 4 × 512 training batch is 2,048)."""

AMX_COLUMNS = 2048
"""Vocabulary rows per product in :class:`_AmxPaddedProduct`'s forward pass (one block of logit columns each)."""


def padding_is_faster(h: torch.Tensor, w: torch.Tensor, training: bool = False) -> bool:
    """Whether the product of ``h`` against the padded embedding ``w`` is the faster one: a large fp32 CPU batch on
    a CPU without AMX, or in training (:func:`training_logits`) a bf16-autocast one (there the gain is in the
    weight gradient's product; on AMX, :class:`_AmxPaddedProduct`).

    A bf16 training product pads at any number of positions on a CPU without AMX: autocast casts the embedding
    anyway, and the padded cast (``_padded_copy``, once per update in the trainer's region) costs what the plain
    one does, so there is no copy for the alignment to pay for; the weight gradient's product gains most at
    fine-tuning's micro-batches of about a thousand positions (docs/performance.md, "Kernels"). On AMX the padded
    product is measured from ``PAD_MIN_POSITIONS`` only and keeps that bound.

    fp32 depends on the CPU: on an AVX-512 CPU without AMX the BLAS ran GPT-1's 40,478-row products far slower
    than aligned ones, while on CPUs with AMX tiles the plain product and loss measured faster than the padded
    ones (the pad's copy of the embedding costs more than alignment gains there). ``cpu.amx()`` is the CPU flag
    that tells the two apart; an Intel CPU without AMX keeps the padding (not measured)."""
    if w.device.type != "cpu" or w.size(0) % PAD_ROWS_TO == 0:
        return False
    large = h.numel() >= PAD_MIN_POSITIONS * h.size(-1)
    if torch.is_autocast_enabled("cpu"):
        return training and torch.get_autocast_dtype("cpu") == torch.bfloat16 and (large or not cpu.amx())
    return large and w.dtype == torch.float32 and not cpu.amx()


def output_logits(h: torch.Tensor, w: torch.Tensor, link: Link | None = None) -> torch.Tensor:
    """``F.linear(h, w)``, through the padded product when that is faster (module docstring). With the ``link`` of
    the lookup that made ``h``'s tokens (fp32 or bf16-autocast training), through :class:`_LinkedProduct`."""
    pad = padding_is_faster(h, w)
    dtype = _linked_dtype(h, w, link)
    if dtype is not None:
        with torch.autocast("cpu", enabled=False):
            logits = _LinkedProduct.apply(h.to(dtype), w, link, pad)
        return logits[..., : w.size(0)] if pad else logits
    # Without gradients, from PAD_MIN_POSITIONS positions, a full-width AVX-512 CPU's float32 product is oneDNN's
    # (onednn.py).
    linear = onednn.linear if onednn.inference_applies(h, w, PAD_MIN_POSITIONS) else F.linear
    if pad:
        return linear(h, pad_rows(w))[..., : w.size(0)]
    return linear(h, w)


def training_logits(h: torch.Tensor, w: torch.Tensor, link: Link | None = None) -> torch.Tensor | None:
    """The logits of ``h`` against the padded ``w``, padding columns included (the loss ignores them), when the
    padded product is the faster one in training; ``None`` when it is not. ``link``: as :func:`output_logits`'s
    (the AMX product takes it too)."""
    if not padding_is_faster(h, w, training=True):
        return None
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16 and cpu.amx():
        with torch.autocast("cpu", enabled=False):
            return _AmxPaddedProduct.apply(h.to(torch.bfloat16), w, link if _links(h, w, link) else None)
    linked = _linked_dtype(h, w, link)
    if linked is not None:
        with torch.autocast("cpu", enabled=False):
            return _LinkedProduct.apply(h.to(linked), w, link, True)
    return padded_product(h, w)


def _links(h: torch.Tensor, w: torch.Tensor, link: Link | None) -> bool:
    """Whether the product hands its weight gradient to ``link``: the weight the lookup's leaf, gradients wanted,
    outside ``torch.compile``."""
    return not (link is None or not torch.is_grad_enabled() or not w.requires_grad or torch.compiler.is_compiling())


def _linked_dtype(h: torch.Tensor, w: torch.Tensor, link: Link | None) -> torch.dtype | None:
    """The dtype :class:`_LinkedProduct` computes in where it applies (:func:`_links`): float32 outside autocast
    (a float32 ``h`` and ``w``), bf16 under CPU bf16 autocast (autocast's own casts, done by the caller: the AMX
    CPU's bf16 training product is :class:`_AmxPaddedProduct` instead); ``None`` elsewhere (the plain product)."""
    if not _links(h, w, link) or w.dtype != torch.float32:
        return None
    if torch.is_autocast_enabled("cpu"):
        return torch.bfloat16 if torch.get_autocast_dtype("cpu") == torch.bfloat16 else None
    return torch.float32 if h.dtype == torch.float32 else None


class _LinkedProduct(torch.autograd.Function):
    """``F.linear(h, w.to(h.dtype))`` (against ``pad_rows`` of it with ``pad``) in fp32, or in bf16 for bf16 ``h``
    (autocast's form: the weight cast, then padded; the copy made once per update, ``casts.py``), whose weight
    gradient is also offered to the token lookup's ``link`` (``tied_lookup.py``). Autograd's own products in its own
    layouts: the logits, ``dh = g·w`` and ``dw = gᵀ·h`` are bit for bit the reference's, ``dw`` cast to the weight's
    dtype after the padding's rows are cut, as autograd's cast backward does. ``dw`` is returned as a fresh row-major
    tensor (in fp32 with ``pad``, a view of one without the padding's rows) where autograd's ``mm`` backward returns
    a transposed view, which autograd could not add into in place.

    In float32 on CPUs with full-width AVX-512 (``onednn.py``) the three products are oneDNN's, the gradients' from
    dense transposed operands: within float32 rounding of the reference's.

    Without it, bf16 training on a CPU without AMX took the plain product, so the lookup's gradient was a
    zero-filled fp32 tensor as large as the vocabulary, added to this one on every micro-batch."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor, link: Link, pad: bool) -> torch.Tensor:
        if h.dtype == w.dtype:
            wp = pad_rows(w) if pad else w
        elif pad:  # the AMX product's copy: cast and padded in one pass, once per update (casts.py)
            wp = casts.copy_of(w, f"padded {h.dtype}", lambda w: _padded_copy(w, h.dtype))
        else:
            wp = casts.copy_of(w, str(h.dtype), lambda w: w.detach().to(h.dtype))
        ctx.save_for_backward(h, wp)
        ctx.link, ctx.rows, ctx.w_dtype = link, w.size(0), w.dtype
        ctx.dnn = h.dtype == torch.float32 and onednn.applies(h, wp)
        return onednn.linear(h, wp) if ctx.dnn else F.linear(h, wp)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        h, wp = ctx.saved_tensors
        flat, g = h.reshape(-1, h.size(-1)), grad.reshape(-1, grad.size(-1))
        dh = None
        if ctx.needs_input_grad[0]:
            dh = (onednn.input_grad(g, wp) if ctx.dnn else torch.mm(g, wp)).view(h.shape)
        dw = None
        if ctx.needs_input_grad[1]:
            dw = onednn.weight_grad(g, flat) if ctx.dnn else torch.mm(g.t(), flat)
            if dw.size(0) != ctx.rows:  # the padding's rows off (a view: the weight's accumulation copies it)
                dw = dw[: ctx.rows]
            if dw.dtype != ctx.w_dtype:
                dw = dw.to(ctx.w_dtype)
            ctx.link.offer(dw)
        return dh, dw, None, None


def _padded_copy(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``pad_rows(w.to(dtype))`` written in one pass (no padded float32 copy first)."""
    wp = torch.empty(padded_rows(w.size(0)), w.size(1), dtype=dtype, device=w.device)
    wp[: w.size(0)] = w.detach()
    wp[w.size(0) :] = 0.0
    return wp


class _AmxPaddedProduct(torch.autograd.Function):
    """``F.linear(h, pad_rows(w.to(bf16)))`` for bf16 ``h`` (module docstring): the padded bf16 embedding written in
    one pass (once per update inside the trainer's region, ``casts.py``), the logits ``AMX_COLUMNS`` columns at a
    time, and in the backward pass the weight gradient as ``(hᵀ·g)ᵀ`` from one transposed copy of ``h`` (a 2,048 ×
    768 copy against the 2,048 × 40,512 one oneDNN made of ``g``), handed to ``w`` in its dtype and row-major.
    Both transposed copies are ``transpose.py``'s (``transpose.cpp``), the gradient's without the padding's
    rows, into a fresh tensor (not a view of a larger one), which is offered to the token lookup's ``link`` where
    one is given (``tied_lookup.py``), else autograd adds the lookup's gradient into it in place."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor, link: Link | None) -> torch.Tensor:
        wp = casts.copy_of(w, f"padded {h.dtype}", lambda w: _padded_copy(w, h.dtype))
        rows = wp.size(0)
        flat = h.reshape(-1, h.size(-1))
        out = torch.empty(flat.size(0), rows, dtype=h.dtype, device=h.device)
        for a in range(0, rows, AMX_COLUMNS):
            out[:, a : a + AMX_COLUMNS] = F.linear(flat, wp[a : a + AMX_COLUMNS])
        ctx.save_for_backward(flat, wp)
        ctx.shape, ctx.vocab, ctx.w_dtype, ctx.link = h.shape, w.size(0), w.dtype, link
        return out.view(*h.shape[:-1], rows)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        flat, wp = ctx.saved_tensors
        g = grad.reshape(-1, grad.size(-1))
        dh = torch.mm(g, wp).view(ctx.shape) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            dw = transposed(torch.mm(transposed(flat), g), ctx.w_dtype, columns=ctx.vocab)
            if ctx.link is not None:
                ctx.link.offer(dw)
        return dh, dw, None
