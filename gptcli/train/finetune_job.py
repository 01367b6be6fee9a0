"""Fine-tuning's job: the whole of one fine-tuning update, and what the update loop asks of it.

An update (:meth:`FinetuneJob.next_update`) takes the epoch's next batch of examples, gives each rank its share and
splits that into micro-batches (:func:`micro_batches`), lays each out (:func:`training_collate`: padded, packed, or
packed with a shared prefix) and hands them to :meth:`gptcli.train.trainer.Trainer.step` with the task loss
(:class:`TaskLoss`, paper eq. 5: L3 = L2 + λ·L1). After every epoch it scores the dev split and checkpoints.

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
from typing import Any, cast

import torch
import torch.nn as nn

from gptcli import checkpoint as ckpt
from gptcli.data.batching import Batch, collate, collate_packed, collate_shared, train_batches
from gptcli.data.transforms import Encoded
from gptcli.eval.baselines import prediction_summary
from gptcli.eval.metrics import score_predictions
from gptcli.model.build import TRANSFORMER, LanguageModel, arch_of
from gptcli.model.classifier import FinetuneModel
from gptcli.model.gpt import GPT
from gptcli.model.heads import TaskHead
from gptcli.model.losses import lm_loss_per_sequence, lm_loss_per_sequence_packed
from gptcli.progress import Progress
from gptcli.train.finetune_config import FinetuneConfig
from gptcli.train.finetune_dev import Abandoned, cpu_state, epoch_line, predict_dev
from gptcli.train.finetune_setup import FinetuneSetup, checkpoint_meta
from gptcli.train.optim import lr_at, released_lr
from gptcli.train.run.directory import read_step_checkpoint, write_step_checkpoint
from gptcli.train.run.loop import Due, GracefulStop, RunState, every
from gptcli.train.run.memory import half, too_big_warning, update_bytes
from gptcli.train.trainer import Parallel, StepResult, Trainer, unwrap

# --- the update: micro-batches, their layout, the loss -------------------------------------------------------------


class TaskLoss:
    """L3 = L2 + λ·L1 (paper eq. 5) of one micro-batch; keeps each term per micro-batch of the current update
    so the log can show them apart. With λ = 0 the LM head's forward is skipped altogether.

    The update's loss is the mean over its whole (global) batch, whatever the micro-batches and processes it is
    split into: :meth:`start_update` gives each micro-batch its ``(factor, share)`` (see :func:`micro_batches`),
    the loss returned is scaled by ``factor`` (1 when the micro-batches are equal in one process) and each term is
    logged as its ``share``-weighted sum."""

    def __init__(self, lm_weight: float) -> None:
        self.lm_weight = lm_weight
        self.parts: dict[str, list[torch.Tensor]] = {"clf_loss": [], "lm_loss": []}
        """Each term per micro-batch of the current update, on the device: read only when the update is logged."""
        self.weights: list[tuple[float, float]] = []
        self.reduced: dict[str, float] | None = None
        """The terms over the global batch, when the ranks' shares were added up (:func:`global_figures`)."""

    def __call__(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        body, head = body_and_head(model)  # the forward goes through ``model`` (a DDP wrapper sees it)
        factor = self.weights[len(self.parts["clf_loss"])][0] if self.weights else 1.0
        out, hidden = model(batch.ids, batch.n_seqs, batch.packing)
        clf = head.loss(out, cast(torch.Tensor, batch.labels))  # a training batch always has its labels
        self.parts["clf_loss"].append(clf.detach().float())
        if self.lm_weight == 0:
            return clf if factor == 1.0 else clf * factor
        if batch.packing is not None:
            lm = lm_loss_per_sequence_packed(hidden, batch.ids, batch.packing, body.lm_token_nll).mean()
        else:
            lm = lm_loss_per_sequence(
                hidden, batch.ids, batch.mask, body.lm_logits, batch.lm_positions, body.next_token_nll
            ).mean()
        self.parts["lm_loss"].append(lm.detach().float())
        loss = clf + self.lm_weight * lm
        return loss if factor == 1.0 else loss * factor

    def start_update(self, weights: Sequence[tuple[float, float]] = ()) -> None:
        self.parts = {k: [] for k in self.parts}
        self.weights = list(weights)
        self.reduced = None

    def snapshot(self) -> tuple[dict[str, list[torch.Tensor]], list[tuple[float, float]]]:
        """The current update's terms (device tensors, per micro-batch) and weights, to read at the next sync."""
        return {k: v for k, v in self.parts.items() if v}, self.weights

    def means(self) -> dict[str, float]:
        """Each term of the last update read (:meth:`FinetuneJob.read_figures`) over the global batch."""
        return dict(self.reduced or {})


def combine_terms(parts: dict[str, list[float]], weights: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Each term over one update: this process's micro-batches weighted by their share of the global batch (a
    plain mean of the micro-batches when no shares were given)."""
    if weights:
        return {k: sum(x * w[1] for x, w in zip(v, weights)) for k, v in parts.items()}
    return {k: sum(v) / len(v) for k, v in parts.items()}


def rank_share(idx: Sequence[int], rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s part of the global batch ``idx`` (the same seeded order on every rank): contiguous, and the
    parts differ by at most one example (an epoch's last batch may be short; the batch need not divide evenly)."""
    n = len(idx)
    return list(idx[rank * n // world_size : (rank + 1) * n // world_size])


def micro_batches(
    idx: Sequence[int], rank: int, world_size: int, micro: int | None
) -> list[tuple[list[int], float, float]]:
    """This rank's micro-batches of the global batch ``idx``, each as (examples, loss factor, share of the batch).

    The update must follow the mean loss over the whole global batch. The trainer divides each micro-batch's loss by
    their number ``n`` on this rank and DDP averages the ``W`` ranks' gradients, so a micro-batch of ``b`` of the
    batch's ``B`` examples is scaled by ``n·W·b/B``: exactly 1 for equal micro-batches in one process, and example
    counts (not a plain mean of means) weigh uneven ones. A rank left without examples (a short last batch) still
    runs one example, with factor 0: every rank must join the gradient all-reduce."""
    mine = rank_share(idx, rank, world_size)
    size = micro or len(mine) or 1
    chunks = [mine[j : j + size] for j in range(0, len(mine), size)]
    if not chunks:
        return [(list(idx[:1]), 0.0, 0.0)]
    n, total = len(chunks), len(idx)
    return [(chunk, n * world_size * len(chunk) / total, len(chunk) / total) for chunk in chunks]


def global_figures(
    par: Parallel, updates: list[tuple[float, int, dict[str, float]]]
) -> list[tuple[float, int, dict[str, float]]]:
    """Each update's (loss, real tokens, loss terms) over the global batch from this process's figures, added up
    over the ranks in one collective for all of them."""
    if par.world_size == 1:
        return updates
    sums = par.sum([x for loss, n_tok, terms in updates for x in (loss, n_tok, *terms.values())])
    out, at = [], 0
    for _, _, terms in updates:
        mine = sums[at : at + 2 + len(terms)]
        at += len(mine)
        # Each rank's loss is W times its share of the global mean (see micro_batches).
        out.append((mine[0] / par.world_size, round(mine[1]), dict(zip(terms, mine[2:]))))
    return out


def body_and_head(model: nn.Module) -> tuple[LanguageModel, TaskHead]:
    """The body and the task head of a fine-tuning model, DDP-wrapped or not, as the classes they are
    (:class:`FinetuneModel` declares both as plain modules)."""
    bare = unwrap(model)
    return cast(LanguageModel, bare.gpt), cast(TaskHead, bare.head)


def packed_extract(layout: str, model: FinetuneModel) -> int | None:
    """The extract id batches are packed with (``layout`` packed or shared and a Transformer body: the LSTM has no
    packed path), or None for padded batches. The dev scoring lays its batches out the same way."""
    body, head = body_and_head(model)
    packed = layout in ("packed", "shared") and isinstance(body, GPT)
    return head.config.extract_id if packed else None


def training_collate(setup: FinetuneSetup, model: FinetuneModel) -> Callable[[Sequence[Encoded]], Batch]:
    """How ``layout`` lays out a training micro-batch: padded (and always for the LSTM), packed, or — ``shared``,
    multiple-choice tasks only — packed with each example's common prefix once for all its answers. The other
    kinds' sequences share nothing worth it (similarity's two orders: the start token), so they train packed."""
    extract = packed_extract(setup.config.layout, model)
    if extract is None:
        return lambda items: collate(items, setup.regression)
    if setup.config.layout == "shared" and setup.task.kind == "multiple_choice":
        return lambda items: collate_shared(items, extract, setup.regression)
    return lambda items: collate_packed(items, extract, setup.regression)


# --- the job -------------------------------------------------------------------------------------------------------


BEST = "best.safetensors"
"""In a step checkpoint: the best epoch's weights so far (``select = "best"``), when they are no longer the model's."""


def lr_schedule(config: FinetuneConfig, total: int) -> Callable[[int], float]:
    """The learning rate of update ``s`` (0-based) of ``total``: the released ``warmup_linear`` or gpt1's earlier
    warm-up over ``ceil(warmup·total)`` updates followed by ``schedule`` decay."""
    schedule = config.schedule
    if schedule == "warmup_linear":
        return lambda s: released_lr(s, total, config.lr, config.warmup)
    warmup_steps = math.ceil(config.warmup * total) if config.warmup > 0 else 0
    return lambda s: lr_at(s, total, config.lr, warmup_steps, schedule)


def epoch_batches(
    config: FinetuneConfig, lengths: Sequence[int], shuffle: random.Random, epoch_rng: Any
) -> list[list[int]]:
    """An epoch's batches (index lists) in ``batching`` order, rebuilt from the shuffling RNG's state at the epoch's
    start; ``shuffle`` is left where the uninterrupted run leaves it, ready for the next epoch."""
    shuffle.setstate(epoch_rng)
    return train_batches(list(lengths), config.batch_size, config.batching, shuffle)


@dataclass
class PendingUpdate:
    """An update whose figures are still on the device (read at the next sync point:
    :meth:`FinetuneJob.read_figures`)."""

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
        # Where the run stands: saved in every step checkpoint (:meth:`state_dict`).
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

    def start_epoch(self) -> None:
        """Rebuild the current epoch's batch order (after a restore, or for the first epoch)."""
        self.batches = epoch_batches(
            self.setup.config, [e.length for e in self.setup.train_enc], self.shuffle, self.epoch_rng
        )

    def _epoch_done(self) -> bool:
        return self.done_in_epoch == len(self.batches)

    def due_on_resume(self) -> Due | None:
        """A run stopped after its epoch's last update but before its dev score: the score, then a checkpoint."""
        return Due(evaluate=True, save=True) if self._epoch_done() and not self.evaluated else None

    def next_update(self) -> torch.Tensor:
        """Queue the update of the epoch's next batch on the device; its figures wait in ``pending``."""
        if self._epoch_done():  # scored and saved: on to the next epoch
            self.epoch, self.done_in_epoch, self.evaluated = self.epoch + 1, 0, False
            self.epoch_rng = self.shuffle.getstate()
            self.start_epoch()
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

    def after_update(self) -> Due:
        c, step, end = self.setup.config, self.state.step, self._epoch_done()
        return Due(
            log=every(step, c.log_every) or step == self.state.total,
            evaluate=end,
            save=every(step, c.save_every) or end,
        )

    def position(self) -> tuple[int, bool]:
        return self.state.step, self.evaluated

    # --- figures ----------------------------------------------------------------------------------------------------

    def read_figures(self) -> None:
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

    def log(self, report: Progress, due: Due) -> None:
        """The progress report and, when ``due.log``, a ``train`` line in metrics.jsonl: the losses since the last
        one, this update's terms (L2, L1), rate, gradient norm and throughput."""
        if not due.log:
            report.advance(1)
            return
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
        setup, mc = self.setup, body_and_head(self.model)[0].config
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

    def memory_advice(self, evaluating: bool) -> str:
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
            body_and_head(self.model)[0],
            self.setup.tokenizer,
            kind="finetuned",
            meta=meta,
            state={"step": self.state.step, "finetune": self.state_dict()},
            keep_last=self.setup.config.keep_last,
            head_state=self.model.head.state_dict(),
            extra=(lambda d: ckpt.save_tensors(best, d / BEST)) if best else None,
        )

    def state_dict(self) -> dict[str, Any]:
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
            extract = packed_extract(c.layout, job.model)
            preds = predict_dev(setup, job.model, job.par, extract, stop)
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
