"""Generative pretraining (paper §3.1, §4.1) as a library function: ``pretrain(PretrainConfig(...))``.

Run directory layout::

    RUN/config.toml                    the resolved PretrainConfig (repeat the run with ``--config``)
    RUN/metrics.jsonl                  one line per logged update and per validation (see runlog.py)
    RUN/checkpoints/step-0001000/      checkpoint directories (checkpoint.py) with training state; last K kept

so that ``load_checkpoint(RUN)`` opens the newest one. ``resume=True`` continues from the newest complete
checkpoint; on CPU the continued run's losses are bitwise identical to an uninterrupted one (tested).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import torch

from gptcli import checkpoint as ckpt
from gptcli.config import from_dict, load_file, save_config
from gptcli.errors import GPT1Error
from gptcli.eval.perplexity import evaluate_lm
from gptcli.model.gpt import GPT, ModelConfig, preset
from gptcli.model.losses import next_token_nll
from gptcli.train.optim import lr_at, make_optimizer
from gptcli.progress import SILENT, Progress
from gptcli.train.runlog import METRICS, RunLogger, Throughput, format_duration, truncate_metrics
from gptcli.runtime import configure_backends, peak_flops, resolve_device, resolve_precision
from gptcli.data.windows import WindowSampler
from gptcli.data.shards import Corpus, open_corpus
from gptcli.train.trainer import GracefulStop, NonFiniteLossError, Parallel, Trainer, every, split_micro_batches, unwrap

CONFIG_FILE = "config.toml"


@dataclass
class PretrainConfig:
    """Everything a pretraining run depends on. Defaults are the paper's (reference §3) unless noted."""

    data: Path = Path("corpus")
    """Prepared corpus directory (``gpt1 prepare``): manifest.json, tokenizer/, shards."""
    out: Path = Path("runs/pretrain")
    """Run directory: config.toml, metrics.jsonl, checkpoints/."""
    preset: str = "gpt1"
    """Model preset (gpt1: 12×768×12, 512 context; tiny: 4×256×4)."""
    model: dict[str, Any] = field(default_factory=dict)
    """ModelConfig field overrides, e.g. {n_layer = 2}. vocab_size always comes from the corpus tokenizer."""
    seq_len: int = 512
    """Tokens per training sequence (paper: 512)."""
    batch_size: int = 64
    """Global batch in sequences per update (paper: 64)."""
    micro_batch_size: int | None = None
    """Sequences per forward/backward on each process; the rest is gradient accumulation. None = whole batch."""
    epochs: float = 100.0
    """Passes over the training windows (paper: 100). The run stops at the first of epochs/max_steps/max_tokens."""
    max_steps: int | None = None
    """Cap on optimizer updates."""
    max_tokens: int | None = None
    """Cap on training tokens (updates × batch × seq_len)."""
    lr: float = 2.5e-4
    """Peak learning rate (paper: 2.5e-4)."""
    warmup_steps: int = 2000
    """Linear warmup from 0 over this many updates (paper: 2000)."""
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
    compile: bool = False
    """torch.compile the loss computation (worth it on GPUs; no gain measured on CPU)."""
    eval_every: int = 1000
    """Validate every this many updates (and always at the end); 0 = only at the end."""
    eval_batches: int | None = None
    """Cap on validation batches (None = the whole validation split)."""
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
    resume: bool = False
    """Continue from the newest complete checkpoint in RUN/checkpoints (fresh start if there is none)."""
    verify_data: bool = True
    """Check every shard's sha256 against the manifest before training."""
    peak_flops: float | None = None
    """Peak FLOP/s for MFU; default: a table for known GPUs, a quick measured matmul peak on CPU."""

    @property
    def accum_steps(self) -> int:
        return self.batch_size // (self.micro_batch_size or self.batch_size)


def load_config(path: str | Path, **overrides: Any) -> PretrainConfig:
    """A PretrainConfig from a TOML/JSON file, with non-None keyword overrides applied."""
    data = load_file(path)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return from_dict(PretrainConfig, data)


@dataclass
class PretrainResult:
    run_dir: Path
    step: int
    total_steps: int
    final_val_loss: float | None
    stopped_by: str | None = None
    """Signal name when the run was interrupted (it saved a checkpoint and can be resumed)."""
    last_checkpoint: Path | None = None


def plan_steps(config: PretrainConfig, steps_per_epoch: int) -> int:
    """Number of updates: the first reached of epochs, max_steps and max_tokens."""
    caps = [max(1, int(config.epochs * steps_per_epoch))]
    if config.max_steps is not None:
        caps.append(config.max_steps)
    if config.max_tokens is not None:
        caps.append(math.ceil(config.max_tokens / (config.batch_size * config.seq_len)))
    return max(1, min(caps))


def check_launch(config: PretrainConfig, world_size: int) -> None:
    """Refuse batch settings that ``world_size`` processes cannot split (checked before any worker starts)."""
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


def lm_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token loss of a ``(b, T+1)`` window batch. Calls ``model(x)`` so a DDP wrapper sees the forward."""
    h = model(batch[:, :-1])
    logits = unwrap(model).lm_logits(h)
    return next_token_nll(logits, batch[:, 1:])


def build_model_config(config: PretrainConfig, vocab_size: int) -> ModelConfig:
    unknown = set(config.model) - {f.name for f in dataclasses.fields(ModelConfig)}
    if unknown:
        raise GPT1Error(f"unknown model setting(s) {', '.join(sorted(unknown))} in [model]")
    if "vocab_size" in config.model and config.model["vocab_size"] != vocab_size:
        raise GPT1Error(f"[model] vocab_size {config.model['vocab_size']} differs from the corpus tokenizer's {vocab_size}")
    try:
        mcfg = preset(config.preset, **{**config.model, "vocab_size": vocab_size, "n_special": 0})
    except KeyError as e:
        raise GPT1Error(str(e.args[0])) from None
    except ValueError as e:
        raise GPT1Error(str(e)) from None
    if config.seq_len > mcfg.n_ctx:
        raise GPT1Error(f"--seq-len {config.seq_len} exceeds the model context n_ctx={mcfg.n_ctx}")
    return mcfg


def open_training_corpus(config: PretrainConfig) -> Corpus:
    corpus = open_corpus(config.data)
    if config.verify_data:
        problems = corpus.verify()
        if problems:
            raise GPT1Error(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    return corpus


def pretrain(
    config: PretrainConfig,
    *,
    parallel: Parallel | None = None,
    progress: Progress | None = None,
    on_log: Callable[[dict[str, Any]], None] | None = None,
) -> PretrainResult:
    """Run (or resume) pretraining as configured; returns where it stopped. Raises GPT1Error on user errors."""
    par = parallel or Parallel()
    report = (progress or SILENT) if par.is_main else SILENT
    check_launch(config, par.world_size)
    device = resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    configure_backends(device)

    corpus = open_training_corpus(config)
    tokenizer = corpus.tokenizer
    mcfg = build_model_config(config, tokenizer.vocab_size)
    train_arrays = corpus.arrays("train")
    val_name = next((s for s in (config.val_split, "val", "validation", "valid") if s in corpus.splits), None)
    val_arrays = corpus.arrays(val_name) if val_name is not None else None  # no split: no validation
    sampler = WindowSampler(train_arrays, config.seq_len, config.batch_size, config.seed, par.rank, par.world_size)
    total_steps = plan_steps(config, sampler.steps_per_epoch)

    run_dir = Path(config.out)
    ckpt_dir = run_dir / "checkpoints"
    existing = ckpt_dir.is_dir() and any(c.is_dir() and ckpt.is_checkpoint(c) for c in ckpt_dir.glob("step-*"))
    if existing and not config.resume:
        raise GPT1Error(f"{run_dir}: already holds checkpoints; pass --resume to continue it or choose another --out")

    torch.manual_seed(config.seed)
    model = GPT(mcfg).to(device)
    optimizer = make_optimizer(
        model, config.lr, config.weight_decay, (config.beta1, config.beta2), config.eps, config.decay
    )
    step = 0
    resumed_from: Path | None = None
    if config.resume and existing:
        resumed_from = ckpt.resolve_checkpoint(run_dir)
        step = _restore(resumed_from, model, optimizer, sampler, device)

    wrapped = par.wrap(model)
    seed_rank_rng(config.seed, par.rank, step)
    loss_fn = torch.compile(lm_loss) if config.compile else lm_loss
    warmup = config.warmup_steps
    trainer = Trainer(
        wrapped,
        optimizer,
        loss_fn,
        lambda s: lr_at(s, total_steps, config.lr, warmup, config.schedule),
        device=device,
        precision=precision,
        grad_clip=config.grad_clip,
    )
    if resumed_from is not None:
        doc, _ = ckpt.read_training_state(resumed_from)
        if "grad_scaler" in doc:
            trainer.scaler.load_state_dict(doc["grad_scaler"])

    logger = None
    if par.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(dataclasses.replace(config, resume=False), run_dir / CONFIG_FILE)
        if resumed_from is not None:
            truncate_metrics(run_dir / METRICS, step)
        elif (run_dir / METRICS).exists():
            (run_dir / METRICS).unlink()
        logger = RunLogger(run_dir, config.tensorboard)

    tokens_per_step = config.batch_size * config.seq_len
    micro = (config.micro_batch_size or config.batch_size)
    fpt = model.flops_per_token(config.seq_len)
    # tokens_per_step is the global batch, so the meter reads global tokens/s; MFU divides by all devices' peak.
    peak = peak_flops(device, precision, config.peak_flops) if par.is_main else None
    meter = Throughput(fpt, peak * par.world_size if peak else None)
    last_ckpt: Path | None = resumed_from
    final_val: float | None = None
    stopped_by: str | None = None

    def save(at: int) -> Path:
        state = {
            "step": at,
            "total_steps": total_steps,
            "tokens": at * tokens_per_step,
            "sampler": sampler.state_dict(),
        }
        path = ckpt.save_checkpoint(
            ckpt_dir / ckpt.step_dir_name(at),
            model,
            tokenizer,
            kind="lm",
            meta={"step": at, "tokens": at * tokens_per_step, "stage": "pretrain", "seq_len": config.seq_len},
            extra=lambda d: ckpt.write_training_state(d, optimizer, state, scaler=trainer.scaler),
        )
        ckpt.prune_checkpoints(ckpt_dir, config.keep_last)
        return path

    def validate(at: int) -> float | None:
        if val_arrays is None:
            return None
        ev = evaluate_lm(
            unwrap(model), val_arrays, config.seq_len, micro, device=device, precision=precision,
            max_batches=config.eval_batches, rank=par.rank, world_size=par.world_size,
        )
        loss, tokens = ev.loss, ev.tokens
        if par.world_size > 1:  # each rank scored every world_size-th batch: combine them token-weighted
            tokens = round(par.mean(float(ev.tokens)) * par.world_size)
            nll = par.mean(ev.loss * ev.tokens if ev.tokens else 0.0) * par.world_size
            loss = nll / tokens if tokens else float("nan")
        rec = {"kind": "eval", "step": at, "split": val_name, "loss": loss,
               "perplexity": math.exp(min(loss, 700)), "tokens": tokens}
        if logger is not None:
            logger.log(rec)
            report.note(f"validation at update {at}: loss {loss:.4f}, perplexity {rec['perplexity']:.2f}")
        if on_log is not None:
            on_log(rec)
        return loss

    t_start = time.perf_counter()
    steps_at_start = step
    report.stage("pretrain", total_steps, unit="updates", done=step)
    shown = step
    try:
        with GracefulStop(escalate=par.world_size == 1) as stop:
            while step < total_steps:
                meter.start()
                batch = sampler.next_batch()
                if device.type == "cuda":
                    batch = batch.pin_memory().to(device, non_blocking=True)
                result = trainer.step(step, split_micro_batches(batch, micro))
                meter.stop(tokens_per_step)
                if not math.isfinite(result.loss):
                    where = f"the last good checkpoint is {last_ckpt}" if last_ckpt else "no checkpoint was saved yet"
                    raise NonFiniteLossError(
                        f"loss became {result.loss} at update {step + 1}; stopping ({where}; "
                        f"resume with --resume, perhaps with a lower --lr or --precision fp32)"
                    )
                step += 1
                if every(step, config.log_every) or step == total_steps:
                    loss = par.mean(result.loss)
                    tps, mfu = meter.report()
                    elapsed = time.perf_counter() - t_start
                    rate = (step - steps_at_start) / elapsed if elapsed > 0 else 0.0
                    eta = (total_steps - step) / rate if rate > 0 else float("inf")
                    rec = {"kind": "train", "step": step, "loss": loss, "lr": result.lr, "grad_norm": result.grad_norm,
                           "tokens": step * tokens_per_step, "tokens_per_s": tps, "mfu": mfu,
                           "elapsed_s": round(elapsed, 3)}
                    if logger is not None:
                        logger.log(rec)
                        report.advance(step - shown, loss=loss, lr=result.lr, **{"tok/s": round(tps)},
                                       MFU="n/a" if mfu is None else f"{100 * mfu:.1f}%", ETA=format_duration(eta))
                        shown = step
                    if on_log is not None:
                        on_log(rec)
                if every(step, config.eval_every) and step < total_steps:
                    validate(step)
                if par.any(stop.requested is not None):
                    stopped_by = stop.name or "signal"
                    break
                if every(step, config.save_every) and step < total_steps:
                    if par.is_main:
                        last_ckpt = save(step)
                    par.barrier()
            if stopped_by is None:
                final_val = validate(step)
            if par.is_main and (last_ckpt is None or last_ckpt.name != ckpt.step_dir_name(step)):
                last_ckpt = save(step)
            par.barrier()
    finally:
        report.end()
    if logger is not None:
        logger.close()
    return PretrainResult(run_dir, step, total_steps, final_val, stopped_by, last_ckpt)


def seed_rank_rng(seed: int, rank: int, step: int) -> None:
    """Give every rank but 0 its own dropout stream from here on.

    Dropout draws from the global RNG, and every rank starts alike: all are seeded with ``seed`` so they build the
    same weights, and a resumed run restores rank 0's saved RNG state on every rank. Left so, each rank would drop
    the same units at the same positions of its own batch — correlated masks where data parallelism should
    average ``world_size`` independent ones. Rank 0 keeps the single-process stream (a 1-process run and rank 0 of
    an N-process run draw the same masks); rank r > 0 is reseeded from (seed, rank, step), so a resume at the same
    step reproduces it.
    """
    if rank > 0:
        torch.manual_seed((seed * 1_000_003 + rank * 7_919 + step) % (2**63 - 1))


def _restore(path: Path, model: GPT, optimizer: torch.optim.Optimizer, sampler: WindowSampler, device) -> int:
    """Load weights, optimizer, sampler and RNG state from a checkpoint; returns its step."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path / ckpt.WEIGHTS), device=str(device))
    except Exception as e:
        raise GPT1Error(f"{path / ckpt.WEIGHTS}: unreadable weights ({e})") from None
    try:
        model.load_state_dict({k: v for k, v in tensors.items() if not k.startswith(ckpt.HEAD_PREFIX)}, strict=True)
    except RuntimeError as e:
        raise GPT1Error(
            f"{path}: checkpoint does not match the configured model ({str(e).splitlines()[0]}); "
            "resume with the run's own config.toml"
        ) from None
    doc, state_tensors = ckpt.read_training_state(path)
    ckpt.restore_training_state(doc, state_tensors, optimizer)
    sampler.load_state_dict(doc["sampler"])
    return int(doc["step"])
