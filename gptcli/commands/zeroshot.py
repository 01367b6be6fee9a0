"""`gpt1 zeroshot`: the paper's zero-shot heuristics on a pretrained language model, and their learning curve.

Parses options into a :class:`gptcli.eval.zeroshot.ZeroShotConfig`, calls :func:`gptcli.eval.zeroshot.zeroshot` (one
checkpoint) or :func:`gptcli.eval.curve.run_curve` (``--task all`` over a run directory, or several
``--checkpoint``), and renders Rich tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

COMMAND_SETTINGS = {"help": "Zero-shot heuristics of the paper (SST-2, CoLA, RACE, DPRD, WSC, Story Cloze) and their curve over pretraining."}

TASK_HELP = "sst2 | cola | race | race-m | race-h | dprd | wsc | storycloze | all (comma-separated lists work too)."


def _parse_pairs(values: list[str], what: str) -> tuple[Optional[str], dict[str, str]]:
    """``["dev", "dprd=train"]`` → (``"dev"``, ``{"dprd": "train"}``)."""
    from gptcli.errors import GPT1Error

    plain, pairs = None, {}
    for v in values:
        if "=" in v:
            k, _, x = v.partition("=")
            if not k.strip() or not x.strip():
                raise GPT1Error(f"--{what}: expected VALUE or TASK=VALUE, got {v!r}")
            pairs[k.strip().lower()] = x.strip()
        else:
            plain = v
    return plain, pairs


def command(
    task: Optional[str] = typer.Option(None, "--task", help=TASK_HELP + " Default: sst2."),
    checkpoint: List[Path] = typer.Option(..., "--checkpoint", help="Checkpoint directory or run directory; repeat for several (a curve). With --task all a run directory means every checkpoint in it."),
    split: List[str] = typer.Option([], "--split", help="Split to score: SPLIT for every task, or TASK=SPLIT (repeatable). Defaults: dev; dprd test; wsc test (its only file); storycloze val."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Task folder (one task) or the folder holding every task folder (several tasks). Default: $GPT1_DATA."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write results.json and predictions-<task>.jsonl here (and curve.json/curve.png for a curve)."),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="CoLA: average log-probability threshold (default: fitted on the train split to maximise MCC)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="Rows per forward pass (default 32)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Score only the first N examples of each split (quick checks)."),
    precision: Optional[str] = typer.Option(None, "--precision", help="auto | fp32 | bf16 | fp16 (default auto: bf16 autocast on CUDA and on CPUs with native bf16)."),
    device: Optional[str] = typer.Option(None, "--device", help="auto | cpu | cuda | cuda:N (default auto)."),
    curve: Optional[bool] = typer.Option(None, "--curve/--no-curve", help="Force or prevent the curve over checkpoints (default: on for --task all over a run directory, or several --checkpoint)."),
    sota: List[str] = typer.Option([], "--sota", help="Curve normalisation: TASK=SCORE replaces the state-of-the-art value (percent; CoLA MCC x100)."),
    config: Optional[Path] = typer.Option(None, "--config", help="TOML/JSON file with ZeroShotConfig fields; command-line options override it."),
) -> None:
    """Score a pretrained (not fine-tuned) language model with the paper's zero-shot heuristics (§5)."""
    from rich.console import Console
    from rich.table import Table

    from gptcli.config import from_dict, load_file, replace
    from gptcli.errors import GPT1Error
    from gptcli.eval.zeroshot import TASKS, ZeroShotConfig, task_list

    console = Console()
    base = from_dict(ZeroShotConfig, load_file(config)) if config else ZeroShotConfig()
    plain_split, split_pairs = _parse_pairs(split, "split")
    cfg = replace(
        base, task=task.lower() if task else None, checkpoint=str(checkpoint[0]), split=plain_split,
        data_dir=str(data_dir) if data_dir else None, out=str(out) if out else None, threshold=threshold,
        batch_size=batch_size, limit=limit, precision=precision, device=device,
    )
    cfg.splits = {**cfg.splits, **split_pairs}
    cfg.task = cfg.task.lower()
    for k in cfg.splits:
        if k not in TASKS:
            raise GPT1Error(f"--split {k}=…: unknown task {k!r} (known: {', '.join(TASKS)})")
    task_list(cfg.task)  # validate early
    sota_values: dict[str, float] = {}
    for k, v in _parse_pairs(sota, "sota")[1].items():
        try:
            sota_values[k] = float(v)
        except ValueError:
            raise GPT1Error(f"--sota {k}={v}: not a number") from None

    from gptcli.eval.curve import is_run_dir

    use_curve = curve if curve is not None else (len(checkpoint) > 1 or (cfg.task == "all" and is_run_dir(checkpoint[0])))

    def skip(t: str, why: str) -> None:
        console.print(f"[yellow]skipped {t}:[/] {why}", highlight=False)

    if use_curve:
        _render_curve(console, cfg, checkpoint, sota_values, skip)
        return

    from gptcli.eval.zeroshot import zeroshot

    with _progress(console) as progress:
        results, skipped, meta = zeroshot(cfg, on_skip=skip, progress=progress)
    table = Table(title=f"zero-shot · {meta['checkpoint']}" + (f" · step {meta['step']}" if meta.get("step") is not None else ""))
    for h in ("task", "split", "metric", "score", "n", "examples/s", "notes"):
        table.add_column(h, justify="right" if h in ("score", "n", "examples/s") else "left")
    for name, r in results.items():
        table.add_row(name, r.split, r.metric, f"{r.score:.1f}", str(r.n), f"{r.examples_per_s:.1f}", "; ".join(r.notes))
    console.print(table)
    if cfg.out:
        console.print(f"wrote {Path(cfg.out) / 'results.json'}")


class _progress:
    """A Rich progress bar fed by ``progress(what, done, total)`` callbacks (one bar per scoring pass)."""

    def __init__(self, console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=console, transient=True)
        self.current = None
        self.what = None

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def __call__(self, what: str, done: int, total: int) -> None:
        if what != self.what or self.current is None or done == 0:
            if self.current is not None:
                self.bar.remove_task(self.current)
            self.current = self.bar.add_task(f"scoring {what}", total=total)
            self.what = what
        self.bar.update(self.current, completed=done)


def _render_curve(console, cfg, checkpoints, sota_values, on_skip) -> None:
    from rich.table import Table

    from gptcli.eval.curve import RANDOM, SOTA, run_curve

    def point(p) -> None:
        scores = ", ".join(f"{t} {v:.1f}" for t, v in p.scores.items())
        console.print(f"step {p.step if p.step is not None else '?'}: {scores}", highlight=False)

    with _progress(console) as progress:
        curve = run_curve(cfg, checkpoints, sota=sota_values, on_point=point, on_skip=on_skip, progress=progress)
    table = Table(title="zero-shot curve: score (normalised: 0 = random, 1 = SOTA)")
    table.add_column("step", justify="right")
    table.add_column("checkpoint")
    for t in curve.tasks:
        table.add_column(t, justify="right")
    for p in curve.points:
        cells = [f"{p.scores[t]:.1f} ({p.normalized[t]:+.2f})" if t in p.scores else "—" for t in curve.tasks]
        table.add_row("" if p.step is None else str(p.step), Path(p.checkpoint).name, *cells)
    console.print(table)
    table_sota = {**SOTA, **sota_values}
    notes = sorted({n for p in curve.points for t, ns in p.notes.items() for n in ns if n.startswith("multi-token words")})
    for n in notes:
        console.print(f"note (sst2): {n}", highlight=False)
    console.print("normalisation: " + "; ".join(f"{t}: random {RANDOM[t]:g}, SOTA {table_sota[t]:g}" for t in curve.tasks), highlight=False)
    if cfg.out:
        console.print(f"wrote {Path(cfg.out) / 'curve.json'} and {Path(cfg.out) / 'curve.png'}")
