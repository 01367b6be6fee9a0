"""The zero-shot learning curve (paper Figure 2, right): every heuristic scored at every pretraining checkpoint.

Each task's score is normalised between random guessing (0) and the single-model state of the art before GPT-1
(1): ``(score - random) / (sota - random)``, with the values of :data:`RANDOM` and :data:`SOTA` (each one's source
in :data:`SOTA_SOURCE`). The paper's Figure 2 gives no numbers, only "normalized between random guessing and state
of the art"; the DPRD and WSC values are not in the reference, so they can be replaced (``--sota task=value``).

Outputs: ``curve.json`` (raw and normalised scores per checkpoint and task, the constants used, skipped tasks),
``curve.png`` (matplotlib, optional) and one folder of zero-shot results per checkpoint under ``<out>``, built in a
temporary folder that replaces ``<out>`` whole once the curve is complete, so an interrupted curve never leaves a
mix of old and new points. Progress: one stage over the checkpoints, one per checkpoint inside it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptcli.checkpoint import atomic_directory
from gptcli.errors import GPT1Error
from gptcli.eval.zeroshot import (
    TaskResult,
    ZeroShotConfig,
    check_config,
    check_out,
    evaluate,
    json_safe,
    open_model,
    write_results,
)
from gptcli.files.fsutil import write_text_atomic
from gptcli.files.locks import output_lock
from gptcli.files.outputs import mark
from gptcli.progress import SILENT, Progress, staged

RANDOM: dict[str, float] = {
    "sst2": 50.0,
    "cola": 0.0,
    "race": 25.0,
    "race-m": 25.0,
    "race-h": 25.0,
    "storycloze": 50.0,
    "dprd": 50.0,
    "wsc": 50.0,
}
SOTA: dict[str, float] = {
    "sst2": 93.2,
    "cola": 35.0,
    "race": 53.3,
    "race-m": 60.2,
    "race-h": 50.3,
    "storycloze": 77.6,
    "dprd": 76.4,
    "wsc": 63.7,
}
SOTA_SOURCE: dict[str, str] = {
    "sst2": "reference §6 previous best (paper Table 4)",
    "cola": "reference §6 previous best (paper Table 4)",
    "race": "reference §6 previous best (paper Table 3)",
    "race-m": "reference §6 previous best (paper Table 3)",
    "race-h": "reference §6 previous best (paper Table 3)",
    "storycloze": "reference §6 previous best (paper Table 3)",
    "dprd": "Peng, Khashabi & Roth 2015 (not in the reference; replace with --sota dprd=X)",
    "wsc": "Trinh & Le 2018, LM ensemble (not in the reference; replace with --sota wsc=X)",
}
LABELS = {
    "sst2": "Sentiment analysis (SST-2)",
    "cola": "Linguistic acceptability (CoLA)",
    "race": "Question answering (RACE)",
    "race-m": "RACE-m",
    "race-h": "RACE-h",
    "dprd": "Winograd schemas (DPRD)",
    "wsc": "Winograd schemas (WSC273)",
    "storycloze": "Story Cloze",
}


def normalize(task: str, score: float, sota: dict[str, float] | None = None) -> float:
    """``(score - random) / (sota - random)``: 0 = random guessing, 1 = the state of the art before GPT-1."""
    top = (sota or SOTA)[task]
    lo = RANDOM[task]
    if score is None or (isinstance(score, float) and math.isnan(score)):
        return float("nan")
    return (score - lo) / (top - lo)


def list_checkpoints(paths: Sequence[str | Path]) -> list[Path]:
    """Checkpoint directories named by ``paths``: a checkpoint itself, or every complete checkpoint of a run
    directory (``RUN/checkpoints/*``) in order of training step."""
    from gptcli.checkpoint import list_checkpoints as of_path

    return [c for raw in paths for c in of_path(raw)]


def is_run_dir(path: str | Path) -> bool:
    from gptcli.checkpoint import is_checkpoint

    p = Path(path)
    return p.is_dir() and not is_checkpoint(p) and (p / "checkpoints").is_dir()


def wants_curve(task: str, checkpoints: Sequence[str | Path], curve: bool | None = None) -> bool:
    """Whether ``gpt1 zeroshot`` draws the curve: as ``curve`` says when given (``--curve/--no-curve``), else for
    several checkpoints, or for ``--task all`` over a run directory (every checkpoint in it)."""
    if curve is not None:
        return curve
    return len(checkpoints) > 1 or (task.strip().lower() == "all" and is_run_dir(checkpoints[0]))


@dataclass
class CurvePoint:
    checkpoint: str
    step: int | None
    scores: dict[str, float] = field(default_factory=dict)
    normalized: dict[str, float] = field(default_factory=dict)
    n: dict[str, int] = field(default_factory=dict)
    examples_per_s: dict[str, float] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Curve:
    tasks: list[str]
    points: list[CurvePoint]
    skipped: dict[str, str] = field(default_factory=dict)
    sota: dict[str, float] = field(default_factory=lambda: dict(SOTA))

    def to_dict(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "normalization": {
                t: {"random": RANDOM[t], "sota": self.sota[t], "sota_source": SOTA_SOURCE.get(t, "given")}
                for t in self.tasks
            },
            "points": [p.__dict__ for p in self.points],
            "skipped": self.skipped,
        }


@dataclass
class _Run:
    """What the curve has gathered so far, passed from checkpoint to checkpoint."""

    config: ZeroShotConfig
    sota: dict[str, float]
    tasks: list[str] = field(default_factory=list)
    points: list[CurvePoint] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    """Output folder names already used (two runs may both have a ``step-0001000``)."""
    out: Path | None = None
    """The folder being written (the temporary one that becomes ``config.out``), or None to write nothing."""


def run_curve(
    config: ZeroShotConfig,
    checkpoints: Sequence[str | Path],
    progress: Progress | None = None,
    *,
    sota: dict[str, float] | None = None,
) -> Curve:
    """Score ``config.task`` (usually ``all``) at every checkpoint; write per-checkpoint results and the curve
    files into ``config.out`` when set. Tasks whose data is missing are skipped for the whole curve. The model
    computes in ``config.kernels``; the caller's kernels mode is back afterwards."""
    from gptcli.model.kernels import use_kernels

    check_config(config)
    with use_kernels(config.kernels):
        return _run_curve(config, checkpoints, sota, progress)


def _run_curve(
    config: ZeroShotConfig, checkpoints: Sequence[str | Path], sota: dict[str, float] | None, progress: Progress | None
) -> Curve:
    paths = list_checkpoints(checkpoints)
    if config.out:
        _pyplot()  # fail before hours of scoring, not after
        check_out(config, paths)
    run = _Run(config, {**SOTA, **(sota or {})})
    report = progress or SILENT
    if not config.out:
        return _score_all(run, paths, report)
    # Built in a temporary folder that replaces ``out`` whole at the end: an earlier curve there survives a
    # failed or interrupted one.
    curves: list[Curve] = []
    with output_lock(config.out):
        check_out(config, paths)  # again, now that no other run can be writing there
        atomic_directory(Path(config.out), lambda tmp: curves.append(_score_all(run, paths, report, tmp)))
    return curves[0]


def _score_all(run: _Run, paths: Sequence[Path], report: Progress, out: Path | None = None) -> Curve:
    """Every checkpoint in turn; with ``out``, its results under ``out/<name>/`` and the curve files in ``out``."""
    run.out = out
    if out is not None:
        mark(out, "zeroshot")
    with staged(report, "zero-shot curve", total=len(paths), unit="checkpoints"):
        for path in paths:
            _score_checkpoint(run, path, report)
            report.advance(1)
    curve = Curve(run.tasks, run.points, run.skipped, run.sota)
    if out is not None:
        write_curve(out, curve)
    return curve


def _score_checkpoint(run: _Run, path: Path, report: Progress) -> None:
    """Every task at one checkpoint: a point of the curve, and its results written under ``<out>/<name>/``."""
    model, tokenizer, ck = open_model(path, run.config.device, run.config.verify, report)
    report.stage(f"checkpoint {ck.path.name}")
    summary = ""
    try:
        # Later checkpoints need not retry a task whose data is missing.
        results, skip = evaluate(model, tokenizer, run.config, report, exclude=run.skipped)
        _absorb(run, results, skip)
        step = ck.meta.get("step")
        point = _point(str(ck.path), step if isinstance(step, int) else None, results, run.sota)
        run.points.append(point)
        if run.out is not None:
            name = ck.path.name if ck.path.name not in run.names else f"{ck.path.parent.parent.name}-{ck.path.name}"
            run.names.add(name)
            write_results(run.out / name, results, {"checkpoint": str(ck.path), "step": point.step}, skip)
        summary = f"step {point.step if point.step is not None else '?'}: " + ", ".join(
            f"{t} {v:.1f}" for t, v in point.scores.items()
        )
    finally:
        report.end(summary)


def _absorb(run: _Run, results: dict[str, TaskResult], skip: dict[str, str]) -> None:
    run.skipped.update(skip)
    run.tasks += [t for t in results if t not in run.tasks]


def _point(checkpoint: str, step: int | None, results: dict[str, TaskResult], sota: dict[str, float]) -> CurvePoint:
    pt = CurvePoint(checkpoint, step)
    for t, r in results.items():
        pt.scores[t] = r.score
        pt.normalized[t] = normalize(t, r.score, sota)
        pt.n[t] = r.n
        pt.examples_per_s[t] = r.examples_per_s
        pt.notes[t] = list(r.notes)
    return pt


def write_curve(out: str | Path, curve: Curve) -> tuple[Path, Path]:
    """``curve.json`` and ``curve.png`` in ``out`` (the plot needs matplotlib; checked before anything is written).
    Each appears whole: the PNG is drawn to a hidden temporary file and renamed, the JSON written atomically."""
    plt = _pyplot()
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    png = d / "curve.png"
    tmp_png = d / ".curve.png.tmp.png"  # matplotlib picks the format from the suffix
    plot(curve, tmp_png, plt)
    js = write_text_atomic(d / "curve.json", json.dumps(json_safe(curve.to_dict()), indent=2, allow_nan=False) + "\n")
    tmp_png.replace(png)
    return js, png


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise GPT1Error(
            "the zero-shot curve plot needs matplotlib: pip install matplotlib (or pip install 'gpt1[plot]')"
        ) from None
    return plt


def plot(curve: Curve, path: str | Path, plt=None) -> None:
    """Normalised score of each task over pretraining updates, as the paper's Figure 2 (right)."""
    plt = plt or _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    xs_all = [p.step if p.step is not None else i for i, p in enumerate(curve.points)]
    for t in curve.tasks:
        xs = [x for x, p in zip(xs_all, curve.points) if t in p.normalized and not math.isnan(p.normalized[t])]
        ys = [p.normalized[t] for p in curve.points if t in p.normalized and not math.isnan(p.normalized[t])]
        if xs:
            ax.plot(xs, ys, marker="o", label=LABELS.get(t, t))
    ax.axhline(0.0, color="grey", lw=0.8, ls="--")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("pretraining updates" if all(p.step is not None for p in curve.points) else "checkpoint")
    ax.set_ylabel("normalized zero-shot performance")
    ax.set_title("Zero-shot heuristics over pretraining (0 = random, 1 = SOTA)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(str(path), format="png")
    plt.close(fig)
