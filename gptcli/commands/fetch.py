"""`gpt1 fetch TASK...`: download task data from the Hugging Face Hub into its official layout under the data root.

Options come from :class:`gptcli.interop.datasets.FetchConfig`; the work is :func:`gptcli.interop.datasets.fetch`.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from gptcli.commands.options import CliOnly, Options, Parsed
from gptcli.interop.datasets import FetchConfig, Fetched

OPTIONS = Options(
    FetchConfig,
    arguments=("tasks",),
    panels={"Input": ("revision",), "Output": ("root", "overwrite")},
    # What to fetch is named on the command line; a config file of four settings would be ceremony.
    config_option=False,
    cli_only=[
        CliOnly(
            "list",
            bool,
            False,
            ("--list",),
            "Show which tasks can be fetched, from where, and which are already under the data root.",
            why="an action (look), not a setting of a download",
            panel="Input",
        ),
    ],
)


def run(p: Parsed) -> None:
    """Download the paper's datasets (GLUE, SNLI, SciTail, RACE) from the Hugging Face Hub and write them in their
    official layout under the data root ($GPT1_DATA, else ~/.cache/gpt1/data), where every command looks.
    Row counts are checked against the official release; a task folder appears whole or not at all."""
    from gptcli.commands.render import RichProgress, stderr_console, stdout_console
    from gptcli.interop.datasets import fetch

    cfg: FetchConfig = p.resolve(FetchConfig)
    if p.cli["list"]:
        stdout_console().print(_sources_table(cfg))
        return
    console = stderr_console()
    results = fetch(cfg, RichProgress(console))
    for r in results:
        _say(console, r)


command = OPTIONS.command(run)


def _say(console: Console, r: Fetched) -> None:
    from gptcli.commands.render import escape

    if r.status == "fetched":
        counts = ", ".join(f"{name} {n:,}" for name, n in r.rows.items())
        console.print(
            f"[green]fetched[/] {escape(str(r.path))} from {escape(r.detail)}: {escape(counts)} rows "
            "(the official release's counts)",
            highlight=False,
            soft_wrap=True,
        )
    elif r.status == "present":
        console.print(f"{escape(str(r.path))}: {escape(r.detail)}", highlight=False, soft_wrap=True)
    else:
        console.print(
            f"[yellow]{escape(r.folder)}: not fetched[/]: {escape(r.detail)}", highlight=False, soft_wrap=True
        )


def _sources_table(cfg: FetchConfig) -> Any:
    from rich.table import Table

    from gptcli.commands.render import escape
    from gptcli.tasks import all_tasks
    from gptcli.tasks.base import data_root
    from gptcli.tasks.sources import SOURCES

    root = cfg.root if cfg.root is not None else data_root()
    table = Table(title=escape(f"gpt1 fetch: task data under {root}"))
    for h in ("tasks", "folder", "source", "here"):
        table.add_column(h)
    by_folder: dict[str, list[Any]] = {}
    for t in all_tasks(zero_shot=True):
        by_folder.setdefault(t.folder, []).append(t)
    for folder, tasks in by_folder.items():
        source = SOURCES[folder].repo if folder in SOURCES else tasks[0].how_to_get()
        table.add_row(", ".join(t.name for t in tasks), folder, source, _here(tasks, root))
    return table


def _here(tasks: list[Any], root: Any) -> str:
    """``yes`` when the folder holds every file its tasks read, ``partly (no …)`` naming the missing ones when it
    holds some (often the unlabeled test split), else ``no``: a folder with a README alone is not the data."""
    found = next((d for d in tasks[0].candidate_dirs(root) if d.is_dir()), None)
    expected = list(dict.fromkeys(f for t in tasks for f in t.files))
    missing = [f for f in expected if found is None or not (found / f).exists()]
    if not missing:
        return "yes"
    return f"partly (no {', '.join(missing)})" if len(missing) < len(expected) else "no"
