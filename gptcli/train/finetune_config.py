"""The settings of a fine-tuning run (:class:`FinetuneConfig`, the CLI's options), how ``--resume`` treats each, and
the checks they pass before anything is read (:func:`check_finetune`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gptcli.config import check_settings
from gptcli.errors import GPT1Error
from gptcli.model.kernels import check_mode, config_default
from gptcli.tasks import Task
from gptcli.train.run.resume import SettingRules

# What --resume compares (gptcli.train.run.resume). The defining settings decide what the run's updates and dev
# scores are. Unlike pretraining, whose long runs need steering, the learning-rate recipe and the number of epochs are
# fixed too: a fine-tuning run is short, and its results.json records one config, which a recipe changed half-way
# would misreport. The inputs are compared by content, not by path: the init checkpoint's weights, the data files
# read, the encoded examples (the tokenizer) and the model's shape (gptcli.train.finetune_setup.run_identity).
# Adjustable: how the same updates and dev scores are computed. The micro-batch is memory (a resume on a smaller
# device must be able to lower it); it, the device, the precision, the kernels and the layout change the arithmetic
# (and the micro-batch the order of the dropout draws), so the continuation is no longer bitwise the uninterrupted
# run; the evaluation batch may change a dev score's last bits. Silent: where things are (compared by content
# instead), how the run is watched and kept, and the two switches that say what to do with --out.
# Runs recorded before `batching` existed were length-bucketed, so resuming one with today's default ("random") is
# refused by name instead of silently changing its batch order; runs recorded before `layout` trained padded.
# Layout "shared" is the exception among the adjustable settings: it changes what is computed, not only how (an
# example's answers share the prefix's dropout masks, where separate sequences draw their own), so a resume that
# switches to or from it is refused, naming it; packed ↔ padded stays a noted change. It is refused even with every
# dropout at 0, where the two compute the same: the rule reads the settings, not the model.
RULES = SettingRules(
    defining=(
        "task",
        "train_split",
        "eval_split",
        "skip_bad_rows",
        "lr",
        "batch_size",
        "epochs",
        "warmup",
        "schedule",
        "batching",
        "clf_pdrop",
        "dropout",
        "grad_clip",
        "weight_decay",
        "decay",
        "lm_weight",
        "transfer_layers",
        "select",
        "seed",
        "n_ctx",
        "max_train_examples",
        "max_eval_examples",
    ),
    adjustable=("micro_batch_size", "eval_batch_size", "device", "precision", "kernels", "layout"),
    silent=(
        "init",
        "tokenizer",
        "model",
        "data_dir",
        "out",
        "verify",
        "log_every",
        "save_every",
        "keep_last",
        "overwrite",
        "resume",
        "cache",
        "workers",
        "wandb",
        "max_minutes",
    ),
    older_runs={"batching": "length", "layout": "padded"},
    defining_values={"layout": ("shared",)},
)


@dataclass
class FinetuneConfig:
    """Settings of one fine-tuning run. Defaults are the paper's (§4.1) unless noted."""

    task: str = ""
    """Registry name of the task (``gpt1 finetune --list-tasks``)."""
    init: str = ""
    """Pretrained checkpoint (or run directory) to start from, a Hugging Face Hub id (``openai-gpt``,
    ``owner/name[@revision]``: converted once), or ``none`` for a randomly initialised model. Not given: ``openai-gpt``,
    OpenAI's released GPT-1 (`gpt1 finetune` resolves ids and the default; the library itself takes a path)."""
    verify: bool = True
    """Check the ``init`` checkpoint's files against their checksums before loading it, and on --resume the run's
    own checkpoints (a damaged newer one is skipped with a warning); --no-verify skips both."""
    out: str | None = None
    """Run directory: metrics.jsonl, config.toml, results.json, checkpoints/final (never the --init run itself).
    Not given (None): ``runs/finetune-<task>``, or the next free ``-2``, ``-3``, … (a default never reuses a run)."""
    tokenizer: str | None = None
    """With ``init = "none"``: a tokenizer directory, or a checkpoint whose tokenizer *and* shape are used. With a
    pretrained init only its own tokenizer is accepted (another, even of the same size, is refused)."""
    model: str = "gpt1"
    """With ``init = "none"`` and a bare tokenizer: the model preset, which picks the architecture too (``gpt1``,
    ``tiny``; the LSTM baseline ``lstm``, ``lstm-tiny``)."""
    data_dir: str | None = None
    """The task's official folder; default ``$GPT1_DATA/<folder>``."""
    cache: bool = True
    """Keep the encoded examples in ``$GPT1_CACHE`` (default ``~/.cache/gpt1/encoded``) and reuse them when the
    data, tokenizer, task and n_ctx are the same; --no-cache encodes afresh and writes nothing there."""
    workers: int = 0
    """Processes that tokenize the examples (0 = all cores); the ids are the same for any number."""
    skip_bad_rows: bool = False
    """Skip and count malformed rows instead of stopping at the first."""
    train_split: str = "train"
    """Split to train on."""
    eval_split: str = "dev"
    """Split scored after every epoch (and used by ``select = "best"``); empty to skip."""
    lr: float = 6.25e-5
    """Peak learning rate."""
    batch_size: int = 32
    """Examples per update (a multiple-choice example holds one sequence per answer)."""
    micro_batch_size: int | None = None
    """Examples per forward/backward (gradient accumulation up to ``batch_size``); None = the whole batch."""
    epochs: int = 3
    """Passes over the training split."""
    max_minutes: float | None = None
    """Stop once this many minutes of updates have passed, however far the epochs got (evaluated and saved as at
    the end, with a warning saying so); unset: no time limit. The quickstart sets it to its share of its minutes."""
    warmup: float = 0.002
    """Linear warm-up as a fraction of all updates (0.2%), then ``schedule`` decay to 0."""
    schedule: Literal["warmup_linear", "linear", "cosine", "constant"] = "warmup_linear"
    """``warmup_linear``: the released code's function exactly, lr·(1 − t/T) with the warm-up ramp t/(warmup·T)
    multiplied in while t ≤ warmup·T (the first update runs at lr 0); ``linear``/``cosine``/``constant``: gpt1's
    earlier schedule, a warm-up over ceil(warmup·T) updates (at least 1, the first at lr/W) and then the decay from
    the end of the warm-up."""
    batching: Literal["random", "length"] = "random"
    """Training batch order. ``random``: i.i.d. shuffled minibatches, as the paper and the released code.
    ``length``: length-bucketed batches (shuffled pools of 50 batches sorted by length), the fast option: far fewer
    pad tokens and, where the LM projection does not dominate, more updates per second; but a batch then holds
    examples of similar length (docs/finetune.md, "Batching", gives the figures)."""
    layout: Literal["packed", "padded", "shared"] = "packed"
    """How a training micro-batch is laid out. ``packed``: its sequences end to end in one row, each attending to
    itself only, so no layer computes on padding: the same examples,
    order and losses, with dropout masks drawn over the real positions only; the dev scoring packs too, with a
    multiple-choice example's shared context run once for all its answers. ``padded``: every sequence padded to
    the batch's longest, the reference it is tested against. ``shared`` (multiple choice; other tasks train
    packed): training too runs an example's common prefix (``<s> story $``, RACE's article and question) once,
    each answer attending to it, with the same losses as packed; a deviation from the paper, off by default: with
    dropout on, the answers share the prefix's dropout masks instead of drawing one each (its gain:
    docs/performance.md, "Layout"). A resume cannot switch to or from it. The LSTM baseline is always padded."""
    clf_pdrop: float = 0.1
    """Classifier dropout before the head."""
    dropout: float | None = None
    """Every dropout of the body for this run (a Transformer's embedding, attention and residual dropout; an LSTM's
    embedding and output dropout); None: the init checkpoint's, or the preset's with ``init = "none"`` (the paper's
    0.1). 0 makes the layouts' runs comparable update for update: with dropout on, ``packed`` draws its masks over
    the real positions only and ``padded`` over the padding too, so their runs part after the first mask."""
    grad_clip: float = 1.0
    """Global gradient-norm clipping (0 disables)."""
    weight_decay: float = 0.01
    """Decoupled weight decay on weight matrices (as pretraining)."""
    decay: Literal["paper", "released"] = "paper"
    """Which tensors decay: ``paper`` (not biases/LayerNorm) or ``released`` (every tensor with ndim > 1)."""
    lm_weight: float = 0.5
    """λ of the auxiliary LM loss (L3 = L2 + λ·L1); 0 disables it (ablation)."""
    transfer_layers: int | None = None
    """Keep the embeddings and only the first K blocks (an LSTM: layers) of the checkpoint (ablation); None = all."""
    select: Literal["best", "last"] = "best"
    """Which epoch's weights the final checkpoint keeps: best dev score or the last epoch."""
    seed: int = 42
    """Seeds the head init, special-token rows, dropout, shuffling and subsampling."""
    n_ctx: int | None = None
    """Longest sequence (default: the model's context); transformations truncate to it."""
    max_train_examples: int | None = None
    """Train on a random subset of this many examples (quick experiments, tests)."""
    max_eval_examples: int | None = None
    """Score a random subset of this many dev examples: the one `gpt1 eval --max-examples` scores, whatever `--seed`."""
    eval_batch_size: int | None = None
    """Examples per evaluation batch (default: 2 × batch_size)."""
    device: str = "auto"
    """auto, cpu or cuda[:N]."""
    precision: str = "auto"
    """auto, fp32, bf16 or fp16 (autocast; weights stay fp32)."""
    kernels: str = field(default_factory=config_default)
    """How the model is computed, not what: auto = the fast CPU kernels of gptcli/model/kernels on CPU (PyTorch's
    fused ones elsewhere); reference = plain PyTorch everywhere (SDPA, F.dropout, F.cross_entropy). Default: the
    process's mode when the config is made ($GPT1_KERNELS, else auto)."""
    log_every: int = 10
    """Write a training record to metrics.jsonl every this many updates."""
    wandb: str | None = None
    """Also log to Weights & Biases (rank 0): the same scalars, this config and the checkpoint paths, under this
    project (``--wandb`` alone: ``gpt1``); files in RUN/wandb; WANDB_MODE=offline logs without a network (needs
    gpt1[wandb])."""
    save_every: int = 1000
    """Checkpoint every this many updates to RUN/checkpoints/step-N (also after every epoch's dev score and on
    SIGINT/SIGTERM); 0 = only those. Step checkpoints are deleted when the run finishes."""
    keep_last: int = 2
    """Step checkpoints kept while the run trains (older ones deleted); 0 = keep all."""
    resume: bool = False
    """Continue the unfinished run in ``out`` from its newest intact checkpoint (a fresh start if it has none). The
    task, data, init checkpoint, seed, batch size and recipe must stay as they were; progress, logging and
    checkpoint cadence may change."""
    overwrite: bool = False
    """Replace a finished fine-tuning run in ``out``, or start an unfinished one over (kept whole until the new one
    is complete; any other kind of directory is refused)."""

    @property
    def scoring_batch_size(self) -> int:
        """Examples per evaluation batch: ``eval_batch_size``, by default twice ``batch_size``."""
        return self.eval_batch_size or 2 * self.batch_size


def check_finetune(c: FinetuneConfig, world_size: int) -> None:
    """Refuse settings that cannot work, before anything is read or loaded (by the launcher of a job before any
    worker starts, and by every worker): every number by its one rule (:data:`gptcli.config.RULES`, the same in
    every command), then the combinations, then the global batch against the ``world_size`` processes."""
    if not c.task:
        raise GPT1Error("no task given (--task NAME; see --list-tasks)")
    check_mode(c.kernels)
    check_settings(c)
    if c.init.lower() == "none" and not c.tokenizer:
        raise GPT1Error("--init none needs --tokenizer DIR (a tokenizer directory or a checkpoint) to encode the task")
    if c.transfer_layers is not None and c.init.lower() == "none":
        raise GPT1Error(
            "--transfer-layers needs a pretrained --init checkpoint (with --init none nothing is transferred)"
        )
    if c.resume and c.overwrite:
        raise GPT1Error("--resume continues the run in --out and --overwrite starts it over (pass one of them)")
    # A batch the processes do not divide evenly is handled exactly (shares differ by one example and the loss is
    # weighted by example counts); one smaller than the processes would leave some of them without examples.
    if world_size > 1 and c.batch_size < world_size:
        raise GPT1Error(
            f"--batch-size {c.batch_size} is smaller than the {world_size} processes: every update would "
            f"leave a process without examples (use a batch of at least {world_size}, or fewer processes)"
        )


def run_inputs(init: str, tokenizer: str | None, task: Task, data_dir: str | None) -> list[Path]:
    """What a fine-tuning run reads, which its ``out`` must never be: the --init checkpoint or run, the tokenizer,
    the task's data."""
    inputs = [Path(p) for p in (init, tokenizer) if p and p.lower() != "none"]
    try:
        inputs.append(task.data_dir(data_dir))
    except GPT1Error:
        pass  # missing data is reported when it is read, with the task's own advice
    return inputs
