"""What pretraining passes to the update loop (:func:`gptcli.train.run.loop.train`): its windows, its cadences, its
figures and validation, and what its step checkpoints hold.

:class:`PretrainSetup` is fixed before the first update (what the run reads, where it computes, for how long);
:class:`PretrainJob` is the run as it trains, one :class:`gptcli.train.run.loop.Job`. Validation also says when a
run learned nothing (:func:`plateau_hint`: its loss still at the unigram loss of token frequencies alone).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch

from gptcli.config import to_dict
from gptcli.data.shards import Corpus
from gptcli.data.windows import WindowSampler
from gptcli.eval.perplexity import evaluate_lm
from gptcli.model.build import TRANSFORMER, AnyConfig, LanguageModel, arch_of
from gptcli.progress import Progress
from gptcli.system.runtime import Precision
from gptcli.train.pretrain_config import PretrainConfig
from gptcli.train.recipes import MIN_WARMUP
from gptcli.train.run.directory import write_step_checkpoint
from gptcli.train.run.loop import Due, GracefulStop, RunState, every
from gptcli.train.run.memory import half, too_big_warning, update_bytes
from gptcli.train.runlog import Throughput, format_duration, mfu_text
from gptcli.train.trainer import Parallel, StepResult, Trainer, split_micro_batches, unwrap

# A run "learned nothing" when, after PLATEAU_MIN_UPDATES updates, its validation loss is not PLATEAU_MARGIN nats
# below the unigram loss (or is above it). Why: a model reaches the unigram loss within a few dozen updates (token
# frequencies are the easiest thing to learn) and a healthy small run leaves it well below soon after, while a
# stalled one sits a hundredth or two from it for hundreds of updates (docs/presets.md, "The unigram plateau, and
# why `tiny` is initialised at 0.06"). The margin separates the two widely; the wait leaves time to get there.
PLATEAU_MARGIN = 0.1
PLATEAU_MIN_UPDATES = 250
_COUNT_CHUNK = 1 << 22  # tokens per bincount: bounded memory (np.bincount works on int64 copies)


@dataclass
class PretrainSetup:
    """What a run is made of before any weights exist: where it computes, what it reads and for how long."""

    config: PretrainConfig
    par: Parallel
    device: torch.device
    precision: Precision
    corpus: Corpus
    model_config: AnyConfig
    sampler: WindowSampler
    """This rank's share of every global batch of training windows."""
    val_name: str | None
    """The validation split actually used (``val_split``, else a common name); None = no validation."""
    val_arrays: list[np.ndarray] | None
    total_steps: int
    resume_from: Path | None
    """The checkpoint a resumed run continues from (the newest intact one; None: a fresh start)."""
    unigram_loss: float | None = None
    """(Rank 0) the validation split's loss under the training split's token frequencies."""

    @property
    def run_dir(self) -> Path:
        return Path(self.config.out)

    @property
    def micro(self) -> int:
        """Rows per forward/backward, and per validation forward (a rank's whole share when ``micro_batch_size`` is
        unset: never the global batch, which on every GPU of a job would be world-size times the memory)."""
        return self.config.micro_batch_size or self.share

    @property
    def share(self) -> int:
        """Rows of each global batch that this rank computes."""
        return max(1, self.config.batch_size // self.par.world_size)

    @property
    def tokens_per_step(self) -> int:
        """Training tokens per update over all ranks (the global batch)."""
        return self.config.batch_size * self.config.seq_len


def validation_batches(config: PretrainConfig, micro: int) -> int | None:
    """``eval_batches`` (counted in global batches of ``batch_size`` windows) as the number of ``micro``-row batches
    that validation scores over all ranks: the same windows, and so the same loss, whatever ``--procs`` and
    ``--micro-batch-size`` (counted in micro-batches, the cap scored half the windows with two processes)."""
    if config.eval_batches is None:
        return None
    return -(-config.eval_batches * config.batch_size // micro)


class BatchFeed:
    """The sampler's batches on the training device, the next one read and sent while the current update computes.

    On CUDA the host copy is pinned and sent without waiting, so at a sync point the next batch is already on its
    way when the loop waits for the device. :meth:`state_dict` is the sampler's state after the batches handed out,
    not after the one read ahead: a checkpoint resumes at the next batch to train on."""

    def __init__(self, sampler: WindowSampler, device: torch.device) -> None:
        self.sampler = sampler
        self.device = device
        self._ahead: tuple[torch.Tensor, dict[str, int]] | None = None

    def prefetch(self) -> None:
        if self._ahead is None:
            state = self.sampler.state_dict()
            batch = self.sampler.next_batch()
            if self.device.type == "cuda":
                batch = batch.pin_memory().to(self.device, non_blocking=True)
            self._ahead = (batch, state)

    def next(self) -> torch.Tensor:
        self.prefetch()
        assert self._ahead is not None
        batch, self._ahead = self._ahead[0], None
        return batch

    def state_dict(self) -> dict[str, int]:
        return self._ahead[1] if self._ahead is not None else self.sampler.state_dict()


class PretrainJob:
    """Pretraining as a :class:`gptcli.train.run.loop.Job`: one update per global batch of windows, a metrics line
    every ``log_every``, a validation every ``eval_every`` and a checkpoint every ``save_every`` updates (all three
    after the last one too)."""

    resumable = True

    def __init__(
        self,
        setup: PretrainSetup,
        model: LanguageModel,
        trainer: Trainer,
        state: RunState,
        feed: BatchFeed,
        meter: Throughput,
    ) -> None:
        self.setup, self.model, self.trainer, self.state, self.feed, self.meter = (
            setup,
            model,
            trainer,
            state,
            feed,
            meter,
        )
        self.par = setup.par
        self.result: StepResult | None = None
        """The update just queued (its figures still on the device until a sync point reads them)."""
        self.figures = (math.nan, math.nan)
        """(loss, grad norm) of the last update read."""
        self.advanced_to = state.step
        """The step of the last ``advance`` reported."""
        self.plateau_noted = False
        """Whether the unigram-plateau hint was given (once per run)."""
        self.val_loss: float | None = None
        """The last validation loss (None before the first, or without a validation split)."""

    def next_update(self) -> torch.Tensor:
        """One optimizer update on this rank's share of the next global batch, queued on the device without waiting
        for it; the batch after it is read and sent to the device while this one computes."""
        self.meter.start()
        batch = self.feed.next()
        self.result = self.trainer.step(self.state.step, split_micro_batches(batch, self.setup.micro))
        self.feed.prefetch()
        self.state.step += 1
        return self.result.loss

    def after_update(self) -> Due:
        config, step, last = self.setup.config, self.state.step, self.state.step == self.state.total
        return Due(
            log=every(step, config.log_every) or last,
            evaluate=every(step, config.eval_every) or last,
            save=every(step, config.save_every) or last,
        )

    def due_on_resume(self) -> Due | None:
        """A run resumed at its last update has no update left: it still ends as every run does, validated (its
        checkpoint holds this step already). Otherwise nothing: a checkpoint is written only after all that its
        update was due."""
        return Due(evaluate=True) if self.state.step >= self.state.total else None

    def read_figures(self) -> None:
        assert self.result is not None
        self.figures = self.result.read()

    def position(self) -> int:
        return self.state.step

    def log(self, report: Progress, due: Due) -> None:
        """The update's throughput and, when ``due.log``, a ``train`` line in metrics.jsonl and an ``advance`` (see
        :func:`gptcli.train.pretrain.pretrain`) from its figures read at this sync point. Every rank calls it: the
        logged loss is averaged over ranks."""
        self.meter.stop(self.setup.tokens_per_step)  # after the read: the window's time includes the device's work
        if not due.log:
            return
        assert self.result is not None
        state, lr, (loss, grad_norm) = self.state, self.result.lr, self.figures
        loss = self.par.mean(loss)
        tps, mfu = self.meter.report()
        elapsed = time.perf_counter() - state.started
        rate = (state.step - state.first_step) / elapsed if elapsed > 0 else 0.0
        eta = (state.total - state.step) / rate if rate > 0 else float("inf")
        state.log(
            {
                "kind": "train",
                "step": state.step,
                "loss": loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "tokens": state.step * self.setup.tokens_per_step,
                "tokens_per_s": tps,
                "mfu": mfu,
                "elapsed_s": round(elapsed, 3),
            }
        )
        report.advance(
            state.step - self.advanced_to,
            loss=loss,
            lr=lr,
            grad_norm=grad_norm,
            **{"tok/s": round(tps)},
            MFU=mfu_text(mfu),
            ETA=format_duration(eta),
        )
        self.advanced_to = state.step

    def evaluate(self, report: Progress, stop: GracefulStop) -> bool:
        """Validation loss at the current step (none without a validation split), logged as an ``eval`` line and a
        ``note``. Every rank calls it: each scores its share of the batches. Not cut short by a signal: it is
        bounded by ``eval_batches``."""
        setup = self.setup
        if setup.val_arrays is None:
            return True
        loss, tokens = self._validation_loss(setup.val_arrays)
        perplexity = math.exp(min(loss, 700))
        self.state.log(
            {
                "kind": "eval",
                "step": self.state.step,
                "split": setup.val_name,
                "loss": loss,
                "perplexity": perplexity,
                "tokens": tokens,
                "unigram_loss": setup.unigram_loss,
            }
        )
        report.note(f"validation at update {self.state.step}: loss {loss:.4f}, perplexity {perplexity:.2f}")
        hint = None if self.plateau_noted else plateau_hint(self.state.step, loss, setup.unigram_loss)
        if hint is not None:
            report.note(hint, level="warn")
            self.plateau_noted = True
        self.val_loss = loss
        return True

    def _validation_loss(self, arrays: list[np.ndarray]) -> tuple[float, int]:
        """(mean loss per token, tokens scored) over the validation split, combined over ranks."""
        setup, par = self.setup, self.par
        ev = evaluate_lm(
            cast(LanguageModel, unwrap(self.model)),  # unwrapping leaves the model's own class
            arrays,
            setup.config.seq_len,
            setup.micro,
            device=setup.device,
            precision=setup.precision,
            max_batches=validation_batches(setup.config, setup.micro),
            rank=par.rank,
            world_size=par.world_size,
        )
        if par.world_size == 1:
            return ev.loss, ev.tokens
        # Each rank scored every world_size-th batch: combine them token-weighted.
        tokens = round(par.mean(float(ev.tokens)) * par.world_size)
        nll = par.mean(ev.loss * ev.tokens if ev.tokens else 0.0) * par.world_size
        return (nll / tokens if tokens else float("nan")), tokens

    def memory_warning(self) -> str | None:
        """On a CPU, when the largest forward/backward would not fit in the free memory (memory.py)."""
        setup, c = self.setup, self.setup.config
        mc = setup.model_config
        if setup.device.type != "cpu" or arch_of(mc) != TRANSFORMER:  # the estimate is the Transformer's
            return None
        params = sum(p.numel() for p in self.model.parameters())

        def needed(rows: int) -> int:
            return update_bytes(mc.n_layer, mc.n_embd, mc.total_vocab, params, rows * c.seq_len, setup.precision)

        return too_big_warning(needed, setup.micro, f"sequences of {c.seq_len} tokens", divides=setup.share)

    def memory_advice(self, evaluating: bool) -> str:
        """``--micro-batch-size`` halved (the largest size under half that divides a process's share, as the
        batch split requires): it sets the rows of every training and validation forward pass."""
        c, share, now = self.setup.config, self.setup.share, self.setup.micro
        size = half(now, divides=share)
        if size is None:
            return (
                f"one sequence of {c.seq_len} tokens per forward pass does not fit: use --precision bf16 where "
                f"the device has it, a shorter --seq-len or a smaller --model"
            )
        if evaluating:
            return (
                f"pass --micro-batch-size {size}: validation then scores {size} sequences of {c.seq_len} tokens "
                f"at a time instead of {now}"
            )
        return (
            f"pass --micro-batch-size {size}: each process then computes its {share} sequences of {c.seq_len} "
            f"tokens per update {size} at a time instead of {now}; the update is the same (gradient accumulation)"
        )

    def save(self) -> Path:
        """(Rank 0) checkpoint the current step with its training state; prune to ``keep_last``."""
        setup, at = self.setup, self.state.step
        tokens = at * setup.tokens_per_step
        assert self.state.checkpoints is not None
        return write_step_checkpoint(
            self.state.checkpoints,
            at,
            self.trainer,
            self.model,
            setup.corpus.tokenizer,
            kind="lm",
            meta={
                "step": at,
                "tokens": tokens,
                "stage": "pretrain",
                "seq_len": setup.config.seq_len,
                # What the resume check compares a later --resume against.
                "pretrain_config": to_dict(dataclasses.replace(setup.config, resume=False)),
                "corpus_sha256": setup.corpus.fingerprint(),
            },
            state={
                "step": at,
                "total_steps": setup.total_steps,
                "tokens": tokens,
                "sampler": self.feed.state_dict(),
                "records": self.state.records,
            },
            keep_last=setup.config.keep_last,
        )


# --- what validation says about the run ------------------------------------------------------------------------


def token_counts(arrays: list[np.ndarray], vocab: int) -> np.ndarray:
    """How often each of ``vocab`` ids occurs in ``arrays`` (memory-mapped shards, read in bounded chunks)."""
    counts = np.zeros(vocab, dtype=np.int64)
    for a in arrays:
        for start in range(0, len(a), _COUNT_CHUNK):
            counts += np.bincount(a[start : start + _COUNT_CHUNK], minlength=vocab)[:vocab]
    return counts


def unigram_loss(train: list[np.ndarray], val: list[np.ndarray], vocab: int) -> float | None:
    """Cross-entropy in nats per token of the validation tokens under the training tokens' frequencies, add-one
    smoothed over the ``vocab`` ids (an id never seen in training still gets a probability): the loss of a model
    that learned which tokens are common and nothing about context. None without validation tokens."""
    seen, held = token_counts(train, vocab), token_counts(val, vocab)
    if held.sum() == 0:
        return None
    log_p = np.log(seen + 1.0) - np.log(seen.sum() + float(vocab))
    return float(-(held * log_p).sum() / held.sum())


def plateau_hint(step: int, val_loss: float, unigram: float | None) -> str | None:
    """One line when the validation loss after a meaningful number of updates is still at the unigram loss
    (within :data:`PLATEAU_MARGIN`, or above it): what it means and what to try. None otherwise."""
    if unigram is None or step < PLATEAU_MIN_UPDATES or not math.isfinite(val_loss):
        return None
    if val_loss < unigram - PLATEAU_MARGIN:
        return None
    return (
        f"hint: after {step:,} updates the validation loss {val_loss:.2f} is still at the unigram loss "
        f"{unigram:.2f} (predicting each token by its frequency alone): the model has not learned to use "
        f"context yet (small post-LN models stall at a high --lr, a short warm-up or a narrow init: try "
        f"--warmup-steps {MIN_WARMUP} or more, a lower --lr, --init-std 0.06 (the tiny preset's), or more updates; "
        f"docs/presets.md)"
    )
