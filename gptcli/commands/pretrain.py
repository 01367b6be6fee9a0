"""`gpt1 pretrain`: options derived from PretrainConfig (and LaunchConfig), run, render the outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gptcli.commands.options import CliOnly, Nested, Options, Parsed
from gptcli.commands.render import RichProgress, WarningsOnly, escape, held_console, release_held, stderr_console
from gptcli.config import check_setting
from gptcli.errors import GPT1Error
from gptcli.files.locks import main_rank_lock
from gptcli.files.outputs import check_output
from gptcli.model.build import dropout_fields
from gptcli.model.gpt import ModelConfig
from gptcli.model.lstm import LSTMConfig
from gptcli.train.distributed import LaunchConfig, LaunchSpec
from gptcli.train.pretrain import CONFIG_FILE, PretrainConfig
from gptcli.train.pretrain_config import check_pretrain

OPTIONS = Options(
    PretrainConfig,
    panels={
        "Input": ("data", "verify_data", "val_split"),
        "Model": ("preset", "seq_len", "compile", "compile_mode"),
        "Optimisation": (
            "lr",
            "batch_size",
            "micro_batch_size",
            "weight_decay",
            "decay",
            "beta1",
            "beta2",
            "eps",
            "grad_clip",
            "seed",
        ),
        "Schedule": ("epochs", "max_steps", "max_tokens", "max_minutes", "warmup_steps", "schedule"),
        "Evaluation": ("eval_every", "eval_batches"),
        "Checkpointing": ("out", "save_every", "keep_last", "resume"),
        "Runtime": ("device", "precision", "kernels", "peak_flops"),
        "Output": ("log_every", "tensorboard", "wandb"),
    },
    flags={"verify_data": ("--verify/--no-verify", "--verify-data/--no-verify-data")},
    # The Transformer's fields, then the LSTM's own (--n-hidden); a preset of the other architecture refuses them.
    nested={
        "model": Nested(
            (ModelConfig, LSTMConfig), ("n_layer", "n_embd", "n_head", "n_inner", "n_hidden", "n_ctx", "init_std")
        )
    },
    sections={"launch": (LaunchConfig, "Distributed")},
    cli_only=[
        CliOnly(
            "dropout",
            float | None,
            None,
            ("--dropout",),
            "Set every dropout of the model together (paper: 0.1): a Transformer's embedding, attention and "
            "residual dropout; an LSTM's embedding and output dropout.",
            why="a shorthand for the preset's dropout fields (embd_pdrop, attn_pdrop, resid_pdrop; an LSTM's "
            "embd_pdrop, out_pdrop)",
            panel="Model",
        ),
        CliOnly(
            "quiet",
            bool,
            False,
            ("--quiet", "-q"),
            "No live display; only the final summary.",
            why="a display choice; the run is the same",
        ),
    ],
)


def run(p: Parsed) -> None:
    """Pretrain GPT-1 on a prepared corpus: paper defaults (64×512, Adam 2.5e-4, 2000 warmup + cosine, 100 epochs),
    every one overridable. Interrupt with Ctrl-C to checkpoint and stop; continue with --resume.
    --gpus N / --procs N (and --nodes …) train data-parallel; torchrun and SLURM launches work too."""
    from gptcli.train.distributed import join, leave, plan_launch
    from gptcli.train.pretrain import pretrain

    console, held = stderr_console(), held_console()
    base = _settings_under_the_options(p, held)
    cfg = p.resolve(PretrainConfig, base)
    _check_model_table(cfg, p.base_source if "model" in base else None)
    check_pretrain(cfg, world_size=None)  # the processes are checked when the launch is planned
    release_held(held, console)  # the defaults chosen (./corpus, runs/pretrain), said once the settings are valid
    resume, out = p.given.get("resume", False), p.given.get("out")
    if resume and out is not None and "data" not in p.given and not Path(cfg.data).exists():
        raise GPT1Error(
            f"{Path(out) / CONFIG_FILE}: data = {str(cfg.data)!r}, the corpus this run was started with, "
            f"is not there from {Path.cwd()} (a relative path is relative to where the run was started: "
            f"resume from there, or pass --data CORPUS)"
        )
    spec = plan_launch(p.sections["launch"])
    if spec is not None:
        with main_rank_lock(cfg.out, spec.node_rank == 0):  # once for the job: its workers run under it
            _launch(cfg, spec, p.cli["quiet"], console)
        return
    # A plain process, or one worker of a job (ours, torchrun's or SLURM's): join it, train, leave.
    parallel = join(cfg.device)
    progress = (WarningsOnly(console) if p.cli["quiet"] else RichProgress(console)) if parallel.is_main else None
    result = pretrain(cfg, parallel=parallel, progress=progress)
    if not parallel.is_main:
        leave(parallel, 130 if result.stopped_by else 0)
    if result.stopped_by:
        console.print(
            f"[yellow]stopped by {result.stopped_by}[/] at update {result.step}/{result.total_steps}; "
            f"checkpoint {escape(str(result.last_checkpoint))}. Continue with: gpt1 pretrain --out "
            f"{escape(str(result.run_dir))} --resume",
            highlight=False,
        )
        leave(parallel, 130)
        raise typer.Exit(130)
    val = f", validation loss {result.final_val_loss:.4f}" if result.final_val_loss is not None else ""
    console.print(
        f"[green]done[/]: {result.step} updates{val}; checkpoint {escape(str(result.last_checkpoint))}", highlight=False
    )
    leave(parallel, 0)


command = OPTIONS.command(run)


def _check_model_table(cfg: PretrainConfig, source: Path | None) -> None:
    """The model overrides typed against the preset's fields now (pretrain() checks them again), so that an error
    in a --config file's [model] table names the file, as one in its top-level keys does."""
    from gptcli.train.pretrain_config import model_overrides

    try:
        model_overrides(cfg)
    except GPT1Error as e:
        raise GPT1Error(f"{source}: {e}" if source is not None else str(e)) from None


def _settings_under_the_options(p: Parsed, console: Any) -> dict[str, Any]:
    """The settings the options given override (``Parsed.resolve``'s ``base``): ``--config FILE`` or, with
    ``--resume``, the run's own config.toml; ``--dropout`` over the preset's dropout fields; and the short form's
    defaults, each said (commands/defaults.py). ``p`` itself is left as parsed."""
    resume = p.given.get("resume", False)
    out = p.given.get("out")
    if resume and out is not None:
        # Before its config.toml is read as this run's settings: it may be a fine-tuning run's, or not gpt1's.
        data = [Path(p.given["data"])] if "data" in p.given else []
        check_output(Path(out), "pretrain-run", overwrite=True, inputs=data, replacing=False)
    base = {**p.base(out / CONFIG_FILE if resume and out is not None else None), "resume": resume}
    if p.cli["dropout"] is not None:
        check_setting("dropout", p.cli["dropout"])  # named as typed, before it becomes the preset's fields
        # Under the given options: --n-layer and the like merge over this table; no option names a dropout field.
        preset = p.given.get("preset", base.get("preset", PretrainConfig.preset))
        base["model"] = {**base.get("model", {}), **dict.fromkeys(dropout_fields(str(preset)), p.cli["dropout"])}
    return {**base, **_short_form_defaults(p, base, resume, console)}


def _short_form_defaults(p: Parsed, base: dict[str, Any], resume: bool, console: Any) -> dict[str, Any]:
    """The short form `gpt1 prepare books/ && gpt1 pretrain`: --data ./corpus (what prepare writes by default) when
    it is there, and a fresh run directory (runs/pretrain, else -2, -3, …), each said (commands/defaults.py)."""
    from gptcli.commands import defaults

    filled: dict[str, Any] = {}
    default_data = PretrainConfig.data
    if not p.has("data", base):
        if not default_data.is_dir():
            raise GPT1Error(
                f"--data is required: there is no ./{default_data} here (`gpt1 prepare TEXT...` writes one "
                "there; or pass --data CORPUS_DIR)"
            )
        console.print(f"corpus: ./{default_data} (no --data given)", highlight=False, markup=False)
        filled["data"] = default_data
    if not p.has("out", base):
        if resume:
            raise GPT1Error("--resume needs --out RUN (the run to continue)")
        filled["out"] = defaults.run_dir(PretrainConfig.out, console)
    return filled


def _launch(cfg: PretrainConfig, spec: LaunchSpec, quiet: bool, console: Any) -> None:
    """Start the workers of a --gpus/--procs run here (checked by gptcli.train.pretrain.check_pretrain_launch);
    each re-runs `gpt1 pretrain` on the resolved config."""
    from gptcli.checkpoint import resolve_checkpoint
    from gptcli.train.distributed import describe_launch, launch_command
    from gptcli.train.pretrain import check_pretrain_launch

    verified = check_pretrain_launch(cfg, spec)
    console.print(describe_launch(spec, cfg.batch_size), highlight=False)
    stopped = launch_command(spec, "pretrain", cfg, resume=cfg.resume, quiet=quiet, inputs_verified=verified)
    if stopped:
        try:
            saved = f"checkpoint {resolve_checkpoint(cfg.out)}"
        except GPT1Error:  # nothing to resume: `--out RUN --resume` alone would start another run from defaults
            console.print(
                f"[yellow]stopped by {stopped}[/] before the first checkpoint: nothing to resume (run the "
                "same command again to start over)",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(130) from None
        console.print(
            f"[yellow]stopped by {stopped}[/]; {escape(saved)}. Continue with: gpt1 pretrain --out "
            f"{escape(str(cfg.out))} --resume (with any number of processes)",
            highlight=False,
        )
        raise typer.Exit(130)
