"""Zero-shot scoring throughput: SST-2 dev examples per second for the `tiny` and `gpt1` presets (random weights).

Three contenders in the same run, on the same sentences and the same weights:

- **ours**: ``gptcli.eval.zeroshot.sst2``, what ``gpt1 zeroshot --task sst2`` runs (one forward pass of
  ``<sentence> very`` per example, rows sorted and padded dynamically, logits only at the read position);
- **HF**: ``transformers.OpenAIGPTLMHeadModel`` with our weights (``gptcli.interop.hf``), driven as a user would
  write it: the prompt ``<sentence> very`` tokenized with the same tokenizer, batches of ``--batch-size`` in
  dataset order, right padding + ``attention_mask``, the log-softmax of the logits at the last real position,
  ``positive`` vs ``negative`` compared (a word the vocabulary splits gets one pass per word, its tokens'
  log-probabilities summed, as ours does);
- **reference** (slow, a subset): each (sentence + very, word) pair alone, batch 1, full-sequence logits.

Ours and HF both start from the sentences (tokenization included, with the tokenizer's word cache warm) and run
round-robin (ours fp32, HF fp32, ours bf16, HF bf16; ``--repeats`` passes, the best pass reported) so a change in
the machine's load falls on all alike. Reported: examples/s, ours/HF at each precision, and how often the two
predict the same label (same weights → the same decisions, up to rounding on near-ties; bf16 also against fp32).

Tokenizers: `gpt1` uses the original OpenAI BPE (../shared/data/openai-gpt-bpe, 40,478 ids, where very /
positive / negative are single tokens); `tiny` a sentencepiece BPE of 8,192 ids learned here from one book.

    python benchmarks/zeroshot_throughput.py [--limit 872] [--ref-limit 48] [--threads 2] [--presets tiny,gpt1]
        [--repeats 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from _machine import best_of, machine_header, write_json  # benchmarks/_machine.py (run as `python benchmarks/...`)

from gptcli.eval.scoring import Request
from gptcli.eval.zeroshot import SST2_CUE, SST2_WORDS, sst2
from gptcli.model.gpt import GPT, preset

SHARED = Path(os.environ.get("GPT1_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data"


def tokenizer_for(name: str):
    if name == "gpt1":
        from gptcli.tokenizers.openai import OpenAIBPETokenizer

        return OpenAIBPETokenizer.from_dir(SHARED / "openai-gpt-bpe")
    from gptcli.tokenizers.learned import LearnedBPETokenizer
    from gptcli.tokenizers.text import word_lines

    text = (SHARED / "books" / "pg1342_pride_and_prejudice.txt").read_text(encoding="utf-8-sig")
    return LearnedBPETokenizer.train(word_lines(text), vocab_size=preset("tiny").vocab_size)


def hf_model(model: GPT):
    """``OpenAIGPTLMHeadModel`` holding ``model``'s weights (eval mode)."""
    import transformers

    from gptcli.interop.hf import config_to_hf, state_dict_to_hf

    cfg = model.config
    hf_cfg = transformers.OpenAIGPTConfig(
        **{k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")}
    )
    hf = transformers.OpenAIGPTLMHeadModel(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(state_dict_to_hf(model.state_dict(), cfg.n_layer), strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)  # tied to wte
    return hf


def _autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


@torch.no_grad()
def hf_sst2(hf, tok, sentences: list[str], batch_size: int, precision: str) -> list[int]:
    """The plain Hugging Face loop: 1 = positive, 0 = negative (ties to negative, as ours)."""
    prompts = tok.encode_batch([f"{s} {SST2_CUE}" for s in sentences])
    words = [tok.encode(w) for w in SST2_WORDS]
    preds: list[int] = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        if all(len(w) == 1 for w in words):  # one pass: both words are read off the last position
            lp = _last_logprobs(hf, chunk, precision)
            scores = [lp[:, w[0]] for w in words]
        else:  # a split word: one pass per word over prompt + word, its tokens' log-probabilities summed
            scores = [_word_logprob(hf, chunk, w, precision) for w in words]
        preds.extend((scores[1] > scores[0]).long().tolist())
    return preds


def _padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(r) for r in rows])
    ids = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, : len(r)] = torch.tensor(r)
    mask = (torch.arange(ids.size(1))[None, :] < lengths[:, None]).long()
    return ids, mask, lengths


def _last_logprobs(hf, rows: list[list[int]], precision: str) -> torch.Tensor:
    ids, mask, lengths = _padded(rows)
    with _autocast(precision):
        logits = hf(input_ids=ids, attention_mask=mask).logits
    return torch.log_softmax(logits[torch.arange(len(rows)), lengths - 1].float(), -1)


def _word_logprob(hf, rows: list[list[int]], word: list[int], precision: str) -> torch.Tensor:
    ids, mask, lengths = _padded([r + word for r in rows])
    with _autocast(precision):
        logits = hf(input_ids=ids, attention_mask=mask).logits
    lp = torch.log_softmax(logits.float(), -1)
    total = torch.zeros(len(rows))
    for j, t in enumerate(word):  # token j of the word is predicted at position len(prompt) - 1 + j
        total += lp[torch.arange(len(rows)), lengths - len(word) - 1 + j, t]
    return total


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


def bench_preset(name: str, exs: list, args: argparse.Namespace) -> dict:
    """Time ours, HF and the reference on one preset; print one block and return its figures."""
    tok = tokenizer_for(name)
    torch.manual_seed(0)
    model = GPT(preset(name, vocab_size=tok.vocab_size)).eval()
    hf = hf_model(model)
    sentences = [e.texts[0] for e in exs]
    lens = [len(tok.encode(w)) for w in (SST2_CUE, *SST2_WORDS)]

    def run(impl: str, prec: str, n: int | None = None) -> list[int]:
        if impl == "ours":
            res = sst2(model, tok, exs[:n], batch_size=args.batch_size, precision=prec)
            return [p["prediction"] for p in res.predictions]
        return hf_sst2(hf, tok, sentences[:n], args.batch_size, prec)

    variants = [(i, p) for p in args.precisions.split(",") for i in ("ours", "hf")]
    tok.encode_batch(sentences)  # warm the tokenizer's word cache (and load spaCy) for both
    for v in variants:  # warm-up: torch's kernels
        run(*v, n=2 * args.batch_size)
    best, preds = best_of(run, variants, args.repeats)
    cue, words = tok.encode(SST2_CUE), [tok.encode(w) for w in SST2_WORDS]
    ref_reqs = [Request.of(c + cue, w) for c in tok.encode_batch(sentences[: args.ref_limit]) for w in words]
    ref_rate = args.ref_limit / reference(model, ref_reqs) if args.ref_limit else float("nan")
    n = len(exs)
    print(
        f"\n{name}: {model.num_params() / 1e6:.1f}M params, {n} SST-2 dev examples, batch {args.batch_size}, "
        f"tokens very/positive/negative = {lens}; reference (batch 1, fp32): {ref_rate:.1f} ex/s "
        f"({args.ref_limit} ex)"
    )
    print(
        f"  {'precision':<10}{'ours ex/s':>11}{'HF ex/s':>10}{'ours/HF':>9}{'ours/ref':>10}{'agree':>9}"
        f"{'ours vs fp32':>14}{'HF vs fp32':>12}"
    )
    rows = []
    for prec in args.precisions.split(","):
        o, h = n / best[("ours", prec)], n / best[("hf", prec)]
        agree = _agreement(preds[("ours", prec)], preds[("hf", prec)])
        o32 = _agreement(preds[("ours", prec)], preds.get(("ours", "fp32"), preds[("ours", prec)]))
        h32 = _agreement(preds[("hf", prec)], preds.get(("hf", "fp32"), preds[("hf", prec)]))
        print(
            f"  {prec:<10}{o:>11.1f}{h:>10.1f}{o / h:>8.2f}×{o / ref_rate:>9.1f}×{100 * agree:>8.1f}%"
            f"{100 * o32:>13.1f}%{100 * h32:>11.1f}%",
            flush=True,
        )
        rows.append(
            {
                "preset": name,
                "precision": prec,
                "examples": n,
                "ours_ex_per_s": o,
                "hf_ex_per_s": h,
                "ours_over_hf": o / h,
                "reference_ex_per_s": ref_rate,
                "agreement_ours_hf": agree,
                "agreement_ours_vs_ours_fp32": o32,
                "agreement_hf_vs_hf_fp32": h32,
            }
        )
    return {"preset": name, "tokens_cue_words": lens, "rows": rows}


def _agreement(a: list[int], b: list[int]) -> float:
    return sum(x == y for x, y in zip(a, b)) / max(1, len(a))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=872, help="SST-2 dev examples for ours and HF (872 = all).")
    ap.add_argument("--ref-limit", type=int, default=48, help="Examples for the slow batch-1 reference (0: skip).")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--presets", default="tiny,gpt1")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16 (CPU autocast)")
    ap.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass, ours and HF")
    ap.add_argument("--repeats", type=int, default=2, help="timed passes per variant (the best is reported)")
    ap.add_argument("--peak-seconds", type=float, default=2.0, help="time spent measuring each matmul peak")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from gptcli.tasks import get_task

    header, line = machine_header(args.peak_seconds)
    print(line)
    exs = get_task("sst2").read("dev", SHARED / "glue" / "SST-2")[: args.limit]
    results = [bench_preset(name, exs, args) for name in args.presets.split(",")]
    write_json(args.json, header, args=vars(args), results=results)


if __name__ == "__main__":
    main()
