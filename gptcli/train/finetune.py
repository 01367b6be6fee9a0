"""Fine-tuning on a task (paper §3.2, §4.1): body + linear head, task loss + λ·LM loss.

``finetune(FinetuneConfig(task="rte", init="runs/pre/checkpoints/step-0100000", out="runs/rte"))`` loads the
pretrained checkpoint (weights + tokenizer), appends the three special tokens (start, delimiter, extract) with
N(0, 0.02) embeddings, builds the task head, and trains with the paper's settings. After every epoch it scores
the dev split with the task's metric; the final checkpoint (``RUN/checkpoints/final``) holds the best (or last)
epoch's body + head, the tokenizer and the head config, and ``RUN/results.json`` its dev scores.

A run is a sequence of named stages, top to bottom in :func:`finetune`: read the task data, build the body,
encode and build the model + optimizer (:func:`build_run`), train epoch by epoch with a dev score after each,
keep the best (or last) epoch's weights, write the checkpoint and ``results.json``. The run directory is checked
before anything is read (:func:`check_run_dir`: never an input, never another kind of directory; :func:`plan_run_dir`:
start, resume or replace) and written through :func:`run_directory` (an earlier run it replaces stays whole until
the new one is complete). Progress goes through
:mod:`gptcli.progress`: one stage per run sized in updates, ``advance(1, epoch=, loss=, lr=)`` per update and a
note with the dev scores after every epoch.

A run is resumable (:func:`plan_run_dir`, :func:`check_resume`, :func:`save_step`, :func:`restore_run`): it
checkpoints to ``RUN/checkpoints/step-NNNNNNN`` every ``save_every`` updates, after every epoch's dev score and on
SIGINT/SIGTERM, with everything the rest of the run depends on — optimizer, every RNG, the epoch, the position
inside it and the shuffling RNG state that orders its batches, the best epoch's score and weights, and how many
records metrics.jsonl had — so that ``resume=True`` continues bit for bit on CPU (tested). The step checkpoints are
deleted once ``checkpoints/final`` and ``results.json`` are written.

The update itself (autocast, clipping, schedule, non-finite guard) is the shared :class:`gptcli.train.trainer.Trainer`;
this module only supplies the data (bucketed, dynamically padded batches) and the loss. The model (body + head as
one module) and batched prediction are :mod:`gptcli.model.classifier`; scoring is
:func:`gptcli.eval.metrics.score_predictions`, the same function ``gpt1 eval`` uses.

Ablations (paper Table 5, Figure 2 left): ``init="none"`` (no pretraining: a randomly initialised model of the
same shape), ``lm_weight=0`` (no auxiliary LM; its forward cost is skipped too), ``transfer_layers=K`` (keep
the embeddings and the first K blocks, re-initialise the others with the model's own init).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import random
import shutil
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Sequence, TypeVar

import torch
import torch.nn as nn

from gptcli import checkpoint as ckpt
from gptcli.checkpoint import is_checkpoint, load_checkpoint, read_header, save_checkpoint
from gptcli.config import check_settings, dumps_toml, to_dict
from gptcli.data.batching import Batch, collate, collate_packed, iterate, num_batches, subsample, train_batches
from gptcli.data.cache import encode_cached
from gptcli.data.transforms import Encoded
from gptcli.errors import GPT1Error
from gptcli.eval.baselines import prediction_summary
from gptcli.eval.metrics import score_predictions
from gptcli.fsutil import move_into_place, sha256_file, temp_sibling, write_text_atomic
from gptcli.locks import main_rank_lock
from gptcli.model.classifier import FinetuneModel, predict
from gptcli.model.build import AnyConfig, LanguageModel, arch_of, build_model, config_from_dict, preset
from gptcli.model.gpt import GPT
from gptcli.model.heads import HeadConfig, TaskHead
from gptcli.model.kernels import check_mode, set_kernels
from gptcli.model.losses import lm_loss_per_sequence, lm_loss_per_sequence_packed
from gptcli.model.lstm import precision_note
from gptcli.outputs import MARKER, check_output, kind_of, mark, next_free
from gptcli.progress import SILENT, Progress
from gptcli.runtime import configure_backends, resolve_device, resolve_precision
from gptcli.tasks import ReadOptions, get_task
from gptcli.tokenizers import load_tokenizer
from gptcli.train.optim import lr_at, make_optimizer, released_lr
from gptcli.train.runlog import METRICS, RunLogger, keep_first_records
from gptcli.train.trainer import GracefulStop, Parallel, StepResult, Trainer, every, unwrap

T = TypeVar("T")

RESULTS = "results.json"
FINAL = "final"
CONFIG_FILE = "config.toml"
BEST = "best.safetensors"
"""In a step checkpoint: the best epoch's weights so far (``select = "best"``), when they are no longer the model's."""

# What --resume compares (see check_resume). These settings define what the run's updates and dev scores are; a
# resume that changes one of them is refused, naming each. Unlike pretraining, whose long runs need steering, the
# learning-rate recipe and the number of epochs are fixed too: a fine-tuning run is short, and its results.json
# records one config, which a recipe changed half-way would misreport. The inputs are compared by content, not by
# path: the init checkpoint's weights, the data files read, the encoded examples (the tokenizer) and the model's
# shape (see ``Run.identity``).
RUN_DEFINING = ("task", "train_split", "eval_split", "skip_bad_rows", "lr", "batch_size", "epochs", "warmup",
                "schedule", "batching", "clf_pdrop", "grad_clip", "weight_decay", "decay", "lm_weight", "transfer_layers",
                "select", "seed", "n_ctx", "max_train_examples", "max_eval_examples")
# What a run recorded before a setting existed did: runs recorded before `batching` were length-bucketed, so resuming
# one with today's default ("random") is refused by name instead of silently changing its batch order; runs recorded
# before `layout` trained padded, so resuming one packed is noted.
RECORDED_BEFORE = {"batching": "length", "layout": "padded"}
# Settings a resume may change, each noted when it does: how the same updates and dev scores are computed. The
# micro-batch is memory (a resume on a smaller device must be able to lower it); it, the device, the precision and
# the kernels change the arithmetic (and the micro-batch the order of the dropout draws), so the continuation is no
# longer bitwise the uninterrupted run; the evaluation batch may change a dev score's last bits.
ADJUSTABLE = ("micro_batch_size", "eval_batch_size", "device", "precision", "kernels", "layout")
# Taken silently: where things are (compared by content instead), how the run is watched and kept, and the two
# switches that say what to do with --out.
UNCOMPARED = ("init", "tokenizer", "model", "data_dir", "out", "verify", "log_every", "save_every", "keep_last",
              "overwrite", "resume", "cache", "workers", "wandb")


@dataclass
class FinetuneConfig:
    """Settings of one fine-tuning run. Defaults are the paper's (§4.1) unless noted."""

    task: str = ""
    """Registry name of the task (``gpt1 finetune --list-tasks``)."""
    init: str = ""
    """Pretrained checkpoint (or run directory) to start from, a Hugging Face Hub id (``openai-gpt``,
    ``owner/name[@revision]``: converted once), or ``none`` for a randomly initialised model. Not given: ``openai-gpt``,
    OpenAI's released GPT-1 (`gpt1 finetune` resolves ids and the default; the library itself takes a path)."""
    verify: bool = True
    """Check the ``init`` checkpoint's files against their checksums before loading it, and on --resume the run's
    own checkpoints (a damaged newer one is skipped with a warning); --no-verify skips both."""
    out: str | None = None
    """Run directory: metrics.jsonl, config.toml, results.json, checkpoints/final (never the --init run itself).
    Not given (None): ``runs/finetune-<task>``, or the next free ``-2``, ``-3``, … (a default never reuses a run)."""
    tokenizer: str | None = None
    """With ``init = "none"``: a tokenizer directory, or a checkpoint whose tokenizer *and* shape are used."""
    model: str = "gpt1"
    """With ``init = "none"`` and a bare tokenizer: the model preset, which picks the architecture too (``gpt1``,
    ``tiny``; the LSTM baseline ``lstm``, ``lstm-tiny``)."""
    data_dir: str | None = None
    """The task's official folder; default ``$GPT1_DATA/<folder>``."""
    cache: bool = True
    """Keep the encoded examples in ``$GPT1_CACHE`` (default ``~/.cache/gpt1/encoded``) and reuse them when the
    data, tokenizer, task and n_ctx are the same; --no-cache encodes afresh and writes nothing there."""
    workers: int = 0
    """Processes that tokenize the examples (0 = all cores); the ids are the same for any number."""
    skip_bad_rows: bool = False
    """Skip and count malformed rows instead of stopping at the first."""
    train_split: str = "train"
    """Split to train on."""
    eval_split: str = "dev"
    """Split scored after every epoch (and used by ``select = "best"``); empty to skip."""
    lr: float = 6.25e-5
    """Peak learning rate."""
    batch_size: int = 32
    """Examples per update (a multiple-choice example holds one sequence per answer)."""
    micro_batch_size: int | None = None
    """Examples per forward/backward (gradient accumulation up to ``batch_size``); None = the whole batch."""
    epochs: int = 3
    """Passes over the training split."""
    warmup: float = 0.002
    """Linear warm-up as a fraction of all updates (0.2%), then ``schedule`` decay to 0."""
    schedule: Literal["warmup_linear", "linear", "cosine", "constant"] = "warmup_linear"
    """``warmup_linear``: the released code's function exactly, lr·(1 − t/T) with the warm-up ramp t/(warmup·T)
    multiplied in while t ≤ warmup·T (the first update runs at lr 0); ``linear``/``cosine``/``constant``: gpt1's
    earlier schedule, a warm-up over ceil(warmup·T) updates (at least 1, the first at lr/W) and then the decay from
    the end of the warm-up."""
    batching: Literal["random", "length"] = "random"
    """Training batch order. ``random``: i.i.d. shuffled minibatches, as the paper and the released code.
    ``length``: length-bucketed batches (shuffled pools of 50 batches sorted by length), the fast option: on RTE
    (batch 32, n_ctx 512) 32× fewer pad tokens (4.7% of the positions instead of 61%) and, with the tiny model on
    CPU, ~1.3× the updates per second at lm_weight 0 (none measurable at 0.5, where the 40k-vocabulary LM
    projection dominates); but a batch then holds examples of similar length (see docs/finetune.md)."""
    layout: Literal["packed", "padded"] = "packed"
    """How a training micro-batch is laid out. ``packed``: its sequences end to end in one row, each attending to
    itself only, so no layer computes on padding (61% of RTE's positions with random batches): the same examples,
    order and losses, with dropout masks drawn over the real positions only; the dev scoring packs too, with a
    multiple-choice example's shared context run once for all its answers. ``padded``: every sequence padded to
    the batch's longest, the reference it is tested against. The LSTM baseline is always padded."""
    clf_pdrop: float = 0.1
    """Classifier dropout before the head."""
    grad_clip: float = 1.0
    """Global gradient-norm clipping (0 disables)."""
    weight_decay: float = 0.01
    """Decoupled weight decay on weight matrices (as pretraining)."""
    decay: Literal["paper", "released"] = "paper"
    """Which tensors decay: ``paper`` (not biases/LayerNorm) or ``released`` (every tensor with ndim > 1)."""
    lm_weight: float = 0.5
    """λ of the auxiliary LM loss (L3 = L2 + λ·L1); 0 disables it (ablation)."""
    transfer_layers: int | None = None
    """Keep the embeddings and only the first K blocks (an LSTM: layers) of the checkpoint (ablation); None = all."""
    select: Literal["best", "last"] = "best"
    """Which epoch's weights the final checkpoint keeps: best dev score or the last epoch."""
    seed: int = 42
    """Seeds the head init, special-token rows, dropout, shuffling and subsampling."""
    n_ctx: int | None = None
    """Longest sequence (default: the model's context); transformations truncate to it."""
    max_train_examples: int | None = None
    """Train on a random subset of this many examples (quick experiments, tests)."""
    max_eval_examples: int | None = None
    """Score a random subset of this many dev examples."""
    eval_batch_size: int | None = None
    """Examples per evaluation batch (default: 2 × batch_size)."""
    device: str = "auto"
    """auto, cpu or cuda[:N]."""
    precision: str = "auto"
    """auto, fp32, bf16 or fp16 (autocast; weights stay fp32)."""
    kernels: str = "auto"
    """How the model is computed, not what: auto = the fast CPU kernels of gptcli/model/kernels on CPU (PyTorch's
    fused ones elsewhere); reference = plain PyTorch everywhere (SDPA, F.dropout, F.cross_entropy)."""
    log_every: int = 10
    """Write a training record to metrics.jsonl every this many updates."""
    wandb: str | None = None
    """Also log to Weights & Biases (rank 0): the same scalars, this config and the checkpoint paths, under this
    project (``--wandb`` alone: ``gpt1``); files in RUN/wandb; WANDB_MODE=offline logs without a network (needs
    gpt1[wandb])."""
    save_every: int = 1000
    """Checkpoint every this many updates to RUN/checkpoints/step-N (also after every epoch's dev score and on
    SIGINT/SIGTERM); 0 = only those. Step checkpoints are deleted when the run finishes."""
    keep_last: int = 2
    """Step checkpoints kept while the run trains (older ones deleted); 0 = keep all."""
    resume: bool = False
    """Continue the unfinished run in ``out`` from its newest intact checkpoint (a fresh start if it has none). The
    task, data, init checkpoint, seed, batch size and recipe must stay as they were; progress, logging and
    checkpoint cadence may change."""
    overwrite: bool = False
    """Replace a finished fine-tuning run in ``out``, or start an unfinished one over (kept whole until the new one
    is complete; any other kind of directory is refused)."""


@dataclass
class FinetuneResult:
    """What :func:`finetune` returns."""

    run_dir: Path
    """The run directory (``config.out``)."""
    checkpoint: Path
    """``RUN/checkpoints/final``: body + head + tokenizer of the kept epoch."""
    results: dict[str, Any]
    """The contents of ``RUN/results.json``."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """One evaluation record per epoch (as in metrics.jsonl)."""
    stopped_by: str | None = None
    """The signal that stopped the run early (``checkpoint`` is then the step checkpoint to resume from, and
    ``results`` is empty)."""
    step: int = 0
    """Updates done (the resumed ones included)."""
    total: int = 0
    """Updates planned."""


def default_run_dir(task: str) -> Path:
    """Where a run started without ``out`` goes (or the next free ``-2``, ``-3``, … beside it)."""
    return Path("runs") / f"finetune-{task}"


def finetune(config: FinetuneConfig, progress: Progress | None = None,
             parallel: Parallel | None = None) -> FinetuneResult:
    """Run (or, with ``resume``, continue) one fine-tuning job as configured; returns where the checkpoint and
    results went, or, when a signal stopped it, the checkpoint to resume from.

    ``parallel`` (from :func:`gptcli.train.distributed.join`) makes this one rank of a data-parallel job: every rank
    calls it alike; each trains on its share of every global batch and scores its share of the dev split, and rank
    0 alone writes (see :func:`rank_share`, :func:`eval_shard`). Progress is reported on rank 0 only. ``out`` is
    locked for the run (rank 0 alone, or the job's launcher: :func:`gptcli.locks.output_lock`)."""
    par = parallel or Parallel()
    with main_rank_lock(config.out, par.is_main):
        return _finetune(config, progress, par)


def _finetune(config: FinetuneConfig, progress: Progress | None, par: Parallel) -> FinetuneResult:
    report = (progress or SILENT) if par.is_main else SILENT
    check_config(config)
    check_world(config, par.world_size)
    set_kernels(config.kernels)
    task = get_task(config.task)
    if not config.out:  # what `gpt1 finetune` chooses too (it says so before calling here)
        config = dataclasses.replace(config, out=str(next_free(default_run_dir(task.name))))
        report.note(f"run directory: {config.out}")
    plan = plan_run_dir(config, task, report)
    par.barrier()  # every rank has looked at the run directory before rank 0 writes in it
    if plan.mode == "done":
        return finished_run(config, plan.out, report, tidy=par.is_main)
    # A worker of a job computes on its own device (cuda:LOCAL_RANK), which a bare "cuda" would not name.
    device = par.device if par.device is not None else resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    configure_backends(device)
    # Data first: a missing or malformed file should fail before any weights are loaded.
    data = read_task_data(task, config)
    _seed_everything(config.seed)
    gpt, tok, source = build_body(config)
    run = build_run(config, task, data, gpt, tok, source, device, precision, report, parallel=par)
    lstm_note = precision_note(device.type, precision) if arch_of(gpt.config) == "lstm" else None
    if lstm_note is not None:
        report.note(lstm_note)
    run.resumable = plan.mode != "replace"
    if run.resumable:
        run.identity = run_identity(run)
    if plan.resume_from is not None:
        for note in check_resume(run, plan.resume_from):
            report.note(note)
    with _rank_directory(par, plan) as work:
        run.work = work
        run.logger = _start_rank(run, plan, report)
        scored = f"{len(data.dev)} {config.eval_split} examples" if config.eval_split else "no evaluation split"
        report.note(f"{task.name}: {len(data.train)} training examples, {scored}; {run.total} updates")
        if plan.resume_from is not None:
            report.note(f"resuming from {plan.resume_from.name}: update {run.step} of {run.total}, epoch {run.epoch}")
        stopped_by = train_epochs(run, report)
        if stopped_by is not None:
            return FinetuneResult(plan.out, run.last_ckpt or plan.out, {}, run.history, stopped_by, run.step, run.total)
        return _finish(run, plan.out)


def _finish(run: Run, out: Path) -> FinetuneResult:
    """Keep the selected epoch's weights and write ``checkpoints/final`` and results.json (rank 0; the other ranks
    return the run's history only)."""
    if not run.par.is_main:
        run.par.barrier()
        return FinetuneResult(out, out / "checkpoints" / FINAL, {}, run.history, None, run.step, run.total)
    assert run.work is not None
    chosen_epoch = keep_selected_weights(run)
    result = write_outputs(run, out, chosen_epoch, run.work)
    # The run is complete: its step checkpoints were there only to resume it (up to 1.9 GB each for GPT-1).
    ckpt.remove_step_checkpoints(run.work / "checkpoints")
    run.par.barrier()
    return result


def check_config(c: FinetuneConfig) -> None:
    """Refuse settings that cannot work, before anything is read or loaded: every number by its one rule
    (:data:`gptcli.config.RULES`, the same in every command), then the combinations."""
    if not c.task:
        raise GPT1Error("no task given (--task NAME; see --list-tasks)")
    check_mode(c.kernels)
    check_settings(c)
    if c.init.lower() == "none" and not c.tokenizer:
        raise GPT1Error("--init none needs --tokenizer DIR (a tokenizer directory or a checkpoint) to encode the task")
    if c.transfer_layers is not None and c.init.lower() == "none":
        raise GPT1Error("--transfer-layers needs a pretrained --init checkpoint (with --init none nothing is transferred)")
    if c.resume and c.overwrite:
        raise GPT1Error("--resume continues the run in --out and --overwrite starts it over (pass one of them)")


def check_world(c: FinetuneConfig, world_size: int) -> None:
    """Refuse a global batch that ``world_size`` processes cannot share (checked by the launcher before any worker
    starts, and by every worker). A batch the processes do not divide evenly is handled exactly (shares differ by
    one example and the loss is weighted by example counts); one smaller than the processes would leave some of
    them without examples in every update."""
    if world_size > 1 and c.batch_size < world_size:
        raise GPT1Error(f"--batch-size {c.batch_size} is smaller than the {world_size} processes: every update would "
                        f"leave a process without examples (use a batch of at least {world_size}, or fewer processes)")


def plan_launch_run(config: FinetuneConfig, world_size: int) -> "RunDirPlan":
    """What a launcher checks once before it starts ``world_size`` workers: the settings, the batch against the
    processes, and what the run does with ``out`` (without hashing checkpoints: each worker verifies the one it
    resumes from). A refusal here is the workers' own one-line error, before any process starts."""
    check_config(config)
    check_world(config, world_size)
    return plan_run_dir(dataclasses.replace(config, verify=False), get_task(config.task), SILENT)


@dataclass
class RunDirPlan:
    """What a run does with ``out``, decided before anything is read or written (:func:`plan_run_dir`)."""

    out: Path
    mode: Literal["fresh", "resume", "replace", "done"]
    """``fresh``: a new run written in ``out`` itself (empty, missing, or an unfinished run with no checkpoint);
    ``resume``: continue the unfinished run in ``out``; ``replace``: build a new run in a hidden sibling and swap it
    in when complete (``overwrite`` of a finished run or of an unfinished one's checkpoints); ``done``: ``resume``
    of a finished run, which has nothing left to do."""
    resume_from: Path | None = None
    """The step checkpoint a resumed run continues from."""


def check_run_dir(config: FinetuneConfig, task: Any) -> Path:
    """``config.out``, if this run may write there: never an input (the --init checkpoint or run, the tokenizer,
    the task's data), never another kind of directory (a pretraining run, a folder of notes). Checked before
    anything is read or written."""
    out = Path(config.out)
    inputs = [Path(p) for p in (config.init, config.tokenizer) if p and p.lower() != "none"]
    try:
        inputs.append(task.data_dir(config.data_dir))
    except GPT1Error:
        pass  # missing data is reported when it is read, with the task's own advice
    check_output(out, "finetune-run", overwrite=True, inputs=inputs)
    return out


def plan_run_dir(config: FinetuneConfig, task: Any, report: Progress) -> RunDirPlan:
    """Decide what to do with ``out`` (see :class:`RunDirPlan`). A finished run is replaced only with ``overwrite``;
    an unfinished one with checkpoints is continued with ``resume``, started over with ``overwrite``, and refused
    otherwise (its checkpoints are hours of work); one without checkpoints is simply run again."""
    out = check_run_dir(config, task)
    steps = step_checkpoints(out)
    finished = (out / "checkpoints" / FINAL).exists()
    if config.resume and steps:
        return RunDirPlan(out, "resume", _resume_point(out, steps, config.verify, report))
    if config.overwrite and (finished or steps):
        return RunDirPlan(out, "replace")
    if finished and config.resume and (out / RESULTS).is_file():
        return RunDirPlan(out, "done")
    if finished:
        raise GPT1Error(f"{out}: already holds a fine-tuned checkpoint (pass --overwrite to replace it)")
    if steps:
        raise GPT1Error(f"{out}: holds an unfinished fine-tuning run with checkpoints (pass --resume to continue it, "
                        "or --overwrite to start it over)")
    if config.resume:
        report.note(f"{out}: no checkpoint to resume from; starting the run")
    return RunDirPlan(out, "fresh")


def step_checkpoints(out: Path) -> list[Path]:
    """The run's step checkpoints (complete ones, damaged or not), oldest first."""
    d = out / "checkpoints"
    if not d.is_dir():
        return []
    return sorted(c for c in d.glob("step-*") if c.is_dir() and is_checkpoint(c))


def _resume_point(out: Path, steps: list[Path], verify: bool, report: Progress) -> Path:
    """The newest step checkpoint whose files verify, each newer damaged one skipped with a warning (with
    ``verify`` off: simply the newest)."""
    if not verify:
        return steps[-1]
    try:
        path, skipped = ckpt.newest_intact(out, candidates=steps)
    except GPT1Error as e:
        raise GPT1Error(f"{e} (restore a checkpoint, pass --no-verify to resume from the newest anyway, or "
                        "--overwrite to start the run over)") from None
    for bad, why in skipped:
        report.note(f"skipping checkpoint {bad.name}: {why}; resuming from {path.name}", level="warn")
    return path


def finished_run(config: FinetuneConfig, out: Path, report: Progress, tidy: bool = True) -> FinetuneResult:
    """``resume`` of a finished run: nothing to train, so the result it has (a resume is idempotent, e.g. for a job
    that is requeued after it ended) — unless a setting that defines the run changed, which is refused as any resume
    would be. Stale temporaries a kill in the run's last moments left in checkpoints/ are removed."""
    try:
        results = json.loads((out / RESULTS).read_text(encoding="utf-8"))
        old = dict(results["config"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise GPT1Error(f"{out / RESULTS}: unreadable results of a finished run ({e}) (pass --overwrite to run it "
                        "again)") from None
    defaults = {f.name: f.default for f in dataclasses.fields(FinetuneConfig)} | RECORDED_BEFORE
    changed = [f"{k} {old.get(k, defaults[k])} → {getattr(config, k)}" for k in RUN_DEFINING
               if old.get(k, defaults[k]) != getattr(config, k)]
    if changed:
        raise GPT1Error(f"{out}: the run is finished with other settings: {', '.join(changed)} (pass --overwrite to "
                        "run it again with these, or choose another --out)")
    if tidy:  # rank 0 of a data-parallel job alone
        ckpt.remove_step_checkpoints(out / "checkpoints")
    report.note(f"{out}: the run is already finished; nothing to resume")
    steps = int(results.get("steps", 0))
    return FinetuneResult(out, out / "checkpoints" / FINAL, results, list(results.get("history", [])), None, steps,
                          steps)


@contextlib.contextmanager
def run_directory(out: Path, replace: bool) -> Iterator[Path]:
    """Where a run writes. A new or resumed run writes in ``out`` itself, marked as a fine-tuning run at once (so
    even an interrupted one is recognised as gpt1's, and its checkpoints are where ``--resume`` looks); a run
    replacing an earlier one writes in a hidden sibling that is moved into place only when complete, so the
    earlier run survives a failed or interrupted one whole."""
    if not replace:
        out.mkdir(parents=True, exist_ok=True)
        if kind_of(out) != "finetune-run" or not (out / MARKER).is_file():
            mark(out, "finetune-run")
        yield out
        return
    tmp = temp_sibling(out)
    tmp.mkdir()
    try:
        mark(tmp, "finetune-run")
        yield tmp
        move_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op after a successful move


def _rank_directory(par: Parallel, plan: RunDirPlan) -> contextlib.AbstractContextManager[Path | None]:
    """Where this rank writes: rank 0 in :func:`run_directory`; the other ranks of a data-parallel job nowhere."""
    if par.is_main:
        return run_directory(plan.out, plan.mode == "replace")
    return contextlib.nullcontext(None)


# --------------------------------------------------------------------------------------------- the task's data


@dataclass
class TaskData:
    """The examples a run trains and scores on, and what reading them left out."""

    train: list[Any]
    dev: list[Any]
    skipped: list[str]
    """Malformed rows skipped with ``skip_bad_rows`` (``path:line: reason``)."""
    excluded: int
    """Rows the dataset's own rule leaves out (SNLI/MNLI ``gold_label == "-"``)."""


def read_split(task: Any, split: str, config: FinetuneConfig) -> tuple[list[Any], list[str], int]:
    """Examples of one split, the skipped bad rows (``path:line: reason``) and the count of rows the dataset's
    own rule leaves out (SNLI/MNLI ``gold_label == "-"``)."""
    opts = ReadOptions(skip_bad_rows=config.skip_bad_rows)
    examples = task.read(split, config.data_dir, opts)
    return examples, opts.skipped, len(getattr(opts, "excluded", []))


def read_task_data(task: Any, config: FinetuneConfig) -> TaskData:
    """The labeled training split and (unless ``eval_split`` is empty) the labeled dev split, subsampled."""
    train, skipped, excluded = read_split(task, config.train_split, config)
    unlabeled = sum(e.label is None for e in train)
    if unlabeled:
        raise GPT1Error(f"{task.name}: split {config.train_split!r} has {unlabeled} unlabeled rows; cannot train on it")
    dev: list[Any] = []
    if config.eval_split:
        dev, dev_skipped, dev_excluded = read_split(task, config.eval_split, config)
        skipped += dev_skipped
        excluded += dev_excluded
        if any(e.label is None for e in dev):
            raise GPT1Error(f"{task.name}: split {config.eval_split!r} is unlabeled; choose a labeled --eval-split")
    train = subsample(train, config.max_train_examples, config.seed)
    dev = subsample(dev, config.max_eval_examples, config.seed + 1)
    if not train:
        raise GPT1Error(f"{task.name}: no training examples in split {config.train_split!r}")
    return TaskData(train, dev, skipped, excluded)


# --------------------------------------------------------------------------------------------- the body


def reinit_after(gpt: nn.Module, keep_layers: int) -> None:
    """Re-initialise blocks ``keep_layers…`` with the model's own init (``transfer_layers`` ablation).

    The embeddings (token, position) and blocks ``0 … keep_layers-1`` keep their pretrained values, as the
    released code's ``n_transfer`` does. An LSTM keeps its embedding and LSTM layers ``0 … keep_layers-1``
    (:meth:`gptcli.model.lstm.LSTMLM.reinit_layers`; the paper's has one layer: 0 keeps the embedding only).
    """
    n = gpt.config.n_layer
    if not 0 <= keep_layers <= n:
        raise GPT1Error(f"--transfer-layers must be between 0 and {n} (the model's layers), got {keep_layers}")
    if hasattr(gpt, "reinit_layers"):  # the LSTM: one module holds every layer
        gpt.reinit_layers(keep_layers)
        return
    for block in list(gpt.blocks)[keep_layers:]:
        block.apply(gpt._init_weights)


def _load_tokenizer_from(path: str) -> tuple[Any, AnyConfig | None]:
    """A tokenizer: from a tokenizer directory or a prepared corpus (shape unknown: None), or from a checkpoint
    or run directory together with its model config (so a random model can have the pretrained one's shape)."""
    p = Path(path)
    if (p / "tokenizer.json").is_file():
        return load_tokenizer(p), None
    if is_checkpoint(p) or (p / "checkpoints").is_dir():
        header = read_header(p)
        if not (header.path / "tokenizer").is_dir():
            raise GPT1Error(f"{header.path}: checkpoint has no tokenizer/")
        mcfg = config_from_dict(header.arch, header.model)
        mcfg.n_special = 0
        return load_tokenizer(header.path / "tokenizer"), mcfg
    if (p / "tokenizer" / "tokenizer.json").is_file():  # a prepared corpus directory
        return load_tokenizer(p / "tokenizer"), None
    raise GPT1Error(f"{p}: not a tokenizer directory, prepared corpus, checkpoint or run directory")


def build_body(config: FinetuneConfig) -> tuple[LanguageModel, Any, dict[str, Any]]:
    """The GPT body with its three special tokens, the tokenizer, and a description of where it came from."""
    n_sp = 3
    if config.init.lower() == "none":
        if not config.tokenizer:
            raise GPT1Error("--init none needs --tokenizer DIR (a tokenizer directory or a checkpoint) to encode the task")
        tok, mcfg = _load_tokenizer_from(config.tokenizer)
        if mcfg is None:
            try:
                mcfg = preset(config.model, vocab_size=tok.vocab_size)
            except KeyError as e:
                raise GPT1Error(f"--model: {e.args[0]}") from None
        mcfg.vocab_size = tok.vocab_size
        gpt = build_model(mcfg)
        source: dict[str, Any] = {"init": "none", "tokenizer": str(config.tokenizer)}
    else:
        if not config.init:
            raise GPT1Error("no checkpoint to fine-tune: pass --init CHECKPOINT (or --init none for no pretraining)")
        ck = load_checkpoint(config.init, verify=config.verify)
        gpt = ck.model
        tok = ck.tokenizer
        if config.tokenizer:
            tok, _ = _load_tokenizer_from(config.tokenizer)
        if tok is None:
            raise GPT1Error(f"{ck.path}: checkpoint has no tokenizer/ (pass --tokenizer DIR)")
        n_sp = max(0, 3 - gpt.config.n_special)
        # What a resume compares the init checkpoint by (its recorded checksum; computed for older checkpoints).
        weights_sha = read_header(ck.path).files.get(ckpt.WEIGHTS) or sha256_file(ck.path / ckpt.WEIGHTS)
        source = {"init": str(ck.path), "init_kind": ck.kind, "init_meta": ck.meta, "init_sha256": weights_sha}
    if tok.vocab_size != gpt.config.vocab_size:
        raise GPT1Error(
            f"tokenizer has {tok.vocab_size} ids but the model's vocabulary has {gpt.config.vocab_size}: "
            "they must come from the same pretraining run"
        )
    gpt.add_special_tokens(n_sp)  # start, delimiter, extract: new rows drawn from N(0, 0.02)
    if config.transfer_layers is not None and config.init.lower() != "none":
        reinit_after(gpt, config.transfer_layers)
        source["transfer_layers"] = config.transfer_layers
    return gpt, tok, source


# --------------------------------------------------------------------------------------------- model, loss, run state


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
        """The terms over the global batch, when the ranks' shares were added up (:func:`_global_figures`)."""

    def __call__(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        bare = unwrap(model)  # the forward goes through ``model`` (a DDP wrapper sees it); attributes from the bare one
        factor = self.weights[len(self.parts["clf_loss"])][0] if self.weights else 1.0
        out, hidden = model(batch.ids, batch.n_seqs, batch.packing)
        clf = bare.head.loss(out, batch.labels)
        self.parts["clf_loss"].append(clf.detach().float())
        if self.lm_weight == 0:
            return clf if factor == 1.0 else clf * factor
        if batch.packing is not None:
            lm = lm_loss_per_sequence_packed(hidden, batch.ids, batch.packing, bare.gpt.lm_logits).mean()
        else:
            lm = lm_loss_per_sequence(hidden, batch.ids, batch.mask, bare.gpt.lm_logits).mean()
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
        """Each term of the last update read (:func:`_settle`) over the global batch."""
        return dict(self.reduced or {})


def combine_terms(parts: dict[str, list[float]], weights: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Each term over one update: this process's micro-batches weighted by their share of the global batch (a
    plain mean of the micro-batches when no shares were given)."""
    if weights:
        return {k: sum(x * w[1] for x, w in zip(v, weights)) for k, v in parts.items()}
    return {k: sum(v) / len(v) for k, v in parts.items()}


@dataclass
class PendingUpdate:
    """An update whose figures are still on the device (read at the next sync point, :func:`_settle`)."""

    step: int
    """Its 1-based number."""
    result: StepResult
    terms: dict[str, list[torch.Tensor]]
    weights: list[tuple[float, float]]
    tokens: int
    """This rank's real tokens in it (counted on the host)."""


@dataclass
class Run:
    """What the stages of one run share: the inputs, the model and its trainer, and the running state. Everything
    from ``step`` to ``records`` is saved in a step checkpoint (:func:`save_step`) and restored on resume."""

    config: FinetuneConfig
    task: Any
    device: torch.device
    precision: str
    data: TaskData
    tokenizer: Any
    n_ctx: int
    train_enc: list[Encoded]
    dev_enc: list[Encoded]
    head_config: HeadConfig
    model: FinetuneModel
    loss: TaskLoss
    trainer: Trainer
    total: int
    """Updates in the whole run."""
    source: dict[str, Any]
    """Where the body came from (init checkpoint, its kind and meta, transfer_layers): checkpoint meta."""
    par: Parallel = field(default_factory=Parallel)
    """This process's place in a data-parallel job (one process by default); rank 0 alone writes."""
    logger: RunLogger | None = None
    work: Path | None = None
    """The directory the run writes in (``out``, or the hidden one that becomes ``out``)."""
    resumable: bool = True
    """Whether the run saves step checkpoints and stops cleanly on a signal (not when it replaces a finished run:
    it builds in a hidden directory that an interruption removes)."""
    identity: dict[str, Any] = field(default_factory=dict)
    """What the run was made from, by content (:func:`run_identity`), for :func:`check_resume`."""
    step: int = 0
    epoch: int = 1
    """The epoch in progress (1-based)."""
    done_in_epoch: int = 0
    """Batches of the current epoch already trained on."""
    evaluated: bool = False
    """Whether the current epoch is complete: trained and scored on the dev split."""
    shuffle: random.Random = field(default_factory=random.Random)
    """Orders every epoch's batches (seeded with ``config.seed``; one stream through the whole run)."""
    epoch_rng: Any = None
    """``shuffle``'s state at the start of the current epoch: the current epoch's batch order is rebuilt from it."""
    tokens: int = 0
    window_loss: float = 0.0
    window_n: int = 0
    """Sum and count of the update losses since the last training record (the record logs their mean)."""
    records: int = 0
    """Records written to metrics.jsonl (a resume keeps this many)."""
    window_tokens: int = 0
    """Tokens since the last training record (for tokens_per_s)."""
    t0: float = 0.0
    t_log: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    """(dev score, epoch, weights) of the best epoch so far; weights empty for the last epoch (still in the model)."""
    last_ckpt: Path | None = None
    saved: tuple[int, bool] | None = None
    """(step, evaluated) of the newest step checkpoint this process wrote: a stop right after it saves nothing new."""
    pending: list[PendingUpdate] = field(default_factory=list)
    """Updates since the last sync point, their figures not read from the device yet."""
    grad_norm: float = float("nan")
    """The gradient norm of the last update read."""
    last_loss: float = float("nan")
    """The global loss of the last update read."""
    last_lr: float = 0.0
    """The learning rate of the last update read."""

    def log(self, record: dict[str, Any]) -> None:
        assert self.logger is not None or not self.par.is_main, "the run directory is started before training"
        if self.logger is not None:  # rank 0 writes; the other ranks only count, as rank 0 does
            self.logger.log(record)
        self.records += 1


def build_run(config: FinetuneConfig, task: Any, data: TaskData, gpt: GPT, tok: Any, source: dict[str, Any],
              device: torch.device, precision: str, progress: Progress | None = None,
              parallel: Parallel | None = None) -> Run:
    """Encode the examples, put the head on the body and set up the optimizer, schedule and trainer (the model
    wrapped for ``parallel``'s ranks)."""
    par = parallel or Parallel()
    n_ctx = min(config.n_ctx or gpt.config.n_ctx, gpt.config.n_ctx)
    train_enc, dev_enc = _main_first(par, config.cache,
                                     lambda: encode_task_data(config, task, data, tok, n_ctx, progress))
    head_cfg = HeadConfig(kind=task.kind, n_embd=gpt.config.n_embd, n_labels=max(1, len(task.labels)),
                          extract_id=tok.extract_id, pdrop=config.clf_pdrop, init_std=gpt.config.init_std)
    model = FinetuneModel(gpt, TaskHead(head_cfg)).to(device)
    total = num_batches(len(train_enc), config.batch_size, batching=config.batching) * config.epochs
    optimizer = make_optimizer(model, config.lr, config.weight_decay, decay=config.decay, report=progress or SILENT)
    loss = TaskLoss(config.lm_weight)
    trainer = Trainer(par.wrap(model), optimizer, loss, lr_schedule(config, total),
                      device=device, precision=precision, grad_clip=config.grad_clip or None)
    run = Run(config, task, device, precision, data, tok, n_ctx, train_enc, dev_enc, head_cfg, model, loss,
              trainer, total, source, par=par, shuffle=random.Random(config.seed))
    run.epoch_rng = run.shuffle.getstate()
    return run


def encode_task_data(config: FinetuneConfig, task: Any, data: TaskData, tok: Any, n_ctx: int,
                     progress: Progress | None = None) -> tuple[list[Encoded], list[Encoded]]:
    """The training and dev examples encoded (through the encoding cache unless ``cache`` is off, over ``workers``
    processes): the same ids whichever way they were obtained, so the run is the same."""
    opts = dict(cache=config.cache, workers=config.workers, progress=progress)
    train_enc = encode_cached(task, data.train, tok, n_ctx, what=f"{task.name} {config.train_split}", **opts)
    dev_enc = encode_cached(task, data.dev, tok, n_ctx, what=f"{task.name} {config.eval_split}", **opts) if data.dev else []
    return train_enc, dev_enc


def _main_first(par: Parallel, cache: bool, work: Callable[[], T]) -> T:
    """``work()`` (encoding through the cache) on rank 0 first and then on the other ranks, which read what rank 0
    stored instead of racing it to write the same entries. Without the cache every rank encodes for itself."""
    if par.world_size == 1 or not cache:
        return work()
    if par.is_main:
        done = work()
        par.barrier()
        return done
    par.barrier()  # waits out rank 0's encoding: a cold MNLI can take minutes (GPT1_DIST_TIMEOUT bounds the wait)
    return work()


def _seed_everything(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def recorded(config: FinetuneConfig) -> FinetuneConfig:
    """The settings a run records (config.toml, checkpoints, results.json): ``resume`` and ``overwrite`` say what to
    do with ``out`` this time, not what the run is, and would make ``--resume`` of the saved config.toml refuse."""
    return dataclasses.replace(config, resume=False, overwrite=False)


def _start_run_dir(run: Run, plan: RunDirPlan, report: Progress) -> RunLogger:
    """The resolved config and metrics.jsonl: a resumed run restores its state and keeps the records its checkpoint
    had seen (dropping those a killed process wrote after it); a new one starts the file afresh."""
    assert run.work is not None
    for stale in run.work.glob(".*.tmp-*"):  # a file write (config, metrics, results) cut short by a kill
        if stale.is_file():
            stale.unlink()
    # Atomically: a config.toml cut short would be read back by `--resume` as a run with other settings.
    write_text_atomic(run.work / CONFIG_FILE, dumps_toml(to_dict(recorded(run.config))))
    metrics = run.work / METRICS
    if plan.resume_from is not None:
        restore_run(run, plan.resume_from)
        _keep_records(metrics, run.records, report)
    elif metrics.exists():
        metrics.unlink()  # an unfinished run without checkpoints started over
    return RunLogger(run.work, wandb=run.config.wandb, config=to_dict(recorded(run.config)))


def _start_rank(run: Run, plan: RunDirPlan, report: Progress) -> RunLogger | None:
    """Rank 0 starts the run directory (:func:`_start_run_dir`); every other rank only restores a resumed run's
    state. Then each rank but 0 gets its own dropout stream (:func:`gptcli.train.pretrain.seed_rank_rng`)."""
    from gptcli.train.pretrain import seed_rank_rng

    if run.par.is_main:
        logger: RunLogger | None = _start_run_dir(run, plan, report)
    else:
        logger = None
        if plan.resume_from is not None:
            restore_run(run, plan.resume_from)
    seed_rank_rng(run.config.seed, run.par.rank, run.step)
    return logger


def _keep_records(path: Path, n: int, report: Progress) -> None:
    """Keep the first ``n`` records of metrics.jsonl, saying so when fewer than that survived."""
    kept = keep_first_records(path, n)
    if kept < n:
        report.note(f"{path}: {n - kept} of the {n} records the checkpoint had seen are missing", level="warn")


# --------------------------------------------------------------------------------------------- training


def train_epochs(run: Run, report: Progress) -> str | None:
    """Every epoch from where the run stands: its remaining updates on the shuffled, length-bucketed training
    batches, a dev score, a checkpoint. Returns the name of the signal that stopped the run (after saving a step
    checkpoint), or None when every epoch is done. A run that is not resumable leaves signals as they are."""
    run.t0 = run.t_log = time.perf_counter()
    report.stage(f"finetune {run.task.name}", run.total, unit="updates", done=run.step)
    # A worker of a job (even of one process) hears one Ctrl-C twice, from the terminal and from the launcher, and
    # must still checkpoint: only a plain process takes a second signal as "stop at once".
    escalate = type(run.par) is Parallel
    try:
        with GracefulStop(escalate=escalate) if run.resumable else GracefulStop(signals=()) as stop:
            while run.epoch <= run.config.epochs:
                stopped = run_epoch(run, report, stop)
                if stopped is not None:
                    return stopped
            return None
    finally:
        if run.logger is not None:
            run.logger.close()
        report.end()


def lr_schedule(config: FinetuneConfig, total: int) -> Callable[[int], float]:
    """The learning rate of update ``s`` (0-based) of ``total``: the released ``warmup_linear`` or gpt1's earlier
    warm-up over ``ceil(warmup·total)`` updates followed by ``schedule`` decay."""
    if config.schedule == "warmup_linear":
        return lambda s: released_lr(s, total, config.lr, config.warmup)
    warmup_steps = math.ceil(config.warmup * total) if config.warmup > 0 else 0
    return lambda s: lr_at(s, total, config.lr, warmup_steps, config.schedule)


def epoch_batches(run: Run) -> list[list[int]]:
    """The current epoch's batches (index lists) in ``batching`` order, rebuilt from the shuffling RNG's state at the
    epoch's start; the RNG is left where the uninterrupted run leaves it, ready for the next epoch."""
    run.shuffle.setstate(run.epoch_rng)
    return train_batches([e.length for e in run.train_enc], run.config.batch_size, run.config.batching, run.shuffle)


def run_epoch(run: Run, report: Progress, stop: GracefulStop) -> str | None:
    """The rest of the current epoch: updates, the dev score, the epoch-end checkpoint (so a resume never scores an
    epoch twice); then move on to the next epoch. Returns the stopping signal's name, or None."""
    batches = epoch_batches(run)
    if not run.evaluated:
        stopped = train_one_epoch(run, batches, report, stop)
        if stopped is not None:
            return stopped
        # Data-parallel ranks finish the evaluation they share out and agree on a stop afterwards.
        record = evaluate_epoch(run, run.epoch, stop if run.par.world_size == 1 else None)
        if record is None:  # a signal came during the evaluation: it is redone on resume
            return _stop(run, stop)
        report.note(_epoch_line(record, run))
        run.evaluated = True
        save_step(run)
        if _stopping(run, stop):
            return _stop(run, stop)
    run.epoch, run.done_in_epoch, run.evaluated = run.epoch + 1, 0, False
    run.epoch_rng = run.shuffle.getstate()
    return None


def _stopping(run: Run, stop: GracefulStop) -> bool:
    """Whether a signal stops the run here: seen by any rank, so that every rank stops after the same update (a
    signal reaches the workers of a job one by one)."""
    return run.par.any(stop.requested is not None)


def _stop(run: Run, stop: GracefulStop) -> str:
    """Checkpoint where the run stands (unless the newest step checkpoint already holds it) for a signal."""
    if run.saved != (run.step, run.evaluated):
        save_step(run)
    return stop.name or "signal"


def train_one_epoch(run: Run, batches: list[list[int]], report: Progress, stop: GracefulStop) -> str | None:
    """The current epoch's remaining batches: an update per batch (micro-batches accumulate; under data
    parallelism each rank takes its share of the batch), a record every log_every, a step checkpoint every
    save_every (the epoch's last update is saved after its dev score instead). Returns the name of a signal that
    arrived, after checkpointing, or None at the end of the epoch.

    Updates are queued on the device without waiting for them. Their figures are read at *sync points* only — a
    logged or saved update and the epoch's last — where a non-finite loss stops the run, naming its update; a job
    of several processes also agrees there on whether a signal came (a single process checks after every update)."""
    c = run.config
    for idx in batches[run.done_in_epoch :]:
        _queue_update(run, idx)
        logging = run.step % c.log_every == 0 or run.step == run.total
        saving = every(run.step, c.save_every) and run.done_in_epoch < len(batches)
        synced = logging or saving or run.done_in_epoch == len(batches)
        if synced:
            _settle(run)
        if logging:
            _log_train(run, run.epoch, run.window_loss / run.window_n)
            report.advance(1, epoch=f"{run.epoch}/{c.epochs}", loss=run.last_loss, lr=run.last_lr)
            run.window_loss, run.window_n = 0.0, 0
        else:
            report.advance(1)
        if saving:
            save_step(run)
        if (synced or run.par.world_size == 1) and _stopping(run, stop):
            _settle(run)  # never checkpoint past a divergence
            return _stop(run, stop)
    return None


def _queue_update(run: Run, idx: Sequence[int]) -> None:
    """Queue the update of global batch ``idx`` on the device; its figures wait in ``run.pending``."""
    parts = micro_batches(idx, run.par.rank, run.par.world_size, run.config.micro_batch_size)
    regression = run.task.kind == "regression"
    extract = _packed_extract(run)
    if extract is not None:
        host = [collate_packed([run.train_enc[i] for i in chunk], extract, regression) for chunk, _, _ in parts]
    else:
        host = [collate([run.train_enc[i] for i in chunk], regression) for chunk, _, _ in parts]
    # Real tokens, from the encoded lengths (what the mask sums to): no tensor is read.
    tokens = sum(len(s) for chunk, _, share in parts if share > 0 for i in chunk for s in run.train_enc[i].seqs)
    run.loss.start_update([(factor, share) for _, factor, share in parts])
    res = run.trainer.step(run.step, [mb.to(run.device) for mb in host])
    run.step += 1
    run.done_in_epoch += 1
    run.pending.append(PendingUpdate(run.step, res, *run.loss.snapshot(), tokens))


def _settle(run: Run) -> None:
    """Read the pending updates' figures from the device (one transfer, and one collective over the ranks), stop on
    the first non-finite loss, and add them to the run's counts as if each had been read when it ran."""
    if not run.pending:
        return
    pending, run.pending = run.pending, []
    values = torch.cat([torch.stack([p.result.loss, p.result.grad_norm, *(t for v in p.terms.values() for t in v)])
                        for p in pending]).tolist()
    local, norms, at = [], [], 0
    for p in pending:
        loss, norm, *flat = values[at : at + 2 + sum(len(v) for v in p.terms.values())]
        at += 2 + len(flat)
        parts, k = {}, 0
        for name, v in p.terms.items():
            parts[name], k = flat[k : k + len(v)], k + len(v)
        local.append((loss, p.tokens, combine_terms(parts, p.weights)))
        norms.append(norm)
    for p, (loss, tokens, terms), norm in zip(pending, _global_figures(run, local), norms):
        if not math.isfinite(loss):
            raise GPT1Error(f"{run.task.name}: the loss became {loss} at update {p.step}; "
                            "lower --lr or use --precision fp32")
        run.tokens += tokens
        run.window_tokens += tokens
        run.window_loss += loss
        run.window_n += 1
        run.loss.reduced, run.grad_norm, run.last_loss = terms, norm, loss
    run.last_lr = pending[-1].result.lr


def rank_share(idx: Sequence[int], rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s part of the global batch ``idx`` (the same seeded order on every rank): contiguous, and the
    parts differ by at most one example (an epoch's last batch may be short; the batch need not divide evenly)."""
    n = len(idx)
    return list(idx[rank * n // world_size : (rank + 1) * n // world_size])


def micro_batches(idx: Sequence[int], rank: int, world_size: int,
                  micro: int | None) -> list[tuple[list[int], float, float]]:
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


def _global_figures(run: Run, updates: list[tuple[float, int, dict[str, float]]]
                    ) -> list[tuple[float, int, dict[str, float]]]:
    """Each update's (loss, real tokens, loss terms) over the global batch from this process's figures, added up
    over the ranks in one collective for all of them."""
    par = run.par
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


def _log_train(run: Run, epoch: int, loss: float) -> None:
    now = time.perf_counter()
    run.log({"kind": "train", "step": run.step, "epoch": epoch, "loss": loss, **run.loss.means(),
                    "lr": run.last_lr, "grad_norm": run.grad_norm, "tokens": run.tokens,
                    "tokens_per_s": round(run.window_tokens / max(now - run.t_log, 1e-9), 1),
                    "elapsed_s": round(now - run.t0, 3)})
    run.window_tokens, run.t_log = 0, now


class _Abandoned(Exception):
    """A signal arrived during a dev evaluation: it is left unfinished and redone on resume."""


def _until_stopped(batches: Iterator[Batch], stop: GracefulStop) -> Iterator[Batch]:
    for batch in batches:
        if stop.requested is not None:
            raise _Abandoned
        yield batch


# Keys of an epoch's eval record that are not scores (the prediction distribution rides along for the report).
NOT_SCORES = ("kind", "step", "epoch", "split", "prediction_counts", "prediction_stats", "constant_prediction")


def evaluate_epoch(run: Run, epoch: int, stop: GracefulStop | None = None) -> dict[str, Any] | None:
    """Score the dev split (when there is one), remember the best epoch's weights, log the record. None when a
    signal cut the evaluation short (nothing was changed: the model and every RNG are as before it)."""
    c = run.config
    record: dict[str, Any] = {"kind": "eval", "step": run.step, "epoch": epoch, "split": c.eval_split}
    if run.dev_enc:
        try:
            preds = predict_dev(run, stop)
        except _Abandoned:
            return None
        scores = score_predictions(run.task, preds, run.data.dev)
        record.update(scores)
        record.update(prediction_summary(run.task, preds))  # a one-class model is named as such, not just scored
        value = scores[run.task.metric]
        # Strictly better only: on ties the earlier epoch stays (as the released code's `>`). The last epoch's
        # weights are still in the model, so they need no copy.
        if c.select == "best" and (run.best is None or value > run.best[0]):
            # Every rank keeps the bookkeeping; rank 0 alone, which writes the final checkpoint, the weights.
            keep = epoch < c.epochs and run.par.is_main
            run.best = (value, epoch, _cpu_state(run.model) if keep else {})
    run.log(record)
    run.history.append(record)
    run.t_log, run.window_tokens = time.perf_counter(), 0  # evaluation time is not training throughput
    return record


def predict_dev(run: Run, stop: GracefulStop | None = None) -> list[Any]:
    """The model's prediction for every dev example, in the split's order. Under data parallelism each rank scores
    its share (:func:`eval_shard`) and the shares are gathered on every rank: MCC, F1 and correlations need all
    the predictions, not a mean of per-rank scores. ``stop`` (one process only) abandons the evaluation."""
    c, par = run.config, run.par
    size, regression = c.eval_batch_size or 2 * c.batch_size, run.task.kind == "regression"
    if par.world_size == 1:
        batches = iterate(run.dev_enc, size, shuffle=False, regression=regression, shared_extract=_packed_extract(run))
        preds, _ = predict(run.model, batches if stop is None else _until_stopped(batches, stop), run.device,
                           run.precision)
        return preds
    mine = [run.dev_enc[i] for i in eval_shard([e.length for e in run.dev_enc], par.rank, par.world_size)]
    preds, _ = predict(run.model, iterate(mine, size, shuffle=False, regression=regression,
                                          shared_extract=_packed_extract(run)), run.device,
                       run.precision)
    merged: dict[int, Any] = {}
    for shard in par.gather(list(zip(sorted(e.index for e in mine), preds))):  # predict orders by index
        merged.update(shard)
    return [merged[i] for i in sorted(merged)]


def _packed_extract(run: Run) -> int | None:
    """The extract id batches are packed with (``layout`` packed and a Transformer body: the LSTM has no packed
    path), or None for padded batches."""
    packed = run.config.layout == "packed" and isinstance(run.model.gpt, GPT)
    return run.model.head.config.extract_id if packed else None


def eval_shard(lengths: Sequence[int], rank: int, world_size: int) -> list[int]:
    """The dev examples rank ``rank`` scores: every ``world_size``-th of them by length, longest first, so that the
    ranks get about the same number of tokens to read."""
    by_length = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return by_length[rank::world_size]


def _epoch_line(record: dict[str, Any], run: Run | None = None) -> str:
    """``epoch 2 (update 6): dev accuracy 55.00 (majority 52.71)``: with ``run``, the level of always answering the
    most frequent training label (or chance) beside the headline, marked "≈ majority" when the score is that."""
    from gptcli.eval.baselines import baseline_of, constant_sentence, level_note

    scores = {k: v for k, v in record.items() if k not in NOT_SCORES}
    text = ", ".join(f"{k} {v:.2f}" for k, v in scores.items())
    base = baseline_of(run.task, run.data.train, run.data.dev) if run is not None and scores else None
    note = level_note(scores, base, run.task.metric) if base else ""
    line = f"epoch {record['epoch']} (update {record['step']}): {record.get('split') or 'no eval'} {text}".rstrip()
    constant = constant_sentence({**record, "n": len(run.data.dev)}) if run is not None else None
    return line + (f" ({note})" if note else "") + (f"; {constant}" if constant else "")


def _cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------------------------- resuming


def save_step(run: Run) -> None:
    """Checkpoint where the run stands to ``checkpoints/step-N`` (body + head + tokenizer, loadable by ``gpt1
    eval``) with its training state and, when they are no longer the model's, the best epoch's weights; prune to
    ``keep_last``. A run that is not resumable saves nothing, nor does any rank of a data-parallel job but 0."""
    if not run.resumable or not run.par.is_main:  # rank 0 alone writes
        return
    assert run.work is not None
    finite = torch.stack([torch.isfinite(p).all() for p in run.model.parameters()]).all()
    if not bool(finite):  # such a checkpoint would be the one --resume picks, and saving it would prune a good one
        raise GPT1Error(f"{run.task.name}: the weights became non-finite at update {run.step}; "
                        "lower --lr or use --precision fp32")
    best = run.best[2] if run.best is not None else {}

    def extra(d: Path) -> None:
        ckpt.write_training_state(d, run.trainer.optimizer, {"step": run.step, "finetune": _position(run)},
                                  scaler=run.trainer.scaler)
        if best:
            ckpt.save_tensors(best, d / BEST)

    meta = {**_checkpoint_meta(run, run.epoch, {}, {}), "stage": "finetune", "resume_identity": run.identity}
    where = run.work / "checkpoints"
    run.last_ckpt = save_checkpoint(where / ckpt.step_dir_name(run.step), run.model.gpt, run.tokenizer,
                                    kind="finetuned", meta=meta, head_state=run.model.head.state_dict(), extra=extra)
    run.saved = (run.step, run.evaluated)
    ckpt.prune_checkpoints(where, run.config.keep_last)


def _position(run: Run) -> dict[str, Any]:
    """Where the run stands, as JSON (floats round-trip exactly): :class:`Run` from ``step`` to ``records``."""
    version, state, gauss = run.epoch_rng
    return {"epoch": run.epoch, "done_in_epoch": run.done_in_epoch, "evaluated": run.evaluated,
            "epoch_rng": [version, list(state), gauss], "tokens": run.tokens, "window_loss": run.window_loss,
            "window_n": run.window_n, "records": run.records, "history": run.history,
            "best": None if run.best is None else [run.best[0], run.best[1]], "total": run.total}


def restore_run(run: Run, path: Path) -> None:
    """Load a step checkpoint into the freshly built run: weights, optimizer (and loss scaler), every RNG, the
    position and the best-epoch bookkeeping. Its files were verified when it was chosen (or --no-verify said not to)."""
    saved = load_checkpoint(path, load_tokenizer=False, verify=False)
    try:
        run.model.gpt.load_state_dict(saved.model.state_dict(), strict=True)
        run.model.head.load_state_dict(saved.head_state, strict=True)
    except RuntimeError as e:
        raise GPT1Error(f"{path}: checkpoint does not match the configured model ({str(e).splitlines()[0]}); "
                        "resume with the run's own settings") from None
    doc, tensors = ckpt.read_training_state(path, verify=False)
    ckpt.restore_training_state(doc, tensors, run.trainer.optimizer, scaler=run.trainer.scaler)
    pos = doc["finetune"]
    run.step = int(doc["step"])
    run.epoch, run.done_in_epoch, run.evaluated = pos["epoch"], pos["done_in_epoch"], pos["evaluated"]
    version, state, gauss = pos["epoch_rng"]
    run.epoch_rng = (version, tuple(state), gauss)
    run.tokens, run.window_loss, run.window_n = pos["tokens"], pos["window_loss"], pos["window_n"]
    run.records, run.history = pos["records"], pos["history"]
    if pos["best"] is not None:
        # Only rank 0 writes the final checkpoint, so only it needs the best epoch's weights.
        weights = ckpt.load_tensors(path / BEST) if (path / BEST).is_file() and run.par.is_main else {}
        run.best = (pos["best"][0], pos["best"][1], weights)
    run.last_ckpt, run.saved = path, (run.step, run.evaluated)


def run_identity(run: Run) -> dict[str, Any]:
    """What the run is made of, by content, recorded in every step checkpoint: the data files read (sha256 each,
    by path inside the task folder), the init checkpoint's weights, and the encoded examples (which the tokenizer,
    the truncation and the subsets decide)."""
    c = run.config
    folder = run.task.data_dir(c.data_dir)
    files: dict[str, str] = {}
    for split in dict.fromkeys(s for s in (c.train_split, c.eval_split) if s):
        for name in run.task.splits[split].files:
            top = folder / name
            for f in sorted(top.rglob("*")) if top.is_dir() else [top]:
                if f.is_file():
                    files[f.relative_to(folder).as_posix()] = sha256_file(f)
    h = hashlib.sha256()
    for e in [*run.train_enc, None, *run.dev_enc]:  # about 1 s for MNLI's 393k pairs
        if e is None:
            h.update(b"|dev|")
            continue
        for seq in e.seqs:  # length-prefixed, so the boundaries are part of what is hashed
            h.update(len(seq).to_bytes(4, "little") + array("q", seq).tobytes())
        h.update(repr(e.label).encode() + b";")
    return {"data_dir": str(folder.resolve()), "data_files": files, "init_sha256": run.source.get("init_sha256"),
            "examples_sha256": h.hexdigest()}



def check_resume(run: Run, path: Path) -> list[str]:
    """Refuse a resume from ``path`` that would change what the run is — a :data:`RUN_DEFINING` setting, the model's
    shape, the init weights, a data file or the encoded examples — naming each change with its old and new value;
    returns a note for the :data:`ADJUSTABLE` settings that changed."""
    header = read_header(path)
    old, ident, c = header.meta.get("finetune_config", {}), header.meta.get("resume_identity", {}), run.config
    defaults = {f.name: f.default for f in dataclasses.fields(FinetuneConfig)} | RECORDED_BEFORE
    changed, adjusted = [], []
    for key in RUN_DEFINING + ADJUSTABLE:
        was, now = old.get(key, defaults[key]), getattr(c, key)
        if was != now:
            (adjusted if key in ADJUSTABLE else changed).append(f"{key} {was} → {now}")
    shape = dataclasses.asdict(run.model.gpt.config)
    if header.arch != arch_of(run.model.gpt.config):  # the shared shape fields alone cannot tell an LSTM apart
        changed.append(f"architecture {header.arch} → {arch_of(run.model.gpt.config)}")
    changed += [f"model {k} {v} → {shape[k]}" for k, v in header.model.items() if k in shape and shape[k] != v]
    if ident.get("init_sha256") != run.identity.get("init_sha256"):
        was = old.get("init", "?")
        changed.append(f"init {c.init} (its weights changed since the run started)" if was == c.init
                       else f"init {was} → {c.init} (other weights)")
    changed += _changed_data(ident, run.identity, c)
    if not changed and ident.get("examples_sha256") != run.identity.get("examples_sha256"):
        changed.append(f"tokenizer {old.get('tokenizer') or 'of the init checkpoint'} → "
                       f"{c.tokenizer or 'of the init checkpoint'} (it encodes the examples differently)")
    if changed:
        raise GPT1Error(f"{c.out}: cannot resume with changed settings: {', '.join(changed)} (these define the run: "
                        "resume without changing them, or start a new run with another --out)")
    return [f"resuming with changed settings: {', '.join(adjusted)}"] if adjusted else []


def _changed_data(old: dict[str, Any], new: dict[str, Any], c: FinetuneConfig) -> list[str]:
    """Each data file whose content differs from the one the run started with (the folder may have moved)."""
    was, now = old.get("data_files", {}), new.get("data_files", {})
    differ = [f for f in sorted(set(was) | set(now)) if was.get(f) != now.get(f)]
    if not differ:
        return []
    if old.get("data_dir") != new.get("data_dir"):
        return [f"data {old.get('data_dir', '?')} → {new['data_dir']} (other files: {', '.join(differ)})"]
    return [f"data file {f} ({'changed since the run started' if f in now else 'no longer read'})" for f in differ]


# --------------------------------------------------------------------------------------------- outputs


def keep_selected_weights(run: Run) -> int:
    """Load the best epoch's weights back when ``select = "best"`` chose an earlier epoch; returns the kept epoch."""
    c = run.config
    if c.select == "best" and run.best is not None and run.best[1] != c.epochs:
        run.model.load_state_dict(run.best[2])
        return run.best[1]
    return c.epochs


def write_outputs(run: Run, out: Path, chosen_epoch: int, work: Path | None = None) -> FinetuneResult:
    """``RUN/checkpoints/final`` (body + head + tokenizer + head config) and ``RUN/results.json``, written in
    ``work`` (``out``, or the hidden directory that becomes ``out``); paths recorded are those under ``out``."""
    work = work or out
    chosen = next((h for h in run.history if h["epoch"] == chosen_epoch), {})
    dev_scores = {k: v for k, v in chosen.items() if k not in NOT_SCORES}
    run.model.cpu()
    ckpt = out / "checkpoints" / FINAL
    save_checkpoint(work / "checkpoints" / FINAL, run.model.gpt, run.tokenizer, kind="finetuned",
                    meta=_checkpoint_meta(run, chosen_epoch, chosen, dev_scores),
                    head_state=run.model.head.state_dict())
    results = _results(run, chosen_epoch, dev_scores, ckpt)
    write_text_atomic(work / RESULTS, json.dumps(results, indent=2, default=str))
    return FinetuneResult(out, ckpt, results, run.history)


def _checkpoint_meta(run: Run, epoch: int, chosen: dict[str, Any], dev_scores: dict[str, Any]) -> dict[str, Any]:
    """What the fine-tuned checkpoint says about itself (``gpt1 eval`` reads the task, head and context here)."""
    from gptcli.eval.baselines import label_counts

    c, task = run.config, run.task
    return {
        "task": task.name,
        "kind": task.kind,
        "labels": list(task.labels),
        "head": run.head_config.to_dict(),
        "n_ctx": run.n_ctx,
        "epoch": epoch,
        "step": chosen.get("step", run.step),
        "select": c.select,
        "dev_split": c.eval_split,
        "dev_scores": dev_scores,
        "train_label_counts": label_counts(task, run.data.train),  # gpt1 eval's majority level comes from these
        "finetune_config": to_dict(recorded(c)),
        **run.source,
    }


def _results(run: Run, epoch: int, dev_scores: dict[str, Any], ckpt: Path) -> dict[str, Any]:
    from gptcli.eval.baselines import baseline_of

    c, task = run.config, run.task
    return {
        "task": task.name,
        "title": task.title,
        "split": c.eval_split,
        "metric": task.metric,
        "paper_score": task.paper_score,
        "scores": dev_scores,
        "baseline": baseline_of(task, run.data.train, run.data.dev),  # what a trivial predictor scores here
        **{k: v for h in run.history if h["epoch"] == epoch for k, v in h.items() if k in NOT_SCORES[4:]},
        "epoch": epoch,
        "select": c.select,
        "checkpoint": str(ckpt),
        "n_train": len(run.data.train),
        "n_eval": len(run.data.dev),
        "skipped_rows": run.data.skipped,
        "excluded_rows": run.data.excluded,
        "history": run.history,
        "steps": run.step,
        "elapsed_s": round(time.perf_counter() - run.t0, 3),
        "config": to_dict(recorded(c)),
    }
