"""Run logging: ``metrics.jsonl`` (always), TensorBoard and Weights & Biases (optional), and the throughput figures
they carry.

``metrics.jsonl`` has one JSON object per line: ``{"kind": "train", "step", "loss", "lr", "grad_norm",
"tokens", "tokens_per_s", "mfu", "elapsed_s"}`` per logged update and ``{"kind": "eval", "step", "split",
"loss", "perplexity", "tokens"}`` per validation (pretraining adds ``"unigram_loss"``). Only the writing rank
(rank 0 under DDP) creates a logger. Nothing is drawn here: the training loop reports through
:mod:`gptcli.progress` and the command layer renders it, so a library caller gets the same records without a
terminal. Weights & Biases gets the same scalars as TensorBoard (:class:`WandbTracker` says what else).
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import write_text_atomic

METRICS = "metrics.jsonl"


def _records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) of every whole line of metrics.jsonl; a line cut by a crash is skipped."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError:
            continue
    return out


def truncate_metrics(path: Path, after_step: int) -> None:
    """Drop records past ``after_step`` (written by a run that died after its last checkpoint) before resuming.
    The file is replaced atomically: a crash here leaves the old records, never a cut file."""
    if path.is_file():
        keep = [line for line, rec in _records(path) if rec.get("step", 0) <= after_step]
        write_text_atomic(path, "".join(k + "\n" for k in keep))


def keep_first_records(path: Path, n: int) -> int:
    """Keep the first ``n`` whole records (fine-tuning resumes by count: an epoch's eval record carries the step of
    its last update, so a step rule would keep a score its checkpoint never saw). Atomic like
    :func:`truncate_metrics`; returns how many were kept."""
    keep = [line for line, _ in _records(path)][:n]
    write_text_atomic(path, "".join(k + "\n" for k in keep))
    return len(keep)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf
    return v


class WandbTracker:
    """One W&B run beside a gpt1 run directory (``--wandb[=PROJECT]``, the ``wandb`` extra).

    It gets the same scalars as TensorBoard (``train/loss``, ``eval/perplexity``, … at their step), the run's
    resolved config, and the checkpoint paths (run summary ``run_dir``, ``checkpoints`` and ``last_checkpoint``,
    refreshed after every record and when the log closes: the checkpoints the run holds then; fine-tuning writes
    ``checkpoints/final`` after its log closes). Its files go to ``RUN/wandb``; the run id is kept in
    ``RUN/wandb/gpt1-run-id`` so a resumed run continues the same W&B run (``resumed``; a run started afresh gets a
    new one: W&B would drop its steps from 1 as already logged). ``WANDB_MODE=offline`` (or ``disabled``) works as
    W&B documents it: nothing leaves the machine and ``wandb sync RUN/wandb/offline-run-*`` uploads later.
    """

    def __init__(self, run_dir: Path, project: str, config: dict[str, Any] | None, resumed: bool = False) -> None:
        try:
            import wandb
        except ImportError:
            raise GPT1Error("--wandb needs the wandb package (pip install 'gpt1[wandb]')") from None
        self.run_dir = Path(run_dir)
        d = self.run_dir / "wandb"
        d.mkdir(parents=True, exist_ok=True)
        id_file = d / "gpt1-run-id"
        kept = id_file.read_text(encoding="utf-8").strip() if resumed and id_file.is_file() else ""
        run_id = kept or secrets.token_hex(4)
        write_text_atomic(id_file, run_id + "\n")
        try:
            self.run = wandb.init(
                project=project or DEFAULT_WANDB_PROJECT,
                dir=str(self.run_dir),
                id=run_id,
                resume="allow",
                name=self.run_dir.name,
                config=config or {},
                settings=wandb.Settings(silent=True),
            )
        except Exception as e:  # wandb raises its own errors (no login, no network) as one line
            raise GPT1Error(
                f"--wandb: W&B could not start a run ({str(e).splitlines()[0] if str(e) else e}; "
                "set WANDB_MODE=offline to log locally)"
            ) from None

    def replay(self, records: list[dict[str, Any]]) -> None:
        """Give a resumed run the history its checkpoint had seen when W&B did not resume it (offline, W&B starts a
        new local run under the same id, and syncing it replaces the earlier one): the newest run then holds the
        whole history, each step once. A run W&B did resume holds it already."""
        if getattr(self.run, "resumed", False):
            return
        for record in records:
            self._history(record)

    def log(self, record: dict[str, Any]) -> None:
        self._history(record)
        self._checkpoints()

    def _history(self, record: dict[str, Any]) -> None:
        kind = record.get("kind", "train")
        scalars = _scalars(record, kind)
        if scalars:
            self.run.log(scalars, step=int(record.get("step", 0)))

    def _checkpoints(self) -> None:
        """The run's checkpoint directories in the summary, oldest first (by modification time: ``final`` sorts
        before ``step-…`` by name)."""
        found = [p for p in (self.run_dir / "checkpoints").glob("*") if p.is_dir() and not p.name.startswith(".")]
        found.sort(key=lambda p: (p.stat().st_mtime_ns, p.name))
        self.run.summary["run_dir"] = str(self.run_dir)
        if found:
            self.run.summary["checkpoints"] = [str(p) for p in found]
            self.run.summary["last_checkpoint"] = str(found[-1])

    def close(self) -> None:
        self._checkpoints()
        self.run.finish()


DEFAULT_WANDB_PROJECT = "gpt1"
"""The W&B project ``--wandb`` without a value logs to."""


def _scalars(record: dict[str, Any], kind: str) -> dict[str, float]:
    """A record's finite numbers as ``kind/name`` (what TensorBoard and W&B plot)."""
    return {
        f"{kind}/{k}": v
        for k, v in record.items()
        if k not in ("kind", "step") and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


class RunLogger:
    """Appends metrics to ``RUN/metrics.jsonl`` and, if asked and installed, TensorBoard event files and a W&B run
    (``wandb``: the project name, ``""`` for the default one, None for none; ``config``: the run's settings).
    ``purge_step``: the first step a resumed run logs again; TensorBoard drops the points from there on that the
    crashed process wrote after its checkpoint, as metrics.jsonl is cut back to the checkpoint. ``check``: called
    before each record is written; it raises when the run directory may no longer be written in."""

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = False,
        wandb: str | None = None,
        config: dict[str, Any] | None = None,
        purge_step: int | None = None,
        check: Callable[[], None] | None = None,
    ) -> None:
        self.path = Path(run_dir) / METRICS
        self.check = check
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise GPT1Error("--tensorboard needs the tensorboard package (pip install tensorboard)") from None
            self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=purge_step)
        self.wandb = None
        if wandb is not None:
            resumed = purge_step is not None
            self.wandb = WandbTracker(Path(run_dir), wandb, config, resumed=resumed)
            if resumed:  # metrics.jsonl holds what the checkpoint had seen (cut back like TensorBoard's purge)
                self.wandb.replay([rec for _, rec in _records(self.path)])
        self._f = open(self.path, "a", encoding="utf-8")

    def check_dir(self) -> None:
        """Raise if the run directory may no longer be written in (before a record, or a checkpoint)."""
        if self.check is not None:
            self.check()

    def log(self, record: dict[str, Any]) -> None:
        self.check_dir()
        self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._f.flush()
        if self.tb is not None:
            kind = record.get("kind", "train")
            for k, v in _scalars(record, kind).items():
                self.tb.add_scalar(k, v, record.get("step", 0))
        if self.wandb is not None:
            self.wandb.log(record)

    def close(self) -> None:
        self._f.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.close()


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def mfu_text(mfu: float | None) -> str:
    """MFU for the progress line. Above 100 % the peak it is measured against is wrong (on a CPU, a quick matmul
    probe that ran while the machine was busy), so no figure is shown rather than an impossible one."""
    if mfu is None:
        return "n/a"
    if mfu > 1:
        return "n/a (peak FLOP/s underestimated: set --peak-flops)"
    return f"{100 * mfu:.1f}%"


class Throughput:
    """Tokens/s and MFU over the updates since the last report (excluding evaluation and checkpoint time)."""

    def __init__(self, flops_per_token: float, peak_flops: float | None) -> None:
        self.fpt = flops_per_token
        self.peak = peak_flops
        self.tokens = 0
        self.seconds = 0.0
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self, tokens: int) -> None:
        if self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self._t0 = None
        self.tokens += tokens

    def report(self) -> tuple[float, float | None]:
        tps = self.tokens / self.seconds if self.seconds > 0 else 0.0
        mfu = tps * self.fpt / self.peak if self.peak else None
        self.tokens, self.seconds = 0, 0.0
        return tps, mfu
