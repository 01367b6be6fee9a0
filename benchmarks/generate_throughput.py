"""Tokens/s of `gpt1 generate` decoding, with the KV cache vs re-running the whole sequence (the reference).

Random weights are enough: the cost of a decoding step does not depend on their values. Both variants run in the
same process on the same prompt, so the ratio is meaningful even on a busy machine; absolute tokens/s are not.

    python benchmarks/generate_throughput.py --preset gpt1 --new-tokens 64 --prompt-tokens 32
"""

from __future__ import annotations

import argparse
import time

import torch

from gptcli.model.generate import SamplingConfig, generate
from gptcli.model.gpt import GPT, preset


def measure(model: GPT, prompt: list[int], cfg: SamplingConfig) -> float:
    t0 = time.perf_counter()
    out = generate(model, prompt, cfg)
    return len(out) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt1", help="model preset (gpt1 = the paper's 116M model)")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens to generate per run")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="prompt length")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--skip-reference", action="store_true", help="only measure the KV-cache path")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(preset(args.preset)).eval()
    prompt = torch.randint(0, model.config.vocab_size, (args.prompt_tokens,)).tolist()
    print(f"preset {args.preset}: {model.num_params():,} parameters, {torch.get_num_threads()} threads, "
          f"prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens, greedy")
    generate(model, prompt, SamplingConfig(max_new_tokens=2, greedy=True))  # warm-up
    cached = measure(model, prompt, SamplingConfig(max_new_tokens=args.new_tokens, greedy=True))
    print(f"KV cache:            {cached:8.2f} tokens/s")
    sampled = measure(model, prompt, SamplingConfig(max_new_tokens=args.new_tokens, top_k=40, top_p=0.9, seed=0))
    print(f"KV cache, top-k/p:   {sampled:8.2f} tokens/s")
    if not args.skip_reference:
        full = measure(model, prompt, SamplingConfig(max_new_tokens=args.new_tokens, greedy=True, use_cache=False))
        print(f"no cache (reference): {full:7.2f} tokens/s   → cache speed-up ×{cached / full:.2f}")


if __name__ == "__main__":
    main()
