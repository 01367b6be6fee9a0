"""A run directory's life, the same for every kind of run.

::

    RUN/.gpt1-output               the marker: which kind of run this is (gptcli.files.outputs)
    RUN/config.toml                the resolved config (repeat the run with ``--config``)
    RUN/metrics.jsonl              one line per logged update and per evaluation (runlog.py)
    RUN/checkpoints/step-0001000/  step checkpoints with their training state; the newest ``keep_last`` kept
    RUN/checkpoints/final/         what a finished fine-tuning run keeps (its step checkpoints are then removed)

A run opens its directory in one call (:func:`open_run`): the lock, the output check and what to do with ``--out``
(:func:`plan_run_dir`): start it, resume it (from the newest intact step checkpoint), replace it (``--overwrite``:
built in a hidden sibling and swapped in whole when complete, so the earlier run survives a failed one), or nothing
(a finished run resumed). Nothing is written before then, so every refusal leaves the directory as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch.nn as nn

from gptcli import checkpoint as ckpt
from gptcli.config import dumps_toml, to_dict
from gptcli.errors import GPT1Error
from gptcli.files.fsutil import move_into_place, temp_sibling, write_text_atomic
from gptcli.files.locks import main_rank_lock
from gptcli.files.outputs import MARKER, check_output, check_replaceable, kind_of, mark
from gptcli.model.build import LanguageModel
from gptcli.progress import Progress
from gptcli.tokenizers import Tokenizer
from gptcli.train.run import training_state
from gptcli.train.run.resume import SettingRules
from gptcli.train.runlog import METRICS, RunLogger, keep_first_records, truncate_metrics
from gptcli.train.trainer import Parallel, Trainer

CONFIG_FILE = "config.toml"
CHECKPOINTS = "checkpoints"
FINAL = "final"

C = TypeVar("C")


@dataclass(frozen=True)
class RunKind:
    """What a kind of run is called and what it may do with an existing directory."""

    marker: str
    """Its :data:`gptcli.files.outputs.KINDS` name: a directory of another kind is never written into."""
    what: str
    """How messages name it ("pretraining run")."""
    overwrite: bool
    """Whether it has ``--overwrite`` (start over, or replace a finished run)."""
    final: str | None = None
    """What a finished run holds in ``checkpoints/final`` ("a fine-tuned checkpoint"); None: it never finishes
    (pretraining: a run can always be resumed for more updates)."""
    results: str | None = None
    """The file a finished run's outcome is read back from on a resume (fine-tuning: results.json)."""


@dataclass
class RunDirPlan:
    """What a run does with ``out``, decided before anything is read or written (:func:`plan_run_dir`)."""

    out: Path
    mode: Literal["fresh", "resume", "replace", "done"]
    """``fresh``: a new run written in ``out`` itself (empty, missing, or an unfinished run with no checkpoint);
    ``resume``: continue the run in ``out``; ``replace``: build a new run in a hidden sibling and swap it in when
    complete (``overwrite`` of a finished run or of an unfinished one's checkpoints); ``done``: ``resume`` of a
    finished run, which has nothing left to do."""
    steps: list[Path] = dataclasses.field(default_factory=list)
    """The run's step checkpoints, oldest first (mode ``resume``: :func:`open_run` picks the one to continue from)."""


@dataclass
class RunDir:
    """An opened run directory (:func:`open_run`): what the run does with ``out``, the header of the checkpoint a
    resume continues from (for the resume check), and where this process writes (:meth:`writing`)."""

    kind: RunKind
    plan: RunDirPlan
    is_main: bool
    resume_from: Path | None = None
    """The step checkpoint a resumed run continues from."""
    resume_header: ckpt.Header | None = None
    results: dict[str, Any] | None = None
    """A finished run's recorded outcome (mode ``done``), its settings already found the same."""

    @property
    def out(self) -> Path:
        return self.plan.out

    @property
    def mode(self) -> str:
        return self.plan.mode

    def writing(self) -> contextlib.AbstractContextManager[Path | None]:
        """Rank 0 writes in ``out`` (or the hidden sibling that replaces it: :func:`run_directory`); the other ranks
        of a job nowhere (None)."""
        if not self.is_main:
            return contextlib.nullcontext(None)
        return run_directory(self.kind, self.out, replace=self.mode == "replace")


@contextlib.contextmanager
def open_run(
    kind: RunKind,
    out: Path,
    *,
    resume: bool,
    overwrite: bool,
    verify: bool,
    inputs: list[Path],
    settings: Any = None,
    rules: SettingRules | None = None,
    par: Parallel,
    report: Progress,
) -> Iterator[RunDir]:
    """Open ``out`` for a run, held for as long as the block runs: locked (by rank 0, or the job's launcher:
    :func:`gptcli.files.locks.output_lock`), checked to be no input and no other kind of directory, and what to do with
    it decided (:func:`plan_run_dir`), with the checkpoint a resume continues from, or, for a finished run resumed,
    its results (:func:`finished_results`: its recorded settings compared to ``settings`` by ``rules``; the stale
    temporaries a kill in its last moments left in checkpoints/ removed by rank 0). Every rank has looked at the
    directory before rank 0 writes in it."""
    with main_rank_lock(out, par.is_main):
        plan = plan_run_dir(kind, out, resume=resume, overwrite=overwrite, inputs=inputs, report=report)
        resume_from = None
        if plan.mode == "resume":
            resume_from = resume_point(out, plan.steps, verify, report, overwrite=kind.overwrite)
        header = ckpt.read_header(resume_from) if resume_from is not None else None
        par.barrier()
        results = None
        if plan.mode == "done" and kind.results is not None and rules is not None:
            results = finished_results(out / kind.results, rules, settings)
            if par.is_main:
                remove_step_checkpoints(out / CHECKPOINTS)
            report.note(f"{out}: the run is already finished; nothing to resume")
        yield RunDir(kind, plan, par.is_main, resume_from, header, results)


def finished_results(path: Path, rules: SettingRules, settings: Any) -> dict[str, Any]:
    """A finished run's results (``path``), read back for a resume of it: a resume is idempotent (e.g. a job requeued
    after it ended) unless a setting that defines the run changed, which is refused as any resume would be."""
    out = path.parent
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
        old = dict(results["config"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise GPT1Error(
            f"{path}: unreadable results of a finished run ({e}) (pass --overwrite to run it again)"
        ) from None
    changed, _ = rules.setting_changes(settings, old)
    if changed:
        raise GPT1Error(
            f"{out}: the run is finished with other settings: {', '.join(changed)} (pass --overwrite to "
            "run it again with these, or choose another --out)"
        )
    return dict(results)


def recorded(config: C) -> C:
    """The settings a run records (config.toml, checkpoints, results.json): ``resume`` and ``overwrite`` say what to
    do with ``out`` this time, not what the run is, and would make ``--resume`` of the saved config.toml refuse."""
    switches = {k: False for k in ("resume", "overwrite") if hasattr(config, k)}
    return dataclasses.replace(config, **switches)  # type: ignore[type-var]


def step_checkpoints(out: str | Path) -> list[Path]:
    """The run's step checkpoints (complete ones, damaged or not), oldest first."""
    d = Path(out) / CHECKPOINTS
    if not d.is_dir():
        return []
    return sorted(c for c in d.glob("step-*") if c.is_dir() and ckpt.is_checkpoint(c))


def split_at_step(out: str | Path, step: int) -> tuple[Path | None, list[Path]]:
    """The newest step checkpoint of the run from before update ``step`` (None: none), and those from ``step`` on.
    A checkpoint's step is its header's, or its directory name's when the header is unreadable."""
    before, later = None, []
    for c in step_checkpoints(out):
        try:
            saved = ckpt.read_header(c).step
        except GPT1Error:
            digits = c.name.rsplit("-", 1)[-1]
            saved = int(digits) if digits.isdigit() else -1
        if saved < step:
            before = c
        else:
            later.append(c)
    return before, later


def resume_point(out: Path, steps: Sequence[Path], verify: bool, report: Progress, *, overwrite: bool) -> Path:
    """The step checkpoint a resume continues from: the newest of ``steps`` whose files verify, each newer damaged
    one skipped with a warning naming it and why (with ``verify`` off: simply the newest). ``overwrite``: the run
    can also be started over, which the refusal then offers."""
    if not verify:
        return steps[-1]
    try:
        path, skipped = ckpt.newest_intact(out, candidates=steps)
    except GPT1Error as e:
        ways = ["restore a checkpoint", "pass --no-verify to resume from the newest anyway"]
        ways += ["--overwrite to start the run over"] if overwrite else []
        raise GPT1Error(f"{e} ({', '.join(ways[:-1])}, or {ways[-1]})") from None
    for bad, why in skipped:
        report.note(f"skipping checkpoint {bad.name}: {why}; resuming from {path.name}", level="warn")
    return path


def has_checkpoints(out: str | Path) -> bool:
    """Whether RUN/checkpoints holds a step checkpoint (continued with ``resume``, refused without it)."""
    return bool(step_checkpoints(out))


def step_dir_name(step: int) -> str:
    return f"step-{step:07d}"


def prune_checkpoints(checkpoints: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete ``step-*`` checkpoints and stale temporary directories."""
    checkpoints = Path(checkpoints)
    if not checkpoints.is_dir():
        return []
    removed = []
    # .tmp-: a checkpoint write or a prune cut short; .old-: a checkpoint replaced (fine-tuning saves the same step
    # again after an interrupted epoch's dev score) whose swap was cut short.
    for stale in [*checkpoints.glob(".step-*.tmp-*"), *checkpoints.glob(".step-*.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
        removed.append(stale)
    if keep > 0:
        done = sorted(c for c in checkpoints.glob("step-*") if c.is_dir() and ckpt.is_checkpoint(c))
        for old in done[:-keep]:
            _discard(old)
            removed.append(old)
    return removed


def remove_step_checkpoints(checkpoints: Path) -> None:
    """Delete every ``step-*`` checkpoint, oldest first (so an interrupted removal leaves the newest), and every stale
    temporary (a write, a swap or a prune cut short): a finished fine-tuning run keeps only ``final``."""
    d = Path(checkpoints)
    for stale in [*d.glob(".*.tmp-*"), *d.glob(".*.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    for old in sorted(c for c in d.glob("step-*") if c.is_dir()):
        _discard(old)


def _discard(old: Path) -> None:
    # Hide it first (an atomic rename), then delete: a crash mid-delete leaves a stale temporary that the next
    # prune removes, never a half-deleted step-* directory that looks like a damaged checkpoint.
    trash = old.parent / f".{old.name}.tmp-pruned-{uuid.uuid4().hex[:8]}"
    old.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)


def plan_run_dir(
    kind: RunKind, out: Path, *, resume: bool, overwrite: bool, inputs: list[Path], report: Progress
) -> RunDirPlan:
    """Decide what to do with ``out`` (see :class:`RunDirPlan`): never write into an input or another kind of
    directory. A finished run is replaced only with ``overwrite``; a run with checkpoints is continued with
    ``resume``, started over with ``overwrite``, and refused otherwise (its checkpoints are hours of work); one
    without checkpoints is simply run again."""
    check_output(out, kind.marker, overwrite=True, inputs=inputs, replacing=False)  # user files: when it replaces
    steps = step_checkpoints(out)
    finished = kind.final is not None and (out / CHECKPOINTS / FINAL).exists()
    if resume and steps:
        check_writable(out, resume=True)
        return RunDirPlan(out, "resume", steps)
    if overwrite and (finished or steps):
        check_replaceable(out, kind.marker)  # a user's notes in the run would go with it
        return RunDirPlan(out, "replace")
    if finished and resume and kind.results is not None and (out / kind.results).is_file():
        return RunDirPlan(out, "done")
    if finished:
        raise GPT1Error(f"{out}: already holds {kind.final} (pass --overwrite to replace it)")
    if steps:
        held = f"holds an unfinished {kind.what} with checkpoints" if kind.final else "already holds checkpoints"
        how = "--overwrite to start it over" if kind.overwrite else "choose another --out"
        raise GPT1Error(f"{out}: {held} (pass --resume to continue it, or {how})")
    check_writable(out, resume=False)
    if resume:
        report.note(f"{out}: no checkpoint to resume from; starting the run")
    return RunDirPlan(out, "fresh")


def check_writable(out: Path, resume: bool) -> None:
    """Refuse a run directory, or its checkpoints/, that this process may not write in, before the first update:
    otherwise the run would train and fail only at its first checkpoint, the training it was to keep lost."""
    for d in (out, out / CHECKPOINTS):
        if d.is_dir() and not os.access(d, os.W_OK | os.X_OK):
            how = "copy the run somewhere writable and resume the copy" if resume else "choose another --out"
            raise GPT1Error(f"cannot write in {d}: no checkpoint could be saved there (make it writable, or {how})")


@contextlib.contextmanager
def run_directory(kind: RunKind, out: Path, replace: bool) -> Iterator[Path]:
    """Where a run writes. A new or resumed run writes in ``out`` itself, marked at once (so even an interrupted one
    is recognised as gpt1's, and its checkpoints are where ``--resume`` looks); a run replacing an earlier one
    writes in a hidden sibling that is moved into place only when complete, so the earlier run survives a failed or
    interrupted one whole."""
    if not replace:
        out.mkdir(parents=True, exist_ok=True)
        if kind_of(out) != kind.marker or not (out / MARKER).is_file():
            mark(out, kind.marker)
        yield out
        return
    tmp = temp_sibling(out)
    tmp.mkdir()
    try:
        mark(tmp, kind.marker)
        yield tmp
        move_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op after a successful move


@dataclass(frozen=True)
class OpenedDir:
    """A run directory as the run opened it: its path and its identity then (``st_dev``, ``st_ino``)."""

    path: Path
    identity: tuple[int, int]


def open_dir(path: Path) -> OpenedDir:
    """``path`` as it is now, for :func:`check_run_dir` to compare with later."""
    st = os.stat(path)
    return OpenedDir(path, (st.st_dev, st.st_ino))


def check_run_dir(opened: OpenedDir) -> None:
    """Refuse to write in a run directory that is no longer the one the run opened (moved, renamed or removed while
    it trains): writing by its path would re-create it and split the run in two, its newer checkpoints in the new
    folder and its metrics in the moved one."""
    try:
        st = os.stat(opened.path)
        now: tuple[int, int] | None = (st.st_dev, st.st_ino)
    except FileNotFoundError:
        now = None
    if now != opened.identity:
        raise GPT1Error(
            f"the run directory {opened.path} was moved or removed while training (its checkpoints and metrics "
            "went with it: continue it where it now is with --resume, or move it back first)"
        )


def start_run_dir(
    work: Path,
    config: Any,
    *,
    resumed: bool,
    step: int,
    records: int | None,
    report: Progress,
    tensorboard: bool = False,
    wandb: str | None = None,
) -> RunLogger:
    """(Rank 0) Record the config, bring metrics.jsonl to what the resumed checkpoint had seen (a fresh run starts it
    afresh) and open the run's log, which checks before each write that the directory is still the one opened here
    (:func:`check_run_dir`; :meth:`RunLogger.check_dir` before a checkpoint)."""
    opened = open_dir(work)
    for stale in work.glob(".*.tmp-*"):  # a file write (config, metrics, results) cut short by a kill
        if stale.is_file():
            stale.unlink()
    # Atomically: a config.toml cut short would be read back by `--resume` as a run with other settings.
    settings = to_dict(recorded(config))
    write_text_atomic(work / CONFIG_FILE, dumps_toml(settings))
    metrics = work / METRICS
    if resumed:
        reopen_metrics(metrics, records, step, report)
    elif metrics.exists():
        metrics.unlink()  # an unfinished run without checkpoints started over
    return RunLogger(
        work,
        tensorboard,
        wandb,
        settings,
        purge_step=step + 1 if resumed else None,
        check=lambda: check_run_dir(opened),
    )


def reopen_metrics(path: Path, records: int | None, step: int, report: Progress) -> None:
    """Cut metrics.jsonl back to the ``records`` lines the resumed checkpoint had seen (dropping those a killed
    process wrote after it), saying so when fewer than that survived. By count, not by step: an epoch's evaluation
    line carries the step of its last update, so a step rule would keep a score the checkpoint never saw.
    Checkpoints written before they counted records (pretraining's) keep the lines up to their ``step``."""
    if records is None:
        truncate_metrics(path, step)
        return
    kept = keep_first_records(path, records)
    if kept < records:
        report.note(
            f"{path}: {records - kept} of the {records} records the checkpoint had seen are missing", level="warn"
        )


def write_step_checkpoint(
    checkpoints: Path,
    step: int,
    trainer: Trainer,
    body: LanguageModel,
    tokenizer: Tokenizer,
    *,
    kind: str,
    meta: dict[str, Any],
    state: dict[str, Any],
    keep_last: int,
    head_state: dict[str, Any] | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """``checkpoints/step-N``: the model (body, and head), the tokenizer and ``meta`` as any checkpoint (so ``gpt1
    eval`` can load it), plus the training state — the job's ``state`` (JSON), the optimizer and loss scaler, every
    RNG — and whatever ``extra`` writes; then keep only the newest ``keep_last`` (0: all)."""

    def write_state(d: Path) -> None:
        training_state.write_training_state(d, trainer.optimizer, state, scaler=trainer.scaler)
        if extra is not None:
            extra(d)

    path = ckpt.save_checkpoint(
        checkpoints / step_dir_name(step),
        body,
        tokenizer,
        kind=kind,
        meta=meta,
        head_state=head_state,
        extra=write_state,
    )
    prune_checkpoints(checkpoints, keep_last)
    return path


def read_step_checkpoint(
    path: Path, trainer: Trainer, body: nn.Module, head: nn.Module | None = None
) -> dict[str, Any]:
    """Load a step checkpoint into a freshly built run: the weights, the optimizer and loss scaler, every RNG; returns
    the job's JSON state. Its files were verified when it was chosen (:func:`resume_point`)
    or ``--no-verify`` said not to.

    The weights are read onto the CPU and copied into the model where it lives: loading onto "cuda" would put
    every rank's copy on GPU 0 (the default device), where eight of them do not fit."""
    saved = ckpt.load_checkpoint(path, map_location="cpu", load_tokenizer=False, verify=False)
    try:
        body.load_state_dict(saved.model.state_dict(), strict=True)
        if head is not None:
            head.load_state_dict(saved.head_state, strict=True)
    except RuntimeError as e:
        raise GPT1Error(
            f"{path}: checkpoint does not match the configured model ({str(e).splitlines()[0]}); "
            "resume with the run's own settings"
        ) from None
    del saved
    doc, tensors = training_state.read_training_state(path, verify=False)
    training_state.restore_training_state(doc, tensors, trainer.optimizer, scaler=trainer.scaler)
    return doc
