"""`gpt1 finetune`: options derived from FinetuneConfig, run it, render the outcome; `--list-tasks` shows the
registry."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from gptcli.commands.options import CliOnly, Options, Parsed
from gptcli.commands.render import RichProgress, WarningsOnly, details_table, escape, stderr_console, stdout_console
from gptcli.errors import GPT1Error
from gptcli.files.locks import main_rank_lock
from gptcli.files.outputs import check_output
from gptcli.train.distributed import LaunchConfig, LaunchSpec
from gptcli.train.finetune import CONFIG_FILE, RESULTS, FinetuneConfig, FinetuneResult, default_run_dir

COMMAND_SETTINGS = {
    "help": "Fine-tune a pretrained checkpoint on one of the paper's tasks (paper §3.2, §4.1 defaults)."
}

OPTIONS = Options(
    FinetuneConfig,
    panels={
        "Input": ("task", "init", "verify", "tokenizer", "model"),
        "Model": ("n_ctx", "clf_pdrop", "dropout", "transfer_layers"),
        "Data": (
            "data_dir",
            "train_split",
            "max_train_examples",
            "skip_bad_rows",
            "batching",
            "layout",
            "cache",
            "workers",
        ),
        "Optimisation": (
            "lr",
            "batch_size",
            "micro_batch_size",
            "lm_weight",
            "weight_decay",
            "decay",
            "grad_clip",
            "seed",
        ),
        "Schedule": ("epochs", "warmup", "schedule", "max_minutes"),
        "Evaluation": ("eval_split", "max_eval_examples", "eval_batch_size", "select"),
        "Checkpointing": ("out", "save_every", "keep_last", "resume", "overwrite"),
        "Runtime": ("device", "precision", "kernels"),
        "Output": ("log_every", "wandb"),
    },
    # --clf-dropout is the spelling the command always had; --clf-pdrop matches the config key.
    flags={"clf_pdrop": ("--clf-dropout", "--clf-pdrop")},
    sections={"launch": (LaunchConfig, "Distributed")},
    cli_only=[
        CliOnly(
            "list_tasks",
            bool,
            False,
            ("--list-tasks",),
            "Print the task registry (transformation, labels, metric, expected data) and exit.",
            why="an action (show the registry), not a setting of a run",
            panel="Input",
        ),
        CliOnly(
            "quiet",
            bool,
            False,
            ("--quiet", "-q"),
            "No progress bar; only the final summary.",
            why="a display choice; the run is the same",
        ),
    ],
)


def run(p: Parsed) -> None:
    """Fine-tune on a task: input transformation, linear head on the extract token, task loss + λ·LM loss,
    dev score after every epoch, final checkpoint and results.json in --out. Paper defaults throughout.
    Interrupt with Ctrl-C to checkpoint and stop; continue with `gpt1 finetune --out RUN --resume`.
    --gpus N / --procs N train data-parallel (the same global batch); torchrun and SLURM launches work too."""
    from gptcli.train.distributed import join, leave, plan_launch
    from gptcli.train.finetune import finetune

    if p.cli["list_tasks"]:
        list_tasks(stdout_console())
        return
    resume = p.given.get("resume", False)
    out = p.given.get("out")
    if resume and out is not None:
        # Before its config.toml is read as this run's settings: it may be a pretraining run's, or not gpt1's.
        check_output(Path(out), "finetune-run", overwrite=True, replacing=False)
    base = p.base(Path(out) / CONFIG_FILE if resume and out is not None else None)
    # Runs saved before the progress display left the config had `progress = true|false` in config.toml.
    quiet = p.cli["quiet"] or base.pop("progress", True) is False
    cfg = p.resolve(FinetuneConfig, {**base, "resume": resume})
    if not cfg.task and resume and out is not None and not (Path(out) / CONFIG_FILE).is_file():
        raise GPT1Error(
            f"--resume: {out} has no {CONFIG_FILE}, so there is no fine-tuning run there to continue nor a "
            f"task to take from it (give the --out of a run that was started, or start one with --task "
            f"NAME)"
        )
    if not cfg.task:
        raise GPT1Error("--task is required (see `gpt1 finetune --list-tasks`)")
    if resume and not cfg.out:
        raise GPT1Error("--resume needs --out RUN (the run to continue)")
    console = stderr_console()
    _fill_defaults(cfg, console)
    spec = plan_launch(p.sections["launch"])
    if spec is not None:
        with main_rank_lock(cfg.out, spec.node_rank == 0):  # once for the job: its workers run under it
            _launch(cfg, spec, quiet, console)
        return
    # A plain process, or one worker of a job (ours, torchrun's or SLURM's): join it, train, leave.
    parallel = join(cfg.device)
    progress = (WarningsOnly(console) if quiet else RichProgress(console)) if parallel.is_main else None
    result = finetune(cfg, progress=progress, parallel=parallel)
    if not parallel.is_main:
        leave(parallel, 130 if result.stopped_by else 0)
    if result.stopped_by:
        console.print(
            f"[yellow]stopped by {result.stopped_by}[/] at update {result.step}/{result.total}; "
            f"checkpoint {escape(str(result.checkpoint))}. Continue with: gpt1 finetune --out "
            f"{escape(str(result.run_dir))} --resume",
            highlight=False,
            soft_wrap=True,
        )
        leave(parallel, 130)
        raise typer.Exit(130)
    show_outcome(result, console)
    leave(parallel, 0)


command = OPTIONS.command(run)


def _launch(cfg: FinetuneConfig, spec: LaunchSpec, quiet: bool, console: Any) -> None:
    """Start the workers of a --gpus/--procs run here; each re-runs `gpt1 finetune` on the resolved config. The
    settings and the run directory are checked once, before any worker starts; resuming a finished run needs none."""
    from gptcli.train.distributed import describe_launch, launch_command
    from gptcli.train.finetune import check_finetune_launch, finetune, step_checkpoints

    plan = check_finetune_launch(cfg, spec.nproc_per_node * spec.nnodes)
    if plan.mode == "done":
        show_outcome(finetune(cfg, progress=WarningsOnly(console)), console)
        return
    console.print(describe_launch(spec, cfg.batch_size), highlight=False)
    stopped = launch_command(spec, "finetune", cfg, resume=cfg.resume, quiet=quiet)
    if stopped:
        steps = step_checkpoints(plan.out)
        if not steps:  # nothing to resume: `--out RUN --resume` alone would start another run from defaults
            console.print(
                f"[yellow]stopped by {stopped}[/] before the first checkpoint: nothing to resume (run the "
                "same command again to start over)",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(130)
        saved = f"checkpoint {steps[-1]}"
        console.print(
            f"[yellow]stopped by {stopped}[/]; {escape(saved)}. Continue with: gpt1 finetune --out "
            f"{escape(str(cfg.out))} "
            "--resume (with any number of processes)",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(130)


def _fill_defaults(cfg: FinetuneConfig, console: Any) -> None:
    """The short form `gpt1 finetune --task rte`: the paper's released model, a fresh run directory, each said
    (gptcli/commands/defaults.py); a Hub id given to --init or --tokenizer becomes its converted checkpoint."""
    from gptcli.commands import defaults
    from gptcli.tasks import get_task

    task = get_task(cfg.task)  # an unknown task, or missing data, is one line before any model is downloaded
    hub = defaults.hub_model([cfg.init], "--init") if cfg.init.lower() != "none" else None
    defaults.task_data(task, cfg.data_dir, console, check=hub is not None, hub_model=hub)
    if cfg.init.lower() != "none":
        cfg.init = defaults.model(cfg.init, console, "--init")
    if cfg.tokenizer:
        cfg.tokenizer = defaults.model(cfg.tokenizer, console, "--tokenizer")
    if not cfg.out:
        cfg.out = str(defaults.run_dir(default_run_dir(task.name), console))


def show_outcome(result: FinetuneResult, console: Any) -> None:
    """The kept epoch's dev scores beside the paper's, skipped rows, and where everything went."""
    r = result.results
    if r.get("scores"):
        stdout_console().print(
            details_table(
                [{**r, "run": result.run_dir.name, "n": r.get("n_eval")}],
                title=f"{r['task']}: dev scores of the kept epoch ({r['select']}: epoch {r['epoch']})",
            )
        )
        if r.get("last_scores") and r["epoch"] != r["config"]["epochs"]:
            last = r["last_scores"].get(r["metric"])
            console.print(
                f"[dim]epoch {r['epoch']} was kept as the best of {r['config']['epochs']} on these dev "
                f"examples, so its score is optimistic; the last epoch scored {r['metric']} {last:.1f} "
                f"(--select last keeps it)[/]",
                highlight=False,
                soft_wrap=True,
            )
    if r.get("skipped_rows"):
        console.print(f"[yellow]skipped {len(r['skipped_rows'])} bad rows[/] (first: {escape(r['skipped_rows'][0])})")
    console.print(
        f"[green]done[/]: {r['steps']} updates; checkpoint {escape(str(result.checkpoint))}; "
        f"results {escape(str(result.run_dir / RESULTS))}",
        highlight=False,
    )


def list_tasks(console: Any) -> None:
    """The registry as a table: transformation, labels, metric, paper score and where the data is expected."""
    from rich.table import Table

    from gptcli.tasks import all_tasks
    from gptcli.tasks.base import data_root
    from gptcli.tasks.sources import SOURCES

    root = os.environ.get("GPT1_DATA")
    sources: dict[str, list[str]] = {}  # official source -> folders it provides
    table = Table(title="Tasks (`gpt1 finetune --task NAME`)", show_lines=True)
    table.add_column("task", ratio=2)
    table.add_column("kind / transformation", ratio=3)
    table.add_column("labels", ratio=2)
    table.add_column("metric", ratio=1)
    table.add_column("paper", justify="right", no_wrap=True)
    table.add_column("expected data", ratio=4, overflow="fold")
    for t in all_tasks():
        where = f"{'$GPT1_DATA' if not root else root}/{t.folder}/: " + ", ".join(t.files)
        if t.folder in SOURCES:
            where += f" (`gpt1 fetch {t.name}`)"
        if t.source_url:
            sources.setdefault(t.source_url, [])
            if t.folder not in sources[t.source_url]:
                sources[t.source_url].append(t.folder)
        labels = ", ".join(t.labels) if t.labels else "score in [0, 5]"
        if t.kind == "multiple_choice":
            labels = f"{t.n_choices} answers: {labels}"
        metric = t.metric + (f" (+ {', '.join(t.extra_metrics)})" if getattr(t, "extra_metrics", ()) else "")
        paper = "–" if t.paper_score is None else f"{t.paper_score:.1f}"
        table.add_row(
            f"[bold]{t.name}[/]\n{t.title}", f"{t.kind}\n[dim]{t.transformation}[/]", labels, metric, paper, where
        )
    console.print(table)
    console.print("[bold]Official distributions[/]")
    for url, folders in sources.items():
        console.print(f"  {', '.join(f + '/' for f in folders)}: {url}", highlight=False, soft_wrap=True)
    if not root:
        console.print(
            f"GPT1_DATA is not set: task folders are looked for in {data_root()} (where `gpt1 fetch` "
            "puts them); set GPT1_DATA to the parent of your own copies, or pass --data-dir (the task's "
            "folder).",
            highlight=False,
            soft_wrap=True,
        )
