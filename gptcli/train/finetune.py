"""Fine-tuning on a task (paper §3.2, §4.1): body + linear head, task loss + λ·LM loss.

``finetune(FinetuneConfig(task="rte", init="runs/pre/checkpoints/step-0100000", out="runs/rte"))`` loads the
pretrained checkpoint (weights + tokenizer), appends the three special tokens (start, delimiter, extract) with
N(0, 0.02) embeddings, builds the task head, and trains with the paper's settings. After every epoch it scores
the dev split with the task's metric; the final checkpoint (``RUN/checkpoints/final``) holds the best (or last)
epoch's body + head, the tokenizer and the head config, and ``RUN/results.json`` its dev scores.

The update itself (autocast, clipping, schedule, non-finite guard) is the shared :class:`gptcli.train.trainer.Trainer`;
this module only supplies the data (bucketed, dynamically padded batches) and the loss.

Ablations (paper Table 5, Figure 2 left): ``init="none"`` (no pretraining: a randomly initialised model of the
same shape), ``lm_weight=0`` (no auxiliary LM; its forward cost is skipped too), ``transfer_layers=K`` (keep
the embeddings and the first K blocks, re-initialise the others with the model's own init).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import torch
import torch.nn as nn

from gptcli.errors import GPT1Error

RESULTS = "results.json"
FINAL = "final"


@dataclass
class FinetuneConfig:
    """Settings of one fine-tuning run. Defaults are the paper's (§4.1) unless noted."""

    task: str = ""
    """Registry name of the task (``gpt1 finetune --list-tasks``)."""
    init: str = ""
    """Pretrained checkpoint (or run directory) to start from, or ``none`` for a randomly initialised model."""
    out: str = "runs/finetune"
    """Run directory: metrics.jsonl, config.toml, results.json, checkpoints/final."""
    tokenizer: str | None = None
    """With ``init = "none"``: a tokenizer directory, or a checkpoint whose tokenizer *and* shape are used."""
    model: str = "gpt1"
    """With ``init = "none"`` and a bare tokenizer: the model preset (``gpt1``, ``tiny``)."""
    data_dir: str | None = None
    """The task's official folder; default ``$GPT1_DATA/<folder>``."""
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
    warmup: float = 0.002
    """Linear warm-up as a fraction of all updates (0.2%), then ``schedule`` decay to 0."""
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    """Decay after warm-up (paper: linear)."""
    clf_pdrop: float = 0.1
    """Classifier dropout before the head."""
    grad_clip: float = 1.0
    """Global gradient-norm clipping (0 disables)."""
    weight_decay: float = 0.01
    """Decoupled weight decay on weight matrices (as pretraining)."""
    decay: Literal["paper", "released"] = "paper"
    """Which tensors decay: ``paper`` (not biases/LayerNorm) or ``released`` (every tensor with ndim > 1)."""
    lm_weight: float = 0.5
    """λ of the auxiliary LM loss (L3 = L2 + λ·L1); 0 disables it (ablation)."""
    transfer_layers: int | None = None
    """Keep the embeddings and only the first K blocks of the checkpoint (ablation); None = all."""
    select: Literal["best", "last"] = "best"
    """Which epoch's weights the final checkpoint keeps: best dev score or the last epoch."""
    seed: int = 42
    """Seeds the head init, special-token rows, dropout, shuffling and subsampling."""
    n_ctx: int | None = None
    """Longest sequence (default: the model's context); transformations truncate to it."""
    max_train_examples: int | None = None
    """Train on a random subset of this many examples (quick experiments, tests)."""
    max_eval_examples: int | None = None
    """Score a random subset of this many dev examples."""
    eval_batch_size: int | None = None
    """Examples per evaluation batch (default: 2 × batch_size)."""
    device: str = "auto"
    """auto, cpu or cuda[:N]."""
    precision: str = "auto"
    """auto, fp32, bf16 or fp16 (autocast; weights stay fp32)."""
    log_every: int = 10
    """Write a training record to metrics.jsonl every this many updates."""
    overwrite: bool = False
    """Replace an existing run in ``out``."""
    progress: bool = True
    """Show a Rich progress bar."""


# --------------------------------------------------------------------------------------------- model pieces


class FinetuneModel(nn.Module):
    """The GPT body and its task head as one module (one optimizer, one state dict)."""

    def __init__(self, gpt: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.gpt = gpt
        self.head = head

    def forward(self, ids: torch.Tensor, n_seqs: int) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.gpt(ids)
        return self.head(hidden, ids, n_seqs), hidden


def reinit_after(gpt: nn.Module, keep_layers: int) -> None:
    """Re-initialise blocks ``keep_layers…`` with the model's own init (``transfer_layers`` ablation).

    The embeddings (token, position) and blocks ``0 … keep_layers-1`` keep their pretrained values, as the
    released code's ``n_transfer`` does.
    """
    n = len(gpt.blocks)
    if not 0 <= keep_layers <= n:
        raise GPT1Error(f"--transfer-layers must be between 0 and {n} (the model's layers), got {keep_layers}")
    for block in list(gpt.blocks)[keep_layers:]:
        block.apply(gpt._init_weights)


def _load_tokenizer_from(path: str) -> tuple[Any, Any | None]:
    """A tokenizer: from a tokenizer directory or a prepared corpus (shape unknown: None), or from a checkpoint
    or run directory together with its model config (so a random model can have the pretrained one's shape)."""
    from gptcli.checkpoint import CONFIG, is_checkpoint, resolve_checkpoint
    from gptcli.model.gpt import ModelConfig
    from gptcli.tokenizers import load_tokenizer

    p = Path(path)
    if (p / "tokenizer.json").is_file():
        return load_tokenizer(p), None
    if is_checkpoint(p) or (p / "checkpoints").is_dir():
        ck = resolve_checkpoint(p)
        if not (ck / "tokenizer").is_dir():
            raise GPT1Error(f"{ck}: checkpoint has no tokenizer/")
        mcfg = ModelConfig(**json.loads((ck / CONFIG).read_text(encoding="utf-8"))["model"])
        mcfg.n_special = 0
        return load_tokenizer(ck / "tokenizer"), mcfg
    if (p / "tokenizer" / "tokenizer.json").is_file():  # a prepared corpus directory
        return load_tokenizer(p / "tokenizer"), None
    raise GPT1Error(f"{p}: not a tokenizer directory, prepared corpus, checkpoint or run directory")


def build_body(config: FinetuneConfig) -> tuple[nn.Module, Any, dict[str, Any]]:
    """The GPT body with its three special tokens, the tokenizer, and a description of where it came from."""
    from gptcli.model.gpt import GPT, preset

    n_sp = 3
    if config.init.lower() == "none":
        if not config.tokenizer:
            raise GPT1Error("--init none needs --tokenizer DIR (a tokenizer directory or a checkpoint) to encode the task")
        tok, mcfg = _load_tokenizer_from(config.tokenizer)
        if mcfg is None:
            mcfg = preset(config.model, vocab_size=tok.vocab_size)
        mcfg.vocab_size = tok.vocab_size
        gpt = GPT(mcfg)
        source = {"init": "none", "tokenizer": str(config.tokenizer)}
    else:
        from gptcli.checkpoint import load_checkpoint

        if not config.init:
            raise GPT1Error("no checkpoint to fine-tune: pass --init CHECKPOINT (or --init none for no pretraining)")
        ck = load_checkpoint(config.init)
        gpt = ck.model
        tok = ck.tokenizer
        if config.tokenizer:
            tok, _ = _load_tokenizer_from(config.tokenizer)
        if tok is None:
            raise GPT1Error(f"{ck.path}: checkpoint has no tokenizer/ (pass --tokenizer DIR)")
        n_sp = max(0, 3 - gpt.config.n_special)
        source = {"init": str(ck.path), "init_kind": ck.kind, "init_meta": ck.meta}
    if tok.vocab_size != gpt.config.vocab_size:
        raise GPT1Error(
            f"tokenizer has {tok.vocab_size} ids but the model's vocabulary has {gpt.config.vocab_size}: "
            "they must come from the same pretraining run"
        )
    gpt.add_special_tokens(n_sp)  # start, delimiter, extract: new rows drawn from N(0, 0.02)
    if config.transfer_layers is not None and config.init.lower() != "none":
        reinit_after(gpt, config.transfer_layers)
        source["transfer_layers"] = config.transfer_layers
    return gpt, tok, source


# --------------------------------------------------------------------------------------------- data


def read_split(task: Any, split: str, config: FinetuneConfig) -> tuple[list[Any], list[str], int]:
    """Examples of one split, the skipped bad rows (``path:line: reason``) and the count of rows the dataset's
    own rule leaves out (SNLI/MNLI ``gold_label == "-"``)."""
    from gptcli.tasks import ReadOptions

    opts = ReadOptions(skip_bad_rows=config.skip_bad_rows)
    examples = task.read(split, config.data_dir, opts)
    return examples, opts.skipped, len(getattr(opts, "excluded", []))


def subsample(items: list[Any], n: int | None, seed: int) -> list[Any]:
    """A random subset of ``n`` items in their original order (all of them when ``n`` is None or larger)."""
    if n is None or n >= len(items):
        return items
    keep = sorted(random.Random(seed).sample(range(len(items)), n))
    return [items[i] for i in keep]


# --------------------------------------------------------------------------------------------- prediction


@torch.no_grad()
def predict(
    model: FinetuneModel,
    encoded: list[Any],
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    regression: bool = False,
) -> tuple[list[Any], list[list[float]]]:
    """Predictions (class/answer index or score) and raw head outputs, in the order of ``encoded``."""
    from gptcli.data.batching import iterate
    from gptcli.runtime import autocast

    model.eval()
    preds: list[Any] = [None] * len(encoded)
    outs: list[list[float]] = [[] for _ in encoded]
    pos = {e.index: i for i, e in enumerate(encoded)}
    for batch in iterate(encoded, batch_size, shuffle=False, regression=regression):
        b = batch.to(device)
        with autocast(device, precision):  # type: ignore[arg-type]
            out, _ = model(b.ids, b.n_seqs)
        p = model.head.predict(out).cpu().tolist()
        o = out.float().cpu()
        o = o.unsqueeze(-1) if o.dim() == 1 else o
        for k, idx in enumerate(batch.index.tolist()):
            preds[pos[idx]] = p[k]
            outs[pos[idx]] = [round(v, 6) for v in o[k].tolist()]
    return preds, outs


# --------------------------------------------------------------------------------------------- training


@dataclass
class FinetuneResult:
    run_dir: Path
    checkpoint: Path
    results: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)


def _seed_everything(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def finetune(config: FinetuneConfig, console: Any | None = None, on_epoch: Callable[[dict], None] | None = None) -> FinetuneResult:
    """Run one fine-tuning job as configured; returns where the checkpoint and results went."""
    from gptcli.data.batching import bucketed_batches, collate, num_batches
    from gptcli.model.losses import lm_loss_per_sequence
    from gptcli.checkpoint import save_checkpoint
    from gptcli.config import save_config, to_dict
    from gptcli.model.heads import HeadConfig, TaskHead
    from gptcli.train.optim import lr_at, make_optimizer
    from gptcli.train.runlog import METRICS, RunLogger
    from gptcli.runtime import configure_backends, resolve_device, resolve_precision
    from gptcli.eval.tasks import score_predictions
    from gptcli.tasks import get_task
    from gptcli.train.trainer import Trainer
    from gptcli.data.transforms import encode_examples

    _check_config(config)
    task = get_task(config.task)
    out = Path(config.out)
    final_dir = out / "checkpoints" / FINAL
    if final_dir.exists() and not config.overwrite:
        raise GPT1Error(f"{out}: already holds a fine-tuned checkpoint (pass --overwrite to replace it)")
    device = resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    configure_backends(device)

    # Data first: a missing or malformed file should fail before any weights are loaded.
    train_ex, skipped, excluded = read_split(task, config.train_split, config)
    unlabeled = sum(e.label is None for e in train_ex)
    if unlabeled:
        raise GPT1Error(f"{task.name}: split {config.train_split!r} has {unlabeled} unlabeled rows; cannot train on it")
    dev_ex: list[Any] = []
    if config.eval_split:
        dev_ex, dev_skipped, dev_excluded = read_split(task, config.eval_split, config)
        skipped += dev_skipped
        excluded += dev_excluded
        if any(e.label is None for e in dev_ex):
            raise GPT1Error(f"{task.name}: split {config.eval_split!r} is unlabeled; choose a labeled --eval-split")
    train_ex = subsample(train_ex, config.max_train_examples, config.seed)
    dev_ex = subsample(dev_ex, config.max_eval_examples, config.seed + 1)
    if not train_ex:
        raise GPT1Error(f"{task.name}: no training examples in split {config.train_split!r}")

    _seed_everything(config.seed)
    gpt, tok, source = build_body(config)
    n_ctx = min(config.n_ctx or gpt.config.n_ctx, gpt.config.n_ctx)
    train_enc = encode_examples(task, train_ex, tok, n_ctx)
    dev_enc = encode_examples(task, dev_ex, tok, n_ctx) if dev_ex else []

    head_cfg = HeadConfig(kind=task.kind, n_embd=gpt.config.n_embd, n_labels=max(1, len(task.labels)),
                          extract_id=tok.extract_id, pdrop=config.clf_pdrop, init_std=gpt.config.init_std)
    head = TaskHead(head_cfg)
    model = FinetuneModel(gpt, head).to(device)
    regression = task.kind == "regression"

    steps_per_epoch = num_batches(len(train_enc), config.batch_size)
    total = steps_per_epoch * config.epochs
    warmup_steps = math.ceil(config.warmup * total) if config.warmup > 0 else 0
    optimizer = make_optimizer(model, config.lr, config.weight_decay, decay=config.decay)
    parts: dict[str, list[float]] = {"clf_loss": [], "lm_loss": []}  # per micro-batch, reset every update
    lm_weight = config.lm_weight

    def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
        out_, hidden = m(batch.ids, batch.n_seqs)
        clf = m.head.loss(out_, batch.labels)
        parts["clf_loss"].append(float(clf.detach()))
        if lm_weight == 0:
            return clf
        lm = lm_loss_per_sequence(hidden, batch.ids, batch.mask, m.gpt.lm_logits).mean()
        parts["lm_loss"].append(float(lm.detach()))
        return clf + lm_weight * lm

    trainer = Trainer(model, optimizer, loss_fn, lambda s: lr_at(s, total, config.lr, warmup_steps, config.schedule),
                      device=device, precision=precision, grad_clip=config.grad_clip or None)

    out.mkdir(parents=True, exist_ok=True)
    if config.overwrite and (out / METRICS).exists():
        (out / METRICS).unlink()
    save_config(config, out / "config.toml")
    logger = RunLogger(out)
    metric = task.metric
    history: list[dict[str, Any]] = []
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    rng = random.Random(config.seed)
    step = 0
    tokens, window_tokens = 0, 0
    t0 = t_log = time.perf_counter()
    eval_bs = config.eval_batch_size or 2 * config.batch_size
    micro = config.micro_batch_size or config.batch_size
    progress = _progress(console, config.progress and console is not None)
    try:
        with progress:
            bar = progress.add_task(f"{task.name}", total=total, info="")
            for epoch in range(1, config.epochs + 1):
                run_loss, run_n = 0.0, 0
                lengths = [e.length for e in train_enc]
                for idx in bucketed_batches(lengths, config.batch_size, shuffle=True, rng=rng):
                    mbs = [collate([train_enc[i] for i in idx[j : j + micro]], regression).to(device)
                           for j in range(0, len(idx), micro)]
                    for v in parts.values():
                        v.clear()
                    res = trainer.step(step, mbs)
                    comp = {k: sum(v) / len(v) for k, v in parts.items() if v}
                    if not math.isfinite(res.loss):
                        raise GPT1Error(f"{task.name}: the loss became {res.loss} at update {step + 1}; "
                                        "lower --lr or use --precision fp32")
                    step += 1
                    n_tok = sum(mb.tokens for mb in mbs)
                    tokens += n_tok
                    window_tokens += n_tok
                    run_loss += res.loss
                    run_n += 1
                    if step % config.log_every == 0 or step == total:
                        now = time.perf_counter()
                        logger.log({"kind": "train", "step": step, "epoch": epoch, "loss": run_loss / run_n,
                                    **comp, "lr": res.lr, "grad_norm": res.grad_norm, "tokens": tokens,
                                    "tokens_per_s": round(window_tokens / max(now - t_log, 1e-9), 1),
                                    "elapsed_s": round(now - t0, 3)})
                        run_loss, run_n, window_tokens, t_log = 0.0, 0, 0, now
                    progress.update(bar, advance=1, info=f"epoch {epoch}/{config.epochs} loss {res.loss:.4f} lr {res.lr:.2e}")
                record: dict[str, Any] = {"kind": "eval", "step": step, "epoch": epoch, "split": config.eval_split}
                if dev_enc:
                    preds, _ = predict(model, dev_enc, eval_bs, device, precision, regression)
                    scores = score_predictions(task, preds, dev_ex)
                    record.update(scores)
                    value = scores[metric]
                    # Strictly better only: on ties the earlier epoch stays (as the released code's `>`).
                    if config.select == "best" and (best is None or value > best[0]):
                        best = (value, epoch, _cpu_state(model) if epoch < config.epochs else {})
                    progress.update(bar, info=f"epoch {epoch}/{config.epochs} dev {metric} {value:.2f}")
                logger.log(record)
                history.append(record)
                t_log, window_tokens = time.perf_counter(), 0  # evaluation time is not training throughput
                if on_epoch:
                    on_epoch(record)
    finally:
        logger.close()

    chosen_epoch = config.epochs
    if config.select == "best" and best is not None and best[1] != config.epochs:
        model.load_state_dict(best[2])
        chosen_epoch = best[1]
    chosen = next((h for h in history if h["epoch"] == chosen_epoch), {})
    dev_scores = {k: v for k, v in chosen.items() if k not in ("kind", "step", "epoch", "split")}
    meta = {
        "task": task.name,
        "kind": task.kind,
        "labels": list(task.labels),
        "head": head_cfg.to_dict(),
        "n_ctx": n_ctx,
        "epoch": chosen_epoch,
        "step": chosen.get("step", step),
        "select": config.select,
        "dev_split": config.eval_split,
        "dev_scores": dev_scores,
        "finetune_config": to_dict(config),
        **source,
    }
    model.cpu()
    ckpt = save_checkpoint(final_dir, model.gpt, tok, kind="finetuned", meta=meta, head_state=model.head.state_dict())
    results = {
        "task": task.name,
        "title": task.title,
        "split": config.eval_split,
        "metric": metric,
        "paper_score": task.paper_score,
        "scores": dev_scores,
        "epoch": chosen_epoch,
        "select": config.select,
        "checkpoint": str(ckpt),
        "n_train": len(train_ex),
        "n_eval": len(dev_ex),
        "skipped_rows": skipped,
        "excluded_rows": excluded,
        "history": history,
        "steps": step,
        "elapsed_s": round(time.perf_counter() - t0, 3),
        "config": to_dict(config),
    }
    _write_json(out / RESULTS, results)
    return FinetuneResult(out, ckpt, results, history)


def _check_config(c: FinetuneConfig) -> None:
    if not c.task:
        raise GPT1Error("no task given (--task NAME; see --list-tasks)")
    if c.micro_batch_size is not None and c.micro_batch_size <= 0:
        raise GPT1Error(f"micro_batch_size must be positive, got {c.micro_batch_size}")
    for name in ("lr", "batch_size", "epochs"):
        if getattr(c, name) <= 0:
            raise GPT1Error(f"{name} must be positive, got {getattr(c, name)}")
    if not 0 <= c.warmup < 1:
        raise GPT1Error(f"warmup is a fraction of the updates in [0, 1), got {c.warmup}")
    if c.lm_weight < 0:
        raise GPT1Error(f"lm_weight must be ≥ 0, got {c.lm_weight}")
    if not 0 <= c.clf_pdrop < 1:
        raise GPT1Error(f"clf_pdrop must be in [0, 1), got {c.clf_pdrop}")
    if c.init.lower() == "none" and not c.tokenizer:
        raise GPT1Error("--init none needs --tokenizer DIR (a tokenizer directory or a checkpoint) to encode the task")
    if c.transfer_layers is not None and c.init.lower() == "none":
        raise GPT1Error("--transfer-layers needs a pretrained --init checkpoint (with --init none nothing is transferred)")


def _cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)


class _NoProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, *a, **k):
        return 0

    def update(self, *a, **k):
        pass


def _progress(console: Any, enabled: bool):
    if not enabled:
        return _NoProgress()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console, transient=False,
    )

