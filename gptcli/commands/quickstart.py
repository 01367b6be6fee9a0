"""`gpt1 quickstart`: the whole pipeline at toy scale, offline, in a few minutes (see gptcli/pipelines/quickstart.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

COMMAND_SETTINGS = {
    "help": "Run the whole pipeline at toy scale in minutes, offline: prepare → pretrain → fine-tune → eval → zero-shot."
}


def command(
    out: Optional[Path] = typer.Option(None, "--out", help="Output directory for everything the run writes (default: runs/quickstart)."),
    minutes: Optional[float] = typer.Option(None, "--minutes", help="Wall-clock target for the whole run; pretraining gets what the other stages leave (default: 4)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for the held-out modules, the task, initialisation and data order (default: 0)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the outputs of an earlier quickstart in --out (other files are never deleted)."),
    device: Optional[str] = typer.Option(None, "--device", help="auto | cpu | cuda (default: auto)."),
    precision: Optional[str] = typer.Option(None, "--precision", help="auto | fp32 | bf16 | fp16 (default: auto)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes for the text pipeline (default: 0 = all cores)."),
    config: Optional[Path] = typer.Option(None, "--config", help="TOML/JSON file of QuickstartConfig settings (model size, learning rates...); options given here override it."),
) -> None:
    """Walk the GPT-1 paper's pipeline end to end on the docstrings of Python's standard library (no download):
    learn a BPE vocabulary, pretrain a tiny GPT, fine-tune it to tell sentences from word-shuffled ones (a
    CoLA-style task), evaluate it, and run the paper's zero-shot heuristic. Prints what each number means and
    the commands for the real thing."""
    from rich.console import Console

    from gptcli.config import from_dict, load_file
    from gptcli.pipelines.quickstart import QuickstartConfig, quickstart

    base = load_file(config) if config is not None else {}
    given = dict(out=out, minutes=minutes, seed=seed, device=device, precision=precision, workers=workers)
    merged = {**base, **{k: v for k, v in given.items() if v is not None}}
    if overwrite:
        merged["overwrite"] = True
    cfg = from_dict(QuickstartConfig, merged)

    console = Console(stderr=True)
    hooks = RichHooks(console)
    console.rule("[bold]gpt1 quickstart")
    console.print(
        f"The GPT-1 pipeline at toy scale, offline, in about {cfg.minutes:g} minutes. Output: [bold]{cfg.out}[/]",
        highlight=False,
    )
    result = quickstart(cfg, hooks)
    render_summary(Console(), result)


class RichHooks:
    """Stage headers, notes and timings for :func:`gptcli.pipelines.quickstart.quickstart`, on a Rich console."""

    def __init__(self, console) -> None:
        from gptcli.pipelines.quickstart import STAGES

        from gptcli.commands.render import RichProgress

        self.console = console
        self.progress = RichProgress(console)
        self.index = {key: i + 1 for i, (key, _) in enumerate(STAGES)}
        self.total = len(STAGES)

    def prepare_reporter(self):
        return self.progress  # prepare reports through the progress protocol, like pretrain

    def stage(self, key: str, title: str) -> None:
        self.console.print()
        self.console.rule(f"[bold cyan]{self.index[key]}/{self.total}[/] {title}", align="left")

    def note(self, message: str) -> None:
        self.console.print(f"[dim]{message}[/]", highlight=False)

    def done(self, key: str, summary: str, seconds: float) -> None:
        self.console.print(f"[green]✓[/] {summary} [dim]({seconds:.1f} s)[/]", highlight=False)


def render_summary(console, result) -> None:
    """The final table (value and meaning of each number) and the "what next" commands."""
    from rich.table import Table

    from gptcli.pipelines.quickstart import WHAT_NEXT, summary_rows

    n = result.numbers
    table = Table(title=f"gpt1 quickstart: results ({n['seconds_total']:.0f} s, seed {n['seed']})",
                  title_justify="left", show_lines=False)
    table.add_column("number")
    table.add_column("value", justify="right", style="bold")
    table.add_column("what it means")
    for what, value, meaning in summary_rows(n):
        table.add_row(what, value, meaning)
    console.print()
    console.print(table)
    console.print(f"Everything is in [bold]{result.out}[/]: summary.json, the task files (task/), the corpus, "
                  "the pretraining run, the fine-tuned model and each stage's results.", highlight=False)
    console.print()
    console.print("[bold]What next[/] — the same pipeline at the paper's scale:")
    for cmd, what in WHAT_NEXT:
        console.print(f"  [cyan]{cmd}[/]\n      {what}", highlight=False)
    console.print("  See docs/index.md for the full guide.", highlight=False)
