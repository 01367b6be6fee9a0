"""Causal self-attention's inner product, by the path that is fastest for the device, precision and dropout.

``softmax(q·kᵀ/√d + causal mask) · v`` with dropout on the attention probabilities (GPT-1's ``attn_pdrop``) can be
computed by PyTorch's fused ``F.scaled_dot_product_attention`` (SDPA) or written out. They compute the same function
(tests/model/test_attention.py) but not at the same speed, and which is faster depends on where it runs:

- CUDA: SDPA's flash / memory-efficient kernels fuse the mask, the softmax *and the dropout*: always SDPA.
- CPU, fp32, no dropout (evaluation, or ``attn_pdrop = 0``), long sequences: SDPA's fused CPU kernel is fastest.
- CPU with dropout: there is no fused CPU kernel with dropout, so SDPA falls back to its composite "math" path over
  the whole T × T, and under bf16 autocast SDPA is slow even without dropout. Written out over blocks of queries
  (``chunked``), each block against only the keys it can see, the masked upper triangle is neither computed nor
  dropped out: 0.68× SDPA's time in fp32 and 0.54× in bf16 for a training step's attention at T = 512. That was
  most of the gap between our bf16 training step and Hugging Face's, which writes attention out.
- CPU, sequences under ``CHUNK_MIN_LEN`` (fine-tuning, scoring): written out in one block (``plain``).

Measured by benchmarks/attention_paths.py; the run is in docs/performance.md.
:func:`attention_path` is that table; :func:`causal_attention` applies it. ``path=`` forces one (benchmarks, tests).
The dropout is the same Bernoulli(1 − p) mask scaled by 1/(1 − p) on every path, so the choice changes speed and
floating-point rounding, never the model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

PATHS: tuple[str, ...] = ("sdpa", "plain", "chunked")
"""``sdpa``: F.scaled_dot_product_attention. ``plain``: scores, mask, softmax, dropout and the product with v as
separate ops in the inputs' dtype (what Hugging Face's port does). ``chunked``: ``plain`` over ``CHUNKS`` blocks of queries, each against only the keys it can see, so the masked
upper triangle is (mostly) neither computed nor dropped out: 5/8 of the scores at 4 blocks."""

CHUNKS = 4


CPU_PATHS: dict[tuple[torch.dtype, bool], str] = {
    (torch.float32, False): "sdpa",
    (torch.float32, True): "chunked",
    (torch.bfloat16, False): "chunked",
    (torch.bfloat16, True): "chunked",
}
"""The CPU's path per (dtype, dropout on?) from ``CHUNK_MIN_LEN`` tokens on, from benchmarks/attention_paths.py
(docs/performance.md has the run)."""


CHUNK_MIN_LEN = 256
"""On CPU, shorter sequences take ``plain`` whatever the table says: blocks of a few dozen queries cost more in per-op
overhead than the skipped triangle saves, and at these lengths the written-out attention matched or beat SDPA in
every precision, dropout and mode measured (benchmarks/attention_paths.py at T = 64 and 128)."""


def attention_path(device_type: str, dtype: torch.dtype, dropout: float, seq_len: int) -> str:
    """The path :func:`causal_attention` takes for ``seq_len`` queries of ``dtype`` on ``device_type`` (module
    docstring)."""
    if device_type != "cpu":
        return "sdpa"
    if seq_len < CHUNK_MIN_LEN and dtype in (torch.float32, torch.bfloat16):
        return "plain"
    return CPU_PATHS.get((dtype, dropout > 0.0), "sdpa")


_MASKS: dict[torch.device, torch.Tensor] = {}


def _future(t: int, device: torch.device) -> torch.Tensor:
    """(t, t) bool mask of the positions a query must not see (above the diagonal). One mask per device, as long as
    the longest sequence seen, sliced for shorter ones (the upper triangle of a square's top-left corner is the
    corner's own upper triangle), so fine-tuning's many lengths cost one mask, not one each."""
    mask = _MASKS.get(device)
    if mask is None or mask.size(0) < t:
        mask = _MASKS[device] = torch.ones(t, t, dtype=torch.bool, device=device).triu(1)
    return mask[:t, :t]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float = 0.0,
                     path: str | None = None) -> torch.Tensor:
    """Causal attention of ``q``, ``k``, ``v`` (B, H, T, d) with dropout ``dropout`` on the probabilities.

    ``dropout`` is applied as given (the caller passes 0 outside training)."""
    path = path or attention_path(q.device.type, q.dtype, dropout, q.size(-2))
    if path == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    if path not in PATHS:
        raise ValueError(f"unknown attention path {path!r} (known: {', '.join(PATHS)})")
    t = q.size(-2)
    future = _future(t, q.device)
    if path != "chunked":
        return _written_out(q, k, v, future, dropout)
    bounds = [t * i // CHUNKS for i in range(CHUNKS + 1)]
    return torch.cat([_written_out(q[:, :, a:b], k[:, :, :b], v[:, :, :b], future[a:b, :b], dropout)
                      for a, b in zip(bounds, bounds[1:]) if b > a], dim=-2)


def _written_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, future: torch.Tensor, dropout: float) -> torch.Tensor:
    """Attention of queries ``q`` over keys ``k`` with ``future`` (queries × keys) masked out, op by op."""
    # Scaling q (T·d products) rather than the scores (T·T) is the cheaper place for 1/√d.
    scores = (q * (1.0 / math.sqrt(q.size(-1)))) @ k.transpose(-2, -1)
    scores = scores.masked_fill(future, float("-inf"))
    # In the scores' dtype, as Hugging Face's port under autocast: bf16 probabilities in a bf16 run (a fp32 softmax
    # measured slower, and the product with v is taken in bf16 either way).
    probs = F.dropout(torch.softmax(scores, dim=-1), p=dropout, training=dropout > 0.0)
    return probs @ v
