"""Zero-shot scoring of multiple-choice tasks: shared contexts packed with their candidates vs the engine before.

``gptcli.eval.scoring.score`` on the requests ``gpt1 zeroshot`` makes for Story Cloze val (story → each ending) and
for a RACE-shaped dev set (document + question → each option; ``benchmarks/_race_shaped.py``: RACE has no real file
here), with random weights of the chosen preset and the original BPE, timed in the same process two ways:

- **packed** (now): a GPT packs many contexts into one row, each once and followed by its candidates
  (``Packing.shared``, one attention call per layer), the last block computing only the positions read;
- **before**: the engine as it was for a GPT — contexts of 64 tokens or more (RACE's documents) run once into a KV
  cache, one context at a time, that every candidate continues; shorter ones (Story Cloze's stories) as full rows,
  one per candidate, padded per batch.

Both run inside one autocast region (``score`` now holds one for all its passes); ``--per-pass-autocast`` gives the
"before" side one region per pass instead, as the engine had it. Reported: examples/s, the ratio, and the largest
difference between the two sides' log-probabilities.

    python benchmarks/zeroshot_shared.py --preset gpt1 --limit 48
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from _machine import add_machine_args, machine_header, start, write_json  # benchmarks/_machine.py
from _race_shaped import write_race_shaped

SHARED = Path(os.environ.get("GPT1_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data"


def requests(task: str, tok, limit: int) -> list:
    """The (context, candidate) requests of ``gpt1 zeroshot`` for the first ``limit`` examples."""
    from gptcli.eval.scoring import Request
    from gptcli.tasks import get_task

    if task == "storycloze":
        examples = get_task("storycloze").read("val", SHARED / "storycloze")[:limit]
        contexts = [tok.encode_batch([" ".join(e.texts)])[0] for e in examples]
    else:
        folder = write_race_shaped(Path(tempfile.mkdtemp(prefix="race-shaped-")), SHARED / "books", limit)
        examples = get_task("race").read("dev", folder)[:limit]
        contexts = [[t for ids in tok.encode_batch(list(e.texts)) for t in ids] for e in examples]
    out = []
    for e, ctx in zip(examples, contexts):
        out.extend(Request.of(ctx, ch) for ch in tok.encode_batch(list(e.choices)))
    return out


def run(model, reqs: list, side: str, precision: str, args) -> tuple[float, list[float]]:
    """Seconds and log-probabilities of one pass of ``side`` ("packed" or "before")."""
    from gptcli.eval import scoring

    packs, autocast = scoring._packs, scoring._autocast
    calls = [0]

    def per_pass(device, p):  # score's own outer region (its first call) made a no-op: each pass opens its own
        calls[0] += 1
        return autocast(device, "fp32" if calls[0] == 1 else p)

    try:
        if side == "before":
            scoring._packs = lambda m: False
            if args.per_pass_autocast:
                scoring._autocast = per_pass
        t0 = time.perf_counter()
        scores = scoring.score(
            model,
            reqs,
            batch_size=args.batch_size,
            precision=precision,
            cache_min_context=None if side == "packed" else 64,
        )
        return time.perf_counter() - t0, [s.logprob for s in scores]
    finally:
        scoring._packs, scoring._autocast = packs, autocast


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="gpt1")
    ap.add_argument("--tasks", default="storycloze,race")
    ap.add_argument("--limit", type=int, default=48, help="examples per task")
    ap.add_argument("--batch-size", type=int, default=32, help="gpt1 zeroshot's default")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--repeats", type=int, default=2, help="passes per side, alternating; the best is reported")
    ap.add_argument("--per-pass-autocast", action="store_true", help="the before side with one autocast per pass")
    add_machine_args(ap)
    args = ap.parse_args()
    start(args)
    from gptcli.model.gpt import GPT, preset
    from gptcli.tokenizers.openai import OpenAIBPETokenizer

    header, line = machine_header()
    print(line)
    tok = OpenAIBPETokenizer.from_dir(SHARED / "openai-gpt-bpe")
    torch.manual_seed(0)
    model = GPT(preset(args.preset, vocab_size=tok.vocab_size)).eval()
    rows = []
    for task in args.tasks.split(","):
        reqs = requests(task, tok, args.limit)
        n = args.limit
        for prec in args.precisions.split(","):
            best, logps = {}, {}
            for _ in range(args.repeats):
                for side in ("before", "packed"):
                    t, lp = run(model, reqs, side, prec, args)
                    best[side] = min(best.get(side, t), t)
                    logps[side] = lp
            diff = max(abs(a - b) for a, b in zip(logps["before"], logps["packed"]))
            r = {
                "task": task,
                "precision": prec,
                "examples": n,
                "requests": len(reqs),
                "packed_ex_per_s": n / best["packed"],
                "before_ex_per_s": n / best["before"],
                "ratio": best["before"] / best["packed"],
                "max_abs_logprob_diff": diff,
            }
            rows.append(r)
            print(
                f"{args.preset} {task} {prec}: before {r['before_ex_per_s']:.1f} ex/s, packed "
                f"{r['packed_ex_per_s']:.1f} ex/s, {r['ratio']:.2f}×; max |Δ log-prob| {diff:.1e}",
                flush=True,
            )
    write_json(args.json, header, args=vars(args), results=rows)


if __name__ == "__main__":
    main()
