"""Generative pretraining (paper §3.1, §4.1) as a library function: ``pretrain(PretrainConfig(...))``.

Run directory layout::

    RUN/config.toml                    the resolved PretrainConfig (repeat the run with ``--config``)
    RUN/metrics.jsonl                  one line per logged update and per validation (see runlog.py)
    RUN/checkpoints/step-0001000/      checkpoint directories (checkpoint.py) with training state; last K kept

so that ``load_checkpoint(RUN)`` opens the newest one. ``resume=True`` continues from the newest complete
checkpoint; on CPU the continued run's losses are bitwise identical to an uninterrupted one (tested).

:func:`pretrain` reads top to bottom as its stages: :func:`_plan` (settings, device, corpus, number of updates) →
:func:`_start` (model, optimizer, resume, run directory) → :func:`_train` (the update loop: :func:`_update`,
:func:`_log_update`, :func:`_validate`, :func:`_save`) → a final validation and :func:`_save_final`. The stages
share a :class:`RunPlan` (fixed before the first update) and a :class:`TrainingRun` (what changes as it trains).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from gptcli import checkpoint as ckpt
from gptcli.config import check_settings as check_all_settings
from gptcli.config import from_dict, load_file, save_config, to_dict
from gptcli.data.shards import Corpus, open_corpus, tokenizer_fingerprint
from gptcli.data.windows import WindowSampler
from gptcli.errors import GPT1Error
from gptcli.eval.perplexity import evaluate_lm
from gptcli.model.build import AnyConfig, LanguageModel, arch_of, build_model, preset, preset_class
from gptcli.locks import main_rank_lock
from gptcli.model.kernels import check_mode, set_kernels
from gptcli.model.lstm import precision_note
from gptcli.outputs import MARKER, check_output, mark
from gptcli.progress import SILENT, Progress
from gptcli.runtime import Precision, configure_backends, peak_flops, resolve_device, resolve_precision
from gptcli.train.optim import lr_at, make_optimizer
from gptcli.train.recipes import recipe_note
from gptcli.train.runlog import METRICS, RunLogger, Throughput, format_duration, truncate_metrics
from gptcli.train.trainer import (
    GracefulStop,
    NonFiniteLossError,
    NonFiniteWatch,
    Parallel,
    StepResult,
    Trainer,
    every,
    split_micro_batches,
    unwrap,
)

CONFIG_FILE = "config.toml"

# What --resume compares (see check_resume). A resumed run keeps the settings that define what its updates, steps and
# tokens are: the corpus and its tokenizer and the model's shape (compared by content, not by path or preset name),
# and these. weight_decay, beta1, beta2 and eps also live in the saved optimizer state, which would silently win
# over a new value. A resume that changes one of them is refused, naming each.
RUN_DEFINING = ("seq_len", "batch_size", "seed", "decay", "weight_decay", "beta1", "beta2", "eps")
# Model config fields a resume may change: dropout is regularisation, not shape (out_pdrop: the LSTM's).
ADJUSTABLE_MODEL = ("embd_pdrop", "attn_pdrop", "resid_pdrop", "out_pdrop")
# Settings a resume may change, each noted when it does: the run's length (train longer, or stop sooner; the
# schedule is recomputed over the new total), the learning-rate recipe and clipping (lower --lr after a loss spike),
# the micro-batch (gradient accumulation sums the same mean gradient in another order: last-bit differences only;
# changing the number of processes does the same), and what validation reads. Every other setting — the cadences
# (log/eval/save_every, keep_last), tensorboard, device, precision, kernels, compile, peak_flops, verify_data —
# changes how the run is computed or watched, not what it computes, and is taken silently.
ADJUSTABLE = ("epochs", "max_steps", "max_tokens", "lr", "warmup_steps", "schedule", "grad_clip", "micro_batch_size",
              "val_split", "eval_batches")


@dataclass
class PretrainConfig:
    """Everything a pretraining run depends on. Defaults are the paper's (reference §3) unless noted."""

    data: Path = Path("corpus")
    """Prepared corpus directory (``gpt1 prepare``): manifest.json, tokenizer/, shards. `gpt1 pretrain` uses
    ./corpus (where `gpt1 prepare` writes by default) only when it exists."""
    out: Path = Path("runs/pretrain")
    """Run directory: config.toml, metrics.jsonl, checkpoints/. `gpt1 pretrain` without --out takes the next free
    one of runs/pretrain, runs/pretrain-2, … (a default never reuses a run)."""
    preset: str = "gpt1"
    """Model preset, which also picks the architecture. Transformers: gpt1 = the paper's 12×768, 12 heads, 512
    context, init 0.02 (train it with these defaults); tiny = 4×256, 4 heads, init 0.06, for a laptop: pretrain with
    --lr 1e-3 --batch-size 16 --seq-len 128 and --warmup-steps 30 (at least; ≈ 10% of a longer run), fine-tune with
    --lr 5e-4 --batch-size 32 --epochs 3 (measured: docs/presets.md). LSTMs, the paper's Table 5 baseline: lstm =
    1×2048 units, 768-wide embedding; lstm-tiny = 1×768 units, 256-wide embedding (docs/pretrain.md)."""
    model: dict[str, Any] = field(default_factory=dict)
    """Model config field overrides of the preset, e.g. {n_layer = 2} (an LSTM preset takes LSTMConfig's, e.g.
    {n_hidden = 560}). vocab_size always comes from the corpus tokenizer."""
    seq_len: int = 512
    """Tokens per training sequence (paper: 512)."""
    batch_size: int = 64
    """Global batch in sequences per update (paper: 64)."""
    micro_batch_size: int | None = None
    """Sequences per forward/backward on each process; the rest is gradient accumulation (unset: a process's
    whole share of the batch at once)."""
    epochs: float = 100.0
    """Passes over the training windows (paper: 100). The run stops at the first of epochs/max_steps/max_tokens."""
    max_steps: int | None = None
    """Cap on optimizer updates, at least 1 (unset: no cap)."""
    max_tokens: int | None = None
    """Cap on training tokens, counted as updates × batch_size × seq_len (unset: no cap)."""
    lr: float = 2.5e-4
    """Peak learning rate (paper: 2.5e-4)."""
    warmup_steps: int = 2000
    """Linear warmup from 0 over this many updates (paper: 2000, kept for short runs too: a run with fewer
    updates than its warmup never reaches --lr and is warned about at start; for such a run pass about a tenth of
    its updates)."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warmup (paper: cosine annealing to 0 at the last update)."""
    weight_decay: float = 0.01
    """Decoupled (AdamW) weight decay on weight matrices and embeddings (paper: 0.01)."""
    decay: Literal["paper", "released"] = "paper"
    """Which tensors decay: paper = not biases/LayerNorm; released = every tensor with ndim > 1."""
    beta1: float = 0.9
    """Adam β1 (the released code's default)."""
    beta2: float = 0.999
    """Adam β2 (the released code's default)."""
    eps: float = 1e-8
    """Adam ε (the released code's default)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (released code: 1.0); 0 disables."""
    seed: int = 0
    """Seeds initialisation, dropout and the window order."""
    device: str = "auto"
    """auto | cpu | cuda."""
    precision: str = "auto"
    """auto | fp32 | bf16 | fp16 (auto: bf16 on CUDA; on CPU bf16 where it has native bf16 dot products)."""
    kernels: str = "auto"
    """How the model is computed, not what: auto = the fast CPU kernels of gptcli/model/kernels on CPU (PyTorch's
    fused ones elsewhere); reference = plain PyTorch everywhere (SDPA, F.dropout, F.cross_entropy)."""
    compile: bool = False
    """torch.compile the loss computation (worth it on GPUs; no gain measured on CPU)."""
    eval_every: int = 1000
    """Validate every this many updates (and always at the end); 0 = only at the end."""
    eval_batches: int | None = None
    """Cap on validation batches (unset: the whole validation split)."""
    val_split: str = "val"
    """Corpus split used for validation."""
    save_every: int = 1000
    """Checkpoint every this many updates (and at the end and on SIGINT/SIGTERM); 0 = only those."""
    keep_last: int = 3
    """Checkpoints kept in RUN/checkpoints (older ones deleted); 0 = keep all."""
    log_every: int = 10
    """Write a metrics line (and refresh the display) every this many updates."""
    tensorboard: bool = False
    """Also write TensorBoard events to RUN/tensorboard (needs the tensorboard package)."""
    wandb: str | None = None
    """Also log to Weights & Biases (rank 0): the same scalars, this config and the checkpoint paths, under this
    project (``--wandb`` alone: ``gpt1``); files in RUN/wandb; WANDB_MODE=offline logs without a network (needs
    gpt1[wandb])."""
    resume: bool = False
    """Continue from the newest intact checkpoint in RUN/checkpoints (fresh start if there is none). The data,
    the model's shape, seq_len, batch_size, seed and the optimizer's decay/β/ε must stay as they were; the run's
    length, the learning-rate recipe and how it is watched may change."""
    verify_data: bool = True
    """Check every shard's sha256 against the manifest, and a resumed checkpoint's files against its own
    checksums (skipping damaged newer checkpoints), before training."""
    peak_flops: float | None = None
    """Peak FLOP/s for MFU; default: a table for known GPUs, a quick measured matmul peak on CPU."""
    max_minutes: float | None = None
    """Stop once this many minutes of updates have passed, however far the schedule got (validated and saved as at
    the end, with a warning saying so); unset: no time limit. The quickstart sets it to its deadline."""

    @property
    def accum_steps(self) -> int:
        """Micro-batches per update in a single process (gradient accumulation)."""
        return self.batch_size // (self.micro_batch_size or self.batch_size)


def load_config(path: str | Path, **overrides: Any) -> PretrainConfig:
    """A PretrainConfig from a TOML/JSON file, with non-None keyword overrides applied."""
    data = load_file(path)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return from_dict(PretrainConfig, data)


@dataclass
class PretrainResult:
    """Where a :func:`pretrain` call stopped."""

    run_dir: Path
    step: int
    """Updates done (the resumed ones included)."""
    total_steps: int
    """Updates planned (see :func:`plan_steps`)."""
    final_val_loss: float | None
    """Validation loss at the end (None when stopped early or without a validation split)."""
    stopped_by: str | None = None
    """Signal name when the run was interrupted (it saved a checkpoint and can be resumed)."""
    last_checkpoint: Path | None = None
    """The newest checkpoint this process knows of (on ranks > 0: the one it resumed from, if any)."""


def check_settings(config: PretrainConfig) -> None:
    """Refuse impossible numbers with a one-line error, before anything is read or written. ``max_steps = 0`` is
    refused, not run as one update (or none): a run of no updates has nothing to save."""
    check_mode(config.kernels)
    check_all_settings(config)  # one rule per setting, the same in every command (gptcli.config.RULES)


def plan_steps(config: PretrainConfig, steps_per_epoch: int) -> int:
    """Number of updates: the first reached of epochs, max_steps and max_tokens."""
    caps = [max(1, int(config.epochs * steps_per_epoch))]
    if config.max_steps is not None:
        caps.append(config.max_steps)
    if config.max_tokens is not None:
        caps.append(math.ceil(config.max_tokens / (config.batch_size * config.seq_len)))
    return max(1, min(caps))


def check_launch(config: PretrainConfig, world_size: int) -> None:
    """Refuse batch settings that ``world_size`` processes cannot split (checked before any worker starts)."""
    if config.batch_size % world_size != 0:
        raise GPT1Error(f"--batch-size {config.batch_size} is not divisible by the {world_size} processes")
    # Without a micro-batch size each process takes its whole share of the global batch at once.
    mb = config.micro_batch_size or config.batch_size // world_size
    if config.batch_size <= 0 or mb <= 0 or config.seq_len <= 0:
        raise GPT1Error("--batch-size, --micro-batch-size and --seq-len must be positive")
    if config.batch_size % (mb * world_size) != 0:
        raise GPT1Error(
            f"--batch-size {config.batch_size} must be a multiple of --micro-batch-size {mb} × {world_size} process(es)"
        )


def lm_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token loss of a ``(b, T+1)`` window batch. Calls ``model(x)`` so a DDP wrapper sees the forward."""
    return unwrap(model).lm_nll(model(batch[:, :-1]), batch[:, 1:])


def build_model_config(config: PretrainConfig, vocab_size: int) -> AnyConfig:
    """The preset with the ``[model]`` overrides and the corpus's vocabulary; GPT1Error for impossible settings."""
    try:
        cls = preset_class(config.preset)
    except KeyError as e:
        raise GPT1Error(str(e.args[0])) from None
    known = [f.name for f in dataclasses.fields(cls) if f.name not in ("vocab_size", "n_special")]
    unknown = set(config.model) - {*known, "vocab_size", "n_special"}
    if unknown:
        raise GPT1Error(f"unknown model setting(s) {', '.join(sorted(unknown))} in [model] (preset {config.preset}, "
                        f"a {arch_of(cls())}, takes {', '.join(known)})")
    if "vocab_size" in config.model and config.model["vocab_size"] != vocab_size:
        raise GPT1Error(f"[model] vocab_size {config.model['vocab_size']} differs from the corpus tokenizer's {vocab_size}")
    try:
        mcfg = preset(config.preset, **{**config.model, "vocab_size": vocab_size, "n_special": 0})
    except KeyError as e:
        raise GPT1Error(str(e.args[0])) from None
    except ValueError as e:
        raise GPT1Error(str(e)) from None
    if config.seq_len > mcfg.n_ctx:
        raise GPT1Error(f"--seq-len {config.seq_len} exceeds the model context n_ctx={mcfg.n_ctx}")
    for key in ("n_ctx", "n_embd", "n_layer", "n_head", "n_inner", "n_hidden"):
        if getattr(mcfg, key, 1) < 1:
            raise GPT1Error(f"--{key.replace('_', '-')} {getattr(mcfg, key)} is impossible (it must be at least 1)")
    return mcfg


def open_training_corpus(config: PretrainConfig) -> Corpus:
    """The prepared corpus, with every shard checked against its manifest checksum unless ``verify_data`` is off."""
    corpus = open_corpus(config.data)
    verify_corpus(corpus, config)
    return corpus


def verify_corpus(corpus: Corpus, config: PretrainConfig) -> None:
    """Every shard against its manifest checksum (unless ``verify_data`` is off)."""
    if config.verify_data:
        problems = corpus.verify()
        if problems:
            raise GPT1Error(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def pretrain(
    config: PretrainConfig,
    *,
    parallel: Parallel | None = None,
    progress: Progress | None = None,
) -> PretrainResult:
    """Run (or resume) pretraining as configured; returns where it stopped. Raises GPT1Error on user errors.

    ``progress`` (rank 0 only) hears one stage, ``"pretrain"``, sized in updates and starting at the resumed step
    (``done``). Every logged update (``log_every``, and the last) is one ``advance(n, loss=, lr=, grad_norm=,
    tok/s=, MFU=, ETA=)`` where ``n`` is the number of updates since the previous one, so the stage's position
    (``done`` plus every ``n``) is the update just logged; ``loss`` is the rank-averaged training loss, ``lr`` and
    ``grad_norm`` those of that update. Each validation is one ``note("validation at update N: loss L,
    perplexity P")``. ``end()`` closes the stage however the run stops. The same figures, unrounded, are the
    lines of ``RUN/metrics.jsonl``. ``out`` is locked for the run (rank 0 alone, or the job's launcher:
    :func:`gptcli.locks.output_lock`).
    """
    par = parallel or Parallel()
    with main_rank_lock(config.out, par.is_main):
        return _pretrain(config, par, progress)


def _pretrain(config: PretrainConfig, par: Parallel, progress: Progress | None) -> PretrainResult:
    report = (progress or SILENT) if par.is_main else SILENT
    set_kernels(config.kernels)
    run = _start(_plan(config, par, report), report)
    report.stage("pretrain", run.plan.total_steps, unit="updates", done=run.step)
    warning = warmup_warning(run.plan.total_steps, config.warmup_steps, config.lr)
    if warning is not None:
        report.note(warning, level="warn")
    lstm_note = precision_note(run.plan.device.type, run.plan.precision) if arch_of(run.plan.model_config) == "lstm" else None
    if lstm_note is not None:
        report.note(lstm_note)
    note = recipe_note(config.preset, config.lr, config.batch_size, config.seq_len)
    if note is not None and run.step == 0:
        report.note(note)
    try:
        with GracefulStop(escalate=par.world_size == 1) as stop:
            stopped_by = _train(run, stop, report)
            final_val = _validate(run, report) if stopped_by is None else None
            _save_final(run)
    finally:
        report.end()
        if run.logger is not None:
            run.logger.close()
    return PretrainResult(Path(config.out), run.step, run.plan.total_steps, final_val, stopped_by, run.last_ckpt)


# --- before the first update ---------------------------------------------------------------------------------------


@dataclass
class RunPlan:
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
    """(Rank 0) the validation split's loss under the training split's token frequencies (:func:`unigram_loss`)."""

    @property
    def run_dir(self) -> Path:
        return Path(self.config.out)

    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def micro(self) -> int:
        """Rows per forward/backward (a rank's whole share when ``micro_batch_size`` is unset)."""
        return self.config.micro_batch_size or self.config.batch_size

    @property
    def val_micro(self) -> int:
        """Rows per validation forward on each rank: the micro-batch, else the rank's share of the global batch
        (never the global batch itself, which on every GPU of a job would be world-size times the memory)."""
        return self.config.micro_batch_size or max(1, self.config.batch_size // self.par.world_size)

    @property
    def tokens_per_step(self) -> int:
        """Training tokens per update over all ranks (the global batch)."""
        return self.config.batch_size * self.config.seq_len


@dataclass
class TrainingRun:
    """The live state the training stages share: the plan, the model and its optimizer, and where the run is."""

    plan: RunPlan
    model: LanguageModel
    """The bare model (``trainer.model`` is the same model, DDP-wrapped under data parallelism)."""
    optimizer: torch.optim.Optimizer
    trainer: Trainer
    logger: RunLogger | None
    """Rank 0 only: metrics.jsonl (and TensorBoard)."""
    meter: Throughput
    step: int
    """Updates done."""
    last_ckpt: Path | None
    first_step: int = 0
    """The step this process started from (the resumed one), for the ETA."""
    started: float = field(default_factory=time.perf_counter)
    shown: int = 0
    """The step of the last ``advance`` reported."""
    hinted: bool = False
    """Whether the unigram-plateau hint was given (once per run)."""
    feed: "BatchFeed | None" = None
    """The training batches, one ahead on the device (set by :func:`_start`)."""
    watch: NonFiniteWatch | None = None
    """The first non-finite loss since the start, kept on the device (set by :func:`_start`)."""


def _plan(config: PretrainConfig, par: Parallel, report: Progress) -> RunPlan:
    """Check the settings and the run directory, pick device and precision, open the corpus, choose the checkpoint
    to resume from, and count the updates. Nothing is written yet: every refusal leaves the run as it was."""
    check_settings(config)
    check_launch(config, par.world_size)
    # A run directory belongs to one pretraining run: never a fine-tuning run, a corpus or a folder of notes.
    check_output(Path(config.out), "pretrain-run", overwrite=True, inputs=[Path(config.data)])
    # A worker of a job computes on its own device (cuda:LOCAL_RANK), which a bare "cuda" would not name.
    device = par.device if par.device is not None else resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    configure_backends(device)

    corpus = open_corpus(config.data)
    mcfg = build_model_config(config, corpus.tokenizer.vocab_size)
    # Before the shards are hashed: a resume onto another corpus is refused at once.
    resume_from = _resume_point(config, corpus, mcfg, report) if has_checkpoints(config.out) else None
    verify_corpus(corpus, config)
    train_arrays = corpus.arrays("train")
    val_name = next((s for s in (config.val_split, "val", "validation", "valid") if s in corpus.splits), None)
    for split in ("train", val_name) if val_name is not None else ("train",):
        corpus.check_token_ids(split, mcfg.total_vocab)
    val_arrays = corpus.arrays(val_name) if val_name is not None else None  # no split: no validation
    sampler = WindowSampler(train_arrays, config.seq_len, config.batch_size, config.seed, par.rank, par.world_size)
    total_steps = plan_steps(config, sampler.steps_per_epoch)
    unigram = unigram_loss(train_arrays, val_arrays, mcfg.total_vocab) if par.is_main and val_arrays else None
    par.barrier()  # every rank has checked the run directory before rank 0 writes to it
    return RunPlan(config, par, device, precision, corpus, mcfg, sampler, val_name, val_arrays, total_steps,
                   resume_from, unigram)


def has_checkpoints(out: str | Path) -> bool:
    """Whether RUN/checkpoints holds a checkpoint (continued with ``resume``, refused without it)."""
    ckpt_dir = Path(out) / "checkpoints"
    return ckpt_dir.is_dir() and any(c.is_dir() and ckpt.is_checkpoint(c) for c in ckpt_dir.glob("step-*"))


def _resume_point(config: PretrainConfig, corpus: Corpus, mcfg: AnyConfig, report: Progress) -> Path:
    """The checkpoint to continue from: the newest whose files verify (each newer damaged one skipped with a warning
    naming it and why), or with ``verify_data`` off simply the newest; refused when the run's settings changed."""
    run_dir = Path(config.out)
    if not config.resume:
        raise GPT1Error(f"{run_dir}: already holds checkpoints (pass --resume to continue it or choose another --out)")
    if not config.verify_data:
        path = ckpt.resolve_checkpoint(run_dir)
    else:
        try:
            path, skipped = ckpt.newest_intact(run_dir)
        except GPT1Error as e:
            raise GPT1Error(f"{e} (restore a checkpoint, or pass --no-verify to resume from the newest anyway)") from None
        for bad, why in skipped:
            report.note(f"skipping checkpoint {bad.name}: {why}; resuming from {path.name}", level="warn")
    for note in check_resume(config, corpus, mcfg, path):
        report.note(note)
    return path


def _saved_settings(header: ckpt.Header, run_dir: Path) -> dict[str, Any]:
    """The settings the checkpoint was trained with: its own record, else (checkpoints written before they kept one)
    the run's config.toml, else nothing."""
    if isinstance(header.meta.get("pretrain_config"), dict):
        return header.meta["pretrain_config"]
    try:
        return load_file(run_dir / CONFIG_FILE)
    except GPT1Error:
        return {}


def check_resume(config: PretrainConfig, corpus: Corpus, mcfg: AnyConfig, path: Path) -> list[str]:
    """Refuse a resume from checkpoint ``path`` that would change what the run is (another tokenizer or corpus,
    another model shape, a changed :data:`RUN_DEFINING` setting), naming every change with its old and new value;
    returns a note for each :data:`ADJUSTABLE` setting that changed."""
    header = ckpt.read_header(path)
    mine, theirs = corpus.tokenizer_fingerprint(), tokenizer_fingerprint(path / ckpt.TOKENIZER)
    if mine is not None and theirs is not None and mine != theirs:
        raise GPT1Error(
            f"--data {config.data} was prepared with another tokenizer than the run {config.out} "
            f"({corpus.dir / 'tokenizer'} differs from {path / ckpt.TOKENIZER}; resume on the run's own corpus, or "
            f"start a new run with another --out)")
    old = _saved_settings(header, Path(config.out))
    changed, adjusted = [], []
    saved_corpus = header.meta.get("corpus_sha256")
    if saved_corpus is not None and saved_corpus != corpus.fingerprint():
        same_place = "data" in old and Path(old["data"]).resolve() == Path(config.data).resolve()
        changed.append(f"data {config.data} (its shards changed since the run started)" if same_place
                       else f"data {old.get('data', '?')} → {config.data} (another corpus)")
    elif saved_corpus is None and "data" in old and Path(old["data"]).resolve() != Path(config.data).resolve():
        changed.append(f"data {old['data']} → {config.data}")
    if header.arch != arch_of(mcfg):
        changed.append(f"architecture {header.arch} → {arch_of(mcfg)}")
    for key, was in header.model.items():
        now = getattr(mcfg, key, was)
        if now != was:
            (adjusted if key in ADJUSTABLE_MODEL else changed).append(f"{key} {was} → {now}")
    defaults = {f.name: f.default for f in dataclasses.fields(PretrainConfig)}
    for key in RUN_DEFINING + ADJUSTABLE:
        # A key missing from the saved settings was None (TOML has no null) or did not exist yet: its default.
        was, now = old.get(key, defaults[key]), getattr(config, key)
        if was != now:
            (adjusted if key in ADJUSTABLE else changed).append(f"{key} {was} → {now}")
    if changed:
        raise GPT1Error(
            f"{config.out}: cannot resume with changed settings: {', '.join(changed)} (these define the run: resume "
            f"without changing them, or start a new run with another --out)")
    return [f"resuming with changed settings: {', '.join(adjusted)}"] if adjusted else []


def _start(plan: RunPlan, report: Progress) -> TrainingRun:
    """Build the model (the same weights on every rank), restore a resumed run, and open the run directory.

    The order is the order of RNG use: seed → initialise → restore the saved RNG → reseed ranks > 0.
    """
    config = plan.config
    torch.manual_seed(config.seed)
    model = build_model(plan.model_config).to(plan.device)
    optimizer = make_optimizer(
        model, config.lr, config.weight_decay, (config.beta1, config.beta2), config.eps, config.decay, report=report
    )
    step, resumed_from, state = 0, plan.resume_from, {}
    if resumed_from is not None:
        state = _restore(resumed_from, model, optimizer, plan.sampler)
        step = int(state["step"])
    trainer = _make_trainer(plan, model, optimizer, step)
    if "grad_scaler" in state:
        trainer.scaler.load_state_dict(state["grad_scaler"])
    logger = _open_run_dir(plan, step, resumed=resumed_from is not None) if plan.par.is_main else None
    meter = _throughput_meter(plan, model, report)
    return TrainingRun(plan, model, optimizer, trainer, logger, meter, step, resumed_from, first_step=step, shown=step,
                       feed=BatchFeed(plan.sampler, plan.device), watch=NonFiniteWatch(plan.device))


def _make_trainer(plan: RunPlan, model: LanguageModel, optimizer: torch.optim.Optimizer, step: int) -> Trainer:
    """Wrap the model for the ranks, give ranks > 0 their own dropout stream, and set the schedule."""
    config, par = plan.config, plan.par
    wrapped = par.wrap(model)
    seed_rank_rng(config.seed, par.rank, step)
    loss_fn = torch.compile(lm_loss) if config.compile else lm_loss
    total_steps, warmup = plan.total_steps, config.warmup_steps
    return Trainer(
        wrapped,
        optimizer,
        loss_fn,
        lambda s: lr_at(s, total_steps, config.lr, warmup, config.schedule),
        device=plan.device,
        precision=plan.precision,
        grad_clip=config.grad_clip,
    )


def _open_run_dir(plan: RunPlan, step: int, resumed: bool) -> RunLogger:
    """(Rank 0) write config.toml, drop metrics past the resumed step (or a fresh run's old ones), open the log."""
    config, run_dir = plan.config, plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / MARKER).is_file():
        mark(run_dir, "pretrain-run")
    save_config(dataclasses.replace(config, resume=False), run_dir / CONFIG_FILE)
    if resumed:
        truncate_metrics(run_dir / METRICS, step)
    elif (run_dir / METRICS).exists():
        (run_dir / METRICS).unlink()
    return RunLogger(run_dir, config.tensorboard, config.wandb, to_dict(dataclasses.replace(config, resume=False)))


def _throughput_meter(plan: RunPlan, model: LanguageModel, report: Progress) -> Throughput:
    """Tokens/s and MFU of the updates alone (not validation or saving)."""
    config, par = plan.config, plan.par
    fpt = model.flops_per_token(config.seq_len)
    # tokens_per_step is the global batch, so the meter reads global tokens/s; MFU divides by all devices' peak.
    peak = peak_flops(plan.device, plan.precision, config.peak_flops) if par.is_main else None
    if par.is_main and peak is None:
        report.note(f"unknown GPU {torch.cuda.get_device_name(plan.device)!r} for {plan.precision}: MFU not shown "
                    "(pass --peak-flops with its dense peak FLOP/s)", level="warn")
    return Throughput(fpt, peak * par.world_size if peak else None)


# --- the loop ------------------------------------------------------------------------------------------------------


def _train(run: TrainingRun, stop: GracefulStop, report: Progress) -> str | None:
    """Update until the planned step, logging, validating and saving on their cadences. Returns the name of the
    signal that stopped the run early, or None when it ran to the end.

    The loop reads tensors back from the device only at a *sync point*: an update that is logged, validated,
    saved or the last one. There it reads the update's figures and the non-finite watch, and, in a job of several
    processes, asks the ranks whether a signal came (one collective; every rank asks at the same updates, so all
    stop after the same one). A single process has no one to ask and checks its signal flag after every update."""
    config, par = run.plan.config, run.plan.par
    total = run.plan.total_steps
    limit = None if config.max_minutes is None else time.monotonic() + 60.0 * config.max_minutes
    while run.step < total:
        if limit is not None and par.any(time.monotonic() >= limit):  # every rank stops at the same update
            report.note(f"stopped at the time limit ({config.max_minutes:g} min) after update {run.step} of {total}: "
                        "the learning-rate schedule did not finish", level="warn")
            return None
        result = _update(run)
        logging = every(run.step, config.log_every) or run.step == total
        evaluating = every(run.step, config.eval_every) and run.step < total
        saving = every(run.step, config.save_every) and run.step < total
        synced = logging or evaluating or saving
        figures = _settle(run, result) if synced else None
        run.meter.stop(run.plan.tokens_per_step)  # after the read: the window's time includes the device's work
        if logging:
            _log_update(run, result.lr, *figures, report)
        if evaluating:
            _validate(run, report)
        if (synced or par.world_size == 1) and par.any(stop.requested is not None):
            if not synced:
                _settle(run, result)  # never checkpoint past a divergence
            return stop.name or "signal"
        if saving:
            _check_weights(run)
            if par.is_main:
                run.last_ckpt = _save(run)
            par.barrier()
    return None


def _update(run: TrainingRun) -> StepResult:
    """One optimizer update on this rank's share of the next global batch, queued on the device without waiting
    for it; the batch after it is read and sent to the device while this one computes."""
    plan = run.plan
    run.meter.start()
    batch = run.feed.next()
    result = run.trainer.step(run.step, split_micro_batches(batch, plan.micro))
    run.watch.observe(run.step + 1, result.loss)
    run.feed.prefetch()
    run.step += 1
    return result


def _settle(run: TrainingRun, result: StepResult) -> tuple[float, float]:
    """Wait for the device: (loss, grad norm) of ``result``'s update, after stopping the run if any update since
    the last sync point had a non-finite loss (on any rank)."""
    par = run.plan.par
    bad = run.watch.first()
    first = float(bad[0]) if bad else math.inf
    if par.world_size > 1:
        first = -par.max([-first])[0]  # the earliest bad update of any rank
    if math.isfinite(first):
        update = int(first)
        loss = bad[1] if bad and bad[0] == update else float("nan")  # another rank's: its value stayed there
        run.step = update - 1  # the weights before that update produced it: the ones to distrust
        raise _diverged(run, f"loss became {loss} at update {update}")
    return result.read()


def _diverged(run: TrainingRun, what: str) -> NonFiniteLossError:
    """The error that stops a diverged run, naming the newest checkpoint saved before the divergence.

    ``what`` happened at update ``run.step + 1`` (a loss) or to the weights after update ``run.step``: either way
    those weights are suspect, and so is a checkpoint saved from them (step ``run.step``; resuming from it replays
    the same batch on the same weights). The checkpoints of earlier steps gave finite losses; the newest of them is
    named, with the later ones to move away first (``--resume`` takes the newest)."""
    good, later = None, []
    for c in ckpt.list_checkpoints(run.plan.run_dir) if has_checkpoints(run.plan.run_dir) else []:
        if _step_of(c) < run.step:
            good = c
        else:
            later.append(c.name)
    advice = "perhaps with a lower --lr or --precision fp32"
    if good is None:
        where = f"no checkpoint was saved before the divergence; start a new run with another --out, {advice}"
    else:
        first = f"move away the later {', '.join(later)}, then " if later else ""
        where = f"the newest checkpoint from before the divergence is {good}; to continue from it, {first}" \
                f"resume with --resume, {advice}"
    return NonFiniteLossError(f"{what}; stopping ({where})")


def _step_of(c: Path) -> int:
    """A checkpoint's step: its header's, or its directory name's when the header is unreadable."""
    try:
        return ckpt.read_header(c).step
    except GPT1Error:
        digits = c.name.rsplit("-", 1)[-1]
        return int(digits) if digits.isdigit() else -1


def _check_weights(run: TrainingRun) -> None:
    """Stop before saving non-finite weights: such a checkpoint would be the one ``--resume`` picks, and saving it
    would prune a good one. Every rank checks (their weights are the same) so that all of them stop together."""
    finite = torch.stack([torch.isfinite(p).all() for p in run.model.parameters()]).all()
    if not bool(finite):
        raise _diverged(run, f"the weights became non-finite at update {run.step}")


def _log_update(run: TrainingRun, lr: float, loss: float, grad_norm: float, report: Progress) -> None:
    """A ``train`` line in metrics.jsonl and an ``advance`` (see :func:`pretrain`) for the update just done, from
    its figures read at this sync point. Every rank calls it: the logged loss is averaged over ranks."""
    loss = run.plan.par.mean(loss)
    tps, mfu = run.meter.report()
    elapsed = time.perf_counter() - run.started
    rate = (run.step - run.first_step) / elapsed if elapsed > 0 else 0.0
    eta = (run.plan.total_steps - run.step) / rate if rate > 0 else float("inf")
    rec = {"kind": "train", "step": run.step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
           "tokens": run.step * run.plan.tokens_per_step, "tokens_per_s": tps, "mfu": mfu,
           "elapsed_s": round(elapsed, 3)}
    if run.logger is not None:
        run.logger.log(rec)
    report.advance(run.step - run.shown, loss=loss, lr=lr, grad_norm=grad_norm,
                   **{"tok/s": round(tps)}, MFU="n/a" if mfu is None else f"{100 * mfu:.1f}%",
                   ETA=format_duration(eta))
    run.shown = run.step


def _validate(run: TrainingRun, report: Progress) -> float | None:
    """Validation loss at the current step (None without a validation split), logged as an ``eval`` line and a
    ``note``. Every rank calls it: each scores its share of the batches."""
    plan = run.plan
    if plan.val_arrays is None:
        return None
    loss, tokens = _validation_loss(run)
    perplexity = math.exp(min(loss, 700))
    rec = {"kind": "eval", "step": run.step, "split": plan.val_name, "loss": loss, "perplexity": perplexity,
           "tokens": tokens, "unigram_loss": plan.unigram_loss}
    if run.logger is not None:
        run.logger.log(rec)
    report.note(f"validation at update {run.step}: loss {loss:.4f}, perplexity {perplexity:.2f}")
    hint = None if run.hinted else plateau_hint(run.step, loss, plan.unigram_loss)
    if hint is not None:
        report.note(hint, level="warn")
        run.hinted = True
    return loss


def _validation_loss(run: TrainingRun) -> tuple[float, int]:
    """(mean loss per token, tokens scored) over the validation split, combined over ranks."""
    plan, par = run.plan, run.plan.par
    ev = evaluate_lm(
        unwrap(run.model), plan.val_arrays, plan.config.seq_len, plan.val_micro, device=plan.device,
        precision=plan.precision, max_batches=plan.config.eval_batches, rank=par.rank, world_size=par.world_size,
    )
    if par.world_size == 1:
        return ev.loss, ev.tokens
    # Each rank scored every world_size-th batch: combine them token-weighted.
    tokens = round(par.mean(float(ev.tokens)) * par.world_size)
    nll = par.mean(ev.loss * ev.tokens if ev.tokens else 0.0) * par.world_size
    return (nll / tokens if tokens else float("nan")), tokens


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


# --- hints: settings that do not fit the run, and a run that learned nothing ---------------------------------------

# A run "learned nothing" when, after PLATEAU_MIN_UPDATES updates, its validation loss is not PLATEAU_MARGIN nats
# below the unigram loss (or is above it). Why these numbers: a model reaches the unigram loss within a few dozen
# updates (token frequencies are the easiest thing to learn) and a healthy small run leaves it soon after — the tiny
# preset on two books was 0.5 nats below it by update 300 at lr 2.5e-4 — while a stalled one sits within 0.01-0.02
# of it for hundreds of updates (6.50 → 6.49 over 300 at lr 1e-3; the quickstart's 3 × 192 model at init 0.02 for
# 1,300). 0.1 nats separates the two by a wide margin either way; 250 updates leaves time to get there.
PLATEAU_MARGIN = 0.1
PLATEAU_MIN_UPDATES = 250
_COUNT_CHUNK = 1 << 22  # tokens per bincount: bounded memory (np.bincount works on int64 copies)


def warmup_warning(total_steps: int, warmup_steps: int, lr: float) -> str | None:
    """One line when the run ends before its warmup does, so that the learning rate never reaches ``lr`` (and the
    schedule never decays); None when the schedule fits the run."""
    if warmup_steps <= total_steps:
        return None
    reached = lr * total_steps / warmup_steps
    return (f"the run has {total_steps:,} updates but --warmup-steps {warmup_steps:,}: the learning rate only "
            f"reaches {reached:.3g} ({100 * total_steps / warmup_steps:.0f}% of --lr {lr:g}) and never decays "
            f"(pass --warmup-steps {max(1, total_steps // 10):,}, about a tenth of the run, or train longer)")


def token_counts(arrays: list[np.ndarray], vocab: int) -> np.ndarray:
    """How often each of ``vocab`` ids occurs in ``arrays`` (memory-mapped shards, read in bounded chunks)."""
    counts = np.zeros(vocab, dtype=np.int64)
    for a in arrays:
        for start in range(0, len(a), _COUNT_CHUNK):
            counts += np.bincount(a[start:start + _COUNT_CHUNK], minlength=vocab)[:vocab]
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
    return (f"hint: after {step:,} updates the validation loss {val_loss:.2f} is still at the unigram loss "
            f"{unigram:.2f} (predicting each token by its frequency alone): the model has not learned to use "
            f"context yet (small post-LN models stall at a high --lr, a short warm-up or a narrow init: try "
            f"--warmup-steps 30 or more, a lower --lr, --init-std 0.06 (the tiny preset's), or more updates; "
            f"docs/presets.md)")


# --- checkpoints ---------------------------------------------------------------------------------------------------


def _save(run: TrainingRun) -> Path:
    """(Rank 0) checkpoint the current step with its training state; prune to ``keep_last``."""
    plan, at = run.plan, run.step
    tokens = at * plan.tokens_per_step
    state = {"step": at, "total_steps": plan.total_steps, "tokens": tokens, "sampler": run.feed.state_dict()}
    path = ckpt.save_checkpoint(
        plan.ckpt_dir / ckpt.step_dir_name(at),
        run.model,
        plan.corpus.tokenizer,
        kind="lm",
        meta={"step": at, "tokens": tokens, "stage": "pretrain", "seq_len": plan.config.seq_len,
              # What check_resume compares a later --resume against.
              "pretrain_config": to_dict(dataclasses.replace(plan.config, resume=False)),
              "corpus_sha256": plan.corpus.fingerprint()},
        extra=lambda d: ckpt.write_training_state(d, run.optimizer, state, scaler=run.trainer.scaler),
    )
    ckpt.prune_checkpoints(plan.ckpt_dir, plan.config.keep_last)
    return path


def _save_final(run: TrainingRun) -> None:
    """Checkpoint where the run stopped unless the last periodic save already holds that step."""
    par = run.plan.par
    if run.last_ckpt is None or run.last_ckpt.name != ckpt.step_dir_name(run.step):
        _check_weights(run)
    if par.is_main and (run.last_ckpt is None or run.last_ckpt.name != ckpt.step_dir_name(run.step)):
        run.last_ckpt = _save(run)
    par.barrier()


def seed_rank_rng(seed: int, rank: int, step: int) -> None:
    """Give every rank but 0 its own dropout stream from here on.

    Dropout draws from the global RNG, and every rank starts alike: all are seeded with ``seed`` so they build the
    same weights, and a resumed run restores rank 0's saved RNG state on every rank. Left so, each rank would drop
    the same units at the same positions of its own batch — correlated masks where data parallelism should
    average ``world_size`` independent ones. Rank 0 keeps the single-process stream (a 1-process run and rank 0 of
    an N-process run draw the same masks); rank r > 0 is reseeded from (seed, rank, step), so a resume at the same
    step reproduces it.
    """
    if rank > 0:
        torch.manual_seed((seed * 1_000_003 + rank * 7_919 + step) % (2**63 - 1))


def _restore(path: Path, model: LanguageModel, optimizer: torch.optim.Optimizer, sampler: WindowSampler) -> dict[str, Any]:
    """Load weights, optimizer, sampler and RNG state from a checkpoint; returns its training state (step, ...).
    The files were verified when the checkpoint was chosen (:func:`_resume_point`), or --no-verify said not to.

    The weights are read onto the CPU and copied into the model where it lives: loading onto "cuda" would put
    every rank's copy on GPU 0 (the default device), where eight of them do not fit."""
    saved = ckpt.load_checkpoint(path, map_location="cpu", load_tokenizer=False, verify=False)
    try:
        model.load_state_dict(saved.model.state_dict(), strict=True)
    except RuntimeError as e:
        raise GPT1Error(
            f"{path}: checkpoint does not match the configured model ({str(e).splitlines()[0]}); "
            "resume with the run's own config.toml"
        ) from None
    del saved
    doc, state_tensors = ckpt.read_training_state(path, verify=False)
    ckpt.restore_training_state(doc, state_tensors, optimizer)
    sampler.load_state_dict(doc["sampler"])
    return doc
