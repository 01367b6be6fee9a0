"""Fine-tuning on a task (paper §3.2, §4.1): body + linear head, task loss + λ·LM loss.

``finetune(FinetuneConfig(task="rte", init="runs/pre/checkpoints/step-0100000", out="runs/rte"))`` loads the
pretrained checkpoint (weights + tokenizer), appends the three special tokens (start, delimiter, extract) with
N(0, 0.02) embeddings, builds the task head, and trains with the paper's settings. After every epoch it scores
the dev split with the task's metric; the final checkpoint (``RUN/checkpoints/final``) holds the best (or last)
epoch's body + head, the tokenizer and the head config, and ``RUN/results.json`` its dev scores.

A run is a sequence of named stages, top to bottom in :func:`finetune`: read the task data, build the body,
encode and build the model + optimizer (:func:`build_run`), train epoch by epoch with a dev score after each,
keep the best (or last) epoch's weights, write the checkpoint and ``results.json``. The run directory is checked
before anything is read (:func:`check_run_dir`: never an input, never another kind of directory) and written through
:func:`run_directory` (an earlier run it replaces stays whole until the new one is complete). Progress goes through
:mod:`gptcli.progress`: one stage per run sized in updates, ``advance(1, epoch=, loss=, lr=)`` per update and a
note with the dev scores after every epoch.

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
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

import torch
import torch.nn as nn

from gptcli.checkpoint import is_checkpoint, load_checkpoint, read_header, save_checkpoint
from gptcli.config import save_config, to_dict
from gptcli.data.batching import Batch, bucketed_batches, collate, iterate, num_batches, subsample
from gptcli.data.transforms import Encoded, encode_examples
from gptcli.errors import GPT1Error
from gptcli.eval.metrics import score_predictions
from gptcli.fsutil import move_into_place, write_text_atomic
from gptcli.model.classifier import FinetuneModel, predict
from gptcli.model.gpt import GPT, ModelConfig, preset
from gptcli.model.heads import HeadConfig, TaskHead
from gptcli.model.losses import lm_loss_per_sequence
from gptcli.outputs import check_output, mark
from gptcli.progress import SILENT, Progress
from gptcli.runtime import configure_backends, resolve_device, resolve_precision
from gptcli.tasks import ReadOptions, get_task
from gptcli.tokenizers import load_tokenizer
from gptcli.train.optim import lr_at, make_optimizer
from gptcli.train.runlog import RunLogger
from gptcli.train.trainer import StepResult, Trainer

RESULTS = "results.json"
FINAL = "final"
CONFIG_FILE = "config.toml"


@dataclass
class FinetuneConfig:
    """Settings of one fine-tuning run. Defaults are the paper's (§4.1) unless noted."""

    task: str = ""
    """Registry name of the task (``gpt1 finetune --list-tasks``)."""
    init: str = ""
    """Pretrained checkpoint (or run directory) to start from, or ``none`` for a randomly initialised model."""
    verify: bool = True
    """Check the ``init`` checkpoint's files against their checksums before loading it (--no-verify skips it)."""
    out: str = "runs/finetune"
    """Run directory: metrics.jsonl, config.toml, results.json, checkpoints/final (never the --init run itself)."""
    tokenizer: str | None = None
    """With ``init = "none"``: a tokenizer directory, or a checkpoint whose tokenizer *and* shape are used."""
    model: str = "gpt1"
    """With ``init = "none"`` and a bare tokenizer: the model preset (``gpt1``, ``tiny``)."""
    data_dir: str | None = None
    """The task's official folder; default ``$GPT1_DATA/<folder>``."""
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
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    """Decay after warm-up (paper: linear)."""
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
    """Keep the embeddings and only the first K blocks of the checkpoint (ablation); None = all."""
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
    log_every: int = 10
    """Write a training record to metrics.jsonl every this many updates."""
    overwrite: bool = False
    """Replace a finished fine-tuning run in ``out`` (kept whole until the new one is complete; any other kind of
    directory is refused)."""


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


def finetune(config: FinetuneConfig, progress: Progress | None = None) -> FinetuneResult:
    """Run one fine-tuning job as configured; returns where the checkpoint and results went."""
    report = progress or SILENT
    check_config(config)
    task = get_task(config.task)
    out = check_run_dir(config, task)
    device = resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    configure_backends(device)
    # Data first: a missing or malformed file should fail before any weights are loaded.
    data = read_task_data(task, config)
    _seed_everything(config.seed)
    gpt, tok, source = build_body(config)
    run = build_run(config, task, data, gpt, tok, source, device, precision)
    with run_directory(out) as work:
        run.logger = _start_run_dir(work, config)
        scored = f"{len(data.dev)} {config.eval_split} examples" if config.eval_split else "no evaluation split"
        report.note(f"{task.name}: {len(data.train)} training examples, {scored}; {run.total} updates")
        train_epochs(run, report)
        chosen_epoch = keep_selected_weights(run)
        return write_outputs(run, out, chosen_epoch, work)


def check_config(c: FinetuneConfig) -> None:
    """Refuse settings that cannot work, before anything is read or loaded."""
    if not c.task:
        raise GPT1Error("no task given (--task NAME; see --list-tasks)")
    if c.micro_batch_size is not None and c.micro_batch_size <= 0:
        raise GPT1Error(f"micro_batch_size must be positive, got {c.micro_batch_size}")
    for name in ("lr", "batch_size", "epochs"):
        if getattr(c, name) <= 0:
            raise GPT1Error(f"{name} must be positive, got {getattr(c, name)}")
    if not 0 <= c.warmup < 1:
        raise GPT1Error(f"warmup is a fraction of the updates in [0, 1), got {c.warmup}")
    if c.lm_weight < 0:
        raise GPT1Error(f"lm_weight must be ≥ 0, got {c.lm_weight}")
    if not 0 <= c.clf_pdrop < 1:
        raise GPT1Error(f"clf_pdrop must be in [0, 1), got {c.clf_pdrop}")
    if c.init.lower() == "none" and not c.tokenizer:
        raise GPT1Error("--init none needs --tokenizer DIR (a tokenizer directory or a checkpoint) to encode the task")
    if c.transfer_layers is not None and c.init.lower() == "none":
        raise GPT1Error("--transfer-layers needs a pretrained --init checkpoint (with --init none nothing is transferred)")


def check_run_dir(config: FinetuneConfig, task: Any) -> Path:
    """``config.out``, if this run may write there: never an input (the --init checkpoint or run, the tokenizer,
    the task's data), never another kind of directory (a pretraining run, a folder of notes); a finished
    fine-tuning run only with ``overwrite``. Checked before anything is read or written."""
    out = Path(config.out)
    inputs = [Path(p) for p in (config.init, config.tokenizer) if p and p.lower() != "none"]
    try:
        inputs.append(task.data_dir(config.data_dir))
    except GPT1Error:
        pass  # missing data is reported when it is read, with the task's own advice
    check_output(out, "finetune-run", overwrite=True, inputs=inputs)
    if (out / "checkpoints" / FINAL).exists() and not config.overwrite:
        raise GPT1Error(f"{out}: already holds a fine-tuned checkpoint (pass --overwrite to replace it)")
    return out


@contextlib.contextmanager
def run_directory(out: Path) -> Iterator[Path]:
    """Where a run writes. A new run writes in ``out`` itself, marked as a fine-tuning run at once (so even an
    interrupted one is recognised as gpt1's); a run replacing an earlier one writes in a hidden sibling that is
    moved into place only when complete, so the earlier run survives a failed or interrupted one whole."""
    if not (out.is_dir() and any(out.iterdir())):
        out.mkdir(parents=True, exist_ok=True)
        mark(out, "finetune-run")
        yield out
        return
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        mark(tmp, "finetune-run")
        yield tmp
        move_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op after a successful move


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
    released code's ``n_transfer`` does.
    """
    n = len(gpt.blocks)
    if not 0 <= keep_layers <= n:
        raise GPT1Error(f"--transfer-layers must be between 0 and {n} (the model's layers), got {keep_layers}")
    for block in list(gpt.blocks)[keep_layers:]:
        block.apply(gpt._init_weights)


def _load_tokenizer_from(path: str) -> tuple[Any, ModelConfig | None]:
    """A tokenizer: from a tokenizer directory or a prepared corpus (shape unknown: None), or from a checkpoint
    or run directory together with its model config (so a random model can have the pretrained one's shape)."""
    p = Path(path)
    if (p / "tokenizer.json").is_file():
        return load_tokenizer(p), None
    if is_checkpoint(p) or (p / "checkpoints").is_dir():
        header = read_header(p)
        if not (header.path / "tokenizer").is_dir():
            raise GPT1Error(f"{header.path}: checkpoint has no tokenizer/")
        mcfg = ModelConfig(**header.model)
        mcfg.n_special = 0
        return load_tokenizer(header.path / "tokenizer"), mcfg
    if (p / "tokenizer" / "tokenizer.json").is_file():  # a prepared corpus directory
        return load_tokenizer(p / "tokenizer"), None
    raise GPT1Error(f"{p}: not a tokenizer directory, prepared corpus, checkpoint or run directory")


def build_body(config: FinetuneConfig) -> tuple[GPT, Any, dict[str, Any]]:
    """The GPT body with its three special tokens, the tokenizer, and a description of where it came from."""
    n_sp = 3
    if config.init.lower() == "none":
        if not config.tokenizer:
            raise GPT1Error("--init none needs --tokenizer DIR (a tokenizer directory or a checkpoint) to encode the task")
        tok, mcfg = _load_tokenizer_from(config.tokenizer)
        if mcfg is None:
            mcfg = preset(config.model, vocab_size=tok.vocab_size)
        mcfg.vocab_size = tok.vocab_size
        gpt = GPT(mcfg)
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
        source = {"init": str(ck.path), "init_kind": ck.kind, "init_meta": ck.meta}
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
    so the log can show them apart. With λ = 0 the LM head's forward is skipped altogether."""

    def __init__(self, lm_weight: float) -> None:
        self.lm_weight = lm_weight
        self.parts: dict[str, list[float]] = {"clf_loss": [], "lm_loss": []}

    def __call__(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        out, hidden = model(batch.ids, batch.n_seqs)
        clf = model.head.loss(out, batch.labels)
        self.parts["clf_loss"].append(float(clf.detach()))
        if self.lm_weight == 0:
            return clf
        lm = lm_loss_per_sequence(hidden, batch.ids, batch.mask, model.gpt.lm_logits).mean()
        self.parts["lm_loss"].append(float(lm.detach()))
        return clf + self.lm_weight * lm

    def start_update(self) -> None:
        for v in self.parts.values():
            v.clear()

    def means(self) -> dict[str, float]:
        """Mean of each term over the current update's micro-batches (terms that were not computed are left out)."""
        return {k: sum(v) / len(v) for k, v in self.parts.items() if v}


@dataclass
class Run:
    """What the stages of one run share: the inputs, the model and its trainer, and the running state."""

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
    logger: RunLogger | None = None
    step: int = 0
    tokens: int = 0
    window_tokens: int = 0
    """Tokens since the last training record (for tokens_per_s)."""
    t0: float = 0.0
    t_log: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    """(dev score, epoch, weights) of the best epoch so far; weights empty for the last epoch (still in the model)."""

    def log(self, record: dict[str, Any]) -> None:
        assert self.logger is not None, "the run directory is started before training"
        self.logger.log(record)


def build_run(config: FinetuneConfig, task: Any, data: TaskData, gpt: GPT, tok: Any, source: dict[str, Any],
              device: torch.device, precision: str) -> Run:
    """Encode the examples, put the head on the body and set up the optimizer, schedule and trainer."""
    n_ctx = min(config.n_ctx or gpt.config.n_ctx, gpt.config.n_ctx)
    train_enc = encode_examples(task, data.train, tok, n_ctx)
    dev_enc = encode_examples(task, data.dev, tok, n_ctx) if data.dev else []
    head_cfg = HeadConfig(kind=task.kind, n_embd=gpt.config.n_embd, n_labels=max(1, len(task.labels)),
                          extract_id=tok.extract_id, pdrop=config.clf_pdrop, init_std=gpt.config.init_std)
    model = FinetuneModel(gpt, TaskHead(head_cfg)).to(device)
    total = num_batches(len(train_enc), config.batch_size) * config.epochs
    warmup_steps = math.ceil(config.warmup * total) if config.warmup > 0 else 0
    optimizer = make_optimizer(model, config.lr, config.weight_decay, decay=config.decay)
    loss = TaskLoss(config.lm_weight)
    trainer = Trainer(model, optimizer, loss, lambda s: lr_at(s, total, config.lr, warmup_steps, config.schedule),
                      device=device, precision=precision, grad_clip=config.grad_clip or None)
    return Run(config, task, device, precision, data, tok, n_ctx, train_enc, dev_enc, head_cfg, model, loss,
               trainer, total, source)


def _seed_everything(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _start_run_dir(work: Path, config: FinetuneConfig) -> RunLogger:
    """The resolved config and a fresh metrics.jsonl in the (new, or new hidden) run directory."""
    save_config(config, work / CONFIG_FILE)
    return RunLogger(work)


# --------------------------------------------------------------------------------------------- training


def train_epochs(run: Run, report: Progress) -> None:
    """Every epoch: one pass over the shuffled, length-bucketed training batches, then a dev score."""
    rng = random.Random(run.config.seed)
    run.t0 = run.t_log = time.perf_counter()
    report.stage(f"finetune {run.task.name}", run.total, unit="updates")
    try:
        for epoch in range(1, run.config.epochs + 1):
            train_one_epoch(run, epoch, rng, report)
            record = evaluate_epoch(run, epoch)
            report.note(_epoch_line(record, run))
    finally:
        if run.logger is not None:
            run.logger.close()
        report.end()


def train_one_epoch(run: Run, epoch: int, rng: random.Random, report: Progress) -> None:
    """One pass over the training split: an update per batch (micro-batches accumulate), a record every log_every."""
    c = run.config
    micro = c.micro_batch_size or c.batch_size
    regression = run.task.kind == "regression"
    run_loss, run_n = 0.0, 0  # the mean loss since the last training record
    lengths = [e.length for e in run.train_enc]
    for idx in bucketed_batches(lengths, c.batch_size, shuffle=True, rng=rng):
        mbs = [collate([run.train_enc[i] for i in idx[j : j + micro]], regression).to(run.device)
               for j in range(0, len(idx), micro)]
        run.loss.start_update()
        res = run.trainer.step(run.step, mbs)
        if not math.isfinite(res.loss):
            raise GPT1Error(f"{run.task.name}: the loss became {res.loss} at update {run.step + 1}; "
                            "lower --lr or use --precision fp32")
        run.step += 1
        n_tok = sum(mb.tokens for mb in mbs)
        run.tokens += n_tok
        run.window_tokens += n_tok
        run_loss += res.loss
        run_n += 1
        if run.step % c.log_every == 0 or run.step == run.total:
            _log_train(run, epoch, run_loss / run_n, res)
            run_loss, run_n = 0.0, 0
        report.advance(1, epoch=f"{epoch}/{c.epochs}", loss=res.loss, lr=res.lr)


def _log_train(run: Run, epoch: int, loss: float, res: StepResult) -> None:
    now = time.perf_counter()
    run.log({"kind": "train", "step": run.step, "epoch": epoch, "loss": loss, **run.loss.means(),
                    "lr": res.lr, "grad_norm": res.grad_norm, "tokens": run.tokens,
                    "tokens_per_s": round(run.window_tokens / max(now - run.t_log, 1e-9), 1),
                    "elapsed_s": round(now - run.t0, 3)})
    run.window_tokens, run.t_log = 0, now


def evaluate_epoch(run: Run, epoch: int) -> dict[str, Any]:
    """Score the dev split (when there is one), remember the best epoch's weights, log the record."""
    c = run.config
    record: dict[str, Any] = {"kind": "eval", "step": run.step, "epoch": epoch, "split": c.eval_split}
    if run.dev_enc:
        batches = iterate(run.dev_enc, c.eval_batch_size or 2 * c.batch_size, shuffle=False,
                          regression=run.task.kind == "regression")
        preds, _ = predict(run.model, batches, run.device, run.precision)
        scores = score_predictions(run.task, preds, run.data.dev)
        record.update(scores)
        value = scores[run.task.metric]
        # Strictly better only: on ties the earlier epoch stays (as the released code's `>`). The last epoch's
        # weights are still in the model, so they need no copy.
        if c.select == "best" and (run.best is None or value > run.best[0]):
            run.best = (value, epoch, _cpu_state(run.model) if epoch < c.epochs else {})
    run.log(record)
    run.history.append(record)
    run.t_log, run.window_tokens = time.perf_counter(), 0  # evaluation time is not training throughput
    return record


def _epoch_line(record: dict[str, Any], run: Run | None = None) -> str:
    """``epoch 2 (update 6): dev accuracy 55.00 (majority 52.71)``: with ``run``, the level of always answering the
    most frequent training label (or chance) beside the headline, marked "≈ majority" when the score is that."""
    from gptcli.eval.baselines import baseline_of, level_note

    scores = {k: v for k, v in record.items() if k not in ("kind", "step", "epoch", "split")}
    text = ", ".join(f"{k} {v:.2f}" for k, v in scores.items())
    base = baseline_of(run.task, run.data.train, run.data.dev) if run is not None and scores else None
    note = level_note(scores, base, run.task.metric) if base else ""
    line = f"epoch {record['epoch']} (update {record['step']}): {record.get('split') or 'no eval'} {text}".rstrip()
    return line + (f" ({note})" if note else "")


def _cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


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
    dev_scores = {k: v for k, v in chosen.items() if k not in ("kind", "step", "epoch", "split")}
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
        "finetune_config": to_dict(c),
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
        "config": to_dict(c),
    }
