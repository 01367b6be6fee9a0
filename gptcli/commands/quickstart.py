"""`gpt1 quickstart`: the whole pipeline at toy scale, offline, in a few minutes (see gptcli/pipelines/quickstart.py).

Options are derived from QuickstartConfig; progress renders through RichProgress (a heading per stage, a ✓ line
with its summary and seconds), then the final table of numbers and what they mean goes to stdout.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from gptcli import guide
from gptcli.commands.options import Options, Parsed
from gptcli.commands.render import RichProgress, stderr_console, stdout_console
from gptcli.pipelines.quickstart import QuickstartConfig, QuickstartResult

OPTIONS = Options(
    QuickstartConfig,
    panels={
        "Input": ("stdlib", "max_modules", "task_fraction", "max_train_examples"),
        "Model": ("seq_len",),
        "Data": ("vocab_size",),
        "Optimisation": ("lr", "batch_size", "finetune_lr", "finetune_batch_size", "seed"),
        "Schedule": ("minutes", "pretrain_steps", "max_epochs", "finetune_epochs"),
        "Evaluation": ("eval_batches", "zeroshot_fit_examples"),
        "Runtime": ("device", "precision", "kernels", "workers"),
        "Output": ("out", "overwrite"),
    },
)
# The model table (QuickstartConfig.model, overrides of the tiny preset) stays config-file only, as before: one
# --config file sizes the whole toy model.


def run(p: Parsed) -> None:
    """Walk the GPT-1 paper's pipeline end to end on the docstrings of Python's standard library (no download):
    learn a BPE vocabulary, pretrain a tiny GPT, fine-tune it to tell sentences from word-shuffled ones (a
    CoLA-style task), evaluate it, and run the paper's zero-shot heuristic. Prints what each number means and
    the commands for the real thing."""
    from gptcli.pipelines.quickstart import check_out, quickstart

    cfg = p.resolve(QuickstartConfig, p.base())
    check_out(cfg)  # a refused --out is the one line it prints, not a header and then the error (checked again there)
    console = stderr_console()
    console.rule("[bold]gpt1 quickstart")
    console.print(
        f"The GPT-1 pipeline at toy scale, offline, in about {cfg.minutes:g} minutes. "
        f"Output: [bold]{escape(str(cfg.out))}[/]",
        highlight=False,
    )
    result = quickstart(cfg, RichProgress(console))
    render_summary(stdout_console(), result)


command = OPTIONS.command(run)


def render_summary(console: Console, result: QuickstartResult) -> None:
    """The final table (value and meaning of each number) and the "what next" commands."""
    from rich.table import Table

    from gptcli.pipelines.quickstart import WHAT_NEXT, summary_rows

    n = result.numbers
    table = Table(
        title=f"gpt1 quickstart: results ({n['seconds_total']:.0f} s, seed {n['seed']})",
        title_justify="left",
        show_lines=False,
    )
    table.add_column("number")
    table.add_column("value", justify="right", style="bold")
    table.add_column("what it means")
    for what, value, meaning in summary_rows(n):
        table.add_row(what, value, meaning)
    console.print()
    console.print(table)
    console.print(
        f"Everything is in [bold]{escape(str(result.out))}[/]: summary.json, the task files (task/), the corpus, "
        "the pretraining run, the fine-tuned model and each stage's results.",
        highlight=False,
    )
    console.print()
    console.print("[bold]What next[/] — the same pipeline at the paper's scale:")
    for cmd, what, doc in WHAT_NEXT:
        console.print(f"  [cyan]{cmd}[/]\n      {what} ({escape(guide.page(doc))})", highlight=False)
    console.print(f"  See {escape(guide.page('index.md'))} for the full guide.", highlight=False)
