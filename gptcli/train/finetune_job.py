"""What fine-tuning passes to the run machinery's loop (:func:`gptcli.train.run.loop.train`): epochs of shuffled
batches, the task loss, a dev score and a checkpoint after every epoch, and what its step checkpoints hold.

A step checkpoint holds everything the rest of the run depends on — the optimizer, every RNG, the epoch, the position
inside it and the shuffling RNG's state that orders its batches, the best epoch's score and weights, and how many
records metrics.jsonl had — so that a resume continues bit for bit on CPU (tested).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gptcli import checkpoint as ckpt
from gptcli.data.batching import Batch, collate, collate_packed, collate_shared, train_batches
from gptcli.data.transforms import Encoded
from gptcli.eval.baselines import prediction_summary
from gptcli.eval.metrics import score_predictions
from gptcli.model.build import TRANSFORMER, arch_of
from gptcli.model.classifier import FinetuneModel
from gptcli.progress import Progress
from gptcli.train.finetune_config import FinetuneConfig
from gptcli.train.finetune_dev import Abandoned, cpu_state, epoch_line, packed_extract, predict_dev
from gptcli.train.finetune_loss import TaskLoss, combine_terms, global_figures, micro_batches
from gptcli.train.finetune_setup import FinetuneSetup, checkpoint_meta
from gptcli.train.optim import lr_at, released_lr
from gptcli.train.run.directory import read_step_checkpoint, write_step_checkpoint
from gptcli.train.run.loop import GracefulStop, Moment, RunState, every
from gptcli.train.run.memory import half, too_big_warning, update_bytes
from gptcli.train.trainer import Parallel, StepResult, Trainer


def training_collate(setup: FinetuneSetup, model: FinetuneModel) -> Callable[[Sequence[Encoded]], Batch]:
    """How ``layout`` lays out a training micro-batch: padded (and always for the LSTM), packed, or — ``shared``,
    multiple-choice tasks only — packed with each example's common prefix once for all its answers. The other
    kinds' sequences share nothing worth it (similarity's two orders: the start token), so they train packed."""
    extract = packed_extract(setup, model)
    if extract is None:
        return lambda items: collate(items, setup.regression)
    if setup.config.layout == "shared" and setup.task.kind == "multiple_choice":
        return lambda items: collate_shared(items, extract, setup.regression)
    return lambda items: collate_packed(items, extract, setup.regression)


BEST = "best.safetensors"
"""In a step checkpoint: the best epoch's weights so far (``select = "best"``), when they are no longer the model's."""


def lr_schedule(config: FinetuneConfig, total: int) -> Callable[[int], float]:
    """The learning rate of update ``s`` (0-based) of ``total``: the released ``warmup_linear`` or gpt1's earlier
    warm-up over ``ceil(warmup·total)`` updates followed by ``schedule`` decay."""
    if config.schedule == "warmup_linear":
        return lambda s: released_lr(s, total, config.lr, config.warmup)
    warmup_steps = math.ceil(config.warmup * total) if config.warmup > 0 else 0
    return lambda s: lr_at(s, total, config.lr, warmup_steps, config.schedule)


def epoch_batches(
    config: FinetuneConfig, lengths: Sequence[int], shuffle: random.Random, epoch_rng: Any
) -> list[list[int]]:
    """An epoch's batches (index lists) in ``batching`` order, rebuilt from the shuffling RNG's state at the epoch's
    start; ``shuffle`` is left where the uninterrupted run leaves it, ready for the next epoch."""
    shuffle.setstate(epoch_rng)
    return train_batches(list(lengths), config.batch_size, config.batching, shuffle)


@dataclass
class PendingUpdate:
    """An update whose figures are still on the device (read at the next sync point, :meth:`FinetuneJob.read`)."""

    step: int
    """Its 1-based number."""
    result: StepResult
    terms: dict[str, list[torch.Tensor]]
    weights: list[tuple[float, float]]
    tokens: int
    """This rank's real tokens in it (counted on the host)."""


class FinetuneJob:
    """Fine-tuning as a :class:`gptcli.train.run.loop.Job`: one update per batch of the epoch's order (under data
    parallelism each rank takes its share), a metrics line every ``log_every`` updates, a step checkpoint every
    ``save_every``, and after each epoch's last update a dev score and a checkpoint."""

    def __init__(
        self,
        setup: FinetuneSetup,
        model: FinetuneModel,
        trainer: Trainer,
        loss: TaskLoss,
        state: RunState,
        par: Parallel,
        resumable: bool,
    ) -> None:
        self.setup, self.model, self.trainer, self.loss, self.state, self.par = setup, model, trainer, loss, state, par
        self.resumable = resumable
        self.work: Path | None = None
        """The directory rank 0 writes in (``out``, or the hidden one that becomes ``out``)."""
        # Where the run stands: saved in every step checkpoint (:meth:`position_state`).
        self.epoch, self.done_in_epoch, self.evaluated = 1, 0, False
        """The epoch in progress (1-based), its batches already trained on, and whether it was scored."""
        self.shuffle = random.Random(setup.config.seed)
        """Orders every epoch's batches: one stream through the whole run."""
        self.epoch_rng: Any = self.shuffle.getstate()
        """``shuffle``'s state at the start of the current epoch: the epoch's batch order is rebuilt from it."""
        self.tokens, self.window_loss, self.window_n = 0, 0.0, 0
        """Real tokens trained on; sum and count of the update losses since the last training record."""
        self.history: list[dict[str, Any]] = []
        self.best: tuple[float, int, dict[str, torch.Tensor]] | None = None
        """(dev score, epoch, weights) of the best epoch so far; weights empty for the last epoch (the model's)."""
        # This process's figures.
        self.batches: list[list[int]] = []
        self.pending: list[PendingUpdate] = []
        """Updates since the last sync point, their figures not read from the device yet."""
        self.window_tokens, self.t_log = 0, time.perf_counter()
        self.grad_norm, self.last_loss, self.last_lr = math.nan, math.nan, 0.0
        """Of the last update read: its gradient norm, global loss and learning rate."""

    # --- the epochs -------------------------------------------------------------------------------------------------

    def begin(self) -> None:
        """Rebuild the current epoch's batch order (after a restore, or for the first epoch)."""
        self.batches = epoch_batches(
            self.setup.config, [e.length for e in self.setup.train_enc], self.shuffle, self.epoch_rng
        )

    def _epoch_done(self) -> bool:
        return self.done_in_epoch == len(self.batches)

    def finished(self) -> bool:
        return self.epoch >= self.setup.config.epochs and self._epoch_done() and self.evaluated

    def owed(self) -> Moment | None:
        """A run stopped after its epoch's last update but before its dev score: the score, then a checkpoint."""
        return Moment(evaluate=True, save=True) if self._epoch_done() and not self.evaluated else None

    def update(self) -> torch.Tensor:
        """Queue the update of the epoch's next batch on the device; its figures wait in ``pending``."""
        if self._epoch_done():  # scored and saved: on to the next epoch
            self.epoch, self.done_in_epoch, self.evaluated = self.epoch + 1, 0, False
            self.epoch_rng = self.shuffle.getstate()
            self.begin()
        setup, par = self.setup, self.par
        parts = micro_batches(self.batches[self.done_in_epoch], par.rank, par.world_size, setup.config.micro_batch_size)
        enc, lay_out = setup.train_enc, training_collate(setup, self.model)
        host = [lay_out([enc[i] for i in chunk]) for chunk, _, _ in parts]
        # Real tokens, from the encoded lengths (what the mask sums to): no tensor is read.
        tokens = sum(len(s) for chunk, _, share in parts if share > 0 for i in chunk for s in enc[i].seqs)
        self.loss.start_update([(factor, share) for _, factor, share in parts])
        result = self.trainer.step(self.state.step, [mb.to(setup.device) for mb in host])
        self.state.step += 1
        self.done_in_epoch += 1
        self.pending.append(PendingUpdate(self.state.step, result, *self.loss.snapshot(), tokens))
        return result.loss

    def moment(self) -> Moment:
        c, step, end = self.setup.config, self.state.step, self._epoch_done()
        return Moment(
            log=every(step, c.log_every) or step == self.state.total,
            evaluate=end,
            save=every(step, c.save_every) or end,
        )

    def position(self) -> tuple[int, bool]:
        return self.state.step, self.evaluated

    # --- figures ----------------------------------------------------------------------------------------------------

    def read(self) -> None:
        """Read the pending updates' figures from the device (one transfer, and one collective over the ranks) and
        add them to the run's counts as if each had been read when it ran."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        values = torch.cat(
            [
                torch.stack([p.result.loss, p.result.grad_norm, *(t for v in p.terms.values() for t in v)])
                for p in pending
            ]
        ).tolist()
        local, norms, at = [], [], 0
        for p in pending:
            loss, norm, *flat = values[at : at + 2 + sum(len(v) for v in p.terms.values())]
            at += 2 + len(flat)
            parts, k = {}, 0
            for name, v in p.terms.items():
                parts[name], k = flat[k : k + len(v)], k + len(v)
            local.append((loss, p.tokens, combine_terms(parts, p.weights)))
            norms.append(norm)
        for (loss, tokens, terms), norm in zip(global_figures(self.par, local), norms):
            self.tokens += tokens
            self.window_tokens += tokens
            self.window_loss += loss
            self.window_n += 1
            self.loss.reduced, self.grad_norm, self.last_loss = terms, norm, loss
        self.last_lr = pending[-1].result.lr

    def update_done(self, report: Progress, moment: Moment) -> None:
        if not moment.log:
            report.advance(1)

    def log(self, report: Progress) -> None:
        now, c, state = time.perf_counter(), self.setup.config, self.state
        state.log(
            {
                "kind": "train",
                "step": state.step,
                "epoch": self.epoch,
                "loss": self.window_loss / self.window_n,
                **self.loss.means(),
                "lr": self.last_lr,
                "grad_norm": self.grad_norm,
                "tokens": self.tokens,
                "tokens_per_s": round(self.window_tokens / max(now - self.t_log, 1e-9), 1),
                "elapsed_s": round(now - state.started, 3),
            }
        )
        report.advance(1, epoch=f"{self.epoch}/{c.epochs}", loss=self.last_loss, lr=self.last_lr)
        self.window_loss, self.window_n, self.window_tokens, self.t_log = 0.0, 0, 0, now

    # --- the dev score ----------------------------------------------------------------------------------------------

    def evaluate(self, report: Progress, stop: GracefulStop) -> bool:
        """The epoch's dev score (data-parallel ranks finish the evaluation they share out and agree on a stop
        afterwards); False when a signal cut it short (it is redone on resume)."""
        record = evaluate_epoch(self, stop if self.par.world_size == 1 else None)
        if record is None:
            return False
        report.note(epoch_line(record, self.setup))
        self.evaluated = True
        return True

    # --- memory -----------------------------------------------------------------------------------------------------

    def _micro(self) -> tuple[int, int]:
        """(this rank's share of a batch, rounded up; the examples of it per forward/backward)."""
        c = self.setup.config
        share = -(-c.batch_size // self.par.world_size)
        return share, min(c.micro_batch_size or share, share)

    def memory_warning(self) -> str | None:
        """On a CPU, when the epoch's largest forward/backward would not fit in the free memory (memory.py)."""
        setup, mc = self.setup, self.model.gpt.config
        if setup.device.type != "cpu" or arch_of(mc) != TRANSFORMER or not self.batches:
            return None
        c, par, enc = setup.config, self.par, setup.train_enc
        padded = c.layout == "padded"
        params = sum(p.numel() for p in self.model.parameters())

        def tokens(chunk: list[int]) -> int:  # what the layout computes: padded rows, or the real tokens
            seqs = [s for i in chunk for s in enc[i].seqs]
            return len(seqs) * max(map(len, seqs)) if padded else sum(map(len, seqs))

        def needed(k: int) -> int:
            most = max(
                tokens(chunk) for b in self.batches for chunk, _, _ in micro_batches(b, par.rank, par.world_size, k)
            )
            return update_bytes(mc.n_layer, mc.n_embd, mc.total_vocab, params, most, setup.precision)

        return too_big_warning(needed, self._micro()[1], "examples")

    def smaller(self, evaluating: bool) -> str:
        """``--eval-batch-size`` halved for the dev scoring, else ``--micro-batch-size`` halved (a multiple-choice
        example holds one sequence per answer)."""
        c = self.setup.config
        if evaluating:
            now = c.scoring_batch_size
            size = half(now)
            flag, what = "--eval-batch-size", f"the dev examples are then scored {size} at a time instead of {now}"
        else:
            share, now = self._micro()
            size = half(now)
            flag, what = (
                "--micro-batch-size",
                (
                    f"each process then computes its {share} examples per update {size} "
                    f"at a time instead of {now}; the update is the same"
                ),
            )
        if size is None:
            return (
                "one example per forward pass does not fit: use --precision bf16 where the device has it, or a "
                "smaller --n-ctx (examples are truncated to it)"
            )
        return f"pass {flag} {size}: {what}"

    # --- checkpoints ------------------------------------------------------------------------------------------------

    def save(self) -> Path:
        """(Rank 0) ``checkpoints/step-N``: body + head + tokenizer (loadable by ``gpt1 eval``), the training state
        and, when they are no longer the model's, the best epoch's weights; pruned to ``keep_last``."""
        assert self.work is not None
        best = self.best[2] if self.best is not None else {}
        meta = {
            **checkpoint_meta(self.setup, self.epoch, self.state.step, {}),
            "stage": "finetune",
            "resume_identity": self.setup.identity,
        }
        return write_step_checkpoint(
            self.work / "checkpoints",
            self.state.step,
            self.trainer,
            self.model.gpt,
            self.setup.tokenizer,
            kind="finetuned",
            meta=meta,
            state={"step": self.state.step, "finetune": self.position_state()},
            keep_last=self.setup.config.keep_last,
            head_state=self.model.head.state_dict(),
            extra=(lambda d: ckpt.save_tensors(best, d / BEST)) if best else None,
        )

    def position_state(self) -> dict[str, Any]:
        """Where the run stands, as JSON (floats round-trip exactly)."""
        version, state, gauss = self.epoch_rng
        return {
            "epoch": self.epoch,
            "done_in_epoch": self.done_in_epoch,
            "evaluated": self.evaluated,
            "epoch_rng": [version, list(state), gauss],
            "tokens": self.tokens,
            "window_loss": self.window_loss,
            "window_n": self.window_n,
            "records": self.state.records,
            "history": self.history,
            "best": None if self.best is None else [self.best[0], self.best[1]],
            "total": self.state.total,
        }

    def restore(self, path: Path) -> None:
        """Load a step checkpoint into the freshly built job: weights, optimizer (and loss scaler), every RNG, the
        position and the best-epoch bookkeeping."""
        doc = read_step_checkpoint(path, self.trainer, self.model.gpt, self.model.head)
        pos = doc["finetune"]
        self.state.step = self.state.first_step = int(doc["step"])
        self.epoch, self.done_in_epoch, self.evaluated = pos["epoch"], pos["done_in_epoch"], pos["evaluated"]
        version, state, gauss = pos["epoch_rng"]
        self.epoch_rng = (version, tuple(state), gauss)
        self.tokens, self.window_loss, self.window_n = pos["tokens"], pos["window_loss"], pos["window_n"]
        self.state.records, self.history = pos["records"], pos["history"]
        if pos["best"] is not None:
            # Only rank 0 writes the final checkpoint, so only it needs the best epoch's weights.
            weights = ckpt.load_tensors(path / BEST) if (path / BEST).is_file() and self.par.is_main else {}
            self.best = (pos["best"][0], pos["best"][1], weights)
        self.state.last_checkpoint, self.state.saved = path, self.position()


def evaluate_epoch(job: FinetuneJob, stop: GracefulStop | None = None) -> dict[str, Any] | None:
    """Score the dev split (when there is one), remember the best epoch's weights, log the record. None when a
    signal cut the evaluation short (nothing was changed: the model and every RNG are as before it)."""
    setup, c = job.setup, job.setup.config
    record: dict[str, Any] = {"kind": "eval", "step": job.state.step, "epoch": job.epoch, "split": c.eval_split}
    if setup.dev_enc:
        try:
            preds = predict_dev(setup, job.model, job.par, stop)
        except Abandoned:
            return None
        scores = score_predictions(setup.task, preds, setup.data.dev)
        record.update(scores)
        record.update(prediction_summary(setup.task, preds))  # a one-class model is named as such, not just scored
        value = scores[setup.task.metric]
        # Strictly better only: on ties the earlier epoch stays (as the released code's `>`). The last epoch's
        # weights are still in the model, so they need no copy.
        if c.select == "best" and (job.best is None or value > job.best[0]):
            # Every rank keeps the bookkeeping; rank 0 alone, which writes the final checkpoint, the weights.
            keep = job.epoch < c.epochs and job.par.is_main
            job.best = (value, job.epoch, cpu_state(job.model) if keep else {})
    job.state.log(record)
    job.history.append(record)
    job.t_log, job.window_tokens = time.perf_counter(), 0  # evaluation time is not training throughput
    return record
