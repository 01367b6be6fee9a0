"""Batched log-probability scoring: how likely is a continuation given a context, under a language model.

Every zero-shot heuristic (paper §5) and lm-eval's ``loglikelihood`` ask one question many times: the sum and count
of the log-probabilities of these continuation tokens after this context. :func:`score` answers it for a list of
:class:`Request` objects at once; the rules are in docs/zeroshot.md. Context and continuation come as separately
tokenized ids, so their boundary never shifts with the tokenizer's merges. Too long an input loses tokens from the
left of its context, and requests sharing a context are truncated together so every candidate sees the same one.
With no context the first continuation token is not scored (nothing predicts it).

Why it is fast: no gradients, rows sorted by length and padded per batch, logits only where they are read, and a
shared context run once — packed with its candidates in one GPT row (``Packing.shared``), or into an LSTM's state
that each candidate continues. Log-softmax is always fp32, so close candidates stay apart.
Every forward pass holds at most ``max_tokens`` tokens: a group of many long candidates is split, its context
repeated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F

from gptcli.progress import SILENT, Progress, staged

if TYPE_CHECKING:
    from gptcli.system import runtime

Precision = Literal["auto", "fp32", "bf16", "fp16"]


@dataclass(frozen=True)
class Request:
    """Score ``continuation`` after ``context`` (both token id sequences)."""

    context: tuple[int, ...]
    continuation: tuple[int, ...]

    @staticmethod
    def of(context: Sequence[int], continuation: Sequence[int]) -> Request:
        return Request(tuple(int(i) for i in context), tuple(int(i) for i in continuation))


@dataclass
class Score:
    """Sum and count of the continuation's token log-probabilities (natural log)."""

    logprob: float = 0.0
    count: int = 0
    truncated: bool = False
    """True when tokens were dropped to fit the context window."""
    greedy: bool = True
    """True when every scored token was the model's most probable next token (argmax over the whole output layer,
    special rows included): what lm-eval calls ``is_greedy``."""

    @property
    def mean(self) -> float:
        """Average token log-probability; ``nan`` when no token was scored."""
        return self.logprob / self.count if self.count else float("nan")


@dataclass
class _Row:
    """One sequence fed to the model and the (position, target token, request) triples read from it."""

    ids: list[int]
    reads: list[tuple[int, int, int]]


def _fit(context: tuple[int, ...], max_cont: int, n_ctx: int) -> tuple[tuple[int, ...], bool]:
    """Left-truncate ``context`` so that context + the longest continuation is at most ``n_ctx + 1`` tokens."""
    budget = n_ctx + 1 - max_cont
    if len(context) <= budget:
        return context, False
    budget = max(budget, 1 if context else 0)
    return context[len(context) - budget :] if budget else (), True


def _plan(requests: Sequence[Request], n_ctx: int, cache_min_context: int):
    """Group requests by context and decide how each group is run.

    Returns ``(rows, cached_groups, truncated)``: plain rows for the batched path, and groups
    ``(context, [(request index, continuation)])`` that run their context once into a KV cache.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault(r.context, []).append(i)
    rows: list[_Row] = []
    cached: list[tuple[tuple[int, ...], list[tuple[int, tuple[int, ...]]]]] = []
    truncated = [False] * len(requests)
    for context, members in groups.items():
        conts = []
        for i in members:
            c = requests[i].continuation
            limit = n_ctx if context else n_ctx + 1
            if len(c) > limit:
                c, truncated[i] = c[:limit], True
            conts.append(c)
        max_cont = max((len(c) for c in conts), default=0)
        ctx, cut = _fit(context, max_cont, n_ctx)
        for i in members:
            truncated[i] = truncated[i] or cut
        a = len(ctx)
        if a and len(members) > 1 and all(len(c) <= 1 for c in conts):
            # One row for the context; every single-token continuation is read at its last position.
            rows.append(_Row(list(ctx), [(a - 1, c[0], i) for i, c in zip(members, conts) if c]))
        elif a >= cache_min_context and len(members) > 1:
            cached.append((ctx, list(zip(members, conts))))
        else:
            for i, c in zip(members, conts):
                seq = list(ctx) + list(c)
                reads = [(a - 1 + j, c[j], i) for j in range(0 if a else 1, len(c))]
                if reads:
                    rows.append(_Row(seq[:-1], reads))
    return rows, cached, truncated


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _precision(device: torch.device, precision: str) -> runtime.Precision:
    from gptcli.system.runtime import resolve_precision

    return resolve_precision(precision, device)


def _autocast(device: torch.device, precision: str):
    from gptcli.system.runtime import autocast

    return autocast(device, _precision(device, precision))


def _read(model, h: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of ``targets`` (N,) from hidden states ``h`` (N, d): logits only where they are read; and
    whether each target is the argmax there.

    Autocast is off here and ``h`` cast back to the weights' dtype: the output projection is a small part of the
    work here (only read positions) and fp32 logits keep close candidates apart.
    """
    with torch.autocast(h.device.type, enabled=False):
        logits = model.lm_logits(h.to(next(model.parameters()).dtype)).float()
    lp = torch.gather(F.log_softmax(logits, dim=-1), 1, targets.unsqueeze(1)).squeeze(1)
    return lp, logits.argmax(dim=-1) == targets


@torch.no_grad()
def score(
    model,
    requests: Sequence[Request],
    *,
    batch_size: int = 32,
    max_tokens: int | None = None,
    precision: Precision = "auto",
    cache_min_context: int | None = None,
    progress: Progress | None = None,
    stage: str = "scoring",
) -> list[Score]:
    """Score every request; results come back in the order of ``requests``.

    ``model`` is a :class:`gptcli.model.gpt.GPT` or :class:`gptcli.model.lstm.LSTMLM` (``config.n_ctx``,
    ``forward(idx, cache)``, ``lm_logits(h)``). ``batch_size`` caps rows per forward pass and ``max_tokens`` (default
    ``batch_size × 128``) padded tokens per pass. Requests sharing a context of at least ``cache_min_context`` tokens
    run it once (default: any context for a GPT, 64 tokens for an LSTM). ``progress`` sees one stage named ``stage``
    of ``len(requests)``, advanced by the requests each pass finishes.
    """
    if not requests:
        return []
    if cache_min_context is None:
        cache_min_context = 1 if _packs(model) else 64
    was_training = model.training
    model.eval()
    try:
        # One autocast region around every pass: it keeps its low-precision copy of each weight from the first pass
        # to the last (the weights do not change here) instead of casting the model again for every pass.
        with staged(progress or SILENT, stage, total=len(requests)), _autocast(_device(model), precision):
            return _score(
                model,
                requests,
                batch_size,
                max_tokens or batch_size * 128,
                precision,
                cache_min_context,
                progress or SILENT,
            )
    finally:
        model.train(was_training)


class _Totals:
    """Running sum and count of log-probabilities per request, reporting finished requests to the progress stage."""

    def __init__(self, n: int, report: Progress) -> None:
        self.sums = torch.zeros(n, dtype=torch.float64)
        self.counts = torch.zeros(n, dtype=torch.long)
        self.misses = torch.zeros(n, dtype=torch.long)
        self.report = report
        self.reported = 0

    def add(self, idx: list[int], read: tuple[torch.Tensor, torch.Tensor]) -> None:
        lp, top = read
        ix = torch.tensor(idx, dtype=torch.long)
        self.sums.index_add_(0, ix, lp.double().cpu())
        self.counts.index_add_(0, ix, torch.ones_like(ix))
        self.misses.index_add_(0, ix, (~top).long().cpu())

    def finished(self, n: int) -> None:
        self.reported += n
        self.report.advance(n)


def _score(model, requests, batch_size, max_tokens, precision, cache_min_context, report: Progress) -> list[Score]:
    rows, cached, truncated = _plan(requests, model.config.n_ctx, cache_min_context)
    totals = _Totals(len(requests), report)
    _score_rows(model, rows, batch_size, max_tokens, precision, totals)
    if _packs(model):
        _score_packed(model, cached, batch_size, max_tokens, precision, totals)
    else:
        _score_cached(model, cached, batch_size, precision, totals)
    if totals.reported < len(requests):
        totals.finished(len(requests) - totals.reported)  # requests with no token to score are done too
    return [
        Score(float(s), int(c), t, m == 0)
        for s, c, t, m in zip(totals.sums.tolist(), totals.counts.tolist(), truncated, totals.misses.tolist())
    ]


def _read_at(model, h: torch.Tensor, reads: list[tuple[int, int, int, int]], totals: _Totals) -> None:
    """Add the log-probabilities read from ``h`` (batch, time, d) at ``(row, position, target, request)``."""
    if not reads:  # a row of contexts whose continuations are all empty
        return
    device = h.device
    rows, pos, tgt, req = (list(x) for x in zip(*reads))
    read = _read(
        model, h[torch.tensor(rows, device=device), torch.tensor(pos, device=device)], torch.tensor(tgt, device=device)
    )
    totals.add(req, read)


def _score_rows(model, rows: list[_Row], batch_size: int, max_tokens: int, precision: str, totals: _Totals) -> None:
    """Plain rows, longest first (the first batch shows the worst-case memory at once), padded per batch."""
    device = _device(model)
    rows.sort(key=lambda r: len(r.ids), reverse=True)
    start = 0
    while start < len(rows):
        longest = len(rows[start].ids)
        take = max(1, min(batch_size, max_tokens // max(longest, 1)))
        batch = rows[start : start + take]
        start += take
        x = torch.zeros(len(batch), longest, dtype=torch.long)
        for b, r in enumerate(batch):
            x[b, : len(r.ids)] = torch.tensor(r.ids, dtype=torch.long)
        with _autocast(device, precision):
            h = model(x.to(device))
        _read_at(model, h, [(b, p, t, i) for b, r in enumerate(batch) for p, t, i in r.reads], totals)
        totals.finished(len({i for r in batch for _, _, i in r.reads}))


def _packs(model) -> bool:
    """Whether ``model`` takes packed rows (a GPT; the LSTM continues a copy of its recurrent state instead)."""
    from gptcli.model.gpt import GPT

    return isinstance(model, GPT)


def _score_packed(model, cached, batch_size: int, max_tokens: int, precision: str, totals: _Totals) -> None:
    """Shared contexts of a GPT, several per forward pass (up to ``batch_size`` contexts and ``max_tokens``
    tokens): one row holding each context once, then its candidates, each attending to its context and causally to
    itself (``Packing.shared``) — the KV-cache continuation's attention, for every group in one call per layer."""
    chunk: list = []
    used = 0
    for ctx, members in cached:
        for part in _parts(ctx, [(i, c) for i, c in members if c], max_tokens):
            cost = len(ctx) + sum(len(c) - 1 for _, c in part)
            if chunk and (used + cost > max_tokens or len(chunk) == batch_size):
                _score_packed_row(model, chunk, precision, totals)
                chunk, used = [], 0
            chunk.append((ctx, part))
            used += cost
    if chunk:
        _score_packed_row(model, chunk, precision, totals)


def _parts(ctx: tuple[int, ...], members: list, max_tokens: int) -> list[list]:
    """A group's candidates in parts that each fit ``max_tokens`` with their context (repeated in every part): one
    group of many long candidates must not become one pass over all of them. A part holds one candidate at least."""
    parts: list[list] = [[]]
    used = len(ctx)
    for i, c in members:
        if parts[-1] and used + len(c) - 1 > max_tokens:
            parts.append([])
            used = len(ctx)
        parts[-1].append((i, c))
        used += len(c) - 1
    return parts


def _score_packed_row(model, groups, precision: str, totals: _Totals) -> None:
    """One packed row of ``groups`` (context, [(request, continuation)]): a continuation's first token is read
    where its context ends, token j ≥ 1 where its own token j − 1 sits; the last block computes those rows only."""
    from gptcli.model.packed import Packing
    from gptcli.model.packed_eval import final_states_at

    device = _device(model)
    prefixes: list[Sequence[int]] = []
    answers: list[list[Sequence[int]]] = []
    rows: list[int] = []
    reads: list[tuple[int, int, int]] = []
    at = 0
    for ctx, members in groups:
        prefixes.append(ctx)
        answers.append([c[:-1] for _, c in members if len(c) > 1])
        if ctx:
            reads.extend((len(rows), c[0], i) for i, c in members)
            rows.append(at + len(ctx) - 1)
        at += len(ctx)
        for i, c in members:
            for j in range(1, len(c)):
                reads.append((len(rows), c[j], i))
                rows.append(at + j - 1)
            at += len(c) - 1
    ids, packing = Packing.shared(prefixes, answers, extract_id=-1)
    with _autocast(device, precision):
        h = final_states_at(
            model,
            torch.tensor([ids], device=device),
            packing.to(device),
            torch.tensor(rows, dtype=torch.long, device=device),
        )
    _read_at(model, h, [(0, r, t, i) for r, t, i in reads], totals)
    totals.finished(sum(len(m) for _, m in groups))


def _score_cached(model, cached, batch_size: int, precision: str, totals: _Totals) -> None:
    """Shared long contexts: run each once into a KV cache, then every candidate continues from a copy of it."""
    from gptcli.model.build import new_cache

    device = _device(model)
    for ctx, members in cached:
        members = [(i, c) for i, c in members if c]
        for s in range(0, len(members), batch_size):
            chunk = members[s : s + batch_size]
            with _autocast(device, precision):
                cache = new_cache(model, 1, device=device, dtype=_cache_dtype(model, device, precision))
                h_ctx = model(torch.tensor([list(ctx)], dtype=torch.long, device=device), cache)[0, -1]
            first = _read(model, h_ctx.expand(len(chunk), -1), torch.tensor([c[0] for _, c in chunk], device=device))
            totals.add([i for i, _ in chunk], first)
            if max(len(c) for _, c in chunk) > 1:
                _continue_from_cache(model, cache, chunk, precision, totals)
            totals.finished(len(chunk))


def _continue_from_cache(
    model, cache, chunk: list[tuple[int, tuple[int, ...]]], precision: str, totals: _Totals
) -> None:
    """Tokens 2… of every continuation in ``chunk``, run together on copies of the context's cache."""
    from gptcli.model.build import repeat_cache

    device = _device(model)
    rest = max(len(c) for _, c in chunk) - 1
    with _autocast(device, precision):
        big = repeat_cache(model, cache, len(chunk))
        x = torch.zeros(len(chunk), rest, dtype=torch.long)
        for b, (_, c) in enumerate(chunk):
            x[b, : len(c) - 1] = torch.tensor(c[:-1], dtype=torch.long)
        h = model(x.to(device), big)
    _read_at(model, h, [(b, j - 1, c[j], i) for b, (i, c) in enumerate(chunk) for j in range(1, len(c))], totals)


def _cache_dtype(model, device: torch.device, precision: str) -> torch.dtype:
    """The dtype keys/values have inside the forward pass (the autocast dtype, else the weights' dtype)."""
    p = _precision(device, precision)
    if p == "bf16":
        return torch.bfloat16
    if p == "fp16":
        return torch.float16
    return next(model.parameters()).dtype
