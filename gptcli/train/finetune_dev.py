"""Fine-tuning's dev scores: the model's predictions on the dev split after every epoch (shared out over the ranks of
a data-parallel job), the epoch's record and the line that reports it.

An epoch's record (a line of metrics.jsonl, an entry of results.json's history) holds :data:`RECORD_KEYS`, the
scores of the task's metric, and the prediction distribution (:data:`PREDICTION_SUMMARY`), which names a model
that always predicts one class as such instead of just scoring it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch
import torch.nn as nn

from gptcli.data.batching import Batch, iterate
from gptcli.eval.baselines import baseline_of, constant_sentence, level_note
from gptcli.model.classifier import FinetuneModel, predict
from gptcli.tasks import Task
from gptcli.train.finetune_setup import FinetuneSetup, TaskData
from gptcli.train.run.loop import GracefulStop
from gptcli.train.trainer import Parallel

RECORD_KEYS = ("kind", "step", "epoch", "split")
"""What every evaluation record holds besides its scores."""
PREDICTION_SUMMARY = ("prediction_counts", "prediction_stats", "constant_prediction")
"""The prediction distribution an evaluation record carries (:func:`gptcli.eval.baselines.prediction_summary`)."""


class Abandoned(Exception):
    """A signal arrived during a dev evaluation: it is left unfinished and redone on resume."""


def scores_of(record: dict[str, Any]) -> dict[str, Any]:
    """The scores in an evaluation record (the task metric's, e.g. accuracy, or pearson and spearman)."""
    return {k: v for k, v in record.items() if k not in RECORD_KEYS + PREDICTION_SUMMARY}


def predict_dev(
    setup: FinetuneSetup,
    model: FinetuneModel,
    par: Parallel,
    extract: int | None = None,
    stop: GracefulStop | None = None,
) -> list[Any]:
    """The model's prediction for every dev example, in the split's order, in batches packed with ``extract`` (None:
    padded; :func:`gptcli.train.finetune_job.packed_extract`). Under data parallelism each rank scores its share
    (:func:`eval_shard`) and the shares are gathered on every rank: MCC, F1 and correlations need all the
    predictions, not a mean of per-rank scores. ``stop`` (one process only) abandons the evaluation by raising
    :class:`Abandoned`."""
    dev, size = setup.dev_enc, setup.config.scoring_batch_size
    if par.world_size == 1:
        batches = iterate(dev, size, shuffle=False, regression=setup.regression, shared_extract=extract)
        preds, _ = predict(
            model, batches if stop is None else _until_stopped(batches, stop), setup.device, setup.precision
        )
        return preds
    mine = [dev[i] for i in eval_shard([e.length for e in dev], par.rank, par.world_size)]
    preds, _ = predict(
        model,
        iterate(mine, size, shuffle=False, regression=setup.regression, shared_extract=extract),
        setup.device,
        setup.precision,
    )
    merged: dict[int, Any] = {}
    for shard in par.gather(list(zip(sorted(e.index for e in mine), preds))):  # predict orders by index
        merged.update(shard)
    return [merged[i] for i in sorted(merged)]


def _until_stopped(batches: Iterator[Batch], stop: GracefulStop) -> Iterator[Batch]:
    for batch in batches:
        if stop.requested is not None:
            raise Abandoned
        yield batch


def eval_shard(lengths: Sequence[int], rank: int, world_size: int) -> list[int]:
    """The dev examples rank ``rank`` scores: every ``world_size``-th of them by length, longest first, so that the
    ranks get about the same number of tokens to read."""
    by_length = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return by_length[rank::world_size]


class _HasTaskData(Protocol):
    task: Task
    data: TaskData


def epoch_line(record: dict[str, Any], run: _HasTaskData | None = None) -> str:
    """``epoch 2 (update 6): dev accuracy 55.00 (majority 52.71)``: with ``run`` (its task and data), the level of
    always answering the most frequent training label (or chance) beside the headline, marked "≈ majority" when the
    score is that."""
    scores = scores_of(record)
    text = ", ".join(f"{k} {v:.2f}" for k, v in scores.items())
    base = baseline_of(run.task, run.data.train, run.data.dev) if run is not None and scores else None
    note = level_note(scores, base, run.task.metric) if run is not None and base else ""
    line = f"epoch {record['epoch']} (update {record['step']}): {record.get('split') or 'no eval'} {text}".rstrip()
    constant = constant_sentence({**record, "n": len(run.data.dev)}) if run is not None else None
    return line + (f" ({note})" if note else "") + (f"; {constant}" if constant else "")


def cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the model's weights on the CPU (the best epoch's, kept while later epochs train)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
