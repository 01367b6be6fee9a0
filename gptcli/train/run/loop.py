"""The update loop: the one module that runs a job's updates, whatever the job trains.

A job (:class:`Job`: pretraining's windows, fine-tuning's epochs) queues one update at a time on the device and says
what is due after it (:class:`Due`: a metrics line, an evaluation, a checkpoint). :func:`train` runs them in one
order for every job::

    next_update → [sync point: non-finite check, read the figures] → log → evaluate → save → stop on a signal

Only a *sync point* — an update that is logged, evaluated or saved — reads tensors back from the device: a read per
update would idle a GPU. Every loss is still watched on the device (:class:`NonFiniteWatch`) and read first at each
sync point, so a divergence stops the run by its exact update and is never written into a checkpoint. A signal
(SIGINT/SIGTERM) becomes a flag (:class:`GracefulStop`): the run checkpoints where it stands and returns its name.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn

from gptcli.errors import GPT1Error
from gptcli.progress import Progress
from gptcli.train.run.directory import split_at_step
from gptcli.train.run.memory import is_out_of_memory, out_of_memory
from gptcli.train.runlog import RunLogger
from gptcli.train.trainer import Parallel


class NonFiniteLossError(GPT1Error):
    """The loss (or the weights) became NaN or infinite; the message names the newest checkpoint saved before the
    divergence, or says there is none."""


class NonFiniteWatch:
    """The first update whose loss was not finite, tracked on the device between two reads.

    :meth:`observe` costs two small device ops and no wait; :meth:`first` reads the record back (one transfer) at
    sync points and before anything is saved."""

    def __init__(self, device: torch.device) -> None:
        self.update = torch.full((), -1, dtype=torch.int64, device=device)
        """1-based number of the first non-finite update, or -1."""
        self.loss = torch.zeros((), device=device)
        """That update's loss."""

    def observe(self, update: int, loss: torch.Tensor) -> None:
        new = ~torch.isfinite(loss) & (self.update < 0)
        self.update = torch.where(new, update, self.update)
        self.loss = torch.where(new, loss, self.loss)

    def first(self) -> tuple[int, float] | None:
        """(update, loss) of the first non-finite loss seen, or None."""
        update, loss = torch.stack([self.update.double(), self.loss.double()]).tolist()
        return (int(update), loss) if update >= 0 else None


# SIGHUP (a closed terminal or ssh session) stops a run as SIGTERM does: with a checkpoint to resume from.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))


SKIPPED_STOP_CHECKPOINT = (
    "a second signal stopped the run at once, without its stop checkpoint (--resume continues from the last one "
    "saved; one Ctrl-C lets the run save first)"
)


class GracefulStop:
    """Turns the first SIGINT/SIGTERM into a flag the loop checks between updates (so it can checkpoint and exit
    cleanly); a second signal interrupts at once unless ``escalate=False`` (the workers of a job, which receive one
    Ctrl-C twice — from the terminal and from the launcher — and must still checkpoint). Handlers are restored on
    exit; ``signals=()`` leaves them alone (a run that cannot resume has nothing to checkpoint)."""

    def __init__(self, signals: Sequence[int] = STOP_SIGNALS, escalate: bool = True) -> None:
        self.signals = signals
        self.escalate = escalate
        self.requested: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        if self.requested is not None:
            if self.escalate:
                # Said here, as it happens: the command line turns a KeyboardInterrupt into a quiet exit 130.
                sys.stderr.write(f"\n{SKIPPED_STOP_CHECKPOINT}\n")
                raise KeyboardInterrupt(SKIPPED_STOP_CHECKPOINT)
            return
        self.requested = signum

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()

    @property
    def name(self) -> str:
        return signal.Signals(self.requested).name if self.requested else ""


def every(step: int, interval: int | None) -> bool:
    """True on steps ``interval, 2·interval, …`` (``step`` counts completed updates)."""
    return interval is not None and interval > 0 and step % interval == 0


@dataclass
class RunState:
    """Where a run stands, the same for every kind of run. ``step`` and ``records`` are saved in every step
    checkpoint (in the job's training state) and restored on resume; the rest is this process's."""

    device: torch.device
    total: int
    """Updates planned."""
    step: int = 0
    """Updates done (the resumed ones included)."""
    records: int = 0
    """Lines written to metrics.jsonl: a resume keeps this many (:func:`gptcli.train.run.directory.reopen_metrics`)."""
    checkpoints: Path | None = None
    """Where step checkpoints go (``RUN/checkpoints``, or the hidden directory's); None: the run writes none."""
    logger: RunLogger | None = None
    """Rank 0 only: metrics.jsonl (and TensorBoard, W&B)."""
    last_checkpoint: Path | None = None
    """The newest step checkpoint this process wrote or resumed from."""
    saved: Hashable = None
    """The job's position (:meth:`Job.position`) that the newest step checkpoint holds: a stop there saves nothing
    new."""
    first_step: int = 0
    """The step this process started from (the resumed one), for rates and the ETA."""
    rank_seed: int | None = None
    """The run's seed: every rank but 0 redraws its dropout stream from (seed, rank, step) before each update
    (:func:`seed_rank_rng`), so that a resume at any step draws what the uninterrupted run
    drew (rank 0's stream is the one a checkpoint saves). None: the stream is left alone."""
    started: float = field(default_factory=time.perf_counter)
    watch: NonFiniteWatch = field(init=False)

    def __post_init__(self) -> None:
        self.watch = NonFiniteWatch(self.device)

    def log(self, record: dict[str, Any]) -> None:
        """A line of metrics.jsonl (rank 0 writes; every rank counts, as rank 0 does)."""
        if self.logger is not None:
            self.logger.log(record)
        self.records += 1


@dataclass(frozen=True)
class Due:
    """What is due after an update (or, for :meth:`Job.due_on_resume`, at a restored position: never a log line,
    no update's figures wait there)."""

    log: bool = False
    evaluate: bool = False
    save: bool = False

    @property
    def sync(self) -> bool:
        """Whether the update's figures are read back from the device (a sync point)."""
        return self.log or self.evaluate or self.save


class Job(Protocol):
    """What a kind of run hands to :func:`train`, which runs its updates until ``state.step`` reaches ``state.total``.
    The loop asks, for every update: :meth:`next_update`, then :meth:`after_update` (what is due), at a sync point
    :meth:`read_figures`, then :meth:`log`, and as due :meth:`evaluate` and :meth:`save`."""

    state: RunState
    par: Parallel
    resumable: bool
    """Whether the run writes step checkpoints and stops cleanly on a signal."""

    @property
    def model(self) -> nn.Module:
        """The bare model whose weights are checked before every checkpoint (read-only here: each job holds its
        own kind of model)."""

    def next_update(self) -> torch.Tensor:
        """Queue the next update on the device without waiting for it (``state.step`` counts it); its loss."""

    def after_update(self) -> Due:
        """What is due after the update just queued."""

    def due_on_resume(self) -> Due | None:
        """What a restored position still owes before the next update (an epoch trained but not scored), or None."""

    def read_figures(self) -> None:
        """At a sync point: read the figures of the updates since the last one (one transfer)."""

    def log(self, report: Progress, due: Due) -> None:
        """After every update (and its read, if any): the progress report and, when ``due.log``, a training line in
        metrics.jsonl from the figures :meth:`read_figures` got."""

    def evaluate(self, report: Progress, stop: GracefulStop) -> bool:
        """Score the held-out data now; False when a signal cut it short (nothing changed: it is redone)."""

    def position(self) -> Hashable:
        """Where the run stands, as a step checkpoint would hold it."""

    def save(self) -> Path:
        """(Rank 0) Write a step checkpoint of this position and prune to ``keep_last``; its path."""

    def memory_advice(self, evaluating: bool) -> str:
        """After running out of memory in an update (or, ``evaluating``, in scoring held-out data): the flag and
        value that make each forward pass smaller, with what one holds now (``pass --micro-batch-size 16: each
        process then computes its 32 sequences of 512 tokens per update 16 at a time instead of 32; …``)."""


def stop_handler(par: Parallel, resumable: bool) -> GracefulStop:
    """How a run hears SIGINT/SIGTERM: as a flag, unless it cannot resume (then signals stay as they are); a worker
    of a job (even of one process) hears one Ctrl-C twice, from the terminal and from the launcher, and must still
    checkpoint: only a plain process takes a second signal as "stop at once"."""
    if not resumable:
        return GracefulStop(signals=())
    return GracefulStop(escalate=type(par) is Parallel)


def seed_rank_rng(seed: int, rank: int, step: int) -> None:
    """Give every rank but 0 its own dropout stream from here on.

    Dropout draws from the global RNG, and every rank starts alike: all are seeded with ``seed`` so they build the
    same weights, and a resumed run restores rank 0's saved RNG state on every rank. Left so, each rank would drop
    the same units at the same positions of its own batch — correlated masks where data parallelism should
    average ``world_size`` independent ones. Rank 0 keeps the single-process stream (a 1-process run and rank 0 of
    an N-process run draw the same masks); rank r > 0 is reseeded from (seed, rank, step) before every update (the
    update loop calls this), so a resume at any step reproduces it: reseeded once at the start, rank r's stream
    after a resume was another than the uninterrupted run's, and so were its masks and the final weights.
    """
    if rank > 0:
        torch.manual_seed((seed * 1_000_003 + rank * 7_919 + step) % (2**63 - 1))


def train(job: Job, stop: GracefulStop, report: Progress, max_minutes: float | None = None) -> str | None:
    """Run the job's updates to the end. Returns the name of the signal that stopped it early (after a checkpoint),
    or None when every update is done — or when ``max_minutes`` of updates passed first, which ends the run as its
    last update would (evaluated and saved), with a warning that the schedule did not finish."""
    deadline = None if max_minutes is None else time.monotonic() + 60.0 * max_minutes
    due = job.due_on_resume()
    if due is not None:
        stopped = _do_due(job, due, stop, report)
        if stopped is not None:
            return stopped
    unread = False
    while job.state.step < job.state.total:
        if deadline is not None and job.par.any(time.monotonic() >= deadline):  # every rank stops at the same update
            report.note(
                f"stopped at the time limit ({max_minutes:g} min) after update {job.state.step} of "
                f"{job.state.total}: the learning-rate schedule did not finish",
                level="warn",
            )
            _finish_early(job, report, stop, unread)
            return None
        if job.state.rank_seed is not None:
            seed_rank_rng(job.state.rank_seed, job.par.rank, job.state.step)
        with _memory(job, evaluating=False):
            loss = job.next_update()
        job.state.watch.observe(job.state.step, loss)
        due = job.after_update()
        if due.sync:
            sync_point(job)
        unread = not due.sync
        job.log(report, due)
        stopped = _do_due(job, due, stop, report)
        if stopped is not None:
            return stopped
    return None


def _do_due(job: Job, due: Due, stop: GracefulStop, report: Progress) -> str | None:
    """What is due after an update (its log line written), in the one order: evaluate, save, and stop if a signal
    came."""
    if due.evaluate and not _evaluate(job, report, stop):
        return stop_here(job, stop)  # a signal came during the evaluation: it is redone on resume
    if due.save:
        save(job)
    if (due.sync or job.par.world_size == 1) and job.par.any(stop.requested is not None):
        if not due.sync:
            sync_point(job)  # never checkpoint past a divergence
        return stop_here(job, stop)
    return None


def _finish_early(job: Job, report: Progress, stop: GracefulStop, unread: bool) -> None:
    """End at the deadline as at the end of the schedule: figures read, evaluated, saved."""
    if unread:
        sync_point(job)  # never checkpoint past a divergence
    _evaluate(job, report, stop)
    if job.state.saved != job.position():
        save(job)


def _evaluate(job: Job, report: Progress, stop: GracefulStop) -> bool:
    with _memory(job, evaluating=True):
        return job.evaluate(report, stop)


@contextlib.contextmanager
def _memory(job: Job, evaluating: bool) -> Iterator[None]:
    """Run the block (an update, or with ``evaluating`` a scoring of the held-out data); a failed allocation in it
    becomes the one out-of-memory error (memory.py), with the job's advice and the checkpoint to continue from, if
    the run writes any (a fine-tuning run built for ``--overwrite`` writes none: its hidden directory goes when it
    fails)."""
    step = job.state.step  # before an update counts itself
    try:
        yield
    except Exception as e:  # noqa: BLE001 - re-raised as it is unless an allocation failed
        if not is_out_of_memory(e):
            raise
        during = (
            f"scoring the held-out data after update {step:,}"
            if evaluating
            else f"in update {step + 1:,} of {job.state.total:,}"
        )
        # Rank 0 knows the path it wrote; another rank knows only that a checkpoint holds a position.
        saved = job.resumable and job.state.saved is not None
        where = (job.state.last_checkpoint or "the run's newest checkpoint") if saved else None
        raise out_of_memory(job.state.device, during, job.memory_advice(evaluating), where) from e


def sync_point(job: Job) -> None:
    """A sync point: stop the run if any update since the last one had a non-finite loss on any rank, then read the
    figures."""
    bad = job.state.watch.first()
    first = float(bad[0]) if bad else math.inf
    if job.par.world_size > 1:
        first = -job.par.max([-first])[0]  # the earliest bad update of any rank
    if math.isfinite(first):
        update = int(first)
        loss = bad[1] if bad and bad[0] == update else float("nan")  # another rank's: its value stayed there
        job.state.step = update - 1  # the weights before that update produced it: the ones to distrust
        raise diverged(job.state, f"loss became {loss} at update {update}")
    job.read_figures()


def save(job: Job) -> None:
    """Checkpoint the job's position (rank 0 writes, every rank checks the weights first), unless it cannot resume."""
    if not job.resumable:
        return
    check_weights(job)
    if job.par.is_main:
        if job.state.logger is not None:
            job.state.logger.check_dir()  # a run directory moved while it trains is never re-created
        job.state.last_checkpoint = job.save()
    job.state.saved = job.position()
    job.par.barrier()


def stop_here(job: Job, stop: GracefulStop) -> str:
    """Checkpoint where the run stands for a signal (unless the newest step checkpoint already holds it)."""
    if job.state.saved != job.position():
        save(job)
    return stop.name or "signal"


def check_weights(job: Job) -> None:
    """Stop before saving non-finite weights: such a checkpoint would be the one ``--resume`` picks, and saving it
    would prune a good one. Every rank checks (their weights are the same) so that all of them stop together."""
    finite = torch.stack([torch.isfinite(p).all() for p in job.model.parameters()]).all()
    if not bool(finite):
        raise diverged(job.state, f"the weights became non-finite at update {job.state.step}")


def diverged(state: RunState, what: str) -> NonFiniteLossError:
    """The error that stops a diverged run, naming the newest checkpoint saved before the divergence.

    ``what`` happened at update ``state.step + 1`` (a loss) or to the weights after update ``state.step``: either
    way those weights are suspect, and so is a checkpoint saved from them (step ``state.step``; resuming from it
    replays the same batch on the same weights). The checkpoints of earlier steps gave finite losses; the newest of
    them is named, with the later ones to move away first (``--resume`` takes the newest)."""
    good, later = split_at_step(state.checkpoints.parent, state.step) if state.checkpoints else (None, [])
    advice = "perhaps with a lower --lr or --precision fp32"
    if good is None:
        where = f"no checkpoint was saved before the divergence; start a new run with another --out, {advice}"
    else:
        first = f"move away the later {', '.join(c.name for c in later)}, then " if later else ""
        where = (
            f"the newest checkpoint from before the divergence is {good}; to continue from it, {first}"
            f"resume with --resume, {advice}"
        )
    return NonFiniteLossError(f"{what}; stopping ({where})")
