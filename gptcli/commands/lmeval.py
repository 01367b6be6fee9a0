"""`gpt1 lmeval`: EleutherAI's lm-evaluation-harness command line with the ``gpt1`` model registered.

lm-eval 0.4 finds models only in its own registry (no plugin entry points), so ``lm_eval --model gpt1`` needs
``gptcli.eval.lmeval`` imported first: this command does that and hands every argument to lm-eval unchanged
(``gpt1 lmeval --model gpt1 --model_args checkpoint=RUN --tasks …`` is the ``lm_eval`` command line). It adds one
option of its own, ``--local-tasks ROOT``: the offline task configs over the files in ``ROOT``
(``gptcli/eval/lmeval_tasks.py``).

Unlike the other commands its options are not derived from a config dataclass: they are lm-eval's, parsed by
lm-eval (``gpt1 lmeval run -h`` shows them; ``--help`` shows this command's); ``--local-tasks`` is the only one
gpt1 parses.
"""

from __future__ import annotations

from pathlib import Path

import typer

from gptcli.errors import GPT1Error

COMMAND_SETTINGS = {
    "context_settings": {"allow_extra_args": True, "ignore_unknown_options": True},
    "help": "lm-evaluation-harness with the gpt1 model: [bold]gpt1 lmeval --model gpt1 --model_args "
    "checkpoint=RUN --tasks …[/] (every argument is lm-eval's; see docs/lmeval.md).",
}


def command(
    ctx: typer.Context,
    local_tasks: Path | None = typer.Option(  # noqa: B008 - Typer's way of declaring an option
        None,
        "--local-tasks",
        metavar="ROOT",
        help="Data root (e.g. ../shared/data): add the offline tasks gpt1_sst2, gpt1_storycloze and gpt1_wikitext2 "
        "over its files (written to a temporary --include_path folder for this run).",
    ),
) -> None:
    """lm-evaluation-harness ([bold]lm_eval[/]'s arguments, unchanged) with the gpt1 model registered."""
    from gptcli.eval.lmeval import run_cli

    try:
        run_cli(list(ctx.args), local_tasks)
    except ValueError as e:
        if not str(e).startswith("Tasks not found"):  # lm-eval's message for an unknown --tasks name
            raise
        raise GPT1Error(
            f"{e} (list lm-eval's tasks with `gpt1 lmeval ls tasks`; gpt1's offline gpt1_sst2, gpt1_storycloze and "
            "gpt1_wikitext2 need --local-tasks ROOT)"
        ) from None
