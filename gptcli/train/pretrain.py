"""Generative pretraining (paper §3.1, §4.1) as a library function: ``pretrain(PretrainConfig(...))``.

Run directory (:mod:`gptcli.train.run.directory`)::

    RUN/config.toml                    the resolved PretrainConfig (repeat the run with ``--config``)
    RUN/metrics.jsonl                  one line per logged update and per validation (see runlog.py)
    RUN/checkpoints/step-0001000/      checkpoint directories (checkpoint.py) with training state; last K kept

:func:`pretrain` reads top to bottom: the settings → the corpus and the model's shape → the run directory opened
(:func:`gptcli.train.run.directory.open_run`) and a resume checked → :func:`_build_setup` (device, shards verified,
windows, updates) → :func:`_start` (model, optimizer, restored state) → the update loop
(:func:`gptcli.train.run.loop.train`) over :class:`gptcli.train.pretrain_job.PretrainJob`. On CPU a resumed run's
losses are bitwise those of an uninterrupted one (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from gptcli import checkpoint as ckpt
from gptcli.config import read_config_file
from gptcli.data.shards import Corpus, open_corpus, tokenizer_fingerprint
from gptcli.data.windows import WindowSampler
from gptcli.errors import GPT1Error
from gptcli.files.outputs import check_output
from gptcli.model.build import AnyConfig, LanguageModel, arch_of, new_model
from gptcli.model.kernels import prepare as prepare_kernels  # the compiled kernels' first-use build, as a stage
from gptcli.model.kernels import use_kernels
from gptcli.model.lstm import precision_note
from gptcli.progress import SILENT, Level, Progress
from gptcli.system.runtime import peak_flops, precision_warning, prepare_device
from gptcli.train.compiled import compile_loss, keeps_grads
from gptcli.train.distributed import LaunchSpec, inputs_verified_by_launcher
from gptcli.train.optim import lr_at, make_optimizer
from gptcli.train.pretrain_config import RULES, PretrainConfig, build_model_config, check_pretrain
from gptcli.train.pretrain_job import BatchFeed, PretrainJob, PretrainSetup, unigram_loss
from gptcli.train.recipes import WARMUP_RULE, recipe_note, warmup_for
from gptcli.train.run.directory import (
    CONFIG_FILE,
    RunDir,
    RunKind,
    open_run,
    read_step_checkpoint,
    run_directory,
    start_run_dir,
)
from gptcli.train.run.loop import RunState, stop_handler, train
from gptcli.train.run.resume import check_resume
from gptcli.train.runlog import Throughput
from gptcli.train.trainer import Parallel, Trainer, unwrap

PRETRAIN_RUN = RunKind("pretrain-run", "pretraining run", overwrite=False)


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


def plan_steps(config: PretrainConfig, steps_per_epoch: int) -> int:
    """Number of updates: the first reached of epochs, max_steps and max_tokens."""
    caps = [max(1, int(config.epochs * steps_per_epoch))]
    if config.max_steps is not None:
        caps.append(config.max_steps)
    if config.max_tokens is not None:
        caps.append(math.ceil(config.max_tokens / (config.batch_size * config.seq_len)))
    return max(1, min(caps))


def check_pretrain_launch(config: PretrainConfig, spec: LaunchSpec) -> bool:
    """Check ``config`` for a launch of ``spec``'s processes; True when the shards were verified here.

    The shards are verified here rather than in every worker (they would all read the whole corpus): the launch
    tells its workers so (:func:`gptcli.train.distributed.launch_command`), outside their config. Each worker still
    checks the checkpoint it resumes from as ``verify_data`` says: a damaged newest one is skipped with the warning
    by all alike, and all continue from the same intact one."""
    check_pretrain(config, spec.nproc_per_node * spec.nnodes)
    check_output(Path(config.out), "pretrain-run", overwrite=True, inputs=[Path(config.data)], replacing=False)
    corpus = open_corpus(config.data)
    if config.verify_data:
        corpus.check_intact()
    validation_split(config, corpus)  # a --val-split the corpus lacks: refused once, here, not by every worker
    return config.verify_data


def warmup_warning(total_steps: int, warmup_steps: int, lr: float) -> str | None:
    """One line when the run ends before its warmup does, so that the learning rate never reaches ``lr`` (and the
    schedule never decays); None when the schedule fits the run."""
    if warmup_steps <= total_steps:
        return None
    reached = lr * total_steps / warmup_steps
    return (
        f"the run has {total_steps:,} updates but --warmup-steps {warmup_steps:,}: the learning rate only "
        f"reaches {reached:.3g} ({100 * total_steps / warmup_steps:.0f}% of --lr {lr:g}) and never decays "
        f"(pass --warmup-steps {warmup_for(total_steps):,}: {WARMUP_RULE}, but no more than the run; or train longer)"
    )


def lm_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token loss of a ``(b, T+1)`` window batch. Calls ``model(x)`` so a DDP wrapper sees the forward."""
    bare = cast(LanguageModel, unwrap(model))  # pretraining trains a GPT or an LSTMLM, wrapped or not
    return bare.lm_nll(model(batch[:, :-1]), batch[:, 1:])


def validation_split(config: PretrainConfig, corpus: Corpus) -> str | None:
    """The split validation reads: ``val_split`` when the corpus has it. Any name but the default is one the user
    chose, so a corpus without it is refused rather than validated on another split. The default ("val") cannot be
    told from a typed ``--val-split val`` here (the config is a plain dataclass), so it keeps its meaning: the usual
    names in turn, and no validation for a corpus with none of them."""
    if config.val_split in corpus.splits:
        return config.val_split
    if config.val_split != PretrainConfig.val_split:
        raise GPT1Error(
            f"--val-split {config.val_split}: corpus {config.data} has no such split (its splits: "
            f"{', '.join(corpus.splits) or 'none'}; pass one of them)"
        )
    return next((s for s in ("validation", "valid") if s in corpus.splits), None)


def pretrain(
    config: PretrainConfig,
    progress: Progress | None = None,
    parallel: Parallel | None = None,
) -> PretrainResult:
    """Run (or resume) pretraining as configured; returns where it stopped. Raises GPT1Error on user errors.

    ``progress`` (rank 0 only) hears one stage, ``"pretrain"``, sized in updates and starting at the resumed step
    (``done``). Every logged update (``log_every``, and the last) is one ``advance(n, loss=, lr=, grad_norm=,
    tok/s=, MFU=, ETA=)`` where ``n`` is the number of updates since the previous one, so the stage's position
    (``done`` plus every ``n``) is the update just logged; ``loss`` is the rank-averaged training loss, ``lr`` and
    ``grad_norm`` those of that update. Each validation is one ``note("validation at update N: loss L,
    perplexity P")``. ``end()`` closes the stage however the run stops. The same figures, unrounded, are the
    lines of ``RUN/metrics.jsonl``. ``out`` is locked for the run (rank 0 alone, or the job's launcher:
    :func:`gptcli.files.locks.output_lock`).
    """
    par = parallel or Parallel()
    report = (progress or SILENT) if par.is_main else SILENT
    check_pretrain(config, par.world_size)
    corpus = open_corpus(config.data)
    mcfg = build_model_config(config, corpus.tokenizer.vocab_size)
    val_name = validation_split(config, corpus)
    # A run directory belongs to one pretraining run: never a fine-tuning run, a corpus or a folder of notes. Before
    # the shards are hashed: a resume onto another corpus is refused at once.
    opened = open_run(
        PRETRAIN_RUN,
        Path(config.out),
        resume=config.resume,
        overwrite=False,
        verify=config.verify_data,
        inputs=[Path(config.data)],
        par=par,
        report=report,
    )
    with opened as run, use_kernels(config.kernels):  # the caller's kernel mode back after
        if run.resume_from is not None and run.resume_header is not None:
            for note in _resume_notes(config, corpus, mcfg, run.resume_from, run.resume_header):
                report.note(note)
        setup = _build_setup(config, corpus, mcfg, val_name, run, par, report)
        return _pretrain(setup, report)


def _pretrain(setup: PretrainSetup, report: Progress) -> PretrainResult:
    job = _start(setup, report)
    state = job.state
    report.stage("pretrain", state.total, unit="updates", done=state.step)
    for note, level in _start_notes(job):
        report.note(note, level=level)
    try:
        with stop_handler(setup.par, resumable=True) as stop:
            stopped_by = train(job, stop, report, setup.config.max_minutes)
    finally:
        report.end()
        if state.logger is not None:
            state.logger.close()
    final_val = job.val_loss if stopped_by is None else None
    return PretrainResult(setup.run_dir, state.step, state.total, final_val, stopped_by, state.last_checkpoint)


def _start_notes(job: PretrainJob) -> list[tuple[str, Level]]:
    """What the run says as it starts, as (note, level): a schedule that does not fit the run, a precision this
    CPU only emulates and an update larger than the free memory (warnings), the LSTM's precision and the preset's
    recipe."""
    setup, config = job.setup, job.setup.config
    notes: list[tuple[str | None, Level]] = [
        (warmup_warning(setup.total_steps, config.warmup_steps, config.lr), "warn"),
        (precision_warning(setup.precision, setup.device), "warn"),
        (job.memory_warning(), "warn"),
    ]
    if arch_of(setup.model_config) == "lstm":
        notes.append((precision_note(setup.device.type, setup.precision), "info"))
    if job.state.step == 0:
        notes.append((recipe_note(config.preset, config.lr, config.batch_size, config.seq_len), "info"))
    return [(n, level) for n, level in notes if n is not None]


# --- before the first update ---------------------------------------------------------------------------------------


def _build_setup(
    config: PretrainConfig,
    corpus: Corpus,
    mcfg: AnyConfig,
    val_name: str | None,
    run: RunDir,
    par: Parallel,
    report: Progress,
) -> PretrainSetup:
    """Pick device and precision, verify the corpus, sample its windows and count the updates. Nothing is written
    yet: every refusal leaves the run as it was."""
    device, precision = prepare_device(config.device, config.precision, given=par.device)
    prepare_kernels(device, report)
    if config.verify_data and not inputs_verified_by_launcher():  # a launcher verified it once for all its workers
        corpus.check_intact()
    train_arrays = corpus.arrays("train")
    for split in ("train", val_name) if val_name is not None else ("train",):
        corpus.check_token_ids(split, mcfg.total_vocab)
    val_arrays = corpus.arrays(val_name) if val_name is not None else None  # no split: no validation
    sampler = WindowSampler(train_arrays, config.seq_len, config.batch_size, config.seed, par.rank, par.world_size)
    total_steps = plan_steps(config, sampler.steps_per_epoch)
    unigram = unigram_loss(train_arrays, val_arrays, mcfg.total_vocab) if par.is_main and val_arrays else None
    return PretrainSetup(
        config,
        par,
        device,
        precision,
        corpus,
        mcfg,
        sampler,
        val_name,
        val_arrays,
        total_steps,
        run.resume_from,
        unigram,
    )


def _saved_settings(header: ckpt.Header, run_dir: Path) -> dict[str, Any]:
    """The settings the checkpoint was trained with: its own record, else (checkpoints written before they kept one)
    the run's config.toml, else nothing."""
    if isinstance(header.meta.get("pretrain_config"), dict):
        return header.meta["pretrain_config"]
    try:
        return read_config_file(run_dir / CONFIG_FILE)
    except GPT1Error:
        return {}


def _resume_notes(
    config: PretrainConfig, corpus: Corpus, mcfg: AnyConfig, path: Path, header: ckpt.Header
) -> list[str]:
    """The resume check (:func:`gptcli.train.run.resume.check_resume`) with pretraining's inputs compared by content:
    the corpus's tokenizer (refused on its own, first: nothing else would make sense) and its shards."""
    old = _saved_settings(header, Path(config.out))
    mine, theirs = corpus.tokenizer_fingerprint(), tokenizer_fingerprint(path / ckpt.TOKENIZER)
    if mine is not None and theirs is not None and mine != theirs:
        raise GPT1Error(
            f"--data {config.data} was prepared with another tokenizer than the run {config.out} "
            f"({corpus.dir / 'tokenizer'} differs from {path / ckpt.TOKENIZER}; resume on the run's own corpus, or "
            f"start a new run with another --out)"
        )
    inputs = []
    saved_corpus = header.meta.get("corpus_sha256")
    if saved_corpus is not None and saved_corpus != corpus.fingerprint():
        same_place = "data" in old and Path(old["data"]).resolve() == Path(config.data).resolve()
        inputs.append(
            f"data {config.data} (its shards changed since the run started)"
            if same_place
            else f"data {old.get('data', '?')} → {config.data} (another corpus)"
        )
    elif saved_corpus is None and "data" in old and Path(old["data"]).resolve() != Path(config.data).resolve():
        inputs.append(f"data {old['data']} → {config.data}")
    return check_resume(config.out, RULES, config, old, header, mcfg, inputs)


def _start(setup: PretrainSetup, report: Progress) -> PretrainJob:
    """Build the model (the same weights on every rank) and its trainer, restore a resumed run, and open the run
    directory.

    The order is the order of RNG use: seed → initialise → restore the saved RNG → reseed ranks > 0.
    """
    config, par = setup.config, setup.par
    torch.manual_seed(config.seed)
    model = new_model(setup.model_config, setup.device)
    optimizer = make_optimizer(
        model, config.lr, config.weight_decay, (config.beta1, config.beta2), config.eps, config.decay, report=report
    )
    trainer = _make_trainer(setup, model, optimizer)
    state = RunState(setup.device, setup.total_steps, checkpoints=setup.run_dir / "checkpoints")
    records = None
    if setup.resume_from is not None:
        doc = read_step_checkpoint(setup.resume_from, trainer, model)
        setup.sampler.load_state_dict(doc["sampler"])
        state.step = state.first_step = int(doc["step"])
        records = doc.get("records")  # counted since this version; before: cut by step
        state.records = records if records is not None else 0
        state.last_checkpoint, state.saved = setup.resume_from, state.step
    state.rank_seed = config.seed  # each rank's dropout stream, redrawn per update (run/loop.py)
    if par.is_main:  # a pretraining run always writes in place: it has no --overwrite to build a replacement
        with run_directory(PRETRAIN_RUN, setup.run_dir, replace=False) as work:
            state.logger = start_run_dir(
                work,
                config,
                resumed=setup.resume_from is not None,
                step=state.step,
                records=records,
                report=report,
                tensorboard=config.tensorboard,
                wandb=config.wandb,
            )
    meter = _throughput_meter(setup, model, report)
    return PretrainJob(setup, model, trainer, state, BatchFeed(setup.sampler, setup.device), meter)


def _make_trainer(setup: PretrainSetup, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Trainer:
    """Wrap the model for the ranks and set the loss and the schedule."""
    config = setup.config
    loss_fn = compile_loss(lm_loss, config.compile_mode) if config.compile else lm_loss
    total_steps, warmup = setup.total_steps, config.warmup_steps
    return Trainer(
        setup.par.wrap(model),
        optimizer,
        loss_fn,
        lambda s: lr_at(s, total_steps, config.lr, warmup, config.schedule),
        device=setup.device,
        precision=setup.precision,
        grad_clip=config.grad_clip,
        keep_grads=keeps_grads(config.compile, config.compile_mode),
    )


def _throughput_meter(setup: PretrainSetup, model: LanguageModel, report: Progress) -> Throughput:
    """Tokens/s and MFU of the updates alone (not validation or saving)."""
    config, par = setup.config, setup.par
    fpt = model.flops_per_token(config.seq_len)
    # tokens_per_step is the global batch, so the meter reads global tokens/s; MFU divides by all devices' peak.
    peak = peak_flops(setup.device, setup.precision, config.peak_flops) if par.is_main else None
    if par.is_main and peak is None:
        report.note(
            f"unknown GPU {torch.cuda.get_device_name(setup.device)!r} for {setup.precision}: MFU not shown "
            "(pass --peak-flops with its dense peak FLOP/s)",
            level="warn",
        )
    return Throughput(fpt, peak * par.world_size if peak else None)
