"""Language-model loss and perplexity of a model on a prepared corpus split.

Every token of the split except the first of each shard is predicted exactly once: shards are read in windows of
``seq_len + 1`` tokens on a stride of ``seq_len`` (the first ``seq_len`` tokens are the context, the last
``seq_len`` the targets), and the tail shorter than a window is covered by one last window aligned to the shard's
end whose already-scored targets are masked out. Perplexity is ``exp`` of the mean token negative log-likelihood
(token-level, over the corpus's own BPE tokens — the paper's 18.4 is of that kind, on BooksCorpus).

:func:`evaluate_lm` scores one model (pretraining validates with it); :func:`corpus_perplexity` opens a prepared
corpus and scores checkpoints on one of its splits (``gpt1 eval --data``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gptcli.checkpoint import TOKENIZER, load_checkpoint, read_header, resolve_checkpoint, verify_checkpoint
from gptcli.data.shards import Corpus, open_corpus, tokenizer_fingerprint
from gptcli.errors import GPT1Error
from gptcli.model.build import LanguageModel
from gptcli.model.kernels import apply as apply_kernels
from gptcli.model.kernels import use_kernels
from gptcli.model.losses import IGNORE
from gptcli.progress import SILENT, Progress, staged
from gptcli.system.runtime import Precision, autocast, resolve_device, resolve_precision


@dataclass
class LMEval:
    loss: float
    """Mean next-token negative log-likelihood (nats)."""
    tokens: int
    """Number of predicted tokens."""

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss) if self.loss < 700 else float("inf")


def eval_windows(arrays: Sequence[np.ndarray], seq_len: int) -> Iterator[tuple[np.ndarray, int]]:
    """Yield ``(window of ≤ seq_len+1 tokens, number of leading targets to ignore)`` covering every shard."""
    for a in arrays:
        n = len(a)
        if n < 2:
            continue
        if n <= seq_len + 1:  # sliced all the same: a slice is what checks a mapped shard is whole (ShardTokens)
            yield np.asarray(a[:n], dtype=np.int64), 0
            continue
        start = 0
        while start + seq_len + 1 <= n:
            yield np.asarray(a[start : start + seq_len + 1], dtype=np.int64), 0
            start += seq_len
        scored_until = start  # targets 1..start are scored (target index = token index)
        if scored_until < n - 1:
            s = n - seq_len - 1
            yield np.asarray(a[s:], dtype=np.int64), scored_until - s


@torch.no_grad()
def evaluate_lm(
    model: LanguageModel,
    arrays: Sequence[np.ndarray],
    seq_len: int,
    batch_size: int = 8,
    *,
    device: torch.device | str = "cpu",
    precision: Precision = "fp32",
    max_batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> LMEval:
    """Mean loss over the split (or over its first ``max_batches`` batches).

    With ``world_size > 1`` this process scores only batches ``rank, rank + world_size, …`` of that same sequence
    (data-parallel validation); combine the ranks' results weighted by ``tokens``."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    for i, items in enumerate(eval_batches(arrays, seq_len, batch_size, max_batches)):
        if i % world_size == rank:
            nll, n = _batch_nll(model, items, device, precision)
            total += nll
            count += n
    model.train(was_training)
    if count == 0:
        return LMEval(float("nan"), 0)
    return LMEval(float(total.item() / count), count)


def eval_batches(
    arrays: Sequence[np.ndarray], seq_len: int, batch_size: int, max_batches: int | None = None
) -> Iterator[list[tuple[np.ndarray, int]]]:
    """:func:`eval_windows` in batches of up to ``batch_size`` (the first ``max_batches`` of them)."""
    pending: list[tuple[np.ndarray, int]] = []
    made = 0
    for w, skip in eval_windows(arrays, seq_len):
        # Windows of unequal length (a short shard) are run on their own.
        if pending and len(w) != len(pending[0][0]):
            yield pending
            made, pending = made + 1, []
        pending.append((w, skip))
        if len(pending) == batch_size:
            yield pending
            made, pending = made + 1, []
        if max_batches is not None and made >= max_batches:
            return
    if pending:
        yield pending


def _batch_nll(
    model: LanguageModel, items: list[tuple[np.ndarray, int]], device: torch.device, precision: Precision
) -> tuple[torch.Tensor, int]:
    """Summed next-token NLL (float64, on ``device``) of one batch of windows, and the number of targets scored."""
    x = torch.stack([torch.from_numpy(w[:-1]) for w, _ in items]).to(device)
    y = torch.stack([torch.from_numpy(w[1:]) for w, _ in items]).clone()
    for row, (_, skip) in enumerate(items):
        y[row, :skip] = IGNORE
    y = y.to(device)
    with autocast(device, precision):
        logits = model.lm_logits(model(x))
    nll = model.next_token_nll(logits, y, reduction="sum")  # the model's loss (the kernels' where applied)
    return nll.double(), int((y != IGNORE).sum())


@dataclass
class CheckpointPerplexity:
    """One checkpoint's score on a corpus split."""

    checkpoint: Path
    step: int | None
    """The pretraining update the checkpoint was saved at (None when its header does not say)."""
    loss: float
    """Mean next-token negative log-likelihood (nats)."""
    perplexity: float
    tokens: int
    """Number of predicted tokens."""


def corpus_perplexity(
    checkpoints: Sequence[str | Path],
    data: str | Path,
    split: str = "val",
    *,
    batch_size: int = 8,
    seq_len: int | None = None,
    device: str = "auto",
    precision: str = "fp32",
    max_batches: int | None = None,
    verify: bool = True,
    kernels: str | None = None,
    progress: Progress | None = None,
) -> list[CheckpointPerplexity]:
    """Loss and perplexity of each checkpoint on ``split`` of the prepared corpus ``data`` (windows of ``seq_len``,
    default the length each run trained at (:func:`trained_seq_len`), else the model's context; a longer one is
    refused). ``verify`` checks the shard checksums and each checkpoint's file checksums first. A checkpoint trained
    with another tokenizer than the corpus's is refused: its perplexity on these ids would mean nothing; one without
    a tokenizer is scored with a warning note (it cannot be compared). ``kernels``: the mode the model computes in
    (``None``: the mode in force); the caller's is back afterwards (:func:`gptcli.model.kernels.use_kernels`)."""
    with use_kernels(kernels):
        return _corpus_perplexity(
            checkpoints, data, split, batch_size, seq_len, device, precision, max_batches, verify, progress or SILENT
        )


def _corpus_perplexity(
    checkpoints: Sequence[str | Path],
    data: str | Path,
    split: str,
    batch_size: int,
    seq_len: int | None,
    device: str,
    precision: str,
    max_batches: int | None,
    verify: bool,
    report: Progress,
) -> list[CheckpointPerplexity]:
    corpus = open_corpus(data)
    if verify:
        problems = corpus.verify()
        if problems:
            raise GPT1Error(problems[0])
    arrays = corpus.arrays(split)
    dev = resolve_device(device)
    prec = resolve_precision(precision, dev)
    vocab = _corpus_vocab(corpus)
    paths = [resolve_checkpoint(c) for c in checkpoints]
    for path in paths:  # every checkpoint before any is scored: a refusal comes first, and alone
        _check_checkpoint(path, corpus, verify, seq_len, report)
    rows = []
    with staged(report, f"perplexity on {split}", len(paths), unit="checkpoints"):
        for path in paths:
            ck = load_checkpoint(path, map_location=dev, load_tokenizer=False, verify=False)  # verified above
            if vocab is not None and vocab > ck.config.total_vocab:
                raise GPT1Error(
                    f"{ck.path}: model vocabulary ({ck.config.total_vocab}) is smaller than the corpus's ({vocab}); "
                    "was the corpus prepared with another tokenizer?"
                )
            corpus.check_token_ids(split, ck.config.total_vocab)
            # At most n_ctx: _check_checkpoint refused a longer one.
            n = seq_len or min(trained_seq_len(ck.path) or ck.config.n_ctx, ck.config.n_ctx)
            model = apply_kernels(ck.model, dev)
            res = evaluate_lm(model, arrays, n, batch_size, device=dev, precision=prec, max_batches=max_batches)
            step = ck.meta.get("step")
            rows.append(
                CheckpointPerplexity(ck.path, None if step is None else int(step), res.loss, res.perplexity, res.tokens)
            )
            report.advance(1, loss=res.loss)
    return rows


def trained_seq_len(checkpoint: Path) -> int | None:
    """The window a pretraining run trained its checkpoint ``RUN/checkpoints/step-N`` at (``seq_len`` in
    ``RUN/config.toml``), or None. Scoring a model trained on 128-token windows at its full 512-token context
    measures positions it never learned, so the run's own length is the default window."""
    from gptcli.config import read_config_file

    config = checkpoint.parent.parent / "config.toml"
    if checkpoint.parent.name != "checkpoints" or not config.is_file():
        return None
    try:
        value = read_config_file(config).get("seq_len")
    except GPT1Error:
        return None  # a damaged run config is the run's problem: the model's context is still a valid default
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _check_checkpoint(checkpoint: Path, corpus: Corpus, verify: bool, seq_len: int | None, report: Progress) -> None:
    """Refuse a checkpoint with an unreadable header, (``verify``) one whose files do not match their checksums, one
    whose context is shorter than ``seq_len``, and one whose tokenizer is not the corpus's (when both have one to
    compare). Damage is checked first: a damaged tokenizer file is named as damaged, not as another tokenizer."""
    header = read_header(checkpoint)
    problems = verify_checkpoint(checkpoint) if verify else []
    if problems:
        raise GPT1Error(f"{problems[0]} (use another checkpoint, or pass --no-verify to load it anyway)")
    n_ctx = int(header.model.get("n_ctx", 0)) or None
    if seq_len is not None and n_ctx is not None and seq_len > n_ctx:
        # Refused, not shortened: the number would be another window's perplexity than the one asked for.
        raise GPT1Error(
            f"--seq-len {seq_len} exceeds the context of {checkpoint} (n_ctx={n_ctx}; pass --seq-len "
            f"{n_ctx} or less, or leave it unset for the model's context)"
        )
    _check_tokenizer(checkpoint, corpus, report)


def _check_tokenizer(checkpoint: Path, corpus: Corpus, report: Progress) -> None:
    """Refuse a checkpoint trained with another tokenizer than the corpus's. A checkpoint without tokenizer/ (a
    bare or converted model) cannot be compared: it is scored on the corpus's ids (the vocabulary check in
    :func:`corpus_perplexity` still applies), with a warning saying the tokenizer was not checked. Unlike zero-shot,
    which must encode text and so refuses such a checkpoint, the corpus here is already ids: the user vouches for
    its tokenizer, as fine-tuning's --tokenizer does."""
    mine, theirs = tokenizer_fingerprint(checkpoint / TOKENIZER), corpus.tokenizer_fingerprint()
    if mine is None or theirs is None:
        lacking = checkpoint if mine is None else corpus.dir
        report.note(
            f"the tokenizer could not be checked: {lacking} has no tokenizer/ (the perplexity of "
            f"{checkpoint} means something only if it was trained with the tokenizer of {corpus.dir})",
            level="warn",
        )
        return
    if mine != theirs:
        raise GPT1Error(
            f"{checkpoint} was trained with another tokenizer than the corpus {corpus.dir} "
            f"({checkpoint / TOKENIZER} differs from {corpus.dir / 'tokenizer'}; a perplexity over another "
            f"tokenizer's ids means nothing: evaluate on a corpus prepared with --tokenizer {checkpoint / TOKENIZER})"
        )


def _corpus_vocab(corpus: Corpus) -> int | None:
    """The corpus's vocabulary size (manifest, else its tokenizer), to catch a model from another tokenizer."""
    vocab = corpus.manifest.get("vocab_size")
    if vocab is None and (corpus.dir / "tokenizer").is_dir():
        vocab = corpus.tokenizer.vocab_size
    return vocab
