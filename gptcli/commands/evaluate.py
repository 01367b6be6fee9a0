"""`gpt1 eval`: evaluate checkpoints. Today: language-model perplexity on a prepared corpus (``--data``).

The command dispatches on what is asked for; each kind of evaluation is one ``_eval_*`` function returning rows
for the results table, so further kinds (``--task``) slot in beside :func:`_eval_perplexity`.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

COMMAND_SETTINGS = {"help": "Evaluate checkpoints (perplexity on a prepared corpus with --data)."}


def _eval_perplexity(
    checkpoints: list[Path], data: Path, split: str, batch_size: int, seq_len: Optional[int], device: str,
    precision: str, max_batches: Optional[int], verify: bool,
) -> tuple[list[str], list[list[str]]]:
    from gptcli.checkpoint import load_checkpoint
    from gptcli.errors import GPT1Error
    from gptcli.evaluate_lm import evaluate_lm
    from gptcli.runtime import resolve_device, resolve_precision
    from gptcli.shards import open_corpus

    corpus = open_corpus(data)
    if verify:
        problems = corpus.verify()
        if problems:
            raise GPT1Error(problems[0])
    arrays = corpus.arrays(split)
    dev = resolve_device(device)
    prec = resolve_precision(precision, dev)
    rows = []
    for path in checkpoints:
        ck = load_checkpoint(path, map_location=dev, load_tokenizer=False)
        vocab = corpus.manifest.get("vocab_size")
        if vocab is None and (corpus.dir / "tokenizer").is_dir():
            vocab = corpus.tokenizer.vocab_size
        if vocab is not None and vocab > ck.config.total_vocab:
            raise GPT1Error(
                f"{ck.path}: model vocabulary ({ck.config.total_vocab}) is smaller than the corpus's ({vocab}); "
                "was the corpus prepared with another tokenizer?"
            )
        n = min(seq_len or ck.config.n_ctx, ck.config.n_ctx)
        res = evaluate_lm(ck.model, arrays, n, batch_size, device=dev, precision=prec, max_batches=max_batches)
        step = ck.meta.get("step")
        rows.append([str(ck.path), "" if step is None else str(step), f"{res.loss:.4f}", f"{res.perplexity:.2f}", f"{res.tokens:,}"])
    return ["checkpoint", "step", "loss", "perplexity", "tokens"], rows


def command(
    checkpoint: List[Path] = typer.Option(..., "--checkpoint", help="Checkpoint directory or run directory (newest checkpoint); repeat for several."),
    data: Optional[Path] = typer.Option(None, "--data", help="Prepared corpus directory: report token-level perplexity on --split."),
    split: str = typer.Option("val", "--split", help="Corpus split to evaluate."),
    batch_size: int = typer.Option(8, "--batch-size", help="Sequences per forward pass."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Window length (default: the model's context)."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda."),
    precision: str = typer.Option("fp32", "--precision", help="auto | fp32 | bf16 | fp16."),
    max_batches: Optional[int] = typer.Option(None, "--max-batches", help="Evaluate only the first N batches."),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Check shard checksums first."),
) -> None:
    """Evaluate one or more checkpoints. With --data: loss and perplexity on a corpus split."""
    from rich.console import Console
    from rich.table import Table

    from gptcli.errors import GPT1Error

    if data is None:
        raise GPT1Error("nothing to evaluate: give --data CORPUS_DIR")
    header, rows = _eval_perplexity(checkpoint, data, split, batch_size, seq_len, device, precision, max_batches, verify)
    table = Table(title=f"perplexity on {data} [{split}]")
    for h in header:
        table.add_column(h, justify="left" if h == "checkpoint" else "right")
    for r in rows:
        table.add_row(*r)
    Console().print(table)
