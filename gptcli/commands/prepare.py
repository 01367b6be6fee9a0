"""`gpt1 prepare INPUT... --out DIR`: raw text → GPT-1 BPE token shards (and `--inspect DIR`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from gptcli.errors import GPT1Error


class RichReporter:
    """Renders the pipeline's progress hooks as a Rich progress bar (bytes, documents, tokens, speed, ETA)."""

    def __init__(self, console) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.description:<9}"),
            BarColumn(bar_width=10),
            DownloadColumn(),
            TransferSpeedColumn(),
            TextColumn("{task.fields[docs]:,} docs"),
            TextColumn("{task.fields[tokens]:,} tokens"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = None
        self.started = False

    def stage(self, name: str, total: Optional[int] = None) -> None:
        if not self.started:
            self.progress.start()
            self.started = True
        if self.task is not None:
            t = self.progress.tasks[-1]
            if t.total is not None:
                self.progress.update(self.task, completed=t.total)
            self.progress.stop_task(self.task)
        self.task = self.progress.add_task(name, total=total, docs=0, tokens=0)

    def advance(self, nbytes: int = 0, docs: int = 0, tokens: int = 0) -> None:
        t = self.progress.tasks[-1]
        self.progress.update(
            self.task, advance=nbytes, docs=t.fields["docs"] + docs, tokens=t.fields["tokens"] + tokens
        )

    def warn(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/] {message}", highlight=False, markup=True, soft_wrap=True)

    def done(self) -> None:
        if self.started:
            if self.task is not None:
                self.progress.stop_task(self.task)
            self.progress.stop()
            self.started = False


def _summary(console, result, seconds: float) -> None:
    from rich.table import Table

    m = result.manifest
    table = Table(title=f"prepared {result.out} in {seconds:.1f} s", title_justify="left")
    for col in ("split", "documents", "tokens", "text MB", "bytes/token", "shards"):
        table.add_column(col, justify="left" if col == "split" else "right")
    total_bytes = 0
    for split, st in m["splits"].items():
        total_bytes += st["text_bytes"]
        table.add_row(
            split,
            f"{st['documents']:,}",
            f"{st['tokens']:,}",
            f"{st['text_bytes'] / 1e6:,.2f}",
            f"{st['text_bytes'] / st['tokens']:.2f}" if st["tokens"] else "-",
            str(st["shards"]),
        )
    console.print(table)
    t = m["tokenizer"]
    how = "learned" if t["learned"] else f"reused from {t['source']}"
    console.print(
        f"tokenizer: {how}, vocab {t['vocab_size']:,} (+3 special), {m['dtype']} shards; "
        f"{total_bytes / 1e6 / max(seconds, 1e-9):.2f} MB/s end to end with {m['settings']['workers']} workers"
        + (f"; [yellow]{len(m['warnings'])} warnings[/] (in manifest.json)" if m["warnings"] else ""),
        highlight=False,
    )


def command(
    inputs: Optional[List[str]] = typer.Argument(
        None, help="Text files (.txt: one document each; .jsonl; .parquet), directories (recursive) or globs."
    ),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output corpus directory (must not exist)."),
    vocab_size: Optional[int] = typer.Option(
        None, "--vocab-size", help="BPE vocabulary to learn, newline included, specials excluded \\[default: 40478]."
    ),
    tokenizer: Optional[Path] = typer.Option(
        None, "--tokenizer", help="Reuse this tokenizer (or a corpus dir's tokenizer/) instead of learning one."
    ),
    cased: bool = typer.Option(False, "--cased", help="Keep case (GPT-1 lowercases)."),
    text_field: Optional[str] = typer.Option(
        None, "--text-field", help="JSONL field / Parquet column holding the text \\[default: text]."
    ),
    strip_gutenberg: bool = typer.Option(
        False, "--strip-gutenberg", help="Remove Project Gutenberg headers and licence footers."
    ),
    val_fraction: Optional[float] = typer.Option(
        None, "--val-fraction", help="Share of documents held out for validation, at least one \\[default: 0.01]."
    ),
    seed: Optional[int] = typer.Option(
        None, "--seed", help="Seed of the validation draw and BPE sample \\[default: 0]."
    ),
    workers: Optional[int] = typer.Option(
        None, "--workers", "-j", help="Worker processes (0 = all cores) \\[default: 0]."
    ),
    sample_lines: Optional[int] = typer.Option(
        None, "--sample-lines", help="Most lines the BPE is learned from (seeded sample) \\[default: 1000000]."
    ),
    shard_tokens: Optional[int] = typer.Option(None, "--shard-tokens", help="Tokens per shard \\[default: 67108864]."),
    strict: bool = typer.Option(
        False, "--strict", help="Treat per-file warnings (empty, binary, non-UTF-8…) as errors."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the output directory if it exists."),
    config: Optional[Path] = typer.Option(
        None, "--config", help="TOML/JSON file of PrepareConfig settings; options given here override it."
    ),
    inspect: Optional[Path] = typer.Option(
        None, "--inspect", help="Do not prepare: summarise and verify this corpus directory (= `gpt1 inspect`)."
    ),
) -> None:
    """Clean, split into words, learn a BPE vocabulary and encode text into token shards (GPT-1's pipeline:
    ftfy + standardization → spaCy → lowercase → BPE)."""
    if inspect is not None:
        from gptcli.commands.inspect import render_inspect

        render_inspect(inspect)
        return

    from rich.console import Console

    from gptcli.config import from_dict, load_file, replace
    from gptcli.data.prepare import PrepareConfig, prepare

    cfg = from_dict(PrepareConfig, load_file(config)) if config else PrepareConfig()
    cfg = replace(
        cfg,
        inputs=list(inputs) if inputs else None,
        out=out,
        vocab_size=vocab_size,
        tokenizer=tokenizer,
        cased=cased or None,  # a flag not given leaves the config file's value
        text_field=text_field,
        strip_gutenberg=strip_gutenberg or None,
        val_fraction=val_fraction,
        seed=seed,
        workers=workers,
        sample_lines=sample_lines,
        shard_tokens=shard_tokens,
        strict=strict or None,
        overwrite=overwrite or None,
    )
    if not cfg.inputs:
        raise GPT1Error("no inputs: give text files, directories or globs (see `gpt1 prepare --help`)")
    console = Console(stderr=True)
    start = time.perf_counter()
    result = prepare(cfg, RichReporter(console))
    _summary(Console(), result, time.perf_counter() - start)
