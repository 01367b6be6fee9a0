"""`gpt1 eval`: evaluate checkpoints — perplexity on a prepared corpus (``--data``) or the paper's metric on a
task (``--task``, or fine-tuned checkpoints, which know their task).

The command only dispatches: perplexity is :func:`_eval_perplexity` here, task evaluation is
:func:`gptcli.commands.eval_tasks.task_eval_command`.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

COMMAND_SETTINGS = {
    "help": "Evaluate checkpoints: perplexity on a prepared corpus (--data) or the paper's metric on a task (--task)."
}


def _eval_perplexity(
    checkpoints: list[Path], data: Path, split: str, batch_size: int, seq_len: Optional[int], device: str,
    precision: str, max_batches: Optional[int], verify: bool,
) -> tuple[list[str], list[list[str]]]:
    from gptcli.checkpoint import load_checkpoint
    from gptcli.errors import GPT1Error
    from gptcli.eval.perplexity import evaluate_lm
    from gptcli.runtime import resolve_device, resolve_precision
    from gptcli.data.shards import open_corpus

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


def _is_finetuned(path: Path) -> bool:
    """True when ``path`` (a checkpoint or run directory) holds a fine-tuned checkpoint."""
    import json

    from gptcli.checkpoint import CONFIG, resolve_checkpoint

    try:
        return json.loads((resolve_checkpoint(path) / CONFIG).read_text()).get("kind") == "finetuned"
    except (OSError, ValueError):
        return False


def command(
    checkpoint: List[Path] = typer.Option(..., "--checkpoint", help="Checkpoint directory or run directory (newest checkpoint); repeat for several."),
    data: Optional[Path] = typer.Option(None, "--data", help="Prepared corpus directory: report token-level perplexity on --split."),
    task: Optional[List[str]] = typer.Option(None, "--task", help="Task(s) to score fine-tuned checkpoints on (comma list or repeat; default: each checkpoint's own task). See `gpt1 finetune --list-tasks`."),
    split: Optional[str] = typer.Option(None, "--split", help="Split to evaluate: corpus split (default val) or task split dev|test|train (default dev; test writes a GLUE submission file for unlabeled files)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="The task's official data folder (default: $GPT1_DATA/<folder>)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where task results, predictions and submission files go (default: RUN/eval/<task>-<split>/)."),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="Skip and count malformed task rows instead of stopping at the first."),
    max_examples: Optional[int] = typer.Option(None, "--max-examples", help="Score only the first N task examples (quick checks)."),
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

    if data is not None and task:
        raise GPT1Error("give either --data (perplexity) or --task (task metric), not both")
    if data is None:
        if not task and not all(_is_finetuned(c) for c in checkpoint):
            raise GPT1Error("nothing to evaluate: give --data CORPUS_DIR for perplexity, or --task T for a task metric")
        from gptcli.commands.eval_tasks import task_eval_command

        task_eval_command(
            task or None, checkpoint, split or "dev", data_dir, out, batch_size=batch_size, device=device,
            precision=precision, skip_bad_rows=skip_bad_rows, max_examples=max_examples,
        )
        return
    split = split or "val"
    header, rows = _eval_perplexity(checkpoint, data, split, batch_size, seq_len, device, precision, max_batches, verify)
    table = Table(title=f"perplexity on {data} [{split}]")
    for h in header:
        table.add_column(h, justify="left" if h == "checkpoint" else "right")
    for r in rows:
        table.add_row(*r)
    Console().print(table)
