"""The GPT-1 paper's findings at the scale of a 2-core CPU: ``python experiments/cpu_reproduction.py --out runs/repro``.

What it runs (docs/reproduction.md explains each stage and how to read the outputs):

1. **prepare** — the 56 Project Gutenberg books in ``DATA/books`` (a BooksCorpus stand-in): Gutenberg headers and
   licence footers stripped, the paper's text pipeline, a 4,096-id learned BPE (GPT-1: 40,478); 4 % of the books
   (whole books) are the validation split.
2. **pretrain** — a small post-LN GPT (the paper's architecture, shrunk) for its share of the budget; a checkpoint
   every ``1/checkpoints`` of the run (all kept) and a validation loss every ``1/val_points`` → the validation
   perplexity curve. The model before any update is saved too (step 0).
3. **zeroshot** — the paper's zero-shot heuristics (Figure 2 right) for SST-2, CoLA, DPRD and Story Cloze at every
   checkpoint, step 0 included (DPRD: its train file, the only one available here).
4. **finetune** — SST-2, CoLA, RTE, MRPC, STS-B and Story Cloze in three variants (paper Table 5): ``full``
   (pretrained, auxiliary LM λ = 0.5), ``no-pretraining`` (``init = none``: the same shape, random weights, λ = 0.5),
   ``no-aux-lm`` (pretrained, λ = 0) × ``seeds`` seeds. Large training sets are subsampled (seeded, per run) to
   the sizes in ``TRAIN_EXAMPLES`` scaled by the budget; the sizes used are recorded. Scores are on each task's
   dev split (Story Cloze: the released code's 374-story dev split of the 2016 validation file), always the
   last epoch's (``select = last``: picking the best epoch on the split we report would flatter every variant).
5. **layers** — the layers-transferred curve (Figure 2 left) on ``layers_task``: ``transfer_layers = 0..L``.
6. **report** — ``results.json``, ``tables.md`` (mean ± std over seeds, every run listed, the paper's numbers
   alongside) and ``plots/*.png``. Always rebuilt from what is on disk.

Every stage skips work whose outputs exist (a fine-tuning run with its ``results.json``, the zero-shot curve
with its ``curve.json``...), and pretraining resumes from its newest checkpoint, so an interrupted run continues
where it stopped: rerun the same command. The plan (number of pretraining updates, subsample sizes) is fixed in
``plan.json`` the first time and reused, so a continued run is the run that was planned.

Model and optimiser choice (short probes, 2026-11-30, this 2-core machine, 4,096-id BPE on the books, batches of
16 × 128 tokens, 250 updates each; PROBES below has the numbers):

  The quickstart found that a post-LN 3 × 192 model with GPT-1's N(0, 0.02) initialisation sits at the unigram
  loss (≈ 6.1 nats) for 1,300+ updates at several learning rates, while 1 layer or init_std 0.06 leaves it within
  100-300 updates. PROBES below records what was tried here and what it gave; the defaults are the best of them.
  Dropout is off (GPT-1: 0.1): the run sees its corpus about once, so there is nothing to regularise yet.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Probes run to choose the model (see the module docstring), as measured.
# Each: 4 × 192 post-LN (4 heads, 768 inner, no dropout), 250 updates of 16 × 128 tokens, 50 warm-up updates then a
# constant rate, fp32, 2 threads, one after another on an otherwise idle machine. "loss" = training loss at update
# 250 (the unigram loss of this corpus is ≈ 6.3-6.4 nats); "val" = validation loss on 8 batches.
#   A  init_std 0.02 (GPT-1), lr 2e-3: 6.64 → 6.43 (50) → 6.39 (250); val 6.31  — stuck at the unigram loss
#   B  init_std 0.06,         lr 2e-3: 6.55 → 6.14 (100) → 5.44 (250); val 5.41  — escapes by update ~75
#   C  init_std 0.06,         lr 1e-3: 6.95 → 6.10 (100) → 5.38 (250); val 5.36  — escapes, best of the three
# ≈ 0.28-0.31 s per update (7.6k tokens/s). Chosen: C (init_std 0.06, lr 1e-3), 4 layers so the layers-transferred
# curve has 5 points. Command: see docs/reproduction.md ("How the model was chosen").
PROBES: dict[str, dict[str, Any]] = {
    "A": {"init_std": 0.02, "lr": 2e-3, "updates": 250, "train_loss": 6.39, "val_loss": 6.31, "s_per_update": 0.28},
    "B": {"init_std": 0.06, "lr": 2e-3, "updates": 250, "train_loss": 5.44, "val_loss": 5.41, "s_per_update": 0.315},
    "C": {"init_std": 0.06, "lr": 1e-3, "updates": 250, "train_loss": 5.38, "val_loss": 5.36, "s_per_update": 0.308},
}

TASKS: tuple[str, ...] = ("sst2", "cola", "rte", "mrpc", "stsb", "storycloze")
GLUE_TASKS: tuple[str, ...] = ("sst2", "cola", "rte", "mrpc", "stsb")
ZEROSHOT_TASKS: tuple[str, ...] = ("sst2", "cola", "dprd", "storycloze")
VARIANTS: tuple[str, ...] = ("full", "no-pretraining", "no-aux-lm")
METRIC: dict[str, str] = {"sst2": "accuracy", "cola": "mcc", "rte": "accuracy", "mrpc": "f1", "stsb": "pearson",
                          "storycloze": "accuracy"}
# Training examples per fine-tuning run at a 60-minute budget (scaled linearly with the budget, capped by the
# split's size). SST-2 (67k), CoLA (8.5k), STS-B (5.7k) are subsampled; RTE (2.5k, long pairs), MRPC (3.7k,
# two sequences per example) too; Story Cloze's 1,497 training stories are kept whole.
# Measured cost here (4 × 192 model, one epoch at these sizes, dev scoring included): SST-2 7.7 s, CoLA 3.9 s,
# RTE ≈ 7 s, MRPC ≈ 13 s, STS-B ≈ 13 s (its 1,500 dev pairs), Story Cloze ≈ 12 s → ≈ 3 min per variant and seed.
TRAIN_EXAMPLES: dict[str, int] = {"sst2": 1500, "cola": 1500, "rte": 500, "mrpc": 500, "stsb": 800,
                                  "storycloze": 600}

# The paper's numbers (reference §6): Table 5 ablations and the single-model results. Story Cloze has no
# ablation numbers in the paper.
PAPER: dict[str, dict[str, float | None]] = {
    "full": {"cola": 45.4, "sst2": 91.3, "mrpc": 82.3, "stsb": 82.0, "rte": 56.0, "storycloze": 86.5},
    "no-pretraining": {"cola": 18.9, "sst2": 84.0, "mrpc": 79.4, "stsb": 30.9, "rte": 53.8, "storycloze": None},
    "no-aux-lm": {"cola": 47.9, "sst2": 92.0, "mrpc": 84.9, "stsb": 83.2, "rte": 54.4, "storycloze": None},
}


@dataclass
class ReproConfig:
    """Every setting of the reproduction. ``--smoke`` replaces the sizes by tiny ones (see :func:`smoke`)."""

    out: Path = Path("runs/cpu-reproduction")
    """Output directory (everything goes here; rerun with the same --out to continue)."""
    data: Path = Path("../shared/data")
    """Root of the real data: books/, glue/, storycloze/, dprd/ (MANIFEST.md)."""
    budget_minutes: float = 60.0
    """Wall-clock target for the whole run on 2 CPU cores; pretraining gets ``pretrain_share`` of it."""
    seeds: int = 3
    """Fine-tuning seeds per (task, variant)."""
    pretrain_share: float = 0.45
    """Share of the budget spent pretraining. The rest, measured at the default sizes: prepare ≈ 0.5 min, zero-shot
    ≈ 23 s per checkpoint (9 → 3.4 min), fine-tuning ≈ 3 min per variant and seed (9 → ≈ 25 min), layers ≈ 2 min."""
    books: int | None = None
    """Use only the N smallest books (smoke tests); None = all 56."""
    vocab_size: int = 4096
    """Learned BPE ids (GPT-1: 40,478; a CPU-sized softmax)."""
    val_fraction: float = 0.04
    """Share of the books held out for validation (whole books)."""
    model: dict[str, Any] = field(default_factory=lambda: {
        "n_layer": 4, "n_embd": 192, "n_head": 4, "n_inner": 768, "n_ctx": 128,
        "embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0, "init_std": 0.06})
    """Overrides of the ``tiny`` preset; chosen by the probes in PROBES."""
    seq_len: int = 128
    batch_size: int = 16
    lr: float = 1e-3
    """Peak pretraining learning rate (GPT-1: 2.5e-4 for 117M parameters; small models take larger ones; PROBES)."""
    pretrain_steps: int | None = None
    """Fixed number of updates instead of filling the budget share."""
    checkpoints: int = 8
    """Pretraining checkpoints along the run (the zero-shot curve's points, plus step 0)."""
    val_points: int = 20
    """Validations along the run (the perplexity curve)."""
    eval_batches: int = 24
    """Validation batches per point (24 × 16 × 128 = 49k tokens)."""
    finetune_lr: float = 5e-4
    """Fine-tuning peak learning rate (GPT-1: 6.25e-5; again, small models take larger ones)."""
    finetune_epochs: int = 3
    finetune_batch_size: int = 32
    lm_weight: float = 0.5
    """λ of the auxiliary LM loss in the ``full`` and ``no-pretraining`` variants (paper: 0.5)."""
    train_examples: dict[str, int] = field(default_factory=lambda: dict(TRAIN_EXAMPLES))
    """Training examples per run at a 60-minute budget (scaled by budget_minutes / 60)."""
    max_eval_examples: int | None = None
    """Cap on dev examples scored (None = the whole dev split)."""
    layers_task: str = "sst2"
    """Task of the layers-transferred curve (the paper used MultiNLI and RACE, not available here)."""
    layers_seeds: int = 3
    """Seeds per point of the layers-transferred curve (a point is a fine-tuning comparison too: one seed cannot
    tell a trend from seed noise)."""
    zeroshot_limit: int | None = None
    """Examples per zero-shot split (None = all; the CoLA threshold fit uses the same cap)."""
    device: str = "cpu"
    threads: int = 2
    """torch threads (this machine: 2 cores)."""


def smoke(cfg: ReproConfig) -> ReproConfig:
    """The same pipeline at a size that finishes in about a minute (tests; checking the script, not the paper)."""
    cfg.books = 2
    cfg.vocab_size = 400
    cfg.model = {**cfg.model, "n_layer": 2, "n_embd": 32, "n_head": 2, "n_inner": 64, "n_ctx": 64}
    cfg.seq_len = 64
    cfg.pretrain_steps = 30
    cfg.checkpoints = 3
    cfg.val_points = 3
    cfg.eval_batches = 2
    cfg.finetune_epochs = 1
    cfg.train_examples = {t: 24 for t in TASKS}
    cfg.max_eval_examples = 24
    cfg.zeroshot_limit = 24
    cfg.layers_seeds = 1
    return cfg


# ------------------------------------------------------------------------------------------------- helpers


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def write_json(path: Path, obj: Any) -> None:
    """Atomic write (a crash never leaves a half-written file that a rerun would take as done)."""
    from gptcli.fsutil import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")


def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value); NaN-free input expected."""
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


# Two-sided 5 % critical values of Student's t for 1-30 degrees of freedom (to read Welch's t without scipy).
T975: tuple[float, ...] = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
                           2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
                           2.052, 2.048, 2.045, 2.042)


def t_critical(df: int, conservative: bool = True) -> float:
    """The 5 % two-sided critical t for ``df`` ≥ 1; past 30, 2.042 if ``conservative`` else the normal's 1.960."""
    return T975[df - 1] if df <= len(T975) else (T975[-1] if conservative else 1.960)


def welch_t(a: list[float], b: list[float]) -> float | None:
    """Welch's t of mean(a) − mean(b); None when either side has under 2 values or both have no spread."""
    if len(a) < 2 or len(b) < 2:
        return None
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    return (statistics.fmean(a) - statistics.fmean(b)) / se if se > 0 else None


def fmt(m: float, s: float | None = None, n: int | None = None) -> str:
    if m is None or (isinstance(m, float) and math.isnan(m)):
        return "–"
    text = f"{m:.1f}"
    if s is not None and n and n > 1:
        text += f" ± {s:.1f}"
    return text


# ------------------------------------------------------------------------------------------------- stages


def stage_prepare(cfg: ReproConfig, out: Path) -> Path:
    from gptcli.data.prepare import PrepareConfig, prepare

    corpus = out / "corpus"
    if (corpus / "manifest.json").is_file():
        log("prepare: done already, skipped")
        return corpus
    books = sorted((cfg.data / "books").glob("*.txt"))
    if not books:
        sys.exit(f"{cfg.data / 'books'}: no .txt books found (pass --data, the folder of MANIFEST.md)")
    if cfg.books is not None:
        books = sorted(books, key=lambda p: p.stat().st_size)[: cfg.books]
    t0 = time.perf_counter()
    res = prepare(PrepareConfig(inputs=[str(p) for p in books], out=corpus, vocab_size=cfg.vocab_size,
                                strip_gutenberg=True, val_fraction=cfg.val_fraction, seed=0, workers=cfg.threads,
                                sample_lines=300_000, overwrite=True))
    st = res.manifest["splits"]
    log(f"prepare: {len(books)} books → {st['train']['tokens']:,} train / {st['val']['tokens']:,} val tokens "
        f"({time.perf_counter() - t0:.0f} s)")
    return corpus


def _pretrain_config(cfg: ReproConfig, out: Path, corpus: Path, steps: int):
    from gptcli.train.pretrain import PretrainConfig

    # Intervals rounded up: ``checkpoints`` saves in all with the final one, not an extra one a few updates before it.
    return PretrainConfig(data=corpus, out=out / "pretrain", preset="tiny", model=dict(cfg.model),
                          seq_len=cfg.seq_len, batch_size=cfg.batch_size, lr=cfg.lr, seed=0, device=cfg.device,
                          precision="fp32", max_steps=steps, epochs=1000.0, warmup_steps=max(1, steps // 20),
                          eval_every=-(-steps // cfg.val_points), eval_batches=cfg.eval_batches,
                          save_every=-(-steps // cfg.checkpoints), keep_last=0, log_every=max(1, steps // 50),
                          resume=True)


def stage_plan(cfg: ReproConfig, out: Path, corpus: Path) -> dict[str, Any]:
    """Number of pretraining updates and subsample sizes, fixed on first run (plan.json) and reused after."""
    path = out / "plan.json"
    if path.is_file():
        return read_json(path)
    import torch

    from gptcli.data.shards import open_corpus
    from gptcli.model.gpt import GPT
    from gptcli.pipelines import budget
    from gptcli.train.pretrain import build_model_config

    oc = open_corpus(corpus)
    mcfg = build_model_config(_pretrain_config(cfg, out, corpus, 1), oc.tokenizer.vocab_size)
    step_s = budget.time_update(mcfg, cfg.seq_len, cfg.batch_size, torch.device("cpu"), "fp32")
    # A timed update is ≈ 10 % faster than one inside the run (data loading, logging: 267 vs 294 ms measured), and
    # each validation costs about a third of an update per batch (forward only).
    share_s = 60 * cfg.budget_minutes * cfg.pretrain_share - cfg.val_points * cfg.eval_batches * step_s / 3
    steps = cfg.pretrain_steps or budget.updates_that_fit(share_s, step_s, minimum=50, slowdown=1.1)
    scale = cfg.budget_minutes / 60.0 if cfg.pretrain_steps is None else 1.0
    train_tokens = oc.manifest["splits"]["train"]["tokens"]
    plan = {"pretrain_steps": steps, "update_ms": round(1000 * step_s, 1), "train_tokens": train_tokens,
            "epochs": round(budget.epochs(steps, cfg.batch_size, cfg.seq_len, train_tokens), 2),
            "params": sum(p.numel() for p in GPT(mcfg).parameters()),
            "train_examples": {t: max(8, int(n * scale)) for t, n in cfg.train_examples.items()}}
    write_json(path, plan)
    log(f"plan: {step_s * 1000:.0f} ms per update → {steps} pretraining updates ({plan['epochs']} epochs); "
        f"fine-tuning subsamples {plan['train_examples']}")
    return plan


def stage_pretrain(cfg: ReproConfig, out: Path, corpus: Path, plan: dict[str, Any]) -> Path:
    import torch

    from gptcli.checkpoint import is_checkpoint, save_checkpoint
    from gptcli.eval.perplexity import evaluate_lm
    from gptcli.model.gpt import GPT
    from gptcli.train.pretrain import build_model_config, pretrain
    from gptcli.data.shards import open_corpus

    run = out / "pretrain"
    done = out / "pretrain-done.json"
    init = out / "pretrain-init"
    pc = _pretrain_config(cfg, out, corpus, plan["pretrain_steps"])
    if not is_checkpoint(init):
        oc = open_corpus(corpus)
        torch.manual_seed(pc.seed)  # the same initial weights pretrain() draws
        model = GPT(build_model_config(pc, oc.tokenizer.vocab_size))
        ev = evaluate_lm(model, oc.arrays("val"), cfg.seq_len, cfg.batch_size, device="cpu", precision="fp32",
                         max_batches=cfg.eval_batches)
        save_checkpoint(init, model, oc.tokenizer, meta={"step": 0, "val_loss": ev.loss})
    if done.is_file():
        log("pretrain: done already, skipped")
        return run
    t0 = time.perf_counter()
    res = pretrain(pc)
    if res.stopped_by or res.final_val_loss is None:
        sys.exit(f"{run}: pretraining stopped ({res.stopped_by or 'no validation split'}); rerun to resume")
    write_json(done, {"step": res.step, "final_val_loss": res.final_val_loss, "seconds": round(time.perf_counter() - t0, 1)})
    log(f"pretrain: {res.step} updates, validation perplexity {math.exp(res.final_val_loss):.1f}")
    return run


def stage_zeroshot(cfg: ReproConfig, out: Path, run: Path) -> None:
    from gptcli.eval.zeroshot import ZeroShotConfig
    from gptcli.eval.curve import run_curve

    zs = out / "zeroshot"
    if (zs / "curve.json").is_file():
        log("zeroshot: done already, skipped")
        return
    t0 = time.perf_counter()
    zc = ZeroShotConfig(task=",".join(ZEROSHOT_TASKS), data_dir=str(cfg.data), out=str(zs), splits={"dprd": "train"},
                        limit=cfg.zeroshot_limit, precision="fp32", device=cfg.device, batch_size=64)
    curve = run_curve(zc, [out / "pretrain-init", run])
    if curve.skipped:
        log(f"zeroshot: skipped tasks {curve.skipped}")
    log(f"zeroshot: {len(curve.points)} checkpoints × {len(curve.tasks)} tasks ({time.perf_counter() - t0:.0f} s)")


def _finetune_one(cfg: ReproConfig, run_dir: Path, task: str, seed: int, init: str, tokenizer: str | None,
                  lm_weight: float, n_train: int, transfer: int | None = None) -> dict[str, Any]:
    from gptcli.train.finetune import FinetuneConfig, finetune

    results = run_dir / "results.json"
    if results.is_file():
        return read_json(results)
    fc = FinetuneConfig(task=task, init=init, tokenizer=tokenizer, out=str(run_dir), lr=cfg.finetune_lr,
                        batch_size=cfg.finetune_batch_size, epochs=cfg.finetune_epochs, warmup=0.05, seed=seed,
                        # What the recorded results were measured with (before the defaults became the released
                        # code's random batches and warmup_linear): kept so that they stay reproducible.
                        batching="length", schedule="linear",
                        lm_weight=lm_weight, transfer_layers=transfer, select="last", n_ctx=cfg.model.get("n_ctx"),
                        max_train_examples=n_train, max_eval_examples=cfg.max_eval_examples, device=cfg.device,
                        precision="fp32", overwrite=True)
    return finetune(fc).results


def stage_finetune(cfg: ReproConfig, out: Path, run: Path, plan: dict[str, Any]) -> None:
    from gptcli.checkpoint import resolve_checkpoint

    final = str(resolve_checkpoint(run))  # the run's newest (= final) checkpoint
    for task in TASKS:
        for variant in VARIANTS:
            for seed in range(cfg.seeds):
                d = out / "finetune" / task / variant / f"seed-{seed}"
                if (d / "results.json").is_file():
                    continue
                t0 = time.perf_counter()
                init, tok = ("none", final) if variant == "no-pretraining" else (final, None)
                lam = 0.0 if variant == "no-aux-lm" else cfg.lm_weight
                r = _finetune_one(cfg, d, task, seed, init, tok, lam, plan["train_examples"][task])
                log(f"finetune {task:10s} {variant:14s} seed {seed}: {METRIC[task]} "
                    f"{r['scores'].get(METRIC[task], float('nan')):.1f} (n_train {r['n_train']}, "
                    f"{time.perf_counter() - t0:.0f} s)")


def stage_layers(cfg: ReproConfig, out: Path, run: Path, plan: dict[str, Any]) -> None:
    from gptcli.checkpoint import resolve_checkpoint

    task, final = cfg.layers_task, str(resolve_checkpoint(run))
    for k in range(int(cfg.model["n_layer"]) + 1):
        for seed in range(cfg.layers_seeds):
            d = out / "layers" / task / f"k-{k}" / f"seed-{seed}"
            if (d / "results.json").is_file():
                continue
            t0 = time.perf_counter()
            r = _finetune_one(cfg, d, task, seed, final, None, cfg.lm_weight, plan["train_examples"][task], k)
            log(f"layers {task} transfer {k} seed {seed}: {METRIC[task]} "
                f"{r['scores'].get(METRIC[task], float('nan')):.1f} ({time.perf_counter() - t0:.0f} s)")


# ------------------------------------------------------------------------------------------------- report


def collect_runs(out: Path) -> list[dict[str, Any]]:
    """One record per finished fine-tuning run under ``out/finetune`` and ``out/layers`` (every run, none left out)."""
    recs: list[dict[str, Any]] = []
    for res in sorted((out / "finetune").glob("*/*/seed-*/results.json")):
        task, variant = res.parent.parent.parent.name, res.parent.parent.name
        recs.append(_record(read_json(res), task, variant, int(res.parent.name.split("-")[1]), None))
    for res in sorted((out / "layers").glob("*/k-*/seed-*/results.json")):
        task, k = res.parent.parent.parent.name, int(res.parent.parent.name.split("-")[1])
        recs.append(_record(read_json(res), task, "layers", int(res.parent.name.split("-")[1]), k))
    return recs


def _record(r: dict[str, Any], task: str, variant: str, seed: int, transfer: int | None) -> dict[str, Any]:
    metric = METRIC.get(task, r.get("metric", ""))
    score = r.get("scores", {}).get(metric)
    return {"task": task, "variant": variant, "seed": seed, "transfer_layers": transfer, "metric": metric,
            "score": score if isinstance(score, (int, float)) and math.isfinite(score) else None,
            "n_train": r.get("n_train"), "n_eval": r.get("n_eval"), "epoch": r.get("epoch"),
            "steps": r.get("steps"), "seconds": r.get("elapsed_s")}


def aggregate(recs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{variant: {task: {mean, std, n, scores}}}`` over seeds, for the Table 5 variants."""
    agg: dict[str, dict[str, dict[str, Any]]] = {}
    for r in recs:
        if r["variant"] not in VARIANTS:
            continue
        cell = agg.setdefault(r["variant"], {}).setdefault(r["task"], {"scores": [], "failed": 0})
        if r["score"] is None:
            cell["failed"] += 1
        else:
            cell["scores"].append(r["score"])
    for tasks in agg.values():
        for cell in tasks.values():
            cell["mean"], cell["std"] = mean_std(cell["scores"])
            cell["n"] = len(cell["scores"])
    return agg


def layers_curve(recs: list[dict[str, Any]]) -> dict[int, tuple[float, float, int]]:
    by_k: dict[int, list[float]] = {}
    for r in recs:
        if r["variant"] == "layers" and r["score"] is not None:
            by_k.setdefault(r["transfer_layers"], []).append(r["score"])
    return {k: (*mean_std(v), len(v)) for k, v in sorted(by_k.items())}


def majority_baselines() -> dict[str, float | None]:
    """Dev score of always predicting the most frequent training label (Story Cloze: the most frequent right ending).

    The floor every fine-tuned score is read against: a run can be well above chance accuracy and still only say
    "majority class" (MRPC's F1 of always answering "paraphrase" is ≈ 81). STS-B has none (a constant prediction
    has no Pearson correlation): None. Files are found under ``$GPT1_DATA`` (main() sets it, as fine-tuning reads
    them there too); a task whose files are missing is left out. The levels are :mod:`gptcli.eval.baselines`'s, the
    same ``gpt1 finetune`` and ``gpt1 eval`` put beside every score.
    """
    from gptcli.errors import GPT1Error
    from gptcli.eval.baselines import baseline_of
    from gptcli.tasks import get_task

    out: dict[str, float | None] = {}
    for name in TASKS:
        task = get_task(name)
        try:
            train, dev = task.read("train"), task.read("dev")
        except GPT1Error:  # missing files only drop this baseline cell
            continue
        base = baseline_of(task, train, dev) or {}
        out[name] = (base.get("majority") or {}).get(METRIC[name])
    return out


def sst2_margin_auc(zs_dir: Path) -> dict[int, float]:
    """Per checkpoint step: ROC AUC of log p(positive) − log p(negative) against the SST-2 labels.

    The heuristic's accuracy thresholds that margin at 0; a small model's margin can sit on one side of 0 for every
    sentence (accuracy = the majority share) and still order the sentences by sentiment, or not. AUC asks that,
    threshold-free: 0.5 = no signal.
    """
    curve = zs_dir / "curve.json"
    if not curve.is_file():
        return {}
    out: dict[int, float] = {}
    for point in read_json(curve)["points"]:
        path = zs_dir / Path(point["checkpoint"]).name / "predictions-sst2.jsonl"  # run_curve's layout
        if not path.is_file():
            continue
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        pos = [r["logprob_positive"] - r["logprob_negative"] for r in rows if int(r["label"]) == 1]
        neg = [r["logprob_positive"] - r["logprob_negative"] for r in rows if int(r["label"]) == 0]
        if pos and neg:
            out[int(point["step"])] = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))
    return out


def markdown_tables(recs: list[dict[str, Any]], agg: dict, meta: dict[str, Any]) -> str:
    """The Markdown report: Table 5 at small scale (ours, mean ± std, then the paper's), differences, every run."""
    lines: list[str] = []
    cols = list(TASKS)
    head = "| variant | " + " | ".join(f"{t} ({METRIC[t]})" for t in cols) + " | GLUE-5 avg |"
    sep = "|---|" + "---|" * (len(cols) + 1)
    lines += ["## Table 5 at CPU scale (dev splits; mean ± sample std over seeds)", "", head, sep]
    for v in VARIANTS:
        cells = agg.get(v, {})
        row = [fmt(cells[t]["mean"], cells[t]["std"], cells[t]["n"]) if t in cells and cells[t]["n"] else "–" for t in cols]
        glue = [cells[t]["mean"] for t in GLUE_TASKS if t in cells and cells[t]["n"]]
        avg = fmt(statistics.fmean(glue)) if len(glue) == len(GLUE_TASKS) else "–"
        lines.append(f"| {v} (ours) | " + " | ".join(row) + f" | {avg} |")
    base = meta.get("baselines") or {}
    if base:
        row = [fmt(base[t]) if base.get(t) is not None else "–" for t in cols]
        lines.append("| majority class (ours) | " + " | ".join(row) + " | – |")
    for v in VARIANTS:
        p = PAPER[v]
        glue = [p[t] for t in GLUE_TASKS]
        avg = fmt(statistics.fmean(glue)) if all(x is not None for x in glue) else "–"
        lines.append(f"| {v} (paper) | " + " | ".join(fmt(p[t]) if p[t] is not None else "–" for t in cols) + f" | {avg} |")
    uneven = [f"{v}/{t}: {agg[v][t]['n']}" for v in VARIANTS for t in cols
              if t in agg.get(v, {}) and agg[v][t]["n"] != meta.get("seeds")]
    if uneven:  # an unfinished run, or a run that produced no score
        lines += ["", f"Cells with other than {meta.get('seeds')} scored seeds: " + ", ".join(uneven) + "."]
    lines += ["", "Paper: reference §6 (Table 5; Story Cloze from the main results, no ablation reported). "
              "GLUE-5 avg = mean over SST-2, CoLA, RTE, MRPC, STS-B (the paper's Avg also has QQP, MNLI, QNLI). "
              "Majority class: the dev score of always predicting the most frequent training label (STS-B: none, a "
              "constant has no correlation).", ""]
    lines += ["## Differences of means (ours), with Welch's t", "",
              "| task | full − no-pretraining | full − no-aux-lm |", "|---|---|---|"]
    for t in cols:
        def diff(a: str, b: str) -> str:
            ca, cb = agg.get(a, {}).get(t), agg.get(b, {}).get(t)
            if not ca or not cb or not ca["n"] or not cb["n"]:
                return "–"
            tval = welch_t(ca["scores"], cb["scores"])
            return f"{ca['mean'] - cb['mean']:+.1f}" + ("" if tval is None else f" (t = {tval:+.1f})")
        lines.append(f"| {t} | {diff('full', 'no-pretraining')} | {diff('full', 'no-aux-lm')} |")
    n = int(meta.get("seeds") or 0)
    if n >= 2:
        hi, lo = t_critical(n - 1), t_critical(2 * n - 2, conservative=False)
        lines += ["", f"t: Welch's t statistic of the two groups of seeds. With {n} seeds a side its degrees of freedom "
                  f"are {n - 1}-{2 * n - 2}, so |t| > {hi:.2f} is significant at the 5 % level (two-sided) whatever the "
                  f"variances, and |t| < {lo:.2f} is not."]
    auc = meta.get("sst2_margin_auc") or {}
    if auc:
        lines += ["", "## Zero-shot SST-2: does the margin carry signal? (ROC AUC of log p(positive) − log p(negative))",
                  "", "| step | AUC |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in sorted(auc.items())]
    curve = layers_curve(recs)
    if curve:
        task = next(r["task"] for r in recs if r["variant"] == "layers")
        lines += ["", f"## Layers transferred ({task}, {METRIC[task]})", "", "| layers | score | seeds |", "|---|---|---|"]
        lines += [f"| {k} | {fmt(m, s, n)} | {n} |" for k, (m, s, n) in curve.items()]
    lines += ["", "## Every run", "", "| task | variant | layers | seed | metric | score | train ex. | dev ex. | "
              "updates | seconds |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(recs, key=lambda r: (r["variant"] == "layers", r["task"], r["variant"], r["transfer_layers"] or 0, r["seed"])):
        lines.append(f"| {r['task']} | {r['variant']} | {'' if r['transfer_layers'] is None else r['transfer_layers']} | "
                     f"{r['seed']} | {r['metric']} | {fmt(r['score']) if r['score'] is not None else 'failed'} | "
                     f"{r['n_train']} | {r['n_eval']} | {r['steps']} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def val_curve(out: Path) -> list[tuple[int, float]]:
    """(step, validation loss) from step 0 (the saved initial model) and the run's metrics.jsonl."""
    from gptcli.checkpoint import is_checkpoint, read_header

    pts: list[tuple[int, float]] = []
    init = out / "pretrain-init"
    if is_checkpoint(init):
        meta = read_header(init).meta
        if isinstance(meta.get("val_loss"), (int, float)):
            pts.append((0, float(meta["val_loss"])))
    metrics = out / "pretrain" / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line) if line.strip() else {}
            if rec.get("kind") == "eval" and isinstance(rec.get("loss"), (int, float)):
                pts.append((int(rec["step"]), float(rec["loss"])))
    return sorted(dict(pts).items())


def plots(out: Path, recs: list[dict[str, Any]], baselines: dict[str, float | None] | None = None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[str] = []
    d = out / "plots"
    d.mkdir(parents=True, exist_ok=True)
    vc = val_curve(out)
    if vc:
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
        ax.plot([s for s, _ in vc], [math.exp(min(l, 50)) for _, l in vc], marker="o")
        ax.set_yscale("log")
        ax.set_xlabel("pretraining updates")
        ax.set_ylabel("validation perplexity (held-out books)")
        ax.set_title("Pretraining on 56 Gutenberg books")
        fig.tight_layout()
        fig.savefig(d / "val_perplexity.png")
        plt.close(fig)
        made.append("plots/val_perplexity.png")
    cj = out / "zeroshot" / "curve.json"
    if cj.is_file():
        from gptcli.eval.curve import Curve, CurvePoint, plot

        c = read_json(cj)
        curve = Curve(c["tasks"], [CurvePoint(**p) for p in c["points"]], c.get("skipped", {}),
                      {t: v["sota"] for t, v in c["normalization"].items()})
        for p in curve.points:  # JSON null → NaN for the plot
            p.normalized = {t: (float("nan") if v is None else v) for t, v in p.normalized.items()}
        plot(curve, d / "zeroshot.png", plt)
        made.append("plots/zeroshot.png")
    agg = aggregate(recs)
    if agg:
        # Table 5 as bars: one panel per task (metrics differ in scale), one bar per variant, every seed a dot.
        tasks = [t for t in TASKS if any(t in agg.get(v, {}) for v in VARIANTS)]
        fig, axes = plt.subplots(1, len(tasks), figsize=(2.1 * len(tasks), 3.6), dpi=120, squeeze=False)
        colors = {"full": "tab:blue", "no-pretraining": "tab:red", "no-aux-lm": "tab:green"}
        for ax, t in zip(axes[0], tasks):
            for i, v in enumerate(VARIANTS):
                cell = agg.get(v, {}).get(t)
                if not cell or not cell["n"]:
                    continue
                ax.bar(i, cell["mean"], yerr=cell["std"] if cell["n"] > 1 else None, color=colors[v], alpha=0.75,
                       capsize=3, label=v)
                ax.scatter([i] * cell["n"], cell["scores"], s=9, color="black", zorder=3)
            if baselines and baselines.get(t) is not None:
                ax.axhline(baselines[t], color="black", linestyle=":", linewidth=1, label="majority class")
            ax.set_title(f"{t} ({METRIC[t]})", fontsize=9)
            ax.set_xticks([])
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
        fig.suptitle("Table 5 at CPU scale: dev scores per variant (bars: mean ± std; dots: seeds)", fontsize=10)
        fig.tight_layout(rect=(0, 0.07, 1, 1))
        fig.savefig(d / "table5.png")
        plt.close(fig)
        made.append("plots/table5.png")
    lc = layers_curve(recs)
    if lc:
        task = next(r["task"] for r in recs if r["variant"] == "layers")
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
        ks = list(lc)
        ax.errorbar(ks, [lc[k][0] for k in ks], yerr=[lc[k][1] for k in ks], marker="o", capsize=3,
                    label="mean ± std over seeds")
        seeds = [(r["transfer_layers"], r["score"]) for r in recs if r["variant"] == "layers" and r["score"] is not None]
        ax.scatter([k for k, _ in seeds], [v for _, v in seeds], s=12, color="gray", zorder=3, label="each seed")
        # References a reader needs to judge the curve: the same fine-tuning from random weights, and the floor.
        nopre = [r["score"] for r in recs if r["variant"] == "no-pretraining" and r["task"] == task and r["score"] is not None]
        if nopre:
            ax.axhline(statistics.fmean(nopre), color="tab:red", linestyle="--", linewidth=1,
                       label="no pretraining (mean)")
        if baselines and baselines.get(task) is not None:
            ax.axhline(baselines[task], color="black", linestyle=":", linewidth=1, label="majority class")
        ax.legend(fontsize=8)
        ax.set_xticks(ks)
        ax.set_xlabel("pretrained layers transferred")
        ax.set_ylabel(f"{task} dev {METRIC[task]}")
        ax.set_title("Layers transferred (Figure 2 left, small scale)")
        fig.tight_layout()
        fig.savefig(d / "layers.png")
        plt.close(fig)
        made.append("plots/layers.png")
    return made


def stage_report(cfg: ReproConfig, out: Path) -> dict[str, Any]:
    from gptcli.fsutil import write_text_atomic

    recs = collect_runs(out)
    agg = aggregate(recs)
    plan = read_json(out / "plan.json") if (out / "plan.json").is_file() else {}
    zs = read_json(out / "zeroshot" / "curve.json") if (out / "zeroshot" / "curve.json").is_file() else None
    meta = {"seeds": cfg.seeds, "budget_minutes": cfg.budget_minutes, "config": asdict(cfg), "plan": plan,
            "pretrain": read_json(out / "pretrain-done.json") if (out / "pretrain-done.json").is_file() else None,
            "seconds": read_json(out / "seconds.json") if (out / "seconds.json").is_file() else {},
            "baselines": majority_baselines(), "sst2_margin_auc": sst2_margin_auc(out / "zeroshot")}
    made = plots(out, recs, meta["baselines"])
    result = {"meta": meta, "runs": recs, "table5": {v: {t: {k: c[k] for k in ("mean", "std", "n", "scores", "failed")}
                                                        for t, c in ts.items()} for v, ts in agg.items()},
              "paper": PAPER, "layers": {str(k): {"mean": m, "std": s, "n": n} for k, (m, s, n) in layers_curve(recs).items()},
              "val_curve": [{"step": s, "loss": l, "perplexity": math.exp(min(l, 700))} for s, l in val_curve(out)],
              "zeroshot": zs, "plots": made}
    write_json(out / "results.json", json.loads(json.dumps(result, default=str).replace("NaN", "null")))
    write_text_atomic(out / "tables.md", markdown_tables(recs, agg, meta))
    log(f"report: {len(recs)} runs → {out / 'results.json'}, {out / 'tables.md'}, {', '.join(made)}")
    return result


# ------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ReproConfig.out, help="output directory (rerun to continue)")
    ap.add_argument("--data", type=Path, default=ReproConfig.data, help="real data root (books/, glue/, storycloze/, dprd/)")
    ap.add_argument("--budget-minutes", type=float, default=ReproConfig.budget_minutes,
                    help="wall-clock target for the whole run on 2 cores (pretraining gets 45%%)")
    ap.add_argument("--seeds", type=int, default=ReproConfig.seeds, help="fine-tuning seeds per task and variant")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks the pipeline in about a minute")
    ap.add_argument("--stages", default="prepare,pretrain,zeroshot,finetune,layers,report",
                    help="comma-separated stages to run (each skips work already done)")
    a = ap.parse_args(argv)
    cfg = ReproConfig(out=a.out, data=a.data, budget_minutes=a.budget_minutes, seeds=a.seeds)
    if a.smoke:
        smoke(cfg)
    stages = {s.strip() for s in a.stages.split(",") if s.strip()}
    import torch

    torch.set_num_threads(cfg.threads)
    os.environ["GPT1_DATA"] = str(cfg.data.resolve())  # the tasks find glue/, storycloze/... under it
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", asdict(cfg))
    seconds = read_json(out / "seconds.json") if (out / "seconds.json").is_file() else {}

    def timed(name: str, fn, *args):
        t0 = time.perf_counter()
        r = fn(*args)
        seconds[name] = round(seconds.get(name, 0.0) + time.perf_counter() - t0, 1)
        write_json(out / "seconds.json", seconds)
        return r

    corpus = out / "corpus"
    if "prepare" in stages:
        corpus = timed("prepare", stage_prepare, cfg, out)
    plan = timed("plan", stage_plan, cfg, out, corpus) if (corpus / "manifest.json").is_file() else None
    run = out / "pretrain"
    if "pretrain" in stages and plan:
        run = timed("pretrain", stage_pretrain, cfg, out, corpus, plan)
    ready = (out / "pretrain-done.json").is_file()
    if "zeroshot" in stages and ready:
        timed("zeroshot", stage_zeroshot, cfg, out, run)
    if "finetune" in stages and ready:
        timed("finetune", stage_finetune, cfg, out, run, plan)
    if "layers" in stages and ready:
        timed("layers", stage_layers, cfg, out, run, plan)
    if "report" in stages:
        timed("report", stage_report, cfg, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
