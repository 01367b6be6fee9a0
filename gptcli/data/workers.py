"""The worker processes of ``gpt1 prepare``: units of work, the pool that runs them in order, and the two jobs.

:func:`text_chunks` cuts a document after line breaks into pieces, each carrying the one bit of state the text
pipeline has across lines (whether ftfy has seen a ``<``), so the pieces' results joined in order equal the whole
document's. :class:`Executor` is an ordered map over warm processes (spaCy is loaded once, before forking) with
small tasks batched together; one worker means no pool, with the same results. A worker ignores Ctrl-C (the main
process terminates the pool and removes the partial output) and dies quietly on SIGTERM. The jobs are
:func:`words_task` (raw text → pipeline lines) and :func:`encode_task` (pipeline lines → BPE ids).
"""

from __future__ import annotations

import multiprocessing as mp
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np


def text_chunks(text: str, size: int) -> Iterator[tuple[str, bool, bool]]:
    """Cut a document after line breaks into pieces of ≥ ``size`` characters (at least one piece).

    Yields ``(piece, html_seen, last)``: ``html_seen`` tells whether a ``<`` occurred earlier in the document,
    the only state ftfy carries from line to line; ``last`` marks the document's final piece.
    """
    start, seen, n = 0, False, len(text)
    if n == 0:
        yield "", False, True
        return
    while start < n:
        end = start + size
        if end < n:
            nl = text.find("\n", end)
            end = n if nl < 0 else nl + 1
        else:
            end = n
        piece = text[start:end]
        yield piece, seen, end == n
        seen = seen or "<" in piece
        start = end


def _warm() -> None:
    from gptcli.tokenizers.text import spacy_tokenizer

    spacy_tokenizer()


def quiet_worker() -> None:
    """A pool worker's signals (its ``initializer``): Ctrl-C is left to the main process, which terminates the pool
    and removes the partial output; SIGTERM (how ``terminate`` stops a worker) ends it quietly, because a forked
    worker inherits the command line's handler, which would print the worker's traceback."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "SIGHUP"):  # the command line's handler too, reaching the workers with the terminal's hangup
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _worker_init() -> None:
    quiet_worker()
    _warm()


def words_task(task: tuple[str, bool, bool]) -> str:
    """Worker: raw text piece → its pipeline lines joined by newlines."""
    from gptcli.tokenizers.text import word_lines

    text, cased, html_seen = task
    return "\n".join(word_lines(text, cased=cased, html_seen=html_seen))


_TOKENIZERS: dict[str, Any] = {}


def encode_task(task: tuple[str, str]) -> np.ndarray:
    """Worker: pipeline lines → ids (newline ids between lines) with the tokenizer saved at ``model_dir``."""
    model_dir, text = task
    # Any tokenizer with ``encode_lines``: prepare refuses the kinds without it before starting workers.
    tok: Any = _TOKENIZERS.get(model_dir)
    if tok is None:
        from gptcli.tokenizers import load_tokenizer

        tok = _TOKENIZERS[model_dir] = load_tokenizer(model_dir)
    return tok.encode_lines(text.split("\n"))


def _run_batch(job: tuple[Callable, list]) -> list:
    fn, args = job
    return [fn(a) for a in args]


class Executor:
    """Ordered map over a pool of warm worker processes, with a bounded number of batches in flight.

    Consecutive small tasks (short .jsonl records, say) travel together in batches of about ``batch_chars``
    characters, so the per-task cost of inter-process messaging stays negligible.
    """

    def __init__(self, workers: int, batch_chars: int) -> None:
        self.workers = workers
        self.batch_chars = batch_chars
        self.pool = None
        _warm()  # loaded before forking, so every worker starts warm
        if workers > 1:
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            self.pool = ctx.Pool(workers, initializer=_worker_init)

    def map(
        self, fn: Callable, tasks: Iterable[tuple[Any, Any]], size: Callable[[Any], int]
    ) -> Iterator[tuple[Any, Any]]:
        """``(meta, arg)`` tasks → ``(meta, fn(arg))`` in task order; ``meta`` stays in this process."""
        if self.pool is None:
            for meta, arg in tasks:
                yield meta, fn(arg)
            return

        def batches() -> Iterator[tuple[list, list]]:
            metas, args, chars = [], [], 0
            for meta, arg in tasks:
                metas.append(meta)
                args.append(arg)
                chars += size(arg)
                if chars >= self.batch_chars:
                    yield metas, args
                    metas, args, chars = [], [], 0
            if metas:
                yield metas, args

        window = 3 * self.workers
        pending: deque = deque()

        def drain_one() -> Iterator[tuple[Any, Any]]:
            metas, result = pending.popleft()
            yield from zip(metas, result.get())

        for metas, args in batches():
            pending.append((metas, self.pool.apply_async(_run_batch, ((fn, args),))))
            if len(pending) >= window:
                yield from drain_one()
        while pending:
            yield from drain_one()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.close(ok=exc_type is None)  # a failure (or Ctrl-C) terminates the workers instead of waiting

    def close(self, ok: bool) -> None:
        if self.pool is not None:
            if ok:
                self.pool.close()
            else:
                self.pool.terminate()
            self.pool.join()
            self.pool = None
