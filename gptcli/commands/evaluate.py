"""`gpt1 eval`: evaluate checkpoints — perplexity on a prepared corpus (``--data``) or the paper's metric on a
task (``--task``, or fine-tuned checkpoints, which know their task).

Options come from :class:`gptcli.eval.tasks.EvalConfig`. The command turns Hub ids into checkpoints and renders;
both modes are :func:`gptcli.eval.tasks.evaluate_tasks` (perplexity by its call of
:func:`gptcli.eval.perplexity.corpus_perplexity`). With several checkpoints and/or tasks the task summary is one
combined table like the paper's Tables 2–4, with GPT-1's numbers in the first row and what a trivial predictor
scores (majority class / chance) in the second.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from gptcli.commands.options import Options, Parsed
from gptcli.commands.render import RichProgress, details_table, results_table, stderr_console, stdout_console
from gptcli.errors import GPT1Error
from gptcli.eval.tasks import EvalConfig
from gptcli.files.fsutil import printable

OPTIONS = Options(
    EvalConfig,
    panels={
        "Input": ("checkpoint", "data", "task", "verify"),
        "Data": ("split", "data_dir", "skip_bad_rows", "max_examples"),
        "Evaluation": ("batch_size", "seq_len", "max_batches", "layout"),
        "Runtime": ("device", "precision", "kernels"),
        "Output": ("out",),
    },
)


def run(p: Parsed) -> None:
    """Evaluate one or more checkpoints. With --data: loss and perplexity on a corpus split. With --task (or
    fine-tuned checkpoints alone): the task's metric, predictions and, for unlabeled test splits, GLUE files."""
    from gptcli.commands import defaults
    from gptcli.eval.tasks import check_eval_mode, evaluate_tasks

    cfg: EvalConfig = p.resolve(EvalConfig, p.base())
    if not cfg.checkpoint:
        # No default model here: evaluating means evaluating *your* run (the released GPT-1 is a language model,
        # not fine-tuned on any task); `gpt1 eval --checkpoint openai-gpt --data CORPUS` names it explicitly.
        raise GPT1Error(
            "no checkpoint to evaluate: give --checkpoint RUN_DIR (repeatable; a Hugging Face Hub id "
            "such as openai-gpt works too)"
        )
    check_eval_mode(cfg)  # before a Hub id is fetched
    console = stderr_console()
    cfg.checkpoint = [defaults.model(c, console) for c in cfg.checkpoint]
    results = evaluate_tasks(cfg, progress=RichProgress(console))
    if cfg.data is None:
        show_task_results(results, stdout_console())
    else:
        stdout_console().print(perplexity_table(results, cfg.data, cfg.split or "val"))


command = OPTIONS.command(run)


def perplexity_table(rows: Sequence[dict[str, Any]], data: str | Path, split: str) -> Any:
    """One row per checkpoint (``evaluate_tasks``'s perplexity dicts): step, loss, perplexity, tokens scored."""
    from rich.table import Table

    from gptcli.commands.render import escape

    table = Table(title=escape(f"perplexity on {data} [{split}]"))
    for h in ("checkpoint", "step", "loss", "perplexity", "tokens"):
        table.add_column(h, justify="left" if h == "checkpoint" else "right")
    for r in rows:
        table.add_row(
            escape(r["checkpoint"]),
            "" if r["step"] is None else str(r["step"]),
            f"{r['loss']:.4f}",
            f"{r['perplexity']:.2f}",
            f"{r['tokens']:,}",
        )
    return table


def show_task_results(results: Sequence[dict[str, Any]], console: Console, details: bool = True) -> None:
    """Skipped rows, the combined runs × tasks table, every metric (``details``), and where each result went."""
    from gptcli.commands.render import escape

    for r in results:
        if r.get("skipped_rows"):
            console.print(
                f"[yellow]{escape(r['run'])} · {r['task']}: skipped {len(r['skipped_rows'])} bad rows[/] "
                f"(first: {escape(r['skipped_rows'][0])})"
            )
    console.print(results_table(results))  # its caption says which runs answered one label throughout
    if details:
        console.print(details_table(results, notes=False))
    for r in results:
        where = r.get("submission") or r.get("out_dir")
        console.print(printable(f"{r['run']} · {r['task']} ({r['split']}): {where}"), highlight=False, markup=False)
