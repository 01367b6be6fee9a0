"""Do the small presets leave the unigram plateau? A sweep over learning rate × initialisation × seed.

With its earlier initialisation the ``tiny`` preset at lr 1e-3 sat on the unigram plateau (validation loss 6.50 →
6.49 over 300 updates on two books) while the same run at 2.5e-4 left it. This script measures which (lr, init_std)
pairs leave it, for each small preset, on a corpus a new user would have (two real books), so that the presets'
defaults and the recommended settings in ``gpt1 pretrain --help`` rest on evidence. Every run is a plain
``gptcli.train.pretrain`` call; results (the validation curve of every run, the corpus's unigram loss, the machine)
go to ``OUT/sweep.json`` and a plot to ``OUT/sweep.png``. Runs already in ``OUT/runs`` are reused, so an interrupted
sweep continues where it stopped.

    python benchmarks/preset_sweep.py --corpus runs/sweep/corpus --out runs/sweep          # the documented sweep
    python benchmarks/preset_sweep.py --corpus C --out O --presets tiny --lrs 1e-3 --inits 0.02,0.06 --seeds 0

Make the corpus with ``gpt1 prepare BOOK1 BOOK2 --strip-gutenberg --split-by paragraph --vocab-size 4000 --out C``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _machine import cpu_model

from gptcli.data.shards import open_corpus
from gptcli.train.pretrain import PretrainConfig, pretrain
from gptcli.train.pretrain_job import unigram_loss


def run_one(
    corpus: Path, out: Path, preset: str, lr: float, init_std: float, seed: int, a: argparse.Namespace
) -> dict[str, Any]:
    """One pretraining run (or its stored result): the validation curve and the seconds it took."""
    name = f"{preset}-lr{lr:g}-init{init_std:g}-seed{seed}"
    done = out / "runs" / name / "sweep-result.json"
    if done.is_file():
        return json.loads(done.read_text())
    cfg = PretrainConfig(
        data=corpus,
        out=out / "runs" / name,
        preset=preset,
        model={"init_std": init_std},
        seq_len=a.seq_len,
        batch_size=a.batch_size,
        lr=lr,
        max_steps=a.updates,
        epochs=1000.0,
        warmup_steps=a.warmup,
        seed=seed,
        device="cpu",
        precision="fp32",
        eval_every=a.eval_every,
        eval_batches=a.eval_batches,
        save_every=0,
        keep_last=1,
        log_every=a.eval_every,
        resume=True,
    )
    t0 = time.perf_counter()
    pretrain(cfg)
    seconds = time.perf_counter() - t0
    rows = [json.loads(line) for line in (cfg.out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [(r["step"], r["loss"]) for r in rows if r.get("kind") == "eval"]
    res = {
        "name": name,
        "preset": preset,
        "lr": lr,
        "init_std": init_std,
        "seed": seed,
        "val_curve": curve,
        "seconds": round(seconds, 1),
    }
    done.write_text(json.dumps(res))
    return res


def corpus_unigram(corpus: Path) -> float:
    oc = open_corpus(corpus)
    return float(unigram_loss(oc.arrays("train"), oc.arrays("val"), oc.tokenizer.vocab_size + 3))


def summarise(results: list[dict[str, Any]], unigram: float, margin: float) -> list[dict[str, Any]]:
    """Per (preset, lr, init): final validation loss over seeds and whether every seed left the plateau."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["preset"], r["lr"], r["init_std"]), []).append(r)
    rows = []
    for (preset, lr, init), rs in sorted(groups.items()):
        finals = [r["val_curve"][-1][1] for r in rs]
        rows.append(
            {
                "preset": preset,
                "lr": lr,
                "init_std": init,
                "seeds": len(rs),
                "final_val_mean": float(np.mean(finals)),
                "final_val_min": min(finals),
                "final_val_max": max(finals),
                "below_unigram": unigram - max(finals),
                "left_plateau": all(f < unigram - margin for f in finals),
            }
        )
    return rows


def plot(results: list[dict[str, Any]], unigram: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = sorted({r["preset"] for r in results})
    inits = sorted({r["init_std"] for r in results})
    fig, axes = plt.subplots(len(presets), len(inits), figsize=(5.5 * len(inits), 3.8 * len(presets)), squeeze=False)
    lrs = sorted({r["lr"] for r in results})
    colours = dict(zip(lrs, plt.cm.viridis(np.linspace(0, 0.9, len(lrs)))))
    for i, preset in enumerate(presets):
        for j, init in enumerate(inits):
            ax = axes[i][j]
            for r in results:
                if r["preset"] == preset and r["init_std"] == init:
                    xs, ys = zip(*r["val_curve"])
                    ax.plot(
                        xs, ys, color=colours[r["lr"]], alpha=0.85, label=f"lr {r['lr']:g}" if r["seed"] == 0 else None
                    )
            ax.axhline(unigram, color="red", ls="--", lw=1, label="unigram loss")
            ax.set_title(f"{preset}, init_std {init:g}")
            ax.set_xlabel("update")
            ax.set_ylabel("validation loss (nats)")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--lrs", default="2.5e-4,1e-3,2e-3")
    ap.add_argument("--inits", default="0.02,0.06")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("SWEEP_THREADS", "2")))
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: summarise and plot every finished run in OUT/runs (grids of several calls)",
    )
    ap.add_argument("--margin", type=float, default=0.1, help="nats below the unigram loss that count as learning")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    a.out.mkdir(parents=True, exist_ok=True)
    unigram = corpus_unigram(a.corpus)
    grid = [
        (p, float(lr), float(i), int(s))
        for p in a.presets.split(",")
        for lr in a.lrs.split(",")
        for i in a.inits.split(",")
        for s in a.seeds.split(",")
    ]
    results = []
    if a.report_only:
        grid = []
        results = [json.loads(p.read_text()) for p in sorted((a.out / "runs").glob("*/sweep-result.json"))]
        results.sort(key=lambda r: (r["preset"], r["init_std"], r["lr"], r["seed"]))
    for preset, lr, init, seed in grid:
        r = run_one(a.corpus, a.out, preset, lr, init, seed, a)
        print(
            f"{r['name']}: val {r['val_curve'][0][1]:.3f} → {r['val_curve'][-1][1]:.3f} "
            f"(unigram {unigram:.3f}; {r['seconds']} s)",
            flush=True,
        )
        results.append(r)
    summary = summarise(results, unigram, a.margin)
    settings = {k: v for k, v in vars(a).items() if k not in ("corpus", "out", "report_only", "lrs", "inits", "seeds")}
    report = {
        "cpu": cpu_model(),
        "threads": a.threads,
        "torch": torch.__version__,
        "unigram_loss": unigram,
        "settings": settings,
        "corpus": str(a.corpus),
        "summary": summary,
        "runs": results,
    }
    (a.out / "sweep.json").write_text(json.dumps(report, indent=1))
    plot(results, unigram, a.out / "sweep.png")
    for row in summary:
        print(
            f"{row['preset']:6} lr {row['lr']:<7g} init {row['init_std']:<5g} final val {row['final_val_mean']:.3f} "
            f"({row['below_unigram']:+.3f} below unigram at worst) {'LEARNS' if row['left_plateau'] else 'plateau'}"
        )


if __name__ == "__main__":
    main()
