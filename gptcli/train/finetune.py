"""Fine-tuning on a task (paper §3.2, §4.1): body + linear head, task loss + λ·LM loss.

``finetune(FinetuneConfig(task="rte", init="runs/pre/checkpoints/step-0100000", out="runs/rte"))`` loads the
pretrained checkpoint (weights + tokenizer), appends the three special tokens with N(0, 0.02) embeddings, builds the
task head and trains with the paper's settings, scoring the dev split after every epoch. ``RUN/checkpoints/final``
holds the best (or last) epoch's body + head and tokenizer, ``RUN/results.json`` its dev scores.

:func:`finetune` reads top to bottom: the settings → the run directory opened
(:func:`gptcli.train.run.directory.open_run`) → the task's data, the device, the body and the encoded examples
(:func:`gptcli.train.finetune_setup.build_setup`) → the job (:func:`_build_job`) and the resume check → the update loop
(:func:`gptcli.train.run.loop.train`) over :class:`gptcli.train.finetune_job.FinetuneJob` → the outputs
(:func:`_finish`). Ablations (paper Table 5, Figure 2 left): ``init="none"``, ``lm_weight=0``,
``transfer_layers=K``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from gptcli.checkpoint import Header, save_checkpoint
from gptcli.config import to_dict
from gptcli.data.batching import num_batches
from gptcli.eval.baselines import baseline_of
from gptcli.files.fsutil import write_text_atomic
from gptcli.files.outputs import next_free
from gptcli.model.build import LanguageModel
from gptcli.model.classifier import FinetuneModel
from gptcli.model.heads import TaskHead
from gptcli.model.kernels import use_kernels
from gptcli.progress import SILENT, Progress
from gptcli.system.out_of_memory import move_model
from gptcli.tasks import get_task
from gptcli.train.finetune_config import RULES, FinetuneConfig, check_finetune, run_inputs
from gptcli.train.finetune_dev import PREDICTION_SUMMARY, scores_of
from gptcli.train.finetune_job import FinetuneJob, TaskLoss, body_and_head, lr_schedule
from gptcli.train.finetune_setup import (
    FinetuneSetup,
    build_setup,
    changed_data,
    checkpoint_meta,
    run_identity,
)
from gptcli.train.optim import make_optimizer
from gptcli.train.run.directory import (
    CHECKPOINTS,
    CONFIG_FILE,
    FINAL,
    RunDir,
    RunDirPlan,
    RunKind,
    open_run,
    plan_run_dir,
    recorded,
    remove_step_checkpoints,
    start_run_dir,
    step_checkpoints,
)
from gptcli.train.run.loop import RunState, stop_handler, train
from gptcli.train.run.resume import check_resume
from gptcli.train.trainer import Parallel, Trainer

RESULTS = "results.json"
FINETUNE_RUN = RunKind(
    "finetune-run", "fine-tuning run", overwrite=True, final="a fine-tuned checkpoint", results=RESULTS
)
__all__ = [
    "CONFIG_FILE",
    "FINAL",
    "RESULTS",
    "FinetuneConfig",
    "FinetuneResult",
    "default_run_dir",
    "finetune",
    "check_finetune_launch",
    "step_checkpoints",
]


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


def finetune(
    config: FinetuneConfig, progress: Progress | None = None, parallel: Parallel | None = None
) -> FinetuneResult:
    """Run (or, with ``resume``, continue) one fine-tuning job as configured; returns where the checkpoint and
    results went, or, when a signal stopped it, the checkpoint to resume from.

    ``parallel`` (from :func:`gptcli.train.distributed.join`) makes this one rank of a data-parallel job: every rank
    calls it alike; each trains on its share of every global batch and scores its share of the dev split, and rank
    0 alone writes (see :func:`gptcli.train.finetune_job.rank_share`, :func:`gptcli.train.finetune_dev.eval_shard`).
    Progress is reported on rank 0 only. ``out`` is locked for the run (rank 0 alone, or the job's launcher:
    :func:`gptcli.files.locks.output_lock`)."""
    par = parallel or Parallel()
    report = (progress or SILENT) if par.is_main else SILENT
    check_finetune(config, par.world_size)
    task = get_task(config.task)
    out = Path(config.out) if config.out else next_free(default_run_dir(task.name))
    if not config.out:  # what `gpt1 finetune` chooses too (it says so before calling here)
        config = dataclasses.replace(config, out=str(out))
        report.note(f"run directory: {out}")
    inputs = run_inputs(config.init, config.tokenizer, task, config.data_dir)
    opened = open_run(
        FINETUNE_RUN,
        out,
        resume=config.resume,
        overwrite=config.overwrite,
        verify=config.verify,
        inputs=inputs,
        settings=config,
        rules=RULES,
        par=par,
        report=report,
    )
    with opened as run:
        if run.results is not None:  # a finished run resumed: nothing to train, the result it has
            steps, history = int(run.results.get("steps", 0)), list(run.results.get("history", []))
            return FinetuneResult(run.out, run.out / CHECKPOINTS / FINAL, run.results, history, None, steps, steps)
        with use_kernels(config.kernels):  # the caller's kernel mode back after
            setup, gpt = build_setup(config, task, par, report)
            return _finetune(setup, gpt, run, par, report)


def _finetune(setup: FinetuneSetup, gpt: LanguageModel, run: RunDir, par: Parallel, report: Progress) -> FinetuneResult:
    """The run in its opened directory, from what it is made of: the job, the update loop, the outputs."""
    job = _build_job(setup, gpt, par, run, report)
    with run.writing() as work:
        _start(job, run, work, report)
        stopped_by = _train(job, report)
        if stopped_by is not None:
            return FinetuneResult(
                run.out,
                job.state.last_checkpoint or run.out,
                {},
                job.history,
                stopped_by,
                job.state.step,
                job.state.total,
            )
        return _finish(job, run.out)


def _build_job(setup: FinetuneSetup, gpt: LanguageModel, par: Parallel, run: RunDir, report: Progress) -> FinetuneJob:
    """Put the head on the body (its init draws from the RNG after the body's special tokens), set up the optimizer,
    schedule and trainer (the model wrapped for the ranks), restore a resumed run and check that it is the same."""
    c = setup.config
    total = num_batches(len(setup.train_enc), c.batch_size, batching=c.batching) * c.epochs
    model = move_model(FinetuneModel(gpt, TaskHead(setup.head_config)), setup.device)
    loss, schedule = TaskLoss(c.lm_weight), lr_schedule(c, total)
    optimizer = make_optimizer(model, c.lr, c.weight_decay, decay=c.decay, report=report)
    trainer = Trainer(
        par.wrap(model),
        optimizer,
        loss,
        schedule,
        device=setup.device,
        precision=setup.precision,
        grad_clip=c.grad_clip or None,
    )
    resumable = run.mode != "replace"  # a replacement is built in a hidden directory that a stop removes
    if resumable:
        setup.identity = run_identity(setup)
    state = RunState(setup.device, total, checkpoints=run.out / CHECKPOINTS)
    job = FinetuneJob(setup, model, trainer, loss, state, par, resumable)
    if run.resume_header is not None:
        for note in _resume_notes(job, run.resume_header):
            report.note(note)
    if run.resume_from is not None:
        job.restore(run.resume_from)
    return job


def _resume_notes(job: FinetuneJob, header: Header) -> list[str]:
    """The resume check (:func:`gptcli.train.run.resume.check_resume`) with fine-tuning's inputs compared by content:
    the init checkpoint's weights, the data files, and the encoded examples (what the tokenizer decides)."""
    setup, c = job.setup, job.setup.config
    old, ident = header.meta.get("finetune_config", {}), header.meta.get("resume_identity", {})
    inputs = []
    if ident.get("init_sha256") != setup.identity.get("init_sha256"):
        was = old.get("init", "?")
        inputs.append(
            f"init {c.init} (its weights changed since the run started)"
            if was == c.init
            else f"init {was} → {c.init} (other weights)"
        )
    inputs += changed_data(ident, setup.identity)
    unexplained = None
    if ident.get("examples_sha256") != setup.identity.get("examples_sha256"):
        unexplained = (
            f"tokenizer {old.get('tokenizer') or 'of the init checkpoint'} → "
            f"{c.tokenizer or 'of the init checkpoint'} (it encodes the examples differently)"
        )
    out = cast(str, c.out)  # finetune() names the run directory before the job is built
    return check_resume(out, RULES, c, old, header, body_and_head(job.model)[0].config, inputs, unexplained)


def _start(job: FinetuneJob, run: RunDir, work: Path | None, report: Progress) -> None:
    """Start the run directory (rank 0: ``work``), give every rank but 0 its own dropout stream, and say what the
    run is."""
    setup, state = job.setup, job.state
    records = state.records if run.resume_from is not None else None
    job.start_epoch()
    job.work = work
    if work is not None:
        state.logger = start_run_dir(
            work,
            setup.config,
            resumed=records is not None,
            step=state.step,
            records=records,
            report=report,
            wandb=setup.config.wandb,
        )
    state.rank_seed = setup.config.seed  # each rank's dropout stream, redrawn per update (run/loop.py)
    c = setup.config
    scored = f"{len(setup.data.dev)} {c.eval_split} examples" if c.eval_split else "no evaluation split"
    report.note(f"{setup.task.name}: {len(setup.data.train)} training examples, {scored}; {state.total} updates")
    warning = job.memory_warning()
    if warning is not None:
        report.note(warning, level="warn")
    if run.resume_from is not None:
        report.note(f"resuming from {run.resume_from.name}: update {state.step} of {state.total}, epoch {job.epoch}")


def _train(job: FinetuneJob, report: Progress) -> str | None:
    """The epochs, in the update loop every run shares; the name of a signal that stopped it, or None."""
    job.state.started = job.t_log = time.perf_counter()
    report.stage(f"finetune {job.setup.task.name}", job.state.total, unit="updates", done=job.state.step)
    try:
        with stop_handler(job.par, job.resumable) as stop:
            return train(job, stop, report, job.setup.config.max_minutes)
    finally:
        if job.state.logger is not None:
            job.state.logger.close()
        report.end()


def check_finetune_launch(config: FinetuneConfig, world_size: int) -> RunDirPlan:
    """What a launcher checks once before it starts ``world_size`` workers: the settings, the batch against the
    processes, and what the run does with ``out`` (not which checkpoint a resume continues from: each worker
    verifies and picks it). A refusal here is the workers' own one-line error, before any process starts."""
    check_finetune(config, world_size)
    inputs = run_inputs(config.init, config.tokenizer, get_task(config.task), config.data_dir)
    return plan_run_dir(
        FINETUNE_RUN,
        Path(cast(str, config.out)),  # the command names the run directory before it launches
        resume=config.resume,
        overwrite=config.overwrite,
        inputs=inputs,
        report=SILENT,
    )


# --------------------------------------------------------------------------------------------- outputs


def _finish(job: FinetuneJob, out: Path) -> FinetuneResult:
    """Keep the selected epoch's weights and write ``checkpoints/final`` and results.json (rank 0; the other ranks
    return the run's history only)."""
    if not job.par.is_main:
        job.par.barrier()
        return FinetuneResult(out, out / CHECKPOINTS / FINAL, {}, job.history, None, job.state.step, job.state.total)
    assert job.work is not None
    chosen_epoch = keep_selected_weights(job)
    result = write_outputs(job, out, chosen_epoch, job.work)
    # The run is complete: its step checkpoints were there only to resume it (up to 1.9 GB each for GPT-1).
    remove_step_checkpoints(job.work / CHECKPOINTS)
    job.par.barrier()
    return result


def keep_selected_weights(job: FinetuneJob) -> int:
    """Load the best epoch's weights back when ``select = "best"`` chose an earlier epoch; returns the kept epoch."""
    c = job.setup.config
    if c.select == "best" and job.best is not None and job.best[1] != c.epochs:
        job.model.load_state_dict(job.best[2])
        return job.best[1]
    return c.epochs


def write_outputs(job: FinetuneJob, out: Path, chosen_epoch: int, work: Path | None = None) -> FinetuneResult:
    """``RUN/checkpoints/final`` (body + head + tokenizer + head config) and ``RUN/results.json``, written in
    ``work`` (``out``, or the hidden directory that becomes ``out``); paths recorded are those under ``out``."""
    work, setup = work or out, job.setup
    if job.state.logger is not None:
        job.state.logger.check_dir()  # moved while it trained: never re-create it for the final checkpoint
    chosen = next((h for h in job.history if h["epoch"] == chosen_epoch), {})
    dev_scores = scores_of(chosen)
    job.model.cpu()
    final = out / CHECKPOINTS / FINAL
    save_checkpoint(
        work / CHECKPOINTS / FINAL,
        body_and_head(job.model)[0],
        setup.tokenizer,
        kind="finetuned",
        meta=checkpoint_meta(setup, chosen_epoch, chosen.get("step", job.state.step), dev_scores),
        head_state=job.model.head.state_dict(),
    )
    results = _results(job, chosen_epoch, dev_scores, final)
    write_text_atomic(work / RESULTS, json.dumps(results, indent=2, default=str))
    return FinetuneResult(out, final, results, job.history, None, job.state.step, job.state.total)


def _results(job: FinetuneJob, epoch: int, dev_scores: dict[str, Any], final: Path) -> dict[str, Any]:
    setup, c, task = job.setup, job.setup.config, job.setup.task
    # The last epoch's scores beside the kept one's: a best epoch is chosen on the very examples it is scored on, so
    # its score is an optimistic estimate and the last epoch's is the unbiased one (docs/finetune.md).
    last_scores = next((scores_of(h) for h in job.history if h["epoch"] == c.epochs), {})
    return {
        "task": task.name,
        "title": task.title,
        "split": c.eval_split,
        "metric": task.metric,
        "paper_score": task.paper_score,
        "scores": dev_scores,
        "baseline": baseline_of(task, setup.data.train, setup.data.dev),  # what a trivial predictor scores here
        **{k: v for h in job.history if h["epoch"] == epoch for k, v in h.items() if k in PREDICTION_SUMMARY},
        "epoch": epoch,
        "select": c.select if c.eval_split else "last",  # no dev split: nothing to choose by, the last is kept
        "last_scores": last_scores,
        "checkpoint": str(final),
        "n_train": len(setup.data.train),
        "n_eval": len(setup.data.dev),
        "skipped_rows": setup.data.skipped,
        "excluded_rows": setup.data.excluded,
        "history": job.history,
        "steps": job.state.step,
        "elapsed_s": round(time.perf_counter() - job.state.started, 3),
        "config": to_dict(recorded(c)),
    }
