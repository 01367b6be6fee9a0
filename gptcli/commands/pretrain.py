"""`gpt1 pretrain`: parse options into a PretrainConfig, run it, render the outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

COMMAND_SETTINGS = {"help": "Pretrain a GPT-1 language model on a prepared corpus (paper §4.1 defaults)."}


def command(
    data: Optional[Path] = typer.Option(None, "--data", help="Prepared corpus directory (from `gpt1 prepare`)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory: config.toml, metrics.jsonl, checkpoints/."),
    config: Optional[Path] = typer.Option(None, "--config", help="TOML/JSON file of PretrainConfig settings; options given here override it."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest complete checkpoint in --out (its config.toml is the base)."),
    preset: Optional[str] = typer.Option(None, "--preset", help="Model preset: gpt1 (paper, default) or tiny."),
    n_layer: Optional[int] = typer.Option(None, "--n-layer", help="Override the number of Transformer blocks."),
    n_embd: Optional[int] = typer.Option(None, "--n-embd", help="Override the hidden size."),
    n_head: Optional[int] = typer.Option(None, "--n-head", help="Override the number of attention heads."),
    n_inner: Optional[int] = typer.Option(None, "--n-inner", help="Override the MLP hidden size."),
    n_ctx: Optional[int] = typer.Option(None, "--n-ctx", help="Override the context length (position embeddings)."),
    dropout: Optional[float] = typer.Option(None, "--dropout", help="Set the embedding, attention and residual dropout (paper: 0.1)."),
    epochs: Optional[float] = typer.Option(None, "--epochs", help="Passes over the training windows (paper: 100)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Stop after this many updates."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Stop after this many training tokens."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Peak learning rate (paper: 2.5e-4)."),
    warmup_steps: Optional[int] = typer.Option(None, "--warmup-steps", help="Linear warmup updates (paper: 2000)."),
    weight_decay: Optional[float] = typer.Option(None, "--weight-decay", help="Decoupled weight decay (paper: 0.01)."),
    grad_clip: Optional[float] = typer.Option(None, "--grad-clip", help="Global gradient-norm clip (1.0; 0 disables)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Global batch in sequences (paper: 64)."),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", help="Sequences per forward/backward; the rest is gradient accumulation."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens per sequence (paper: 512)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for initialisation, dropout and window order."),
    device: Optional[str] = typer.Option(None, "--device", help="auto | cpu | cuda."),
    precision: Optional[str] = typer.Option(None, "--precision", help="auto | fp32 | bf16 | fp16 (fp16: CUDA only, with loss scaling)."),
    compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help="torch.compile the model and loss."),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Validate every N updates (and at the end)."),
    eval_batches: Optional[int] = typer.Option(None, "--eval-batches", help="Cap on validation batches (default: whole split)."),
    save_every: Optional[int] = typer.Option(None, "--save-every", help="Checkpoint every N updates (and at the end, and on Ctrl-C/SIGTERM)."),
    keep_last: Optional[int] = typer.Option(None, "--keep-last", help="Keep only the newest K checkpoints (0 = all)."),
    log_every: Optional[int] = typer.Option(None, "--log-every", help="Metrics line every N updates."),
    tensorboard: Optional[bool] = typer.Option(None, "--tensorboard/--no-tensorboard", help="Also write TensorBoard events (needs tensorboard)."),
    verify_data: Optional[bool] = typer.Option(None, "--verify/--no-verify", help="Check shard checksums before training."),
    peak_flops: Optional[float] = typer.Option(None, "--peak-flops", help="Peak FLOP/s for MFU (default: GPU table or measured CPU matmul peak)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live display; only the final summary."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="Train with DDP on N GPUs of this node (N worker processes, NCCL); the global batch is split across them."),
    procs: Optional[int] = typer.Option(None, "--procs", help="Train with DDP in N CPU worker processes (gloo): the same code path as --gpus, without GPUs."),
    nodes: int = typer.Option(1, "--nodes", help="Number of nodes; run the same command on each with its --node-rank (docs/distributed.md)."),
    node_rank: int = typer.Option(0, "--node-rank", help="This node's rank, 0 … nodes-1 (with --master-addr)."),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", help="Address of node 0, which hosts the rendezvous (static, like torchrun --master-addr)."),
    master_port: int = typer.Option(29500, "--master-port", help="Port of the rendezvous on --master-addr."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="host:port of a c10d rendezvous; replaces --master-addr/--node-rank (node ranks are assigned)."),
) -> None:
    """Pretrain GPT-1 on a prepared corpus: paper defaults (64×512, Adam 2.5e-4, 2000 warmup + cosine, 100 epochs),
    every one overridable. Interrupt with Ctrl-C to checkpoint and stop; continue with --resume.
    --gpus N / --procs N (and --nodes …) train data-parallel; torchrun and SLURM launches work too."""
    from rich.console import Console

    from gptcli.config import from_dict, load_file, to_dict
    from gptcli.errors import GPT1Error
    from gptcli.train.pretrain import CONFIG_FILE, PretrainConfig, pretrain

    base: dict = {}
    if config is not None:
        base = load_file(config)
    elif resume and out is not None and (out / CONFIG_FILE).is_file():
        base = load_file(out / CONFIG_FILE)
    cfg = from_dict(PretrainConfig, base)
    model = dict(cfg.model)
    for key, value in {"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, "n_inner": n_inner, "n_ctx": n_ctx}.items():
        if value is not None:
            model[key] = value
    if dropout is not None:
        model.update(embd_pdrop=dropout, attn_pdrop=dropout, resid_pdrop=dropout)
    overrides = dict(
        data=data, out=out, preset=preset, epochs=epochs, max_steps=max_steps, max_tokens=max_tokens, lr=lr,
        warmup_steps=warmup_steps, weight_decay=weight_decay, grad_clip=grad_clip, batch_size=batch_size,
        micro_batch_size=micro_batch_size, seq_len=seq_len, seed=seed, device=device, precision=precision,
        compile=compile, eval_every=eval_every, eval_batches=eval_batches, save_every=save_every,
        keep_last=keep_last, log_every=log_every, tensorboard=tensorboard, verify_data=verify_data,
        peak_flops=peak_flops,
    )
    merged = {**to_dict(cfg), **{k: v for k, v in overrides.items() if v is not None}, "model": model, "resume": resume}
    if "data" not in base and data is None:
        raise GPT1Error("--data is required (a corpus directory from `gpt1 prepare`)")
    if "out" not in base and out is None:
        raise GPT1Error("--out is required (the run directory)")
    cfg = from_dict(PretrainConfig, {k: v for k, v in merged.items() if v is not None})

    console = Console(stderr=True)
    from gptcli.train.distributed import join, leave, plan_launch

    spec = plan_launch(gpus=gpus, procs=procs, nodes=nodes, node_rank=node_rank, master_addr=master_addr,
                       master_port=master_port, rdzv_endpoint=rdzv_endpoint)
    if spec is not None:
        _launch(cfg, spec, quiet, console)
        return
    # A plain process, or one worker of a job (ours, torchrun's or SLURM's): join it, train, leave.
    parallel = join(cfg.device)
    result = pretrain(cfg, parallel=parallel, display=not quiet, console=console)
    if not parallel.is_main:
        leave(parallel, 130 if result.stopped_by else 0)
    if result.stopped_by:
        console.print(
            f"[yellow]stopped by {result.stopped_by}[/] at update {result.step}/{result.total_steps}; "
            f"checkpoint {result.last_checkpoint}. Continue with: gpt1 pretrain --out {result.run_dir} --resume"
        )
        leave(parallel, 130)
        raise typer.Exit(130)
    val = f", validation loss {result.final_val_loss:.4f}" if result.final_val_loss is not None else ""
    console.print(f"[green]done[/]: {result.step} updates{val}; checkpoint {result.last_checkpoint}")
    leave(parallel, 0)


def _launch(cfg, spec, quiet: bool, console) -> None:
    """Start the workers of a --gpus/--procs run here; each re-runs `gpt1 pretrain` on the resolved config."""
    import dataclasses
    import tempfile

    from gptcli.checkpoint import resolve_checkpoint
    from gptcli.config import save_config
    from gptcli.train.distributed import launch
    from gptcli.errors import GPT1Error
    from gptcli.train.pretrain import _validate as check_batch, open_training_corpus

    world = spec.nproc_per_node * spec.nnodes
    check_batch(cfg, world)
    # Check the shards once here rather than in every worker (they would all read the whole corpus).
    if cfg.verify_data:
        open_training_corpus(cfg)
    worker_cfg = dataclasses.replace(cfg, device="cuda" if spec.use_cuda else "cpu", verify_data=False, resume=False)
    with tempfile.TemporaryDirectory(prefix="gpt1-launch-") as tmp:
        path = Path(tmp) / "pretrain.toml"
        save_config(worker_cfg, path)
        argv = ["pretrain", "--config", str(path), *(["--resume"] if cfg.resume else []), *(["--quiet"] if quiet else [])]
        where = f"{spec.nproc_per_node} {'GPU' if spec.use_cuda else 'CPU'} worker(s)"
        if spec.nnodes > 1:
            where += f" on one of {spec.nnodes} nodes" if spec.rdzv_endpoint else f" on node {spec.node_rank} of {spec.nnodes}"
        console.print(f"launching {where}: global batch {cfg.batch_size} = {world} × {cfg.batch_size // world}", highlight=False)
        stopped = launch(spec, argv)
    if stopped:
        try:
            saved = f"checkpoint {resolve_checkpoint(cfg.out)}"
        except GPT1Error:
            saved = "no checkpoint yet"
        console.print(
            f"[yellow]stopped by {stopped}[/]; {saved}. Continue with: gpt1 pretrain --out {cfg.out} --resume "
            f"(with any number of processes)"
        )
        raise typer.Exit(130)
