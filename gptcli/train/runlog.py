"""Run logging: ``metrics.jsonl`` (always), TensorBoard (optional), and the throughput figures both carry.

``metrics.jsonl`` has one JSON object per line: ``{"kind": "train", "step", "loss", "lr", "grad_norm",
"tokens", "tokens_per_s", "mfu", "elapsed_s"}`` per logged update and ``{"kind": "eval", "step", "split",
"loss", "perplexity", "tokens"}`` per validation (pretraining adds ``"unigram_loss"``). Only the writing rank
(rank 0 under DDP) creates a logger. Nothing is drawn here: the training loop reports through
:mod:`gptcli.progress` and the command layer renders it.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from gptcli.errors import GPT1Error
from gptcli.fsutil import write_text_atomic

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


class RunLogger:
    """Appends metrics to ``RUN/metrics.jsonl`` and, if asked and installed, TensorBoard event files."""

    def __init__(self, run_dir: Path, tensorboard: bool = False) -> None:
        self.path = Path(run_dir) / METRICS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise GPT1Error("--tensorboard needs the tensorboard package (pip install tensorboard)") from None
            self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._f.flush()
        if self.tb is not None:
            kind = record.get("kind", "train")
            for k, v in record.items():
                if k not in ("kind", "step") and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(f"{kind}/{k}", v, record.get("step", 0))

    def close(self) -> None:
        self._f.close()
        if self.tb is not None:
            self.tb.close()


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


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
