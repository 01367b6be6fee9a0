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
6. **labeled** — the labeled-data curve: ``labeled_sizes`` (SST-2 250 … 8,000, Story Cloze 250 … all 1,497)
   fine-tuned from the final checkpoint (``full``) and from random weights (``no-pretraining``), ``labeled_seeds``
   seeds each, on NESTED subsamples: one seeded permutation per task, a size takes its first n rows, so the
   250-row sample is inside the 500-row one and sizes differ only in added data (:func:`nested_subsample`).
7. **budget** — the pretraining-budget curve: the ``full`` fine-tuning at one size per task (``budget_examples``)
   from every kept pretraining checkpoint (step 0 … final), beside the validation perplexity of each checkpoint.
   The final checkpoint's point is the labeled curve's run at that size (the same run; not trained twice).
8. **report** — ``results.json``, ``tables.md`` (mean ± std over seeds, every run listed, the paper's numbers
   alongside) and ``plots/*.png``. Always rebuilt from what is on disk.

The LSTM of Table 5 (issue #15; on by default, ``--variants`` without ``lstm-full`` turns it off) has three stages
of its own, run right after their Transformer counterparts:

- **pretrain-lstm** — a single-layer LSTM (``lstm-tiny`` preset, 560 units, 192-wide embedding; 2,583,104
  parameters against the Transformer's 2,590,464) pretrained on the same corpus for the same updates (plan.json's
  ``pretrain_steps``) of the same 16 × 128-token batches, same optimiser, schedule and seed; its step-0 model and
  every checkpoint kept as for the Transformer (``pretrain-lstm-init``, ``pretrain-lstm``).
- **zeroshot-lstm** — the same zero-shot heuristics at each of its checkpoints (Figure 2 right's "LSTM" curves:
  dashed in ``plots/zeroshot.png``); ``zeroshot-lstm/curve.json``.
- **finetune-lstm** — Table 5's fourth row, "LSTM w/ aux LM" (variant ``lstm-full``): the ``full`` fine-tuning
  (λ = 0.5) from the LSTM's final checkpoint, same tasks, subsample sizes and seeds as the Transformer's ``full``.

A run directory without them gains them with ``--stages pretrain-lstm,zeroshot-lstm,finetune-lstm,report`` (the
Transformer's files are neither redone nor renamed). On a machine other processes use, ``--lstm-threads 1``
(``ReproConfig.lstm_threads`` says why).

Both curves fine-tune from "a pretrained model" looked up by name (:data:`PRETRAINED`, ``curve_models``): ``gpt``,
the model of the pretrain stage, and ``lstm``, that of pretrain-lstm (not in ``curve_models`` by default: its curves
would double those stages' cost); the LSTM stages find the LSTM's files through the same table.

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
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

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
"""The Transformer's Table 5 variants (the finetune stage)."""
LSTM_VARIANT = "lstm-full"
"""Table 5's "LSTM w/ aux LM": the ``full`` fine-tuning from the LSTM (the finetune-lstm stage)."""
TABLE5: tuple[str, ...] = VARIANTS + (LSTM_VARIANT,)
"""Every row of Table 5, in the paper's order."""
LABELS: dict[str, str] = {LSTM_VARIANT: "LSTM w/ aux LM"}
"""Row names in the report where a variant's directory name is not the paper's."""
METRIC: dict[str, str] = {
    "sst2": "accuracy",
    "cola": "mcc",
    "rte": "accuracy",
    "mrpc": "f1",
    "stsb": "pearson",
    "storycloze": "accuracy",
}
# Training examples per fine-tuning run at a 60-minute budget (scaled linearly with the budget, capped by the
# split's size). SST-2 (67k), CoLA (8.5k), STS-B (5.7k) are subsampled; RTE (2.5k, long pairs), MRPC (3.7k,
# two sequences per example) too; Story Cloze's 1,497 training stories are kept whole.
# Measured cost here (4 × 192 model, one epoch at these sizes, dev scoring included): SST-2 7.7 s, CoLA 3.9 s,
# RTE ≈ 7 s, MRPC ≈ 13 s, STS-B ≈ 13 s (its 1,500 dev pairs), Story Cloze ≈ 12 s → ≈ 3 min per variant and seed.
TRAIN_EXAMPLES: dict[str, int] = {"sst2": 1500, "cola": 1500, "rte": 500, "mrpc": 500, "stsb": 800, "storycloze": 600}

# The paper's numbers (reference §6): Table 5 ablations and the single-model results. Story Cloze has no
# ablation numbers in the paper.
PAPER: dict[str, dict[str, float | None]] = {
    "full": {"cola": 45.4, "sst2": 91.3, "mrpc": 82.3, "stsb": 82.0, "rte": 56.0, "storycloze": 86.5},
    "no-pretraining": {"cola": 18.9, "sst2": 84.0, "mrpc": 79.4, "stsb": 30.9, "rte": 53.8, "storycloze": None},
    "no-aux-lm": {"cola": 47.9, "sst2": 92.0, "mrpc": 84.9, "stsb": 83.2, "rte": 54.4, "storycloze": None},
    LSTM_VARIANT: {"cola": 30.3, "sst2": 90.5, "mrpc": 83.2, "stsb": 71.8, "rte": 54.6, "storycloze": None},
}


@dataclass
class ReproConfig:
    """Every setting of the reproduction. ``--smoke`` replaces the sizes by tiny ones (see :func:`smoke`)."""

    out: Path = Path("runs/cpu-reproduction")
    """Output directory (everything goes here; rerun with the same --out to continue)."""
    data: Path = Path("../shared/data")
    """Root of the real data: books/, glue/, storycloze/, dprd/ (MANIFEST.md)."""
    budget_minutes: float = 60.0
    """Wall-clock target for the whole run on 2 CPU cores; pretraining gets ``pretrain_share`` of it. The LSTM's
    stages come on top: its pretraining takes the Transformer's updates (≈ the same share again), its zero-shot
    curve and fine-tuning ≈ 12 min at 3 seeds (estimated, docs/reproduction.md)."""
    seeds: int = 3
    """Fine-tuning seeds per (task, variant)."""
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    """Tasks the finetune and finetune-lstm stages fine-tune (``TASKS``; the report reads whatever is on disk). Two
    invocations on disjoint tasks can share a run directory (each skips runs whose results exist, but a run one of
    them has started and not finished looks missing to the other: never give two invocations the same task)."""
    pretrain_share: float = 0.45
    """Share of the budget spent pretraining. The rest, measured at the default sizes: prepare ≈ 0.5 min, zero-shot
    ≈ 23 s per checkpoint (9 → 3.4 min), fine-tuning ≈ 3 min per variant and seed (9 → ≈ 25 min), layers ≈ 2 min."""
    books: int | None = None
    """Use only the N smallest books (smoke tests); None = all 56."""
    vocab_size: int = 4096
    """Learned BPE ids (GPT-1: 40,478; a CPU-sized softmax)."""
    val_fraction: float = 0.04
    """Share of the books held out for validation (whole books)."""
    model: dict[str, Any] = field(
        default_factory=lambda: {
            "n_layer": 4,
            "n_embd": 192,
            "n_head": 4,
            "n_inner": 768,
            "n_ctx": 128,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "resid_pdrop": 0.0,
            "init_std": 0.06,
        }
    )
    """Overrides of the ``tiny`` preset; chosen by the probes in PROBES."""
    lstm_model: dict[str, Any] = field(
        default_factory=lambda: {
            "n_embd": 192,
            "n_hidden": 560,
            "n_ctx": 128,
            "embd_pdrop": 0.0,
            "out_pdrop": 0.0,
            "init_std": 0.06,
        }
    )
    """Overrides of the ``lstm-tiny`` preset for the LSTM of Table 5 (pretrain-lstm): one layer of 560 units and the
    Transformer's 192-wide embedding (tied output layer, 560 → 192 projection) = 2,583,104 parameters over 4,096 ids,
    matched to the Transformer's 2,590,464 (tests/model/test_lstm.py). No dropout and N(0, 0.06) as the Transformer
    (the paper gives neither for its LSTM). Everything else (corpus, batches, updates, learning rate, schedule, seed)
    is the Transformer's."""
    variants: list[str] = field(default_factory=lambda: list(TABLE5))
    """Table 5 rows to fine-tune (``TABLE5``). Without ``lstm-full`` the LSTM is neither pretrained nor scored
    (unless ``curve_models`` names it)."""
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
    labeled_sizes: dict[str, list[int]] = field(
        default_factory=lambda: {"sst2": [250, 500, 1000, 2000, 4000, 8000], "storycloze": [250, 500, 1497]}
    )
    """Labeled-data curve: training examples per run, per task (nested subsamples; a size at or above the split's
    size is the whole split). Story Cloze's training split has 1,497 stories. Not scaled by ``budget_minutes``.
    Estimated cost at the defaults (2 idle cores; from the Table 5 runs, SST-2 ≈ 4 s + 6.7 ms per row and Story Cloze
    ≈ 5 s + 53 ms per story for 3 epochs with dev scoring): SST-2 ≈ 130 s and Story Cloze ≈ 135 s per variant and
    seed → ≈ 26 min for 2 variants × 3 seeds (SST-2 8,000 alone ≈ 6 min of it)."""
    full_sizes: bool = False
    """Add each labeled task's whole training split to its sizes (SST-2: 67,349 rows, ≈ 7.5 min per run → ≈ 45 min
    more for 2 variants × 3 seeds; Story Cloze's 1,497 is in the defaults already)."""
    labeled_seeds: int = 3
    """Fine-tuning seeds per (task, variant, size) of the labeled-data curve (every seed sees the same subsample)."""
    labeled_data_seed: int = 0
    """Seeds the one permutation per task whose first n rows are the n-row subsample (so subsamples are nested)."""
    budget_examples: dict[str, int] = field(default_factory=lambda: {"sst2": 1000, "storycloze": 500})
    """Pretraining-budget curve: the one subsample size per task (the labeled curve's nested subsample of that size;
    sizes in ``labeled_sizes`` share the final checkpoint's runs with it). Estimated cost at the defaults: (8
    checkpoints besides the final) × 3 seeds × (SST-2 ≈ 11 s + Story Cloze ≈ 31 s) ≈ 17 min, plus ≈ 30 s of
    validation-perplexity evaluations. With the labeled curve ≈ 43 min for both stages."""
    budget_seeds: int = 3
    """Fine-tuning seeds per (task, checkpoint) of the pretraining-budget curve."""
    curve_models: list[str] = field(default_factory=lambda: ["gpt"])
    """Pretrained models the two curves fine-tune from (keys of :data:`PRETRAINED`; issue #15 adds an LSTM)."""
    device: str = "cpu"
    threads: int = 2
    """torch threads (this machine: 2 cores)."""
    lstm_threads: int | None = None
    """torch threads while the LSTM's stages run (None = ``threads``). An LSTM step is a chain of small per-time-step
    kernels, each ending in a barrier of all threads: on a machine other processes also use, a thread preempted at
    a barrier stalls the step (measured on this machine under load, smoke-size LSTM: 6 ms per update with 1 thread,
    0.02-2.8 s with 2). 1 avoids that on a shared machine."""


def smoke(cfg: ReproConfig) -> ReproConfig:
    """The same pipeline at a size that finishes in about a minute (tests; checking the script, not the paper)."""
    cfg.books = 2
    cfg.vocab_size = 400
    cfg.model = {**cfg.model, "n_layer": 2, "n_embd": 32, "n_head": 2, "n_inner": 64, "n_ctx": 64}
    cfg.lstm_model = {**cfg.lstm_model, "n_embd": 32, "n_hidden": 64, "n_ctx": 64}  # the same context as the above
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
    cfg.labeled_sizes = {"sst2": [8, 16], "storycloze": [8, 16]}
    cfg.labeled_seeds = 1  # each curve run costs the smoke test ≈ 0.3 s on 2 idle cores (it runs in CI)
    cfg.budget_examples = {"sst2": 16, "storycloze": 16}
    cfg.budget_seeds = 1
    cfg.lstm_threads = 1  # a tiny LSTM gains nothing from 2 threads and stalls on a busy CI runner (lstm_threads)
    return cfg


# ------------------------------------------------------------------------------------------------- helpers


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def write_json(path: Path, obj: Any) -> None:
    """Atomic write (a crash never leaves a half-written file that a rerun would take as done)."""
    from gptcli.files.fsutil import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")


def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value); NaN-free input expected."""
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


# Two-sided 5 % critical values of Student's t for 1-30 degrees of freedom (to read Welch's t without scipy).
T975: tuple[float, ...] = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


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


# ------------------------------------------------------------------------------------------------- pretrained models


@dataclass(frozen=True)
class PretrainedModel:
    """A pretrained model the curves fine-tune from: where its untrained (step 0) weights and its run are.

    The one place the curves learn where a model's checkpoints are, so that another architecture pretrained the same
    way (issue #15: an LSTM) is one more entry of :data:`PRETRAINED`, fine-tuned by the same stages.
    """

    name: str
    init: Path
    """The model before any update (step 0), saved as a checkpoint."""
    run: Path
    """The pretraining run directory (``checkpoints/step-N``, all kept)."""
    done: Path
    """Written when pretraining finished (the curves wait for it)."""
    corpus: Path
    """The prepared corpus it was pretrained on (its validation split gives each checkpoint's perplexity)."""
    zeroshot: Path
    """Its zero-shot curve (``curve.json``, one point per checkpoint, step 0 included)."""

    def ready(self) -> bool:
        return self.done.is_file()

    def final(self) -> Path:
        """The run's newest (= final) checkpoint."""
        from gptcli.checkpoint import resolve_checkpoint

        return resolve_checkpoint(self.run)

    def checkpoints(self) -> list[tuple[int, Path]]:
        """(pretraining updates, checkpoint) from step 0 to the final one, in order."""
        from gptcli.checkpoint import list_checkpoints, read_header

        kept = [(int(read_header(p).meta.get("step", -1)), p) for p in list_checkpoints(self.run)]
        return [(0, self.init)] + sorted(kept)


PRETRAINED: dict[str, Callable[[Path], PretrainedModel]] = {
    # The post-LN GPT of the pretrain stage. Its variants keep Table 5's names (full, no-pretraining).
    "gpt": lambda out: PretrainedModel(
        "gpt", out / "pretrain-init", out / "pretrain", out / "pretrain-done.json", out / "corpus", out / "zeroshot"
    ),
    # The LSTM of Table 5's fourth row (stages pretrain-lstm, zeroshot-lstm, finetune-lstm): the same names with
    # "-lstm" after the Transformer's.
    "lstm": lambda out: PretrainedModel(
        "lstm",
        out / "pretrain-lstm-init",
        out / "pretrain-lstm",
        out / "pretrain-lstm-done.json",
        out / "corpus",
        out / "zeroshot-lstm",
    ),
}
MODEL_LABELS: dict[str, str] = {"gpt": "Transformer", "lstm": "LSTM"}
"""How the report names each pretrained model."""


def pretrained_models(cfg: ReproConfig) -> list[str]:
    """The models this configuration pretrains: the Transformer always, the LSTM when Table 5's LSTM row or a
    curve wants it."""
    extra = {model_of_variant(v) for v in cfg.variants} | set(cfg.curve_models)
    return ["gpt"] + [m for m in PRETRAINED if m != "gpt" and m in extra]


def pretrained_model(out: Path, name: str) -> PretrainedModel:
    if name not in PRETRAINED:
        sys.exit(f"curve_models: unknown pretrained model {name!r} (known: {', '.join(PRETRAINED)})")
    return PRETRAINED[name](out)


def curve_variants(model: str) -> tuple[str, str]:
    """(fine-tuned from the pretrained model, same shape from random weights): the variant names of the curves."""
    return ("full", "no-pretraining") if model == "gpt" else (f"{model}-full", f"{model}-no-pretraining")


def model_of_variant(variant: str) -> str:
    for suffix in ("-full", "-no-pretraining"):
        if variant.endswith(suffix):
            return variant[: -len(suffix)]
    return "gpt"


# ------------------------------------------------------------------------------------------------- nested subsamples

T = TypeVar("T")


def nested_subsample(items: Sequence[T], n: int, seed: int | str) -> list[T]:
    """The first ``n`` items of one seeded permutation, kept in their original order (all of them if ``n`` ≥ len).

    For one ``seed``, the subsample of n rows is inside the subsample of every larger size: sizes differ only in
    the rows added. (``gptcli.data.batching.subsample`` draws each size afresh; ``random.sample`` even switches
    algorithm with the size, so its draws are not nested.)
    """
    if n >= len(items):
        return list(items)
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    return [items[i] for i in sorted(order[:n])]


def data_seed(cfg: ReproConfig, task: str) -> str:
    """The seed of a task's permutation: once per task, the same for every size, fine-tuning seed and variant."""
    return f"{task}/{cfg.labeled_data_seed}"


def nested_name(task: str, n: int) -> str:
    return f"{task}-n{n}"


@contextmanager
def nested_task(task: str, n: int, seed: int | str) -> Iterator[str]:
    """Inside the block, task ``<task>-n<n>`` is ``task`` with its training split cut to its nested n-row subsample.

    ``gpt1 finetune``'s own ``max_train_examples`` draws a fresh subsample per size and per fine-tuning seed; the
    curves need nested ones, so they fine-tune a task registered for the run (as the quickstart's toy task is) whose
    ``read("train")`` returns the subsample. Everything else (files, dev split, transformation, metric) is the task's.
    """
    from gptcli.tasks import get_task, registry

    base = get_task(task)

    @dataclass
    class NestedTrain(type(base)):  # type: ignore[misc]  (the task's own class: every attribute carries over)
        def read(self, split, data_dir=None, options=None):  # noqa: ANN001 (Task.read's signature)
            rows = super().read(split, data_dir, options)
            return nested_subsample(rows, n, seed) if split == "train" else rows

    name = nested_name(task, n)
    registry.register(NestedTrain(**{**{f.name: getattr(base, f.name) for f in fields(base) if f.init}, "name": name}))
    try:
        yield name
    finally:
        registry.unregister(name)


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
    res = prepare(
        PrepareConfig(
            inputs=[str(p) for p in books],
            out=corpus,
            vocab_size=cfg.vocab_size,
            strip_gutenberg=True,
            val_fraction=cfg.val_fraction,
            seed=0,
            workers=cfg.threads,
            sample_lines=300_000,
            overwrite=True,
        )
    )
    st = res.manifest["splits"]
    log(
        f"prepare: {len(books)} books → {st['train']['tokens']:,} train / {st['val']['tokens']:,} val tokens "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    return corpus


def _pretrain_config(cfg: ReproConfig, out: Path, corpus: Path, steps: int, model: str = "gpt"):
    """The pretraining run of ``model``: the LSTM's differs from the Transformer's in its preset and shape only."""
    from gptcli.train.pretrain import PretrainConfig

    preset, shape = ("tiny", cfg.model) if model == "gpt" else ("lstm-tiny", cfg.lstm_model)
    # Intervals rounded up: ``checkpoints`` saves in all with the final one, not an extra one a few updates before it.
    return PretrainConfig(
        data=corpus,
        out=pretrained_model(out, model).run,
        preset=preset,
        model=dict(shape),
        seq_len=cfg.seq_len,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        seed=0,
        device=cfg.device,
        precision="fp32",
        max_steps=steps,
        epochs=1000.0,
        warmup_steps=max(1, steps // 20),
        eval_every=-(-steps // cfg.val_points),
        eval_batches=cfg.eval_batches,
        save_every=-(-steps // cfg.checkpoints),
        keep_last=0,
        log_every=max(1, steps // 50),
        resume=True,
    )


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
    plan = {
        "pretrain_steps": steps,
        "update_ms": round(1000 * step_s, 1),
        "train_tokens": train_tokens,
        "epochs": round(budget.epochs(steps, cfg.batch_size, cfg.seq_len, train_tokens), 2),
        "params": sum(p.numel() for p in GPT(mcfg).parameters()),
        "train_examples": {t: max(8, int(n * scale)) for t, n in cfg.train_examples.items()},
    }
    write_json(path, plan)
    log(
        f"plan: {step_s * 1000:.0f} ms per update → {steps} pretraining updates ({plan['epochs']} epochs); "
        f"fine-tuning subsamples {plan['train_examples']}"
    )
    return plan


def stage_pretrain(cfg: ReproConfig, out: Path, corpus: Path, plan: dict[str, Any], model: str = "gpt") -> Path:
    """Pretrain ``model`` for plan.json's updates (the LSTM: the Transformer's number, so both see the same tokens)."""
    import torch

    from gptcli.checkpoint import is_checkpoint, save_checkpoint
    from gptcli.data.shards import open_corpus
    from gptcli.eval.perplexity import evaluate_lm
    from gptcli.model.build import build_model
    from gptcli.train.pretrain import build_model_config, pretrain

    pm, stage = pretrained_model(out, model), "pretrain" if model == "gpt" else f"pretrain-{model}"
    run, done, init = pm.run, pm.done, pm.init
    pc = _pretrain_config(cfg, out, corpus, plan["pretrain_steps"], model)
    if not is_checkpoint(init):
        oc = open_corpus(corpus)
        torch.manual_seed(pc.seed)  # the same initial weights pretrain() draws
        net = build_model(build_model_config(pc, oc.tokenizer.vocab_size))
        ev = evaluate_lm(
            net,
            oc.arrays("val"),
            cfg.seq_len,
            cfg.batch_size,
            device="cpu",
            precision="fp32",
            max_batches=cfg.eval_batches,
        )
        save_checkpoint(init, net, oc.tokenizer, meta={"step": 0, "val_loss": ev.loss})
    if done.is_file():
        log(f"{stage}: done already, skipped")
        return run
    t0 = time.perf_counter()
    res = pretrain(pc)
    if res.stopped_by or res.final_val_loss is None:
        sys.exit(f"{run}: pretraining stopped ({res.stopped_by or 'no validation split'}); rerun to resume")
    record = {"step": res.step, "final_val_loss": res.final_val_loss, "seconds": round(time.perf_counter() - t0, 1)}
    if model != "gpt":  # the Transformer's count is in plan.json (kept as it was)
        from gptcli.checkpoint import read_header

        record["params"] = _param_count(read_header(init))
    write_json(done, record)
    log(f"{stage}: {res.step} updates, validation perplexity {math.exp(res.final_val_loss):.1f}")
    return run


def _param_count(header: Any) -> int:
    """Parameters of the model a checkpoint header describes (built afresh: these models are small)."""
    from gptcli.model.build import build_model, config_from_dict

    return build_model(config_from_dict(header.arch, header.model)).num_params()


def stage_zeroshot(cfg: ReproConfig, out: Path, model: str = "gpt") -> None:
    """The zero-shot curve of ``model``: every checkpoint of its run, step 0 included."""
    from gptcli.eval.curve import run_curve
    from gptcli.eval.zeroshot import ZeroShotConfig

    pm = pretrained_model(out, model)
    zs, stage = pm.zeroshot, "zeroshot" if model == "gpt" else f"zeroshot-{model}"
    if (zs / "curve.json").is_file():
        log(f"{stage}: done already, skipped")
        return
    t0 = time.perf_counter()
    zc = ZeroShotConfig(
        task=",".join(ZEROSHOT_TASKS),
        data_dir=str(cfg.data),
        out=str(zs),
        splits={"dprd": "train"},
        limit=cfg.zeroshot_limit,
        precision="fp32",
        device=cfg.device,
        batch_size=64,
    )
    curve = run_curve(zc, [pm.init, pm.run])
    if curve.skipped:
        log(f"{stage}: skipped tasks {curve.skipped}")
    log(f"{stage}: {len(curve.points)} checkpoints × {len(curve.tasks)} tasks ({time.perf_counter() - t0:.0f} s)")


def _finetune_one(
    cfg: ReproConfig,
    run_dir: Path,
    task: str,
    seed: int,
    init: str,
    tokenizer: str | None,
    lm_weight: float,
    n_train: int | None,
    transfer: int | None = None,
    n_ctx: int | None = None,
) -> dict[str, Any]:
    from gptcli.train.finetune import FinetuneConfig, finetune

    results = run_dir / "results.json"
    if results.is_file():
        return read_json(results)
    fc = FinetuneConfig(
        task=task,
        init=init,
        tokenizer=tokenizer,
        out=str(run_dir),
        lr=cfg.finetune_lr,
        batch_size=cfg.finetune_batch_size,
        epochs=cfg.finetune_epochs,
        warmup=0.05,
        seed=seed,
        # What the recorded results were measured with (before the defaults became the released
        # code's random batches and warmup_linear): kept so that they stay reproducible.
        batching="length",
        schedule="linear",
        lm_weight=lm_weight,
        transfer_layers=transfer,
        select="last",
        n_ctx=n_ctx or cfg.model.get("n_ctx"),
        max_train_examples=n_train,
        max_eval_examples=cfg.max_eval_examples,
        device=cfg.device,
        precision="fp32",
        overwrite=True,
    )
    res = finetune(fc)
    if res.stopped_by:  # a signal: no scores to record; the run restarts from scratch when the command is rerun
        sys.exit(f"{run_dir}: fine-tuning stopped by {res.stopped_by}; rerun the same command to continue")
    return res.results


def stage_finetune(cfg: ReproConfig, out: Path, run: Path, plan: dict[str, Any]) -> None:
    from gptcli.checkpoint import resolve_checkpoint

    final = str(resolve_checkpoint(run))  # the run's newest (= final) checkpoint
    for task in cfg.tasks:
        for variant in (v for v in VARIANTS if v in cfg.variants):
            for seed in range(cfg.seeds):
                d = out / "finetune" / task / variant / f"seed-{seed}"
                if (d / "results.json").is_file():
                    continue
                t0 = time.perf_counter()
                init, tok = ("none", final) if variant == "no-pretraining" else (final, None)
                lam = 0.0 if variant == "no-aux-lm" else cfg.lm_weight
                r = _finetune_one(cfg, d, task, seed, init, tok, lam, plan["train_examples"][task])
                log(
                    f"finetune {task:10s} {variant:14s} seed {seed}: {METRIC[task]} "
                    f"{r['scores'].get(METRIC[task], float('nan')):.1f} (n_train {r['n_train']}, "
                    f"{time.perf_counter() - t0:.0f} s)"
                )


def stage_finetune_model(cfg: ReproConfig, out: Path, plan: dict[str, Any], model: str) -> None:
    """Table 5's row for another pretrained model (the LSTM: "LSTM w/ aux LM"): the ``full`` fine-tuning from its
    final checkpoint — the same tasks, subsample sizes, seeds and λ as the Transformer's ``full``."""
    pm, variant = pretrained_model(out, model), curve_variants(model)[0]
    final = str(pm.final())
    n_ctx = (cfg.lstm_model if model == "lstm" else cfg.model).get("n_ctx")
    for task in cfg.tasks:
        for seed in range(cfg.seeds):
            d = out / "finetune" / task / variant / f"seed-{seed}"
            if (d / "results.json").is_file():
                continue
            t0 = time.perf_counter()
            r = _finetune_one(cfg, d, task, seed, final, None, cfg.lm_weight, plan["train_examples"][task], None, n_ctx)
            _log_run(f"finetune {task:10s} {variant:14s} seed {seed}", task, r, t0)


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
            log(
                f"layers {task} transfer {k} seed {seed}: {METRIC[task]} "
                f"{r['scores'].get(METRIC[task], float('nan')):.1f} ({time.perf_counter() - t0:.0f} s)"
            )


def _finetune_nested(
    cfg: ReproConfig, run_dir: Path, task: str, n: int, seed: int, init: str, tokenizer: str | None
) -> dict[str, Any]:
    """One curve run: ``task``'s nested n-row subsample, λ = ``lm_weight``, otherwise as the finetune stage."""
    if (run_dir / "results.json").is_file():
        return read_json(run_dir / "results.json")
    with nested_task(task, n, data_seed(cfg, task)) as name:
        return _finetune_one(cfg, run_dir, name, seed, init, tokenizer, cfg.lm_weight, None)


_TRAIN_SIZES: dict[str, int] = {}


def train_size(task: str) -> int:
    """Rows in a task's training split (read once per process)."""
    if task not in _TRAIN_SIZES:
        from gptcli.tasks import get_task

        _TRAIN_SIZES[task] = len(get_task(task).read("train"))
    return _TRAIN_SIZES[task]


def labeled_sizes(cfg: ReproConfig, task: str) -> list[int]:
    """The task's sizes, each capped at its training split's size (the cap = the whole split), plus the whole split
    with ``full_sizes``; ascending, without repeats."""
    sizes = [min(int(n), train_size(task)) for n in cfg.labeled_sizes.get(task, [])]
    return sorted(set(sizes + ([train_size(task)] if cfg.full_sizes else [])))


def labeled_dir(out: Path, task: str, variant: str, n: int, seed: int) -> Path:
    return out / "labeled" / task / variant / f"n-{n}" / f"seed-{seed}"


def budget_dir(out: Path, task: str, model: str, n: int, step: int, seed: int) -> Path:
    return out / "budget" / task / model / f"n-{n}" / f"step-{step}" / f"seed-{seed}"


def _log_run(what: str, task: str, r: dict[str, Any], t0: float) -> None:
    log(
        f"{what}: {METRIC[task]} {r['scores'].get(METRIC[task], float('nan')):.1f} (n_train {r['n_train']}, "
        f"{time.perf_counter() - t0:.0f} s)"
    )


def stage_labeled(cfg: ReproConfig, out: Path) -> None:
    """The labeled-data curve. Seeds outermost: an interrupted run already has whole curves with fewer seeds."""
    for model in cfg.curve_models:
        pm = pretrained_model(out, model)
        if not pm.ready():
            log(f"labeled: {model} is not pretrained yet ({pm.done} missing), skipped")
            continue
        final, (pre, rnd) = str(pm.final()), curve_variants(model)
        for seed in range(cfg.labeled_seeds):
            for task in cfg.labeled_sizes:
                for n in labeled_sizes(cfg, task):
                    for variant, init, tok in ((pre, final, None), (rnd, "none", final)):
                        d = labeled_dir(out, task, variant, n, seed)
                        if (d / "results.json").is_file():
                            continue
                        t0 = time.perf_counter()
                        r = _finetune_nested(cfg, d, task, n, seed, init, tok)
                        _log_run(f"labeled {task} {variant} n {n} seed {seed}", task, r, t0)


def budget_size(cfg: ReproConfig, task: str) -> int:
    return min(int(cfg.budget_examples[task]), train_size(task))


def stage_budget(cfg: ReproConfig, out: Path) -> None:
    """The pretraining-budget curve: ``full`` fine-tuning from every kept checkpoint; the final checkpoint's runs
    are the labeled curve's at the same size (run there if that stage has not made them)."""
    for model in cfg.curve_models:
        pm = pretrained_model(out, model)
        if not pm.ready():
            log(f"budget: {model} is not pretrained yet ({pm.done} missing), skipped")
            continue
        points = pm.checkpoints()
        checkpoint_val_losses(cfg, out, pm, points)
        pre = curve_variants(model)[0]
        for seed in range(cfg.budget_seeds):
            for task in cfg.budget_examples:
                n = budget_size(cfg, task)
                for i, (step, path) in enumerate(points):
                    # The final checkpoint's run at a labeled size is the labeled curve's own run (identical).
                    shared = i == len(points) - 1 and n in labeled_sizes(cfg, task)
                    d = labeled_dir(out, task, pre, n, seed) if shared else budget_dir(out, task, model, n, step, seed)
                    if (d / "results.json").is_file():
                        continue
                    t0 = time.perf_counter()
                    r = _finetune_nested(cfg, d, task, n, seed, str(path), None)
                    _log_run(f"budget {task} {model} step {step} n {n} seed {seed}", task, r, t0)


def val_loss_path(out: Path, model: str) -> Path:
    return out / "budget" / f"val-loss-{model}.json"


def checkpoint_val_losses(
    cfg: ReproConfig, out: Path, pm: PretrainedModel, points: list[tuple[int, Path]]
) -> list[dict[str, Any]]:
    """Validation loss of every checkpoint of the budget curve (the same batches as pretraining's validations),
    kept in ``budget/val-loss-<model>.json``; a checkpoint already there is not scored again."""
    path = val_loss_path(out, pm.name)
    have = {int(p["step"]): p for p in read_json(path)} if path.is_file() else {}
    if all(step in have for step, _ in points):
        return [have[step] for step, _ in points]
    from gptcli.checkpoint import load_checkpoint
    from gptcli.data.shards import open_corpus
    from gptcli.eval.perplexity import evaluate_lm

    val = open_corpus(pm.corpus).arrays("val")
    for step, ckpt in points:
        if step not in have:
            model = load_checkpoint(ckpt, load_tokenizer=False).model
            ev = evaluate_lm(
                model,
                val,
                cfg.seq_len,
                cfg.batch_size,
                device=cfg.device,
                precision="fp32",
                max_batches=cfg.eval_batches,
            )
            have[step] = {"step": step, "checkpoint": ckpt.name, "val_loss": ev.loss, "tokens": ev.tokens}
            write_json(path, sorted(have.values(), key=lambda p: p["step"]))
    log(f"budget: validation loss of {len(points)} {pm.name} checkpoints → {path}")
    return [have[step] for step, _ in points]


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
    return {
        "task": task,
        "variant": variant,
        "seed": seed,
        "transfer_layers": transfer,
        "metric": metric,
        "score": score if isinstance(score, (int, float)) and math.isfinite(score) else None,
        "n_train": r.get("n_train"),
        "n_eval": r.get("n_eval"),
        "epoch": r.get("epoch"),
        "steps": r.get("steps"),
        "seconds": r.get("elapsed_s"),
    }


def aggregate(recs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{variant: {task: {mean, std, n, scores}}}`` over seeds, for the Table 5 variants (the LSTM's included)."""
    agg: dict[str, dict[str, dict[str, Any]]] = {}
    for r in recs:
        if r["variant"] not in TABLE5:
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


def score_cell(scores: list[float | None]) -> dict[str, Any]:
    """``{scores, failed, mean, std, n}`` of one point's runs (a run without a score counts as failed)."""
    kept = [x for x in scores if x is not None]
    m, sd = mean_std(kept)
    return {"scores": kept, "failed": len(scores) - len(kept), "mean": m, "std": sd, "n": len(kept)}


def _curve_record(res: Path, task: str, variant: str, seed: int, size: int) -> dict[str, Any]:
    rec = _record(read_json(res), task, variant, seed, None)
    del rec["transfer_layers"]
    return {**rec, "model": model_of_variant(variant), "size": size}


def collect_labeled(out: Path) -> list[dict[str, Any]]:
    """One record per finished run of the labeled-data curve (``labeled/<task>/<variant>/n-<N>/seed-<s>``)."""
    recs = []
    for res in sorted((out / "labeled").glob("*/*/n-*/seed-*/results.json")):
        seed_dir, n_dir = res.parent, res.parent.parent
        recs.append(
            _curve_record(res, n_dir.parent.parent.name, n_dir.parent.name, int(seed_dir.name[5:]), int(n_dir.name[2:]))
        )
    return sorted(recs, key=lambda r: (r["task"], r["variant"], r["size"], r["seed"]))


def labeled_curves(recs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The labeled-data curves (one per task and variant: a point per size) and, per task, model and size where
    both sides have runs, the gap mean(pretrained) − mean(random init) with Welch's t."""
    groups: dict[tuple[str, str], dict[int, list[float | None]]] = {}
    for r in recs:
        groups.setdefault((r["task"], r["variant"]), {}).setdefault(r["size"], []).append(r["score"])
    curves = [
        {
            "task": t,
            "variant": v,
            "model": model_of_variant(v),
            "points": [{"size": n, **score_cell(sc)} for n, sc in sorted(by_n.items())],
        }
        for (t, v), by_n in sorted(groups.items())
    ]
    gaps = []
    for (t, v), by_n in sorted(groups.items()):
        model = model_of_variant(v)
        pre, rnd = curve_variants(model)
        if v != pre or (t, rnd) not in groups:
            continue
        for n in sorted(set(by_n) & set(groups[(t, rnd)])):
            a, b = score_cell(by_n[n]), score_cell(groups[(t, rnd)][n])
            if a["n"] and b["n"]:
                gaps.append(
                    {
                        "task": t,
                        "model": model,
                        "size": n,
                        "pretrained": pre,
                        "random": rnd,
                        "gap": a["mean"] - b["mean"],
                        "t": welch_t(a["scores"], b["scores"]),
                        "n_pretrained": a["n"],
                        "n_random": b["n"],
                    }
                )
    return {"curves": curves, "gaps": gaps}


def collect_budget(out: Path) -> list[dict[str, Any]]:
    """One record per finished run of the pretraining-budget curve (``budget/<task>/<model>/n-<N>/step-<K>/seed-<s>``),
    plus, for the final checkpoint (the last step of ``budget/val-loss-<model>.json``), the labeled curve's runs of
    the same size and model, which the budget stage shares rather than trains twice (those of the seeds the budget
    curve has: every point then averages the same seeds)."""
    recs: list[dict[str, Any]] = []
    groups: set[tuple[str, str, int]] = set()
    for res in sorted((out / "budget").glob("*/*/n-*/step-*/seed-*/results.json")):
        seed_dir, step_dir = res.parent, res.parent.parent
        n_dir = step_dir.parent
        task, model = n_dir.parent.parent.name, n_dir.parent.name
        rec = _curve_record(res, task, curve_variants(model)[0], int(seed_dir.name[5:]), int(n_dir.name[2:]))
        recs.append({**rec, "model": model, "step": int(step_dir.name[5:]), "dir": str(seed_dir.relative_to(out))})
        groups.add((task, model, rec["size"]))
    for task, model, n in sorted(groups):
        vals = read_json(val_loss_path(out, model)) if val_loss_path(out, model).is_file() else []
        if not vals:
            continue
        final, pre = max(int(v["step"]) for v in vals), curve_variants(model)[0]
        group = [r for r in recs if (r["task"], r["model"], r["size"]) == (task, model, n)]
        seeds, have = {r["seed"] for r in group}, {r["seed"] for r in group if r["step"] == final}
        for res in sorted((out / "labeled" / task / pre / f"n-{n}").glob("seed-*/results.json")):
            seed = int(res.parent.name[5:])
            if seed in seeds and seed not in have:
                rec = _curve_record(res, task, pre, seed, n)
                recs.append({**rec, "model": model, "step": final, "dir": str(res.parent.relative_to(out))})
    return sorted(recs, key=lambda r: (r["task"], r["model"], r["size"], r["step"], r["seed"]))


def budget_curves(out: Path, recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (task, model, size): fine-tuned score per pretraining step; per model: each checkpoint's validation
    loss and perplexity."""
    groups: dict[tuple[str, str, int], dict[int, list[float | None]]] = {}
    for r in recs:
        groups.setdefault((r["task"], r["model"], r["size"]), {}).setdefault(r["step"], []).append(r["score"])
    curves = [
        {"task": t, "model": m, "size": n, "points": [{"step": k, **score_cell(sc)} for k, sc in sorted(pts.items())]}
        for (t, m, n), pts in sorted(groups.items())
    ]
    val = {}
    for path in sorted((out / "budget").glob("val-loss-*.json")):
        val[path.stem[len("val-loss-") :]] = [
            {**v, "perplexity": math.exp(min(float(v["val_loss"]), 700))} for v in read_json(path)
        ]
    return {"curves": curves, "val": val}


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


def markdown_tables(
    recs: list[dict[str, Any]], agg: dict, meta: dict[str, Any], curves: list[str] | None = None
) -> str:
    """The Markdown report: Table 5 at small scale (ours, mean ± std, then the paper's), differences, then
    ``curves`` (the labeled-data and pretraining-budget sections, :func:`curves_markdown`), every run."""
    lines: list[str] = []
    cols = list(TASKS)
    head = "| variant | " + " | ".join(f"{t} ({METRIC[t]})" for t in cols) + " | GLUE-5 avg |"
    sep = "|---|" + "---|" * (len(cols) + 1)
    lines += ["## Table 5 at CPU scale (dev splits; mean ± sample std over seeds)", "", head, sep]
    # The LSTM's row once it has runs (a Transformer-only report reads as before).
    ours = [v for v in TABLE5 if v in VARIANTS or v in agg]
    for v in ours:
        cells = agg.get(v, {})
        row = [
            fmt(cells[t]["mean"], cells[t]["std"], cells[t]["n"]) if t in cells and cells[t]["n"] else "–" for t in cols
        ]
        glue = [cells[t]["mean"] for t in GLUE_TASKS if t in cells and cells[t]["n"]]
        avg = fmt(statistics.fmean(glue)) if len(glue) == len(GLUE_TASKS) else "–"
        lines.append(f"| {LABELS.get(v, v)} (ours) | " + " | ".join(row) + f" | {avg} |")
    base = meta.get("baselines") or {}
    if base:
        row = [fmt(base[t]) if base.get(t) is not None else "–" for t in cols]
        lines.append("| majority class (ours) | " + " | ".join(row) + " | – |")
    for v in TABLE5:
        p = PAPER[v]
        glue = [p[t] for t in GLUE_TASKS]
        avg = fmt(statistics.fmean(glue)) if all(x is not None for x in glue) else "–"
        lines.append(
            f"| {LABELS.get(v, v)} (paper) | "
            + " | ".join(fmt(p[t]) if p[t] is not None else "–" for t in cols)
            + f" | {avg} |"
        )
    uneven = [
        f"{v}/{t}: {agg[v][t]['n']}"
        for v in TABLE5
        for t in cols
        if t in agg.get(v, {}) and agg[v][t]["n"] != meta.get("seeds")
    ]
    if uneven:  # an unfinished run, or a run that produced no score
        lines += ["", f"Cells with other than {meta.get('seeds')} scored seeds: " + ", ".join(uneven) + "."]
    lines += [
        "",
        "Paper: reference §6 (Table 5; Story Cloze from the main results, no ablation reported). "
        "GLUE-5 avg = mean over SST-2, CoLA, RTE, MRPC, STS-B (the paper's Avg also has QQP, MNLI, QNLI). "
        "Majority class: the dev score of always predicting the most frequent training label (STS-B: none, a "
        "constant has no correlation)."
        + (
            " LSTM w/ aux LM: the `full` fine-tuning from a single-layer LSTM pretrained like the Transformer "
            "(same parameter count, corpus, updates and tokens; the paper: 2048 units)."
            if LSTM_VARIANT in agg
            else ""
        ),
        "",
    ]
    others = [v for v in ours if v != "full"]
    lines += [
        "## Differences of means (ours), with Welch's t",
        "",
        "| task | " + " | ".join(f"full − {LABELS.get(v, v)}" for v in others) + " |",
        "|---|" + "---|" * len(others),
    ]

    def diff(t: str, a: str, b: str) -> str:
        ca, cb = agg.get(a, {}).get(t), agg.get(b, {}).get(t)
        if not ca or not cb or not ca["n"] or not cb["n"]:
            return "–"
        tval = welch_t(ca["scores"], cb["scores"])
        return f"{ca['mean'] - cb['mean']:+.1f}" + ("" if tval is None else f" (t = {tval:+.1f})")

    for t in cols:
        lines.append(f"| {t} | " + " | ".join(diff(t, "full", v) for v in others) + " |")
    n = int(meta.get("seeds") or 0)
    if n >= 2:
        hi, lo = t_critical(n - 1), t_critical(2 * n - 2, conservative=False)
        lines += [
            "",
            f"t: Welch's t statistic of the two groups of seeds. With {n} seeds a side its degrees of freedom "
            f"are {n - 1}-{2 * n - 2}, so |t| > {hi:.2f} is significant at the 5 % level (two-sided) whatever the "
            f"variances, and |t| < {lo:.2f} is not.",
        ]
    pre = meta.get("pretrained") or {}
    if pre:
        lines += [
            "",
            "## Pretrained models (same corpus, batches, updates, optimiser, schedule and seed)",
            "",
            "| model | parameters | updates | final validation perplexity | minutes |",
            "|---|---|---|---|---|",
        ]
        for m, d in pre.items():
            ppl = (
                f"{math.exp(min(float(d['final_val_loss']), 700)):,.1f}" if d.get("final_val_loss") is not None else "–"
            )
            mins = f"{d['seconds'] / 60:.1f}" if isinstance(d.get("seconds"), (int, float)) else "–"
            params = f"{d['params']:,}" if isinstance(d.get("params"), int) else "–"
            lines.append(f"| {MODEL_LABELS.get(m, m)} | {params} | {d.get('step', '–')} | {ppl} | {mins} |")
    auc = meta.get("sst2_margin_auc") or {}
    more = {m: a for m, a in (meta.get("sst2_margin_auc_models") or {}).items() if a}  # the LSTM's, by model
    if auc:
        lines += [
            "",
            "## Zero-shot SST-2: does the margin carry signal? (ROC AUC of log p(positive) − log p(negative))",
            "",
            "| step | AUC |" + "".join(f" AUC ({MODEL_LABELS.get(m, m)}) |" for m in more),
            "|---|---|" + "---|" * len(more),
        ]
        lines += [
            f"| {k} | {v:.3f} |" + "".join(f" {a[k]:.3f} |" if k in a else " – |" for a in more.values())
            for k, v in sorted(auc.items())
        ]
    curve = layers_curve(recs)
    if curve:
        task = next(r["task"] for r in recs if r["variant"] == "layers")
        lines += [
            "",
            f"## Layers transferred ({task}, {METRIC[task]})",
            "",
            "| layers | score | seeds |",
            "|---|---|---|",
        ]
        lines += [f"| {k} | {fmt(m, s, n)} | {n} |" for k, (m, s, n) in curve.items()]
    lines += curves or []
    lines += [
        "",
        "## Every run",
        "",
        "| task | variant | layers | seed | metric | score | train ex. | dev ex. | updates | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(
        recs, key=lambda r: (r["variant"] == "layers", r["task"], r["variant"], r["transfer_layers"] or 0, r["seed"])
    ):
        lines.append(
            f"| {r['task']} | {r['variant']} | {'' if r['transfer_layers'] is None else r['transfer_layers']} | "
            f"{r['seed']} | {r['metric']} | {fmt(r['score']) if r['score'] is not None else 'failed'} | "
            f"{r['n_train']} | {r['n_eval']} | {r['steps']} | {r['seconds']} |"
        )
    return "\n".join(lines) + "\n"


def _cell_text(c: dict[str, Any] | None) -> str:
    return fmt(c["mean"], c["std"], c["n"]) if c and c["n"] else "–"


def _t_note(n: int) -> list[str]:
    if n < 2:
        return []
    hi, lo = t_critical(n - 1), t_critical(2 * n - 2, conservative=False)
    return [
        "",
        f"t: Welch's t of the two groups of {n} seeds ({n - 1}-{2 * n - 2} degrees of freedom): |t| > {hi:.2f} "
        f"is significant at the 5 % level (two-sided) whatever the variances, |t| < {lo:.2f} is not.",
    ]


def labeled_markdown(lab: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """Per task: score per size for every variant, then per model the gap pretrained − random init and Welch's t."""
    lines: list[str] = []
    base = meta.get("baselines") or {}
    for task in dict.fromkeys(c["task"] for c in lab["curves"]):
        curves = [c for c in lab["curves"] if c["task"] == task]
        gaps = [g for g in lab["gaps"] if g["task"] == task]
        models = list(dict.fromkeys(g["model"] for g in gaps))
        sizes = sorted({p["size"] for c in curves for p in c["points"]})
        at = {(c["variant"], p["size"]): p for c in curves for p in c["points"]}
        gap_at = {(g["model"], g["size"]): g for g in gaps}
        cols = [c["variant"] for c in curves]
        lines += [
            "",
            f"## Labeled-data curve: {task} ({METRIC[task]}, dev; mean ± std over seeds; nested subsamples)",
            "",
            "| labeled examples | "
            + " | ".join(cols)
            + "".join(f" | {' − '.join(curve_variants(m))} (t)" for m in models)
            + " |",
            "|---|" + "---|" * (len(cols) + len(models)),
        ]
        for n in sizes:
            row = [_cell_text(at.get((v, n))) for v in cols]
            for m in models:
                g = gap_at.get((m, n))
                row.append(
                    "–" if g is None else f"{g['gap']:+.1f}" + ("" if g["t"] is None else f" (t = {g['t']:+.1f})")
                )
            lines.append(f"| {n:,} | " + " | ".join(row) + " |")
        if base.get(task) is not None:
            lines += ["", f"Majority class ({task} dev): {base[task]:.1f}."]
    if lab["curves"]:
        lines += _t_note(int(meta.get("labeled_seeds") or 0))
    return lines


def budget_markdown(bud: dict[str, Any], lab: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """Per model: one row per checkpoint (updates, validation perplexity, the fine-tuned score on each task), with
    the same fine-tuning from random weights and the majority class as reference rows."""
    lines: list[str] = []
    base = meta.get("baselines") or {}
    for model in dict.fromkeys(c["model"] for c in bud["curves"]):
        curves = [c for c in bud["curves"] if c["model"] == model]
        val = {int(v["step"]): v for v in bud["val"].get(model, [])}
        steps = sorted({p["step"] for c in curves for p in c["points"]} | set(val))
        at = {(i, p["step"]): p for i, c in enumerate(curves) for p in c["points"]}
        lines += [
            "",
            f"## Pretraining-budget curve ({model}: {curve_variants(model)[0]} fine-tuning from every kept "
            "checkpoint; dev; mean ± std over seeds)",
            "",
            "| pretraining updates | validation perplexity | "
            + " | ".join(f"{c['task']} {METRIC[c['task']]} ({c['size']:,} ex.)" for c in curves)
            + " |",
            "|---|---|" + "---|" * len(curves),
        ]
        for k in steps:
            ppl = f"{math.exp(min(float(val[k]['val_loss']), 700)):,.1f}" if k in val else "–"
            lines.append(
                f"| {k:,} | {ppl} | " + " | ".join(_cell_text(at.get((i, k))) for i in range(len(curves))) + " |"
            )
        rnd = curve_variants(model)[1]
        ref = {(c["task"], p["size"]): p for c in lab["curves"] if c["variant"] == rnd for p in c["points"]}
        lines.append(
            f"| {rnd} (random init, same size) | – | "
            + " | ".join(_cell_text(ref.get((c["task"], c["size"]))) for c in curves)
            + " |"
        )
        lines.append(
            "| majority class | – | "
            + " | ".join(fmt(base[c["task"]]) if base.get(c["task"]) is not None else "–" for c in curves)
            + " |"
        )
    return lines


def curve_runs_markdown(lrecs: list[dict[str, Any]], brecs: list[dict[str, Any]]) -> list[str]:
    """Every run of the two curves, one row each (failed runs included)."""
    lines: list[str] = []

    def row(r: dict[str, Any]) -> str:
        score = fmt(r["score"]) if r["score"] is not None else "failed"
        return f"{score} | {r['n_train']} | {r['n_eval']} | {r['steps']} | {r['seconds']} |"

    if lrecs:
        lines += [
            "",
            "## Every run of the labeled-data curve",
            "",
            "| task | variant | labeled ex. | seed | score | train ex. | dev ex. | updates | seconds |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [f"| {r['task']} | {r['variant']} | {r['size']} | {r['seed']} | " + row(r) for r in lrecs]
    if brecs:
        lines += [
            "",
            "## Every run of the pretraining-budget curve",
            "",
            "| task | model | labeled ex. | pretraining updates | seed | score | train ex. | dev ex. | updates | "
            "seconds |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [f"| {r['task']} | {r['model']} | {r['size']} | {r['step']} | {r['seed']} | " + row(r) for r in brecs]
    return lines


def val_curve(out: Path, model: str = "gpt") -> list[tuple[int, float]]:
    """(step, validation loss) of ``model`` from step 0 (the saved initial model) and its run's metrics.jsonl."""
    from gptcli.checkpoint import is_checkpoint, read_header

    pts: list[tuple[int, float]] = []
    pm = pretrained_model(out, model)
    init = pm.init
    if is_checkpoint(init):
        meta = read_header(init).meta
        if isinstance(meta.get("val_loss"), (int, float)):
            pts.append((0, float(meta["val_loss"])))
    metrics = pm.run / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line) if line.strip() else {}
            if rec.get("kind") == "eval" and isinstance(rec.get("loss"), (int, float)):
                pts.append((int(rec["step"]), float(rec["loss"])))
    return sorted(dict(pts).items())


def zeroshot_curves(out: Path) -> dict[str, dict[str, Any]]:
    """Each pretrained model's zero-shot curve (its ``curve.json``), for the models that have one."""
    found = {m: pretrained_model(out, m).zeroshot / "curve.json" for m in PRETRAINED}
    return {m: read_json(p) for m, p in found.items() if p.is_file()}


def plot_zeroshot(curves: dict[str, dict[str, Any]], path: Path, plt: Any) -> None:
    """Figure 2 (right): normalised zero-shot score per task over pretraining updates, the Transformer solid and
    the LSTM dashed in the same colour per task (as ``gptcli.eval.curve.plot`` draws one model)."""
    from gptcli.eval.curve import LABELS as TASK_LABELS

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    tasks = list(dict.fromkeys(t for c in curves.values() for t in c["tasks"]))
    for model, c in curves.items():
        for i, t in enumerate(tasks):
            pts = [(p["step"], p["normalized"].get(t)) for p in c["points"] if p.get("step") is not None]
            pts = [(x, y) for x, y in pts if isinstance(y, (int, float)) and not math.isnan(y)]
            if not pts:
                continue
            label = TASK_LABELS.get(t, t) + ("" if len(curves) == 1 else f" ({MODEL_LABELS.get(model, model)})")
            ax.plot(
                [x for x, _ in pts],
                [y for _, y in pts],
                marker="o",
                markersize=4 if model != "gpt" else 6,
                color=f"C{i}",
                linestyle="-" if model == "gpt" else "--",
                label=label,
            )
    ax.axhline(0.0, color="grey", lw=0.8, ls="--")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("pretraining updates")
    ax.set_ylabel("normalized zero-shot performance")
    title = "Zero-shot heuristics over pretraining (0 = random, 1 = SOTA)"
    ax.set_title(title if len(curves) == 1 else title + "\nsolid: Transformer, dashed: LSTM", fontsize=10)
    ax.legend(fontsize=7, ncol=2 if len(curves) > 1 else 1)
    fig.tight_layout()
    fig.savefig(str(path), format="png")
    plt.close(fig)


def plots(out: Path, recs: list[dict[str, Any]], baselines: dict[str, float | None] | None = None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[str] = []
    d = out / "plots"
    d.mkdir(parents=True, exist_ok=True)
    vcs = {m: val_curve(out, m) for m in PRETRAINED}
    vcs = {m: vc for m, vc in vcs.items() if vc}
    if vcs:
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
        for i, (m, vc) in enumerate(vcs.items()):
            ax.plot(
                [s for s, _ in vc],
                [math.exp(min(loss, 50)) for _, loss in vc],
                marker="o",
                color=f"C{i}",
                label=MODEL_LABELS.get(m, m),
            )
        if len(vcs) > 1:
            ax.legend(fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("pretraining updates")
        ax.set_ylabel("validation perplexity (held-out books)")
        ax.set_title("Pretraining on 56 Gutenberg books")
        fig.tight_layout()
        fig.savefig(d / "val_perplexity.png")
        plt.close(fig)
        made.append("plots/val_perplexity.png")
    zcs = zeroshot_curves(out)
    if zcs:
        plot_zeroshot(zcs, d / "zeroshot.png", plt)
        made.append("plots/zeroshot.png")
    agg = aggregate(recs)
    if agg:
        # Table 5 as bars: one panel per task (metrics differ in scale), one bar per variant, every seed a dot.
        tasks = [t for t in TASKS if any(t in agg.get(v, {}) for v in TABLE5)]
        fig, axes = plt.subplots(1, len(tasks), figsize=(2.1 * len(tasks), 3.6), dpi=120, squeeze=False)
        colors = {"full": "tab:blue", "no-pretraining": "tab:red", "no-aux-lm": "tab:green", LSTM_VARIANT: "tab:purple"}
        for ax, t in zip(axes[0], tasks):
            for i, v in enumerate(TABLE5):
                cell = agg.get(v, {}).get(t)
                if not cell or not cell["n"]:
                    continue
                ax.bar(
                    i,
                    cell["mean"],
                    yerr=cell["std"] if cell["n"] > 1 else None,
                    color=colors[v],
                    alpha=0.75,
                    capsize=3,
                    label=LABELS.get(v, v),
                )
                ax.scatter([i] * cell["n"], cell["scores"], s=9, color="black", zorder=3)
            if baselines and baselines.get(t) is not None:
                ax.axhline(baselines[t], color="black", linestyle=":", linewidth=1, label="majority class")
            ax.set_title(f"{t} ({METRIC[t]})", fontsize=9)
            ax.set_xticks([])
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
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
        ax.errorbar(
            ks,
            [lc[k][0] for k in ks],
            yerr=[lc[k][1] for k in ks],
            marker="o",
            capsize=3,
            label="mean ± std over seeds",
        )
        seeds = [
            (r["transfer_layers"], r["score"]) for r in recs if r["variant"] == "layers" and r["score"] is not None
        ]
        ax.scatter([k for k, _ in seeds], [v for _, v in seeds], s=12, color="gray", zorder=3, label="each seed")
        # References a reader needs to judge the curve: the same fine-tuning from random weights, and the floor.
        nopre = [
            r["score"]
            for r in recs
            if r["variant"] == "no-pretraining" and r["task"] == task and r["score"] is not None
        ]
        if nopre:
            ax.axhline(
                statistics.fmean(nopre), color="tab:red", linestyle="--", linewidth=1, label="no pretraining (mean)"
            )
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


def _curve_line(ax, xs: list[float], points: list[dict[str, Any]], label: str, color: str, dashed: bool) -> None:
    """Mean ± std over seeds as a line with error bars, every seed a dot."""
    ok = [(x, p) for x, p in zip(xs, points) if p["n"]]
    if not ok:
        return
    ax.errorbar(
        [x for x, _ in ok],
        [p["mean"] for _, p in ok],
        yerr=[p["std"] for _, p in ok],
        marker="o",
        markersize=4,
        capsize=3,
        color=color,
        linestyle="--" if dashed else "-",
        label=label,
    )
    dots = [(x, v) for x, p in ok for v in p["scores"]]
    ax.scatter([x for x, _ in dots], [v for _, v in dots], s=9, color=color, alpha=0.45, zorder=3)


def _color(variant: str, i: int) -> str:
    return {"full": "tab:blue", "no-pretraining": "tab:red"}.get(variant, f"C{i + 2}")


def plot_curves(out: Path, lab: dict[str, Any], bud: dict[str, Any], baselines: dict[str, float | None]) -> list[str]:
    """``plots/labeled.png`` (score against labeled examples, log axis) and ``plots/budget.png`` (validation
    perplexity of the checkpoints, then the fine-tuned score from each, against pretraining updates)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    made: list[str] = []
    d = out / "plots"
    d.mkdir(parents=True, exist_ok=True)
    tasks = list(dict.fromkeys(c["task"] for c in lab["curves"]))
    if tasks:
        fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 4.0), dpi=120, squeeze=False)
        for ax, task in zip(axes[0], tasks):
            for i, c in enumerate(c for c in lab["curves"] if c["task"] == task):
                _curve_line(
                    ax,
                    [p["size"] for p in c["points"]],
                    c["points"],
                    c["variant"],
                    _color(c["variant"], i),
                    c["variant"].endswith("no-pretraining"),
                )
            if baselines.get(task) is not None:
                ax.axhline(baselines[task], color="black", linestyle=":", linewidth=1, label="majority class")
            sizes = sorted({p["size"] for c in lab["curves"] if c["task"] == task for p in c["points"]})
            ax.set_xscale("log")
            ax.set_xticks(sizes, [f"{n:,}" for n in sizes], fontsize=8)
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel("labeled training examples (nested subsamples)")
            ax.set_ylabel(f"{task} dev {METRIC[task]}")
            ax.set_title(task, fontsize=10)
            ax.legend(fontsize=8)
        fig.suptitle("Labeled-data curve: pretrained vs random init (mean ± std over seeds; dots: seeds)", fontsize=10)
        fig.tight_layout()
        fig.savefig(d / "labeled.png")
        plt.close(fig)
        made.append("plots/labeled.png")
    btasks = list(dict.fromkeys(c["task"] for c in bud["curves"]))
    if btasks:
        fig, axes = plt.subplots(1, 1 + len(btasks), figsize=(4.6 * (1 + len(btasks)), 4.0), dpi=120, squeeze=False)
        ax = axes[0][0]
        for i, (model, vals) in enumerate(bud["val"].items()):
            ax.plot([v["step"] for v in vals], [v["perplexity"] for v in vals], marker="o", color=f"C{i}", label=model)
        ax.set_yscale("log")
        ax.set_xlabel("pretraining updates")
        ax.set_ylabel("validation perplexity (held-out books)")
        ax.set_title("the checkpoints", fontsize=10)
        ax.legend(fontsize=8)
        for ax, task in zip(axes[0][1:], btasks):
            for i, c in enumerate(c for c in bud["curves"] if c["task"] == task):
                _curve_line(
                    ax,
                    [p["step"] for p in c["points"]],
                    c["points"],
                    f"{curve_variants(c['model'])[0]}, {c['size']:,} ex.",
                    f"C{i}",
                    False,
                )
                rnd = curve_variants(c["model"])[1]
                ref = [
                    p
                    for r in lab["curves"]
                    if r["task"] == task and r["variant"] == rnd
                    for p in r["points"]
                    if p["size"] == c["size"] and p["n"]
                ]
                if ref:
                    ax.axhline(
                        ref[0]["mean"], color="tab:red", linestyle="--", linewidth=1, label=f"{rnd} (mean, same size)"
                    )
            if baselines.get(task) is not None:
                ax.axhline(baselines[task], color="black", linestyle=":", linewidth=1, label="majority class")
            ax.set_xlabel("pretraining updates of the checkpoint fine-tuned")
            ax.set_ylabel(f"{task} dev {METRIC[task]}")
            ax.set_title(task, fontsize=10)
            ax.legend(fontsize=8)
        fig.suptitle(
            "Pretraining-budget curve: fine-tuned score from each checkpoint (mean ± std; dots: seeds)", fontsize=10
        )
        fig.tight_layout()
        fig.savefig(d / "budget.png")
        plt.close(fig)
        made.append("plots/budget.png")
    return made


def stage_report(cfg: ReproConfig, out: Path) -> dict[str, Any]:
    from gptcli.files.fsutil import write_text_atomic

    recs = collect_runs(out)
    agg = aggregate(recs)
    plan = read_json(out / "plan.json") if (out / "plan.json").is_file() else {}
    zs = read_json(out / "zeroshot" / "curve.json") if (out / "zeroshot" / "curve.json").is_file() else None
    done = {m: read_json(pretrained_model(out, m).done) for m in PRETRAINED if pretrained_model(out, m).ready()}
    if "gpt" in done and "params" in plan:
        done["gpt"] = {**done["gpt"], "params": plan["params"]}
    meta = {
        "seeds": cfg.seeds,
        "budget_minutes": cfg.budget_minutes,
        "config": asdict(cfg),
        "plan": plan,
        "pretrain": read_json(out / "pretrain-done.json") if (out / "pretrain-done.json").is_file() else None,
        "pretrained": done,
        "seconds": read_json(out / "seconds.json") if (out / "seconds.json").is_file() else {},
        "baselines": majority_baselines(),
        "sst2_margin_auc": sst2_margin_auc(out / "zeroshot"),
        "sst2_margin_auc_models": {
            m: sst2_margin_auc(pretrained_model(out, m).zeroshot) for m in PRETRAINED if m != "gpt"
        },
        "labeled_seeds": cfg.labeled_seeds,
        "budget_seeds": cfg.budget_seeds,
    }
    lrecs, brecs = collect_labeled(out), collect_budget(out)
    lab, bud = labeled_curves(lrecs), budget_curves(out, brecs)
    made = plots(out, recs, meta["baselines"]) + plot_curves(out, lab, bud, meta["baselines"])
    result = {
        "meta": meta,
        "runs": recs,
        "table5": {
            v: {t: {k: c[k] for k in ("mean", "std", "n", "scores", "failed")} for t, c in ts.items()}
            for v, ts in agg.items()
        },
        "paper": PAPER,
        "layers": {str(k): {"mean": m, "std": s, "n": n} for k, (m, s, n) in layers_curve(recs).items()},
        "val_curve": [{"step": s, "loss": v, "perplexity": math.exp(min(v, 700))} for s, v in val_curve(out)],
        "zeroshot": zs,
        "labeled": {**lab, "runs": lrecs},
        "budget": {**bud, "runs": brecs},
        "plots": made,
        # Every pretrained model side by side (the Transformer's entries repeat val_curve and zeroshot above).
        "models": {
            m: {
                "pretrain": done.get(m),
                "val_curve": [
                    {"step": s, "loss": v, "perplexity": math.exp(min(v, 700))} for s, v in val_curve(out, m)
                ],
                "zeroshot": zeroshot_curves(out).get(m),
            }
            for m in PRETRAINED
            if m == "gpt" or pretrained_model(out, m).init.exists()
        },
    }
    write_json(out / "results.json", json.loads(json.dumps(result, default=str).replace("NaN", "null")))
    md = markdown_tables(recs, agg, meta, labeled_markdown(lab, meta) + budget_markdown(bud, lab, meta))
    write_text_atomic(out / "tables.md", md + "\n".join(curve_runs_markdown(lrecs, brecs) + [""]))
    log(
        f"report: {len(recs)} + {len(lrecs)} + {len(brecs)} runs → {out / 'results.json'}, {out / 'tables.md'}, "
        f"{', '.join(made)}"
    )
    return result


# ------------------------------------------------------------------------------------------------- main

STAGES: tuple[str, ...] = (
    "prepare",
    "pretrain",
    "pretrain-lstm",
    "zeroshot",
    "zeroshot-lstm",
    "finetune",
    "finetune-lstm",
    "layers",
    "labeled",
    "budget",
    "report",
)
"""In the order they run. The ``-lstm`` stages do nothing unless the configuration wants the LSTM
(:func:`pretrained_models`)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=ReproConfig.out, help="output directory (rerun to continue)")
    ap.add_argument(
        "--data", type=Path, default=ReproConfig.data, help="real data root (books/, glue/, storycloze/, dprd/)"
    )
    ap.add_argument(
        "--budget-minutes",
        type=float,
        default=ReproConfig.budget_minutes,
        help="wall-clock target for the whole run on 2 cores (pretraining gets 45%%)",
    )
    ap.add_argument("--seeds", type=int, default=ReproConfig.seeds, help="fine-tuning seeds per task and variant")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks the pipeline in about a minute")
    ap.add_argument(
        "--stages", default=",".join(STAGES), help="comma-separated stages to run (each skips work already done)"
    )
    ap.add_argument(
        "--variants",
        default=",".join(TABLE5),
        help='Table 5 rows to fine-tune; lstm-full ("LSTM w/ aux LM") also pretrains the LSTM and scores '
        "it zero-shot (stages pretrain-lstm, zeroshot-lstm, finetune-lstm)",
    )
    ap.add_argument(
        "--tasks",
        default=",".join(TASKS),
        help="tasks of the finetune and finetune-lstm stages (default: all six); never give two invocations "
        "on one directory the same task",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=ReproConfig.threads,
        help="torch threads (default: 2, this machine's cores; 1 beside another run, e.g. the LSTM's stages)",
    )
    ap.add_argument(
        "--lstm-threads",
        type=int,
        default=None,
        help="torch threads for the LSTM's stages (default: as the others; 1 on a busy machine)",
    )
    ap.add_argument(
        "--full-sizes",
        action="store_true",
        help="labeled-data curve: add each task's whole training split (SST-2 67,349 rows: ≈ 45 min more)",
    )
    a = ap.parse_args(argv)
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if set(variants) - set(TABLE5):
        ap.error(f"--variants: unknown {', '.join(sorted(set(variants) - set(TABLE5)))} (known: {', '.join(TABLE5)})")
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    if set(tasks) - set(TASKS):
        ap.error(f"--tasks: unknown {', '.join(sorted(set(tasks) - set(TASKS)))} (known: {', '.join(TASKS)})")
    cfg = ReproConfig(
        out=a.out,
        data=a.data,
        budget_minutes=a.budget_minutes,
        seeds=a.seeds,
        full_sizes=a.full_sizes,
        variants=variants,
        threads=a.threads,
        tasks=tasks,
    )
    if a.smoke:
        smoke(cfg)
    if a.lstm_threads is not None:
        cfg.lstm_threads = a.lstm_threads
    stages = {s.strip() for s in a.stages.split(",") if s.strip()}
    if stages - set(STAGES):
        ap.error(f"--stages: unknown {', '.join(sorted(stages - set(STAGES)))} (known: {', '.join(STAGES)})")
    import torch

    torch.set_num_threads(cfg.threads)
    os.environ["GPT1_DATA"] = str(cfg.data.resolve())  # the tasks find glue/, storycloze/... under it
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", asdict(cfg))

    def timed(name: str, fn, *args):
        t0 = time.perf_counter()
        threads = cfg.lstm_threads if name.endswith("-lstm") and cfg.lstm_threads else cfg.threads
        torch.set_num_threads(threads)
        r = fn(*args)
        torch.set_num_threads(cfg.threads)
        # Read afresh: two invocations may run side by side on one directory (the LSTM's stages beside the
        # Transformer's), and each must add its stages to the file without dropping the other's.
        seconds = read_json(out / "seconds.json") if (out / "seconds.json").is_file() else {}
        seconds[name] = round(seconds.get(name, 0.0) + time.perf_counter() - t0, 1)
        write_json(out / "seconds.json", seconds)
        return r

    corpus = out / "corpus"
    if "prepare" in stages:
        corpus = timed("prepare", stage_prepare, cfg, out)
    plan = timed("plan", stage_plan, cfg, out, corpus) if (corpus / "manifest.json").is_file() else None
    run = out / "pretrain"
    models = pretrained_models(cfg)
    for model in models:  # the Transformer, then the LSTM (same corpus, same plan)
        name = "pretrain" if model == "gpt" else f"pretrain-{model}"
        if name in stages and plan:
            timed(name, stage_pretrain, cfg, out, corpus, plan, model)
    ready = (out / "pretrain-done.json").is_file()
    for model in models:
        name = "zeroshot" if model == "gpt" else f"zeroshot-{model}"
        if name in stages and pretrained_model(out, model).ready():
            timed(name, stage_zeroshot, cfg, out, model)
    if "finetune" in stages and ready:
        timed("finetune", stage_finetune, cfg, out, run, plan)
    for model in models[1:]:
        name = f"finetune-{model}"
        if name in stages and curve_variants(model)[0] in cfg.variants and pretrained_model(out, model).ready():
            timed(name, stage_finetune_model, cfg, out, plan, model)
    if "layers" in stages and ready:
        timed("layers", stage_layers, cfg, out, run, plan)
    # The curves check each of their pretrained models themselves (curve_models).
    if "labeled" in stages:
        timed("labeled", stage_labeled, cfg, out)
    if "budget" in stages:
        timed("budget", stage_budget, cfg, out)
    if "report" in stages:
        timed("report", stage_report, cfg, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
