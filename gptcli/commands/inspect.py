"""`gpt1 inspect DIR`: summarise a prepared corpus and verify every shard's checksum."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from gptcli.commands.options import CliOnly, Options, Parsed
from gptcli.commands.render import escape
from gptcli.errors import GPT1Error


@dataclass
class InspectConfig:
    """What `gpt1 inspect` shows (a display command: nothing here changes the corpus)."""

    sample_tokens: int = 64
    """Decode this many tokens of the first validation document as a sample (0: none)."""
    verify: bool = True
    """Check every shard's sha256 against the manifest (--no-verify skips it)."""


OPTIONS = Options(
    InspectConfig,
    panels={"Output": ("sample_tokens", "verify")},
    config_option=False,  # two display settings: a config file would be ceremony
    cli_only=[
        CliOnly(
            "directory",
            Path,
            ...,
            (),
            "A corpus directory written by `gpt1 prepare`.",
            why="the corpus to look at is the subject of the command, not a setting",
            argument=True,
        ),
    ],
)


def splits_table(title: str, summary: Any) -> Any:
    """One row per split (documents, tokens, text MB, bytes/token, shards): `gpt1 prepare` ends with it too."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in ("split", "documents", "tokens", "text MB", "bytes/token", "shards"):
        table.add_column(col, justify="left" if col == "split" else "right")
    for s in summary.splits:
        table.add_row(
            s.name,
            f"{s.documents:,}",
            f"{s.tokens:,}",
            f"{s.text_bytes / 1e6:,.2f}" if s.text_bytes else "-",
            f"{s.text_bytes / s.tokens:.2f}" if s.text_bytes and s.tokens else "-",
            str(s.shards),
        )
    return table


def _facts(corpus: Any, summary: Any) -> str:
    tok = corpus.tokenizer
    facts = [
        f"tokenizer: {tok.kind}, vocab {tok.vocab_size:,} (+{tok.n_special} special = {tok.total_vocab:,}), "
        f"{'cased' if getattr(tok, 'cased', False) else 'lowercased'}, "
        f"{'learned here' if summary.learned else 'reused from ' + str(summary.tokenizer_source)}",
        f"shards: {summary.dtype} ids, Arrow IPC, format {summary.format_version}",
        f"inputs: {summary.inputs} files, {summary.input_bytes / 1e6:,.1f} MB",
        f"made by: gpt1 {summary.tool_version}, seed {summary.seed}",
    ]
    if summary.warnings:
        facts.append(f"warnings while preparing: {summary.warnings} (listed in manifest.json)")
    return "\n".join(facts)


def _print_sample(console: Console, corpus: Any, sample_tokens: int) -> None:
    """The first tokens of the first validation document, decoded: a glance at what the model will read."""
    from rich.panel import Panel

    split = "val" if "val" in corpus.splits else corpus.splits[0]
    doc = next(iter(corpus.documents(split)), None)
    if doc is None:
        return
    ids = doc[:sample_tokens].tolist()
    console.print(
        Panel(
            corpus.tokenizer.decode(ids), title=f"first {len(ids)} tokens of the first {split} document", expand=False
        ),
        highlight=False,
        markup=False,
    )


def _verify(console: Console, corpus: Any, summary: Any, directory: Path) -> None:
    with console.status("verifying shard checksums…"):
        problems = corpus.verify()
    n = sum(s.shards for s in summary.splits)
    if problems:
        for p in problems:
            console.print(f"[red]✗[/] {escape(p)}", highlight=False)
        raise GPT1Error(f"{directory}: {len(problems)} of {n} shards failed verification")
    console.print(f"[green]✓[/] all {n} shard checksums match the manifest")


def render_inspect(directory: Path, sample_tokens: int = 64, verify: bool = True) -> None:
    """Print the Rich summary of a corpus directory; raises GPT1Error when a shard fails verification."""
    from gptcli.commands.render import stdout_console
    from gptcli.data.shards import open_corpus

    console = stdout_console()
    corpus = open_corpus(directory)
    summary = corpus.summary()
    console.print(splits_table(f"corpus {escape(str(directory))}", summary))
    console.print(_facts(corpus, summary), highlight=False)
    if sample_tokens > 0:
        _print_sample(console, corpus, sample_tokens)
    if verify:
        _verify(console, corpus, summary, directory)


def run(p: Parsed) -> None:
    """Summarise a prepared corpus (documents, tokens, vocabulary, bytes per token, a decoded sample) and verify
    every shard's checksum (non-zero exit on a mismatch)."""
    cfg = p.resolve(InspectConfig)
    render_inspect(p.cli["directory"], sample_tokens=cfg.sample_tokens, verify=cfg.verify)


command = OPTIONS.command(run)
