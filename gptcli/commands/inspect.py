"""`gpt1 inspect DIR`: summarise a prepared corpus and verify every shard's checksum."""

from __future__ import annotations

from pathlib import Path

import typer

from gptcli.errors import GPT1Error


def render_inspect(directory: Path, sample_tokens: int = 64, verify: bool = True) -> None:
    """Print the Rich summary of a corpus directory; raises GPT1Error when a shard fails verification."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    from gptcli.data.shards import open_corpus

    console = Console()
    corpus = open_corpus(directory)
    m = corpus.manifest
    tok_info = m.get("tokenizer", {})
    splits = m.get("splits", {})

    table = Table(title=f"corpus {directory}", title_justify="left")
    for col in ("split", "documents", "tokens", "text MB", "bytes/token", "shards"):
        table.add_column(col, justify="left" if col == "split" else "right")
    for split in corpus.splits:
        st = splits.get(split, {})
        tokens = corpus.num_tokens(split)
        text_bytes = st.get("text_bytes")
        table.add_row(
            split,
            f"{corpus.num_documents(split):,}",
            f"{tokens:,}",
            f"{text_bytes / 1e6:,.2f}" if text_bytes else "-",
            f"{text_bytes / tokens:.2f}" if text_bytes and tokens else "-",
            str(len(corpus.shard_entries(split))),
        )
    console.print(table)

    tok = corpus.tokenizer
    settings = m.get("settings", {})
    inputs = m.get("inputs", [])
    facts = [
        f"tokenizer: {tok.kind}, vocab {tok.vocab_size:,} (+{tok.n_special} special = {tok.total_vocab:,}), "
        f"{'cased' if getattr(tok, 'cased', False) else 'lowercased'}, "
        f"{'learned here' if tok_info.get('learned') else 'reused from ' + str(tok_info.get('source'))}",
        f"shards: {m.get('dtype', '?')} ids, Arrow IPC, format {m.get('format_version', '?')}",
        f"inputs: {len(inputs)} files, {sum(i.get('bytes', 0) for i in inputs) / 1e6:,.1f} MB",
        f"made by: gpt1 {m.get('tool', {}).get('version', '?')}, seed {settings.get('seed', '?')}",
    ]
    if m.get("warnings"):
        facts.append(f"warnings while preparing: {len(m['warnings'])} (listed in manifest.json)")
    console.print("\n".join(facts), highlight=False)

    if sample_tokens > 0:
        split = "val" if "val" in corpus.splits else corpus.splits[0]
        doc = next(iter(corpus.documents(split)), None)
        if doc is not None:
            ids = doc[:sample_tokens].tolist()
            console.print(
                Panel(tok.decode(ids), title=f"first {len(ids)} tokens of the first {split} document", expand=False),
                highlight=False,
                markup=False,
            )

    if verify:
        with console.status("verifying shard checksums…"):
            problems = corpus.verify()
        n = len(m["shards"])
        if problems:
            for p in problems:
                console.print(f"[red]✗[/] {p}", highlight=False)
            raise GPT1Error(f"{directory}: {len(problems)} of {n} shards failed verification")
        console.print(f"[green]✓[/] all {n} shard checksums match the manifest")


def command(
    directory: Path = typer.Argument(..., help="A corpus directory written by `gpt1 prepare`."),
    sample_tokens: int = typer.Option(64, "--sample-tokens", help="Decode this many tokens as a sample (0: none)."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the sha256 check of every shard."),
) -> None:
    """Summarise a prepared corpus (documents, tokens, vocabulary, bytes per token, a decoded sample) and verify
    every shard's checksum (non-zero exit on a mismatch)."""
    render_inspect(directory, sample_tokens=sample_tokens, verify=not no_verify)
