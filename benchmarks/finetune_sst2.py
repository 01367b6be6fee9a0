"""Learning actually happens: a small pretrained-then-fine-tuned model beats the majority class on SST-2 dev.

An experiment, not a timed test. In one run, on CPU:

1. ``prepare``: learn a small BPE (``--vocab``) on the pretraining text: by default (``--corpus sst2``) the SST-2
   *training* sentences without their labels (unlabeled in-domain text, the semi-supervised setting at a size a
   CPU can pretrain on in minutes; the dev set is never seen), or ``--corpus books`` (Project Gutenberg books
   from ``../shared/data/books``, closer to the paper's BooksCorpus but needing far more pretraining to transfer);
2. ``pretrain``: a small GPT-1-shaped model for ``--pretrain-steps`` updates on that text;
3. ``finetune``: SST-2 (real GLUE files) on a ``--train-examples`` subset, the paper's recipe otherwise
   (aux LM λ = 0.5, linear warm-up/decay, classifier dropout 0.1) with a learning rate suited to the small model;
4. the same fine-tuning from a *random* model of the same shape and tokenizer (``--init none``);
5. both scored on the full SST-2 dev set (872 sentences) against the majority class.

Reports accuracies, the margin over the majority class and pretrained vs random as a ratio, measured in the same
run, as JSON (``--json``) and a table.

    python benchmarks/finetune_sst2.py                      # ~10 minutes on 2 idle cores
    python benchmarks/finetune_sst2.py --lm-weight 0        # without the auxiliary LM
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GPT1_SHARED", REPO.parent / "shared")) / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=("sst2", "books"), default="sst2", help="pretraining text (see above)")
    ap.add_argument("--books", type=int, default=8, help="with --corpus books: number of books (smallest first)")
    ap.add_argument("--vocab", type=int, default=4000, help="BPE vocabulary size")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--pretrain-steps", type=int, default=400)
    ap.add_argument("--pretrain-batch", type=int, default=32)
    ap.add_argument("--pretrain-lr", type=float, default=1e-3)
    ap.add_argument("--train-examples", type=int, default=4000, help="SST-2 training subset")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3, help="fine-tuning peak lr (the paper's 6.25e-5 is for 117M)")
    ap.add_argument("--lm-weight", type=float, default=0.5, help="auxiliary LM weight λ (paper: 0.5)")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--workdir", help="keep the corpus and runs here (default: a temporary directory)")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()

    import torch
    from rich.console import Console
    from rich.table import Table

    from gptcli.commands.render import RichProgress
    from gptcli.data.prepare import PrepareConfig, prepare
    from gptcli.eval.tasks import evaluate_task
    from gptcli.tasks import get_task
    from gptcli.train.finetune import FinetuneConfig, finetune
    from gptcli.train.pretrain import PretrainConfig, pretrain

    console = Console(stderr=True)
    sst2 = SHARED / "glue" / "SST-2"
    books = sorted((SHARED / "books").glob("*.txt"), key=lambda p: p.stat().st_size)[: args.books]
    if not sst2.is_dir() or (args.corpus == "books" and not books):
        sys.exit(f"needs {sst2}" + (f" and {SHARED / 'books'}" if args.corpus == "books" else ""))
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ft-sst2-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.corpus == "sst2":
        # Labels dropped: pretraining sees unlabeled text only. Documents of 100 sentences, so that prepare's
        # held-out validation documents (1%) leave the rest for training.
        sents = [e.texts[0] for e in get_task("sst2").read("train", sst2)]
        text = work / "sst2-train-sentences.jsonl"
        text.write_text(
            "".join(json.dumps({"text": "\n".join(sents[i : i + 100])}) + "\n" for i in range(0, len(sents), 100)),
            encoding="utf-8",
        )
        inputs = [str(text)]
    else:
        inputs = [str(b) for b in books]
    out: dict = {
        "args": vars(args),
        "threads": torch.get_num_threads(),
        "corpus_mb": round(sum(Path(i).stat().st_size for i in inputs) / 1e6, 2),
    }

    t = time.perf_counter()
    prepare(
        PrepareConfig(
            inputs=inputs,
            out=work / "corpus",
            vocab_size=args.vocab,
            strip_gutenberg=args.corpus == "books",
            overwrite=True,
        )
    )
    out["prepare_s"] = round(time.perf_counter() - t, 1)

    t = time.perf_counter()
    pre = pretrain(
        PretrainConfig(
            data=work / "corpus",
            out=work / "pre",
            preset="gpt1",
            model={
                "n_layer": args.layers,
                "n_embd": args.embd,
                "n_head": args.heads,
                "n_inner": 4 * args.embd,
                "n_ctx": args.seq_len,
            },
            seq_len=args.seq_len,
            batch_size=args.pretrain_batch,
            max_steps=args.pretrain_steps,
            lr=args.pretrain_lr,
            warmup_steps=max(1, args.pretrain_steps // 20),
            eval_every=0,
            save_every=0,
            log_every=50,
            precision=args.precision,
        )
    )
    out["pretrain_s"] = round(time.perf_counter() - t, 1)
    out["pretrain_val_loss"] = pre.final_val_loss

    dev = get_task("sst2").read("dev", sst2)
    majority = Counter(e.label for e in dev).most_common(1)[0][1] / len(dev) * 100
    out["majority_class_acc"] = round(majority, 2)

    for name, init in (("pretrained", str(work / "pre")), ("random init", "none")):
        t = time.perf_counter()
        finetune(
            FinetuneConfig(
                task="sst2",
                init=init,
                tokenizer=str(work / "pre") if init == "none" else None,
                out=str(work / name.replace(" ", "-")),
                data_dir=str(sst2),
                max_train_examples=args.train_examples,
                epochs=args.epochs,
                lr=args.lr,
                lm_weight=args.lm_weight,
                precision=args.precision,
                select="last",
                overwrite=True,
                batching="length",
                schedule="linear",  # what docs/finetune.md's figures were run with
            ),
            progress=RichProgress(console),
        )
        ev = evaluate_task(
            "sst2",
            work / name.replace(" ", "-"),
            "dev",
            data_dir=sst2,
            out=work / f"eval-{name[:3]}",
            precision=args.precision,
        )
        out[name] = {"dev_acc": round(ev["scores"]["accuracy"], 2), "finetune_s": round(time.perf_counter() - t, 1)}

    p, r = out["pretrained"]["dev_acc"], out["random init"]["dev_acc"]
    out["margin_over_majority"] = round(p - majority, 2)
    out["pretrained_over_random"] = round(p / r, 3)
    table = Table(title=f"SST-2 dev accuracy (872 sentences), {args.train_examples} training examples")
    for c in ("model", "dev acc", "vs majority"):
        table.add_column(c, justify="right" if c != "model" else "left")
    table.add_row("majority class", f"{majority:.1f}", "")
    for name in ("pretrained", "random init"):
        a = out[name]["dev_acc"]
        table.add_row(name, f"{a:.1f}", f"{a - majority:+.1f}")
    Console().print(table)
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
