"""`gpt1 prepare INPUT... --out DIR`: raw text → GPT-1 BPE token shards (and `--inspect DIR`)."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from gptcli.commands.options import CliOnly, Options, Parsed
from gptcli.commands.render import escape
from gptcli.data.prepare import PrepareConfig, PrepareResult
from gptcli.errors import GPT1Error

OPTIONS = Options(
    PrepareConfig,
    arguments=("inputs",),
    panels={
        "Input": ("split_by", "text_field", "strip_gutenberg", "strict"),
        "Data": ("vocab_size", "tokenizer", "cased", "sample_lines", "character_coverage", "val_fraction", "seed"),
        "Output": ("out", "shard_tokens", "overwrite"),
        "Runtime": ("workers", "chunk_bytes"),
    },
    flags={"out": ("--out", "-o"), "workers": ("--workers", "-j")},
    cli_only=[
        CliOnly(
            "inspect",
            Path | None,
            None,
            ("--inspect",),
            "Do not prepare: summarise and verify this corpus directory (= `gpt1 inspect DIR`).",
            why="an action (look at an existing corpus) instead of a setting of the preparation",
        ),
    ],
)


def run(p: Parsed) -> None:
    """Clean, split into words, learn a BPE vocabulary and encode text into token shards (GPT-1's pipeline:
    ftfy + standardization → spaCy → lowercase → BPE)."""
    from gptcli.commands.inspect import render_inspect
    from gptcli.commands.render import RichProgress, stderr_console, stdout_console
    from gptcli.data.prepare import prepare

    if p.cli["inspect"] is not None:
        render_inspect(p.cli["inspect"])
        return
    base = p.base()
    cfg = p.resolve(PrepareConfig, base)
    if not cfg.inputs:
        raise GPT1Error("no inputs: give text files, directories or globs (see `gpt1 prepare --help`)")
    start = time.perf_counter()
    # What the user set (typed or in the --config file), which a reused tokenizer is checked against.
    result = prepare(cfg, RichProgress(stderr_console()), given={*p.given, *base})
    _summary(stdout_console(), result, time.perf_counter() - start)


command = OPTIONS.command(run)


def _summary(console: Console, result: PrepareResult, seconds: float) -> None:
    """The splits table, then the tokenizer and the end-to-end speed in one line."""
    from gptcli.commands.inspect import splits_table
    from gptcli.data.shards import summarize

    s = summarize(result.manifest)
    console.print(splits_table(f"prepared {escape(str(result.out))} in {seconds:.1f} s", s))
    how = "learned" if s.learned else f"reused from {escape(str(s.tokenizer_source))}"
    text_bytes = sum(split.text_bytes or 0 for split in s.splits)
    console.print(
        f"tokenizer: {how}, vocab {s.vocab_size:,} (+3 special), {s.dtype} shards; "
        f"{text_bytes / 1e6 / max(seconds, 1e-9):.2f} MB/s end to end with {s.workers} workers"
        + (f"; [yellow]{s.warnings} warnings[/] (in manifest.json)" if s.warnings else ""),
        highlight=False,
    )
