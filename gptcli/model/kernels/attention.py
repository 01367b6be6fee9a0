"""Causal self-attention written out on CPU, over blocks of queries, with a hand-written backward.

Reference: ``F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)`` (gptcli/model/attention.py):
the same function (tests/model/test_attention.py), not the same speed. Why: on CPU SDPA has no fused kernel with
dropout and falls back to its "math" path over the whole T × T, and is slow under bf16 autocast even without.
Written out over blocks of queries (``chunked``), each block against only the keys it can see, the masked upper
triangle is neither computed nor dropped out, and the mask and 1/√d ride on the score product; where the compiled
library serves the dtype, its softmax applies the mask and the dropout in the same pass (``softmax.cpp``). Short
sequences take one block (``plain``); fp32 takes ``fused`` (``fused_attention.cpp``: a block start to end in one
call, recomputed in the backward instead of kept); other dtypes take SDPA. Figures: docs/performance.md, "Kernels".

:func:`attention_path` is that table; :func:`causal_attention` applies it; ``path=`` forces one (benchmarks,
tests). Every path drops units by a Bernoulli(1 − p) mask scaled by 1/(1 − p), so the choice changes speed,
rounding and which units a seed drops, never the model.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from gptcli.model.kernels import native
from gptcli.model.kernels.dropout import Mask, draw_seed, threshold
from gptcli.system.runtime import product_dtype

PATHS: tuple[str, ...] = ("sdpa", "plain", "chunked", "fused")
"""``sdpa``: F.scaled_dot_product_attention. ``plain``: scores, mask, softmax, dropout and the product with v as
separate ops in the inputs' dtype (what Hugging Face's port does). ``chunked``: ``plain`` over blocks of
``CHUNK_ROWS`` queries, each against only the keys it can see, so the masked upper triangle is (mostly) neither
computed nor dropped out: 5/8 of the scores at T = 512. ``fused`` (causal, :data:`FUSED_DTYPES`, where the compiled
library has it): blocks of ``FUSED_ROWS`` queries each computed start to end in one compiled call, their scores never
leaving the cache, and computed again in the backward pass instead of kept (:class:`_FusedAttention`)."""

CHUNK_ROWS = 128
"""Queries per block of the ``chunked`` path (T = 512: 4 blocks): at T = 256 and 512 the fastest block size, or
within noise of it, in every precision, dropout and mode measured."""


CPU_PATHS: dict[tuple[torch.dtype, bool], str] = {
    (torch.float32, False): "chunked",
    (torch.float32, True): "chunked",
    (torch.bfloat16, False): "chunked",
    (torch.bfloat16, True): "chunked",
}
"""The CPU's path per (dtype, dropout on?) from ``CHUNK_MIN_LEN`` tokens on: the fastest measured
(docs/performance.md, "Kernels"). Other dtypes (fp16 on CPU: not measured) take SDPA."""


STRIDED_DTYPES: tuple[torch.dtype, ...] = (torch.float32,)
"""Dtypes whose batched products read strided operands in place (fp32's BLAS): they take :class:`_BlockedAttention`
over one (B·H, T, d) copy of q, k and v, slicing blocks out of it. Every other dtype (bf16, whose products oneDNN
runs and copies any operand that is not dense) takes :class:`_DenseBlockedAttention`. Add bf16 here to time the strided
layout against the dense one."""


COMPILED_SOFTMAX = True
"""Whether the compiled softmax forward (``softmax.cpp``: softmax, causal mask and dropout in one pass per row) runs
where the library serves the dtype; False keeps ``torch.softmax``, the additive mask and :meth:`Mask.apply` (the
same function, PyTorch's rounding): set it False to time the two."""


FUSED_DTYPES: tuple[torch.dtype, ...] = (torch.float32,)
"""Dtypes the ``fused`` path computes (``fused_attention.cpp``, whose products are the BLAS's ``sgemm``): fp32. bf16
keeps ``chunked`` (:class:`_DenseBlockedAttention`, oneDNN's AMX products). Empty it to time ``chunked`` against
``fused``."""

FUSED_ROWS = 64
"""Queries per block of the ``fused`` path: a block's scores against 512 keys are 128 kB of float32, inside a core's
L2 cache with the block's products' operands."""


CHUNK_MIN_LEN = 256
"""On CPU, shorter sequences take ``plain`` whatever the table says: blocks of a few dozen queries cost more in per-op
overhead than the skipped triangle saves, and at these lengths the written-out attention matched or beat SDPA in
every precision, dropout and mode measured (T = 64 and 128)."""


def attention_path(device_type: str, dtype: torch.dtype, dropout: float, seq_len: int) -> str:
    """The path :func:`causal_attention` takes for ``seq_len`` queries of ``dtype`` on ``device_type`` (module
    docstring): ``fused`` where it computes the dtype, else :func:`written_out_path`."""
    if device_type == "cpu" and _fused_library(device_type, dtype) is not None:
        return "fused"
    return written_out_path(device_type, dtype, dropout, seq_len)


def written_out_path(device_type: str, dtype: torch.dtype, dropout: float, seq_len: int) -> str:
    """The path without ``fused``: :data:`CPU_PATHS` from ``CHUNK_MIN_LEN`` tokens on, ``plain`` below, ``sdpa``
    off the CPU and for unmeasured dtypes. What a mask other than the causal one takes (:func:`masked_attention`)."""
    if device_type != "cpu":
        return "sdpa"
    if seq_len < CHUNK_MIN_LEN and dtype in (torch.float32, torch.bfloat16):
        return "plain"
    return CPU_PATHS.get((dtype, dropout > 0.0), "sdpa")


_CAUSAL_BIASES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _causal_bias(t: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(t, t) additive causal mask: 0 where a query may look, −inf above the diagonal. One per device and dtype, as
    long as the longest sequence seen, sliced for shorter ones (the upper triangle of a square's top-left corner is
    the corner's own upper triangle), so fine-tuning's many lengths cost one mask, not one each."""
    bias = _CAUSAL_BIASES.get((device, dtype))
    if bias is None or bias.size(0) < t:
        bias = _CAUSAL_BIASES[(device, dtype)] = torch.full((t, t), float("-inf"), device=device, dtype=dtype).triu(1)
    return bias[:t, :t]


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout: float = 0.0,
    path: str | None = None,
    block_rows: int | None = None,
) -> torch.Tensor:
    """Causal attention of ``q``, ``k``, ``v`` (B, H, T, d) with dropout ``dropout`` on the probabilities.

    ``dropout`` is applied as given (the caller passes 0 outside training). ``path`` forces a path, ``block_rows``
    the ``chunked`` path's queries per block (default ``CHUNK_ROWS``).
    Callers that hold q, k and v as one tensor call :func:`stacked_causal_attention` (no stacking copy)."""
    path = path or attention_path(q.device.type, q.dtype, dropout, q.size(-2))
    if path == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    return stacked_causal_attention(torch.stack((q, k, v)), dropout, path, block_rows)


def stacked_causal_attention(
    x: torch.Tensor, dropout: float = 0.0, path: str | None = None, block_rows: int | None = None
) -> torch.Tensor:
    """:func:`causal_attention` of ``x`` (3, B, H, T, d): q, k and v stacked, any strides. A view of the fused
    projection (``qkv.view(B, T, 3, H, d).permute(2, 0, 3, 1, 4)``) gets its gradient in that projection's layout,
    with no copy to assemble it (in bf16, :class:`_DenseBlockedAttention`)."""
    path = path or attention_path(x.device.type, x.dtype, dropout, x.size(-2))
    if path == "sdpa":
        q, k, v = x.unbind(0)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    if path not in PATHS:
        raise ValueError(f"unknown attention path {path!r} (known: {', '.join(PATHS)})")
    return _written_out(x, _causal_bias, dropout, path, block_rows)


def masked_attention(x: torch.Tensor, bias: torch.Tensor, dropout: float = 0.0) -> torch.Tensor | None:
    """Attention of q, k, v stacked in ``x`` (3, B, H, T, d) under an additive mask ``bias`` (B·H, T, T) that is
    causal and more (a shared-prefix grid's: each answer also blind to the other answers), with dropout ``dropout``
    on the probabilities: the reference is ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
    dropout_p=dropout)`` (gptcli/model/packed.py). Blocks of queries see only the keys up to their last, as
    :func:`causal_attention`'s; ``bias`` must be in the dtype the products run in (the autocast dtype, else
    ``x``'s). None where the dtype has no written-out path (the caller takes SDPA)."""
    # The fused path's mask is the causal one only: a grid's own mask takes the written-out blocks.
    path = written_out_path(x.device.type, x.dtype, dropout, x.size(-2))
    if path == "sdpa":
        return None
    return _written_out(x, lambda t, device, dtype: bias.to(dtype), dropout, path, None)


def _written_out(x: torch.Tensor, bias_of, dropout: float, path: str, block_rows: int | None) -> torch.Tensor:
    """The written-out attention of q, k, v stacked in ``x`` (3, B, H, T, d) on ``path`` (``plain`` or
    ``chunked``), the additive mask ``bias_of(T, device, dtype)`` in the dtype the products run in: (B, H, T, d)."""
    _, B, H, t, d = x.shape
    device = x.device.type
    # Under autocast the written-out products run in the autocast dtype (as they would op by op); the function
    # itself then runs with autocast off, on inputs already in that dtype.
    dtype = product_dtype(x)
    x = x.to(dtype)
    if path == "fused":
        if bias_of is not _causal_bias or _fused_library(device, dtype) is None:
            raise ValueError("the fused attention path computes the causal mask, in FUSED_DTYPES, with the library")
        return _fused(x, dropout)
    blocks = max(1, t // (block_rows or CHUNK_ROWS)) if path == "chunked" else 1
    bounds = tuple(t * i // blocks for i in range(blocks + 1))
    # A causal mask is the compiled softmax's own (no bias) where the library serves the dtype (_probabilities).
    causal = bias_of is _causal_bias and COMPILED_SOFTMAX and _softmax_library(x) is not None
    bias = None if causal else bias_of(t, x.device, dtype)
    with torch.autocast(device, enabled=False):
        if dtype not in STRIDED_DTYPES:
            # oneDNN's products (bf16) copy every operand that is not one dense matrix per batch row: there each
            # block's operands are laid out dense once, inside the function (_DenseBlockedAttention).
            return _DenseBlockedAttention.apply(x, bias, dropout, bounds)
        # One (B·H, T, d) copy of each (q, k, v are strided views of the fused projection): every block's batched
        # matmuls then read contiguous slices instead of copying their own.
        q, k, v = (y.reshape(B * H, t, d) for y in x.unbind(0))
        out = _BlockedAttention.apply(q, k, v, bias, dropout, bounds)
    return out.view(B, H, t, d)


def _probabilities(
    q: torch.Tensor,
    kt: torch.Tensor,
    bias: torch.Tensor | None,
    a: int,
    alpha: float,
    dropout: float,
    probs: list[torch.Tensor],
    masks: list[Mask],
    dropped: list[torch.Tensor],
) -> torch.Tensor:
    """A block's attention probabilities from its queries ``q`` (N, rows, d) and keys ``kt`` (N, d, keys), the
    block's first query at position ``a``: appended to ``probs`` (and, with dropout, its :class:`Mask` to ``masks``
    and the dropped-out probabilities, unscaled, to ``dropped``); returns what multiplies v.

    ``bias`` is the additive mask over all positions, or None for the causal mask (only where the compiled softmax
    serves the dtype). 1/√d rides on the score product as its alpha, and an additive mask as its input: the matmul
    applies both as it writes the scores, where a masked_fill and a scaling would each be another pass. Where the
    compiled library serves the dtype, the softmax, the causal mask and the dropout are one pass per row over the
    scores (``softmax.cpp``: p over the scores, the dropped-out copy beside, the mask's bits those of
    :meth:`Mask.apply`); elsewhere ``torch.softmax`` and :meth:`Mask.apply`. The softmax is in the scores' dtype, as
    Hugging Face's port under autocast (a fp32 softmax measured slower, and the product with v is taken in bf16
    either way)."""
    lib = _softmax_library(q)
    if bias is None:
        scores = torch.baddbmm(q.new_empty(q.size(0), q.size(1), kt.size(2)), q, kt, beta=0.0, alpha=alpha)
    else:
        scores = torch.baddbmm(bias[..., a : a + q.size(1), : kt.size(2)], q, kt, alpha=alpha)
    mask = Mask(scores.shape, dropout, scores.device, scores.dtype) if dropout > 0.0 else None
    if COMPILED_SOFTMAX and lib is not None and (mask is None or mask.seed is not None):
        d = torch.empty_like(scores) if mask is not None else None
        seed, limit = (mask.seed, threshold(dropout)) if mask is not None else (0, 0)
        p = lib.softmax_forward(scores, d, seed, limit, a if bias is None else -1)
    else:
        if bias is None:  # a causal block without the compiled softmax: its mask's rows (keys = a + rows)
            scores.add_(_causal_bias(kt.size(2), scores.device, scores.dtype)[a:])
        p = torch.softmax(scores, dim=-1)
        # Kept for the backward pass (the value gradient's product), which would otherwise redo this pass.
        d = mask.apply(p) if mask is not None else None
    probs.append(p)
    if mask is not None:
        dropped_p = cast(torch.Tensor, d)  # both branches above fill d wherever there is a mask
        masks.append(mask)
        dropped.append(dropped_p)
        return dropped_p
    return p


def _softmax_library(x: torch.Tensor):
    """The compiled library when its softmax forward and backward (``softmax.cpp``, AVX-512 or AVX2) take ``x``'s
    dtype here, else ``None`` (PyTorch's ops then)."""
    return native.vector_library_for(x.device, x.dtype)


@torch.compiler.disable  # the library's lookup and its pybind query are opaque to dynamo: run them eagerly
def _fused_library(device_type: str, dtype: torch.dtype):
    """The compiled library where it computes the ``fused`` path for ``dtype`` here (:data:`FUSED_DTYPES`, built with
    its vector loops and a BLAS ``sgemm`` to call), else ``None``."""
    if dtype not in FUSED_DTYPES:
        return None
    lib = native.vector_library_for(device_type, dtype)
    return lib if lib is not None and lib.fused_attention_available() else None


def _transposed(x: torch.Tensor, blocks: int) -> torch.Tensor:
    """``x`` (N, T, d) as (N, d, T) for the products of every block. In bf16 with several blocks, one contiguous copy:
    oneDNN's products would otherwise copy their transposed operand once per block (docs/performance.md, "Kernels").
    fp32's BLAS reads the transposed view as it is, and one block copies it once either way."""
    xt = x.transpose(1, 2)
    return xt if x.dtype == torch.float32 or blocks == 1 else xt.contiguous()


class _BlockedAttention(torch.autograd.Function):
    """Attention of ``q``, ``k``, ``v`` (N, T, d) over query blocks ``bounds``, each block against only the keys it
    can see, with a hand-written backward.

    Autograd over the same ops cost a T × T pass more per op than needed: each block's slice of k and v sent back
    a zero-filled full-size gradient to be summed (``SliceBackward``), the bool dropout mask was converted to the
    activation dtype on every use, and the transposed keys were copied per block. Here the keys are transposed once,
    the mask is drawn in the activation's dtype, and each block's key and value gradients accumulate in place into
    their slice. ``bias`` is the additive mask: (T, T) for every row of the batch (causal), or (N, T, T) one each
    (a shared-prefix grid's, :func:`masked_attention`)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, dropout: float, bounds: tuple[int, ...]):
        alpha = 1.0 / math.sqrt(q.size(-1))
        kt = _transposed(k, len(bounds) - 1)
        parts: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        masks: list[Mask] = []
        dropped: list[torch.Tensor] = []
        for a, b in zip(bounds, bounds[1:]):
            p = _probabilities(q[:, a:b], kt[:, :, :b], bias, a, alpha, dropout, probs, masks, dropped)
            parts.append(torch.bmm(p, v[:, :b]))
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        if dropout > 0.0:
            # Dropout's 1/(1 − p) is applied to the output (queries × d) rather than the probabilities (queries ×
            # keys): the same product, one pass over a tensor T/d times smaller.
            out.mul_(1.0 / (1.0 - dropout))
        ctx.save_for_backward(q, k, v, *probs, *dropped)
        ctx.alpha, ctx.dropout, ctx.bounds, ctx.masks = alpha, dropout, bounds, masks
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, *saved = ctx.saved_tensors
        n = len(ctx.bounds) - 1
        probs, dropped, masks = saved[:n], saved[n:], ctx.masks
        if ctx.dropout > 0.0:
            grad = grad * (1.0 / (1.0 - ctx.dropout))
        grad = grad.contiguous()
        vt = _transposed(v, n)
        # fp32's BLAS runs a product accumulated into a strided slice matrix by matrix (the query gradient's and the
        # key gradient's): there the products go to fresh tensors, added after (the same sums, bit for bit).
        fresh = q.dtype == torch.float32
        dq, dk, dv = [] if fresh else torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        lib = _softmax_library(q)
        for i, (a, b) in enumerate(zip(ctx.bounds, ctx.bounds[1:])):
            p, g = probs[i], grad[:, a:b]
            d = dropped[i] if masks else p
            dv[:, :b].baddbmm_(d.transpose(1, 2), g)
            dp = torch.bmm(g, vt[:, :, :b])
            ds = _softmax_grad(lib, dp, p, dropped[i] if masks else None, masks[i] if masks else None)
            if fresh:
                dq.append(torch.bmm(ds, k[:, :b]).mul_(ctx.alpha))
                dk[:, :b].add_(torch.bmm(ds.transpose(1, 2), q[:, a:b]), alpha=ctx.alpha)
            else:
                dq[:, a:b].baddbmm_(ds, k[:, :b], alpha=ctx.alpha)
                dk[:, :b].baddbmm_(ds.transpose(1, 2), q[:, a:b], alpha=ctx.alpha)
        if fresh:
            dq = dq[0] if n == 1 else torch.cat(dq, dim=1)
        return dq, dk, dv, None, None, None


@torch.compiler.disable  # under torch.compile (--compile), run eagerly between graphs: a pybind call is opaque to it
def _fused(x: torch.Tensor, dropout: float) -> torch.Tensor:
    with torch.autocast(x.device.type, enabled=False):
        return _FusedAttention.apply(x, dropout)


class _FusedAttention(torch.autograd.Function):
    """Causal attention of q, k, v stacked in ``x`` (3, B, H, T, d), any strides with rows of d contiguous (the
    fused projection's view), by ``fused_attention.cpp``: per block of ``FUSED_ROWS`` queries the scores, softmax,
    dropout and product with v in one compiled call while the block is in cache, and in the backward pass the
    probabilities computed again from q, k and each row's log-sum-exp (kept: B·H·T floats) instead of read back.
    Nothing T × T is kept between the passes (the written-out path keeps the probabilities and their dropped-out
    copy: 60 MB per GPT-1 layer at 4 × 512 in fp32). The dropout is a Bernoulli(1 − p) mask scaled by 1/(1 − p)
    whose bits are those a (B·H, T, T) :class:`Mask` of the same seed draws. Returns a (B, H, T, d) view of a
    (B, T, H, d) tensor, the layout the output projection reads; the input's gradient comes in the input's own
    strides (a permuted view of the fused projection), as :class:`_DenseBlockedAttention`'s."""

    @staticmethod
    def forward(ctx, x, dropout: float):
        if x.stride(-1) != 1:  # the kernel reads rows of d in place
            x = x.contiguous()
        q, k, v = x.unbind(0)
        B, H, T, d = q.shape
        out = q.new_empty(B, T, H, d).transpose(1, 2)
        lse = q.new_empty(B, H, T)
        seed, limit = (draw_seed(x.device), threshold(dropout)) if dropout > 0.0 else (0, 0)
        scale = 1.0 / (1.0 - dropout)
        native.built().fused_attention_forward(q, k, v, out, lse, seed, limit, scale, FUSED_ROWS)
        ctx.save_for_backward(x, out, lse)
        ctx.seed, ctx.limit, ctx.scale = seed, limit, scale
        ctx.layout = torch.empty_like(x, device="meta")
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, out, lse = ctx.saved_tensors
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        dx = torch.empty_strided(ctx.layout.shape, ctx.layout.stride(), dtype=grad.dtype, device=grad.device)
        native.built().fused_attention_backward(
            *x.unbind(0), out, grad, lse, *dx.unbind(0), ctx.seed, ctx.limit, ctx.scale, FUSED_ROWS
        )
        return dx, None


def _dense(x: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """Rows ``a:b`` of ``x`` (B, H, T, d) as one dense (B·H, b − a, d) tensor: a view where ``x`` already is one,
    else one copy."""
    B, H, _, d = x.shape
    return x[:, :, a:b].reshape(B * H, b - a, d).contiguous()


def _write(dst: torch.Tensor, src: torch.Tensor, scale: float) -> None:
    """``dst`` (B, H, T', d), any strides, ← ``src`` (B·H, T', d) · ``scale``, in one pass."""
    torch.mul(src.view(dst.shape), scale, out=dst)


class _DenseBlockedAttention(torch.autograd.Function):
    """:class:`_BlockedAttention` for products run by oneDNN (bf16 on CPU), over operands laid out dense per block.

    oneDNN takes a batch of matrices only as one dense tensor (or its transpose): any other layout, a block's slice
    of the queries, a prefix of the keys, a slice of an output accumulated into, is copied on every product,
    forward and backward, and on CPUs with AMX tiles those copies were a large part of a bf16 attention layer
    (docs/performance.md, "Kernels"). Here each block's queries and the key and value prefixes it sees are copied
    dense once, from the projection's strided views, and serve the forward and backward products alike (the
    prefixes cost (1 + 2 + … + n)/n = (n + 1)/2 times k and v in copies and memory at n blocks); the output and the
    input gradients are written straight into (B, T, H, d) tensors, the layout the output projection and the fused
    q, k, v projection read, so no transpose is copied after; the key and value gradients are summed from each
    block's fresh product.
    Input q, k, v stacked (3, B, H, T, d), any strides; returns a (B, H, T, d) view of a (B, T, H, d) tensor, and
    the input's gradient in the input's own layout where that is dense (a permuted view of the fused projection)."""

    @staticmethod
    def forward(ctx, x, bias, dropout: float, bounds: tuple[int, ...]):
        q, k, v = x.unbind(0)
        B, H, T, d = q.shape
        alpha, scale = 1.0 / math.sqrt(d), 1.0 / (1.0 - dropout)
        pairs = list(zip(bounds, bounds[1:]))
        qs = [_dense(q, a, b) for a, b in pairs]
        ks = [_dense(k, 0, b) for _, b in pairs]
        vs = [_dense(v, 0, b) for _, b in pairs]
        out = q.new_empty(B, T, H, d)
        probs: list[torch.Tensor] = []
        masks: list[Mask] = []
        dropped: list[torch.Tensor] = []
        for i, (a, b) in enumerate(pairs):
            # As _BlockedAttention; 1/(1 − p) rides on the output's copy.
            p = _probabilities(qs[i], ks[i].transpose(1, 2), bias, a, alpha, dropout, probs, masks, dropped)
            _write(out[:, a:b].transpose(1, 2), torch.bmm(p, vs[i]), scale)
        ctx.save_for_backward(*qs, *ks, *vs, *probs, *dropped)
        ctx.alpha, ctx.scale, ctx.pairs, ctx.masks = alpha, scale, pairs, masks
        # The gradient's layout, no memory: empty_like keeps a dense input's strides (else it is contiguous).
        ctx.layout = torch.empty_like(x, device="meta")
        return out.transpose(1, 2)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        n, pairs = len(ctx.pairs), ctx.pairs
        saved = ctx.saved_tensors
        qs, ks, vs, probs, dropped = (saved[i * n : (i + 1) * n] for i in range(5))
        B, H, T, d = grad.shape
        dx = torch.empty_strided(ctx.layout.shape, ctx.layout.stride(), dtype=grad.dtype, device=grad.device)
        dq, dk, dv = dx.unbind(0)
        lib = _softmax_library(grad)
        # Largest block first: its key and value gradients (every key) are written, the others' added onto them.
        for i in reversed(range(n)):
            a, b = pairs[i]
            g = grad.new_empty(B * H, b - a, d)
            torch.mul(grad[:, :, a:b], ctx.scale, out=g.view(B, H, b - a, d))
            p, drop, mask = probs[i], dropped[i] if ctx.masks else None, ctx.masks[i] if ctx.masks else None
            _sum_into(dv[:, :, :b], torch.bmm((p if drop is None else drop).transpose(1, 2), g), 1.0, first=b == T)
            dp = torch.bmm(g, vs[i].transpose(1, 2))
            ds = _softmax_grad(lib, dp, p, drop, mask)
            _write(dq[:, :, a:b], torch.bmm(ds, ks[i]), ctx.alpha)
            _sum_into(dk[:, :, :b], torch.bmm(ds.transpose(1, 2), qs[i]), ctx.alpha, first=b == T)
        return dx, None, None, None


def _sum_into(dst: torch.Tensor, src: torch.Tensor, scale: float, first: bool) -> None:
    """``dst`` (B, H, T', d) ← (or +=, unless ``first``) ``src`` (B·H, T', d) · ``scale``."""
    if first:
        _write(dst, src, scale)
    else:
        dst.add_(src.view(dst.shape), alpha=scale)


def _softmax_grad(lib, dp: torch.Tensor, p: torch.Tensor, dropped: torch.Tensor | None, mask: Mask | None):
    """The scores' gradient from the (dropped-out) probabilities' ``dp``: ``d ⊙ dp − p · Σ(d ⊙ dp)``, ``d`` the
    dropped probabilities ``dropped`` (``p`` without dropout), over ``dp``."""
    if lib is not None:
        # In one compiled pass per row (softmax.cpp): the same function as either branch below, with three passes
        # over the block fewer.
        return lib.softmax_backward(dp, p if dropped is None else dropped, p)
    if dropped is not None and p.dtype == torch.float32:
        # Through the dropout from the forward's dropped probabilities (kept for the value gradient), no mask drawn
        # again. In fp32 faster than masking dp and then _softmax_backward_data; in bf16 slower (its elementwise
        # passes are PyTorch's slower bf16 ones), so bf16 keeps that path.
        t = dp.mul_(dropped)
        return t.addcmul_(p, t.sum(-1, keepdim=True), value=-1.0)
    if mask is not None:
        dp = mask.apply(dp, inplace=True)
    return torch._softmax_backward_data(dp, p, -1, p.dtype)
