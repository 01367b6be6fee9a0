"""The settings of a pretraining run (:class:`PretrainConfig`, the CLI's options), how ``--resume`` treats each, and
the checks they pass before anything is read (:func:`check_pretrain`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gptcli.config import check_settings, coerce_fields
from gptcli.errors import GPT1Error
from gptcli.model.build import AnyConfig, arch_of, preset, preset_class
from gptcli.model.kernels import check_mode, config_default
from gptcli.train.compiled import check_compile_mode
from gptcli.train.run.resume import SettingRules

# What --resume compares (gptcli.train.run.resume). A resumed run keeps the settings that define what its updates,
# steps and tokens are: the corpus and its tokenizer and the model's shape (compared by content, not by path or
# preset name), and the `defining` ones. weight_decay, beta1, beta2 and eps also live in the saved optimizer state,
# which would silently win over a new value. It may change, each noted: the run's length (train longer, or stop
# sooner; the schedule is recomputed over the new total), the learning-rate recipe and clipping (lower --lr after a
# loss spike), the micro-batch (gradient accumulation sums the same mean gradient in another order: last-bit
# differences only; changing the number of processes does the same), and what validation reads. The rest — the
# cadences, tensorboard, wandb, device, precision, kernels, compile, compile_mode, peak_flops, verify_data — changes
# how the run is computed or watched, not what it computes, and is taken silently.
RULES = SettingRules(
    defining=("seq_len", "batch_size", "seed", "decay", "weight_decay", "beta1", "beta2", "eps"),
    adjustable=(
        "epochs",
        "max_steps",
        "max_tokens",
        "lr",
        "warmup_steps",
        "schedule",
        "grad_clip",
        "micro_batch_size",
        "val_split",
        "eval_batches",
    ),
    silent=(
        "data",
        "out",
        "preset",
        "model",
        "device",
        "precision",
        "kernels",
        "compile",
        "compile_mode",
        "eval_every",
        "save_every",
        "keep_last",
        "log_every",
        "tensorboard",
        "wandb",
        "resume",
        "verify_data",
        "peak_flops",
        "max_minutes",
    ),
)


@dataclass
class PretrainConfig:
    """Everything a pretraining run depends on. Defaults are the paper's (reference §3) unless noted."""

    data: Path = Path("corpus")
    """Prepared corpus directory (``gpt1 prepare``): manifest.json, tokenizer/, shards. `gpt1 pretrain` uses
    ./corpus (where `gpt1 prepare` writes by default) only when it exists."""
    out: Path = Path("runs/pretrain")
    """Run directory: config.toml, metrics.jsonl, checkpoints/. `gpt1 pretrain` without --out takes the next free
    one of runs/pretrain, runs/pretrain-2, … (a default never reuses a run)."""
    preset: str = "gpt1"
    """Model preset, which also picks the architecture. Transformers: gpt1 = the paper's 12×768, 12 heads, 512
    context, init 0.02 (train it with these defaults); tiny = 4×256, 4 heads, init 0.06, for a laptop: pretrain with
    --lr 1e-3 --batch-size 16 --seq-len 128 and --warmup-steps 30 (at least; ≈ 10% of a longer run), fine-tune with
    --lr 5e-4 --batch-size 32 --epochs 3 (measured: docs/presets.md). LSTMs, the paper's Table 5 baseline: lstm =
    1×2048 units, 768-wide embedding; lstm-tiny = 1×768 units, 256-wide embedding (docs/pretrain.md)."""
    model: dict[str, Any] = field(default_factory=dict)
    """Model config field overrides of the preset, e.g. {n_layer = 2} (an LSTM preset takes LSTMConfig's, e.g.
    {n_hidden = 560}). vocab_size always comes from the corpus tokenizer."""
    seq_len: int = 512
    """Tokens per training sequence (paper: 512)."""
    batch_size: int = 64
    """Global batch in sequences per update (paper: 64)."""
    micro_batch_size: int | None = None
    """Sequences per forward/backward on each process; the rest is gradient accumulation (unset: a process's
    whole share of the batch at once)."""
    epochs: float = 100.0
    """Passes over the training windows (paper: 100). The run stops at the first of epochs/max_steps/max_tokens."""
    max_steps: int | None = None
    """Cap on optimizer updates, at least 1 (unset: no cap)."""
    max_tokens: int | None = None
    """Cap on training tokens, counted as updates × batch_size × seq_len (unset: no cap)."""
    lr: float = 2.5e-4
    """Peak learning rate (paper: 2.5e-4)."""
    warmup_steps: int = 2000
    """Linear warmup from 0 over this many updates (paper: 2000, kept for short runs too: a run with fewer
    updates than its warmup never reaches --lr and is warned about at start; for such a run pass at least 30
    updates, about a tenth of a longer run, but no more than the run)."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warmup (paper: cosine annealing to 0 at the last update)."""
    weight_decay: float = 0.01
    """Decoupled (AdamW) weight decay on weight matrices and embeddings (paper: 0.01)."""
    decay: Literal["paper", "released"] = "paper"
    """Which tensors decay: paper = not biases/LayerNorm; released = every tensor with ndim > 1."""
    beta1: float = 0.9
    """Adam β1 (the released code's default)."""
    beta2: float = 0.999
    """Adam β2 (the released code's default)."""
    eps: float = 1e-8
    """Adam ε (the released code's default)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (released code: 1.0); 0 disables."""
    seed: int = 0
    """Seeds initialisation, dropout and the window order."""
    device: str = "auto"
    """auto | cpu | cuda."""
    precision: str = "auto"
    """auto | fp32 | bf16 | fp16 (auto: bf16 on CUDA; on CPU bf16 where it has native bf16 dot products)."""
    kernels: str = field(default_factory=config_default)
    """How the model is computed, not what: auto = the fast CPU kernels of gptcli/model/kernels on CPU (PyTorch's
    fused ones elsewhere); reference = plain PyTorch everywhere (SDPA, F.dropout, F.cross_entropy). Default: the
    process's mode when the config is made ($GPT1_KERNELS, else auto)."""
    compile: bool = False
    """torch.compile the loss computation: faster on a GPU once compiled, no gain on CPU (docs/performance.md,
    "Compile")."""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = "default"
    """torch.compile's mode, with --compile: default = inductor's kernels; reduce-overhead also replays them as CUDA
    graphs (on a GPU; gradients are then kept allocated and zeroed in place, not freed, between updates);
    max-autotune = CUDA graphs and a search for the fastest matrix-product kernels (a much longer first update)."""
    eval_every: int = 1000
    """Validate every this many updates (and always at the end); 0 = only at the end."""
    eval_batches: int | None = None
    """Cap on validation, in batches of ``batch_size`` windows (unset: the whole validation split); the same windows
    whatever the number of processes and the micro-batch size."""
    val_split: str = "val"
    """Corpus split used for validation."""
    save_every: int = 1000
    """Checkpoint every this many updates (and at the end and on SIGINT/SIGTERM); 0 = only those."""
    keep_last: int = 3
    """Checkpoints kept in RUN/checkpoints (older ones deleted); 0 = keep all."""
    log_every: int = 10
    """Write a metrics line (and refresh the display) every this many updates."""
    tensorboard: bool = False
    """Also write TensorBoard events to RUN/tensorboard (needs the tensorboard package)."""
    wandb: str | None = None
    """Also log to Weights & Biases (rank 0): the same scalars, this config and the checkpoint paths, under this
    project (``--wandb`` alone: ``gpt1``); files in RUN/wandb; WANDB_MODE=offline logs without a network (needs
    gpt1[wandb])."""
    resume: bool = False
    """Continue from the newest intact checkpoint in RUN/checkpoints (fresh start if there is none). The data,
    the model's shape, seq_len, batch_size, seed and the optimizer's decay/β/ε must stay as they were; the run's
    length, the learning-rate recipe and how it is watched may change."""
    verify_data: bool = True
    """Check every shard's sha256 against the manifest, and a resumed checkpoint's files against its own
    checksums (skipping damaged newer checkpoints), before training."""
    peak_flops: float | None = None
    """Peak FLOP/s for MFU; default: a table for known GPUs, a quick measured matmul peak on CPU."""
    max_minutes: float | None = None
    """Stop once this many minutes of updates have passed, however far the schedule got (validated and saved as at
    the end, with a warning saying so); unset: no time limit. The quickstart sets it to its deadline."""


def check_pretrain(config: PretrainConfig, world_size: int | None) -> None:
    """Refuse impossible settings with a one-line error, before anything is read or written (by the launcher of a
    job before any worker starts, and by every worker). ``max_steps = 0`` is refused, not run as one update (or
    none): a run of no updates has nothing to save. Then the batch against the ``world_size`` processes (None: not
    known yet, as when the command reads its options)."""
    check_mode(config.kernels)
    check_compile_mode(config.compile, config.compile_mode)
    check_settings(config)  # one rule per setting, the same in every command (gptcli.config.RULES)
    model_overrides(config)  # [model] is a free-form table here: typed against the preset's own fields
    if world_size is None:
        return
    if config.batch_size % world_size != 0:
        raise GPT1Error(f"--batch-size {config.batch_size} is not divisible by the {world_size} processes")
    # Without a micro-batch size each process takes its whole share of the global batch at once.
    mb = config.micro_batch_size or config.batch_size // world_size
    if config.batch_size <= 0 or mb <= 0 or config.seq_len <= 0:
        raise GPT1Error("--batch-size, --micro-batch-size and --seq-len must be positive")
    if config.batch_size % (mb * world_size) != 0:
        raise GPT1Error(
            f"--batch-size {config.batch_size} must be a multiple of --micro-batch-size {mb} × {world_size} process(es)"
        )


def model_overrides(config: PretrainConfig) -> dict[str, Any]:
    """The ``[model]`` overrides typed and checked against the fields of the preset's config class (a Transformer's
    or an LSTM's), as the top-level settings are (:func:`gptcli.config.coerce_fields`): ``n_layer = true`` or
    ``n_embd = 1.5`` is a one-line error naming the key, not a traceback or a model of another shape. None values
    are dropped (:func:`gptcli.model.build.preset` ignores them)."""
    try:
        cls = preset_class(config.preset)
    except KeyError as e:
        raise GPT1Error(str(e.args[0])) from None
    known = [f.name for f in dataclasses.fields(cls) if f.name not in ("vocab_size", "n_special")]
    unknown = set(config.model) - {*known, "vocab_size", "n_special"}
    if unknown:
        raise GPT1Error(
            f"unknown model setting(s) {', '.join(sorted(unknown))} in [model] (preset {config.preset}, "
            f"a {arch_of(cls())}, takes {', '.join(known)})"
        )
    given = {k: v for k, v in config.model.items() if v is not None}
    return coerce_fields(cls, given, prefix="model.")


def build_model_config(config: PretrainConfig, vocab_size: int) -> AnyConfig:
    """The preset with the ``[model]`` overrides and the corpus's vocabulary; GPT1Error for impossible settings."""
    overrides = model_overrides(config)
    if "vocab_size" in config.model and config.model["vocab_size"] != vocab_size:
        raise GPT1Error(
            f"[model] vocab_size {config.model['vocab_size']} differs from the corpus tokenizer's {vocab_size}"
        )
    try:
        mcfg = preset(config.preset, **{**overrides, "vocab_size": vocab_size, "n_special": 0})
    except KeyError as e:
        raise GPT1Error(str(e.args[0])) from None
    except ValueError as e:
        raise GPT1Error(str(e)) from None
    if config.seq_len > mcfg.n_ctx:
        raise GPT1Error(f"--seq-len {config.seq_len} exceeds the model context n_ctx={mcfg.n_ctx}")
    for key in ("n_ctx", "n_embd", "n_layer", "n_head", "n_inner", "n_hidden"):
        if getattr(mcfg, key, 1) < 1:
            raise GPT1Error(f"--{key.replace('_', '-')} {getattr(mcfg, key)} is impossible (it must be at least 1)")
    return mcfg
