"""`gpt1 finetune`: parse options into a FinetuneConfig, run it, render the outcome; `--list-tasks` shows the registry."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

COMMAND_SETTINGS = {"help": "Fine-tune a pretrained checkpoint on one of the paper's tasks (paper §3.2, §4.1 defaults)."}


def list_tasks(console) -> None:
    """The registry as a table: transformation, labels, metric, paper score and where the data is expected."""
    import os

    from rich.table import Table

    from gptcli.tasks import all_tasks

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
        if t.source_url:
            sources.setdefault(t.source_url, [])
            if t.folder not in sources[t.source_url]:
                sources[t.source_url].append(t.folder)
        labels = ", ".join(t.labels) if t.labels else "score in [0, 5]"
        if t.kind == "multiple_choice":
            labels = f"{t.n_choices} answers: {labels}"
        metric = t.metric + (f" (+ {', '.join(t.extra_metrics)})" if getattr(t, "extra_metrics", ()) else "")
        paper = "–" if t.paper_score is None else f"{t.paper_score:.1f}"
        table.add_row(f"[bold]{t.name}[/]\n{t.title}", f"{t.kind}\n[dim]{t.transformation}[/]", labels, metric, paper, where)
    console.print(table)
    console.print("[bold]Official distributions[/]")
    for url, folders in sources.items():
        console.print(f"  {', '.join(f + '/' for f in folders)}: {url}", highlight=False, soft_wrap=True)
    if not root:
        console.print("GPT1_DATA is not set: pass --data-dir (the task's folder) or set GPT1_DATA to the parent of these folders.")


def command(
    task: Optional[str] = typer.Option(None, "--task", help="Task to fine-tune on (see --list-tasks)."),
    init: Optional[str] = typer.Option(None, "--init", help="Pretrained checkpoint or run directory, or `none` for random initialisation (no-pretraining ablation)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory: config.toml, metrics.jsonl, results.json, checkpoints/final."),
    config: Optional[Path] = typer.Option(None, "--config", help="TOML/JSON file of FinetuneConfig settings; options given here override it."),
    list_: bool = typer.Option(False, "--list-tasks", help="Print the task registry (transformation, labels, metric, expected data) and exit."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="The task's official folder (default: $GPT1_DATA/<folder>)."),
    skip_bad_rows: Optional[bool] = typer.Option(None, "--skip-bad-rows/--no-skip-bad-rows", help="Skip and count malformed rows instead of stopping at the first."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="With --init none: tokenizer directory, or a checkpoint whose tokenizer and model shape are used."),
    model: Optional[str] = typer.Option(None, "--model", help="With --init none and a bare tokenizer: model preset (gpt1, tiny)."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Peak learning rate (paper: 6.25e-5)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Examples per update (paper: 32)."),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", help="Examples per forward/backward; the rest is gradient accumulation."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Passes over the training split (paper: 3)."),
    warmup: Optional[float] = typer.Option(None, "--warmup", help="Linear warmup as a fraction of all updates (paper: 0.002)."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="Decay after warmup: linear (paper), cosine or constant."),
    clf_pdrop: Optional[float] = typer.Option(None, "--clf-dropout", help="Classifier dropout (paper: 0.1)."),
    grad_clip: Optional[float] = typer.Option(None, "--grad-clip", help="Global gradient-norm clip (1.0; 0 disables)."),
    weight_decay: Optional[float] = typer.Option(None, "--weight-decay", help="Decoupled weight decay (paper: 0.01, as pretraining)."),
    decay: Optional[str] = typer.Option(None, "--decay", help="Decayed tensors: paper (not biases/LayerNorm) or released (ndim > 1)."),
    lm_weight: Optional[float] = typer.Option(None, "--lm-weight", help="λ of the auxiliary LM loss (paper: 0.5; 0 = ablation without it)."),
    transfer_layers: Optional[int] = typer.Option(None, "--transfer-layers", help="Keep the embeddings and only the first K blocks; re-initialise the rest (ablation)."),
    select: Optional[str] = typer.Option(None, "--select", help="Final weights: best (dev score) or last epoch."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for head init, special tokens, dropout, shuffling."),
    n_ctx: Optional[int] = typer.Option(None, "--n-ctx", help="Longest sequence (default: the model's context)."),
    train_split: Optional[str] = typer.Option(None, "--train-split", help="Split to train on (default: train)."),
    eval_split: Optional[str] = typer.Option(None, "--eval-split", help="Split scored after every epoch (default: dev; '' to skip)."),
    max_train_examples: Optional[int] = typer.Option(None, "--max-train-examples", help="Train on a random subset of this many examples."),
    max_eval_examples: Optional[int] = typer.Option(None, "--max-eval-examples", help="Score a random subset of this many dev examples."),
    eval_batch_size: Optional[int] = typer.Option(None, "--eval-batch-size", help="Examples per evaluation batch (default: 2 × batch size)."),
    device: Optional[str] = typer.Option(None, "--device", help="auto | cpu | cuda."),
    precision: Optional[str] = typer.Option(None, "--precision", help="auto | fp32 | bf16 | fp16 (fp16: CUDA only)."),
    log_every: Optional[int] = typer.Option(None, "--log-every", help="Training record in metrics.jsonl every N updates."),
    overwrite: Optional[bool] = typer.Option(None, "--overwrite/--no-overwrite", help="Replace an existing fine-tuned checkpoint in --out."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar; only the final summary."),
) -> None:
    """Fine-tune on a task: input transformation, linear head on the extract token, task loss + λ·LM loss,
    dev score after every epoch, final checkpoint and results.json in --out. Paper defaults throughout."""
    from rich.console import Console
    from rich.markup import escape

    from gptcli.config import from_dict, load_file, to_dict
    from gptcli.errors import GPT1Error
    from gptcli.train.finetune import FinetuneConfig, finetune

    console = Console(stderr=True)
    if list_:
        list_tasks(Console())
        return
    base = load_file(config) if config is not None else {}
    cfg = from_dict(FinetuneConfig, base)
    overrides = dict(
        task=task, init=init, out=None if out is None else str(out), data_dir=None if data_dir is None else str(data_dir),
        skip_bad_rows=skip_bad_rows, tokenizer=tokenizer, model=model, lr=lr, batch_size=batch_size,
        micro_batch_size=micro_batch_size, epochs=epochs, warmup=warmup, schedule=schedule, clf_pdrop=clf_pdrop,
        grad_clip=grad_clip, weight_decay=weight_decay, decay=decay, lm_weight=lm_weight,
        transfer_layers=transfer_layers, select=select, seed=seed, n_ctx=n_ctx, train_split=train_split,
        eval_split=eval_split, max_train_examples=max_train_examples, max_eval_examples=max_eval_examples,
        eval_batch_size=eval_batch_size, device=device, precision=precision, log_every=log_every, overwrite=overwrite,
    )
    merged = {**to_dict(cfg), **{k: v for k, v in overrides.items() if v is not None}}
    merged["progress"] = not quiet
    cfg = from_dict(FinetuneConfig, {k: v for k, v in merged.items() if v is not None})
    if not cfg.task:
        raise GPT1Error("--task is required (see `gpt1 finetune --list-tasks`)")
    if not cfg.init:
        raise GPT1Error("--init is required: a pretrained checkpoint, or `none` for random initialisation")
    if "out" not in base and out is None:
        raise GPT1Error("--out is required (the run directory)")

    def on_epoch(rec: dict) -> None:
        if quiet:
            return
        scores = ", ".join(f"{k} {v:.2f}" for k, v in rec.items() if k not in ("kind", "step", "epoch", "split"))
        console.print(f"epoch {rec['epoch']} (update {rec['step']}): {rec.get('split') or 'no eval'} {scores}", highlight=False)

    result = finetune(cfg, console=console, on_epoch=on_epoch)
    r = result.results
    from gptcli.commands.render import details_table

    if r.get("scores"):
        Console().print(details_table([{**r, "run": result.run_dir.name, "n": r.get("n_eval")}],
                                      title=f"{r['task']}: dev scores of the kept epoch ({r['select']}: epoch {r['epoch']})"))
    if r.get("skipped_rows"):
        console.print(f"[yellow]skipped {len(r['skipped_rows'])} bad rows[/] (first: {escape(r['skipped_rows'][0])})")
    console.print(f"[green]done[/]: {r['steps']} updates; checkpoint {result.checkpoint}; results {result.run_dir / 'results.json'}")
