"""Zero-shot scoring throughput: SST-2 dev examples per second for the `tiny` and `gpt1` presets (random weights).

Compares, in the same run, the batched engine (``gptcli.eval.scoring``: one forward pass of ``<sentence> very`` per
example, rows sorted and padded dynamically, logits only at the read position) with the straightforward reference:
each (sentence + very, word) pair scored on its own with full-sequence logits, batch 1. Reported: examples/s and
the ratio engine / reference; fp32 and bf16 autocast for the engine.

Tokenizers: `gpt1` uses the original OpenAI BPE (../shared/data/openai-gpt-bpe, 40,478 ids, where very /
positive / negative are single tokens); `tiny` a sentencepiece BPE of 8,192 ids learned here from one book.
The allocator setting measured to matter on this machine (docs: measurements.md) is reported, not changed.

    python benchmarks/zeroshot_throughput.py [--limit 872] [--ref-limit 48] [--threads 2] [--presets tiny,gpt1]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from gptcli.model.gpt import GPT, preset
from gptcli.eval.scoring import Request, score

SHARED = Path(os.environ.get("GPT1_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data"


def tokenizer_for(name: str):
    if name == "gpt1":
        from gptcli.tokenizers.openai import OpenAIBPETokenizer

        return OpenAIBPETokenizer.from_dir(SHARED / "openai-gpt-bpe")
    from gptcli.tokenizers.text import word_lines
    from gptcli.tokenizers.learned import LearnedBPETokenizer

    text = (SHARED / "books" / "pg1342_pride_and_prejudice.txt").read_text(encoding="utf-8-sig")
    return LearnedBPETokenizer.train(word_lines(text), vocab_size=preset("tiny").vocab_size)


def requests_for(tok, sentences):
    cue = tok.encode("very")
    words = [tok.encode("positive"), tok.encode("negative")]
    ctxs = tok.encode_batch(sentences)
    return [Request.of(list(c) + cue, w) for c in ctxs for w in words], [len(w) for w in [cue, *words]]


@torch.no_grad()
def reference(model, requests) -> float:
    """Each pair alone, full logits over the whole sequence, fp32: the obvious implementation."""
    t0 = time.perf_counter()
    for r in requests:
        seq = list(r.context) + list(r.continuation)
        x = torch.tensor([seq[:-1]])
        lp = torch.log_softmax(model.lm_logits(model(x)).float(), -1)[0]
        a = len(r.context)
        _ = sum(float(lp[a - 1 + j, r.continuation[j]]) for j in range(len(r.continuation)))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=872, help="SST-2 dev examples for the engine (872 = all).")
    ap.add_argument("--ref-limit", type=int, default=48, help="Examples for the slow reference.")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--presets", default="tiny,gpt1")
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from gptcli.tasks import get_task

    exs = get_task("sst2").read("dev", SHARED / "glue" / "SST-2")
    sentences = [e.texts[0] for e in exs]
    print(f"threads={args.threads} GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')}")
    for name in args.presets.split(","):
        tok = tokenizer_for(name)
        torch.manual_seed(0)
        model = GPT(preset(name, vocab_size=tok.vocab_size)).eval()
        reqs, lens = requests_for(tok, sentences[: args.limit])
        ref_reqs = reqs[: 2 * args.ref_limit]
        score(model, reqs[:8], precision="fp32")  # warm-up
        t_ref = reference(model, ref_reqs)
        ref_rate = args.ref_limit / t_ref
        row = [f"{name}: tokens very/positive/negative = {lens}", f"reference {ref_rate:.1f} ex/s ({args.ref_limit} ex)"]
        for prec in ("fp32", "bf16"):
            t0 = time.perf_counter()
            score(model, reqs, batch_size=args.batch_size, precision=prec)
            rate = (len(reqs) // 2) / (time.perf_counter() - t0)
            row.append(f"engine {prec} {rate:.1f} ex/s ({len(reqs) // 2} ex, {rate / ref_rate:.1f}x reference)")
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
