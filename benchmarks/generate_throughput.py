"""Tokens/s of `gpt1 generate` decoding against Hugging Face `transformers` `generate()` on the same weights.

Ours decodes with the KV cache (``gptcli.model.generate.generate``; several rows of one prompt as one batch with
``generate_batch``, what ``gpt1 generate --samples N`` runs). Hugging Face's ``OpenAIGPTLMHeadModel.generate`` gets
the same weights (converted with ``gptcli.interop.hf``), the same prompt repeated on every row and the same number
of new tokens (``min_new_tokens = max_new_tokens``, so it cannot stop early), with ``use_cache=True`` — which
OpenAI-GPT in transformers accepts but has no cache behind: it re-runs the whole sequence every step.

Variants: {greedy, top-k 40 + top-p 0.9 sampling} × {batch 1, batch 8} × {fp32, bf16 autocast} × {ours, HF}
(and ours without the cache with ``--reference``), timed round-robin (``_machine.round_robin``) so that load on the
machine falls on all alike; the figure is the median tokens/s over all rows (batch × new tokens per run), and the
ratio ours/HF. Every greedy run's tokens are compared with HF's for the same batch and precision: a difference is
printed as a warning row (in bf16 it can come from rounding: HF recomputes the sequence, we read the cache).
Random weights are enough: a decoding step costs the same whatever their values.

The measurement (an idle machine; takes a while at gpt1 size, mostly HF's uncached steps):

    python benchmarks/generate_throughput.py --preset gpt1 --prompt-tokens 32 --new-tokens 64 --repeats 3 \\
        --json generate_throughput.json

A quick check of every code path:

    python benchmarks/generate_throughput.py --preset tiny --new-tokens 8 --prompt-tokens 8 --repeats 1 \\
        --peak-seconds 0.2 --reference
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

from _machine import machine_header, round_robin, use_large_allocator_thresholds  # benchmarks/_machine.py

MODES = {"greedy": {"greedy": True}, "sample": {"top_k": 40, "top_p": 0.9, "seed": 0}}
"""Our sampling settings per mode (HF gets the same: do_sample, top_k, top_p, temperature 1)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="gpt1", help="model preset (gpt1 = the paper's 116M model, tiny)")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens generated per row and run")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="prompt length")
    ap.add_argument("--batches", default="1,8", help="comma-separated rows per run (continuations of one prompt)")
    ap.add_argument("--modes", default="greedy,sample", help="comma-separated: greedy, sample (top-k 40, top-p 0.9)")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16 (CPU autocast)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per variant (after one warm-up run)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--no-hf", action="store_true", help="only our implementation")
    ap.add_argument("--reference", action="store_true", help="also ours without the KV cache (re-running the sequence)")
    ap.add_argument("--peak-seconds", type=float, default=2.0, help="time spent measuring each matmul peak")
    ap.add_argument("--default-malloc", action="store_true", help="do not set GLIBC_TUNABLES")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()

    use_large_allocator_thresholds(args.default_malloc)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    machine, line = machine_header(peak_seconds=args.peak_seconds)
    print(line)
    rows = bench(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "settings": vars(args), "results": rows}, f, indent=1)


def build(preset_name: str, with_hf: bool):
    """Our model with random weights and, unless ``with_hf`` is false, Hugging Face's with the same weights."""
    import torch

    from gptcli.interop.hf import config_to_hf, state_dict_to_hf
    from gptcli.model.gpt import GPT, preset

    cfg = preset(preset_name)
    torch.manual_seed(0)
    ours = GPT(cfg).eval()
    if not with_hf:
        return ours, None
    import transformers

    hf_cfg = transformers.OpenAIGPTConfig(
        **{k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")}
    )
    hf = transformers.OpenAIGPTLMHeadModel(hf_cfg).eval()
    hf.load_state_dict(state_dict_to_hf(ours.state_dict(), cfg.n_layer), strict=False)
    return ours, hf


def bench(args: argparse.Namespace) -> list[dict]:
    """Time every variant round-robin; print the table and return its rows."""
    import torch

    ours, hf = build(args.preset, not args.no_hf)
    prompt = torch.randint(
        0, ours.config.vocab_size, (args.prompt_tokens,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    print(
        f"preset {args.preset}: {ours.num_params():,} parameters, prompt {args.prompt_tokens} tokens, "
        f"{args.new_tokens} new tokens per row, {args.repeats} timed runs per variant"
    )
    outputs: dict[tuple, list[list[int]]] = {}

    def step(impl: str, mode: str, batch: int, prec: str) -> float:
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if prec == "bf16" else contextlib.nullcontext()
        t0 = time.perf_counter()
        with ctx, torch.no_grad():
            tokens = (
                run_ours(ours, prompt, mode, batch, args.new_tokens, impl == "ours")
                if impl != "hf"
                else run_hf(hf, prompt, mode, batch, args.new_tokens)
            )
        seconds = time.perf_counter() - t0
        assert len(tokens) == batch and all(len(r) == args.new_tokens for r in tokens), "a run stopped early"
        outputs[(impl, mode, batch, prec)] = tokens
        return seconds

    impls = ["ours", *([] if args.no_hf else ["hf"]), *(["nocache"] if args.reference else [])]
    variants = [
        (i, m, int(b), p)
        for m in args.modes.split(",")
        for b in args.batches.split(",")
        for p in args.precisions.split(",")
        for i in impls
    ]
    times = round_robin(step, variants, args.repeats)
    rows = []
    for mode in args.modes.split(","):
        for batch in map(int, args.batches.split(",")):
            for prec in args.precisions.split(","):
                rows.append(table_row(times, outputs, (mode, batch, prec), impls, args.new_tokens))
    print_table(rows, impls)
    return rows


def run_ours(model, prompt: list[int], mode: str, batch: int, n: int, cache: bool) -> list[list[int]]:
    from gptcli.model.generate import SamplingConfig, generate, generate_batch

    cfg = SamplingConfig(max_new_tokens=n, use_cache=cache, **MODES[mode])
    return [generate(model, prompt, cfg)] if batch == 1 else generate_batch(model, prompt, cfg, samples=batch)


def run_hf(model, prompt: list[int], mode: str, batch: int, n: int) -> list[list[int]]:
    import torch

    sampling = (
        {"do_sample": True, "top_k": 40, "top_p": 0.9, "temperature": 1.0} if mode == "sample" else {"do_sample": False}
    )
    ids = torch.tensor([prompt] * batch)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        min_new_tokens=n,
        use_cache=True,
        pad_token_id=0,
        **sampling,
    )
    return out[:, len(prompt) :].tolist()


def table_row(times: dict, outputs: dict, key: tuple, impls: list[str], n: int) -> dict:
    """Median tokens/s of each implementation for one (mode, batch, precision), the ratios and the greedy check."""
    mode, batch, prec = key
    row: dict = {"mode": mode, "batch": batch, "precision": prec}
    for impl in impls:
        med = statistics.median(times[(impl, *key)])
        row[f"{impl}_tokens_per_s"] = batch * n / med
        row[f"{impl}_seconds"] = times[(impl, *key)]
    if "hf" in impls:
        row["ours_vs_hf"] = row["ours_tokens_per_s"] / row["hf_tokens_per_s"]
    if "nocache" in impls:
        row["ours_vs_nocache"] = row["ours_tokens_per_s"] / row["nocache_tokens_per_s"]
    if mode == "greedy" and "hf" in impls:
        row["greedy_equal_hf"] = outputs[("ours", *key)] == outputs[("hf", *key)]
    return row


def print_table(rows: list[dict], impls: list[str]) -> None:
    head = f"{'mode':7s} {'batch':>5s} {'prec':5s} {'ours tok/s':>11s}"
    if "hf" in impls:
        head += f" {'HF tok/s':>10s} {'ours/HF':>8s}"
    if "nocache" in impls:
        head += f" {'no-cache tok/s':>15s} {'cache ×':>8s}"
    print("\n" + head)
    for r in rows:
        line = f"{r['mode']:7s} {r['batch']:5d} {r['precision']:5s} {r['ours_tokens_per_s']:11.1f}"
        if "hf" in impls:
            line += f" {r['hf_tokens_per_s']:10.1f} {r['ours_vs_hf']:7.2f}×"
        if "nocache" in impls:
            line += f" {r['nocache_tokens_per_s']:15.1f} {r['ours_vs_nocache']:7.2f}×"
        print(line)
        if r.get("greedy_equal_hf") is False:
            print(f"  WARNING: greedy tokens of ours and HF differ ({r['mode']}, batch {r['batch']}, {r['precision']})")
    checked = [r for r in rows if "greedy_equal_hf" in r]
    if checked and all(r["greedy_equal_hf"] for r in checked):
        print("greedy check: ours and HF chose the same tokens in every greedy variant")


if __name__ == "__main__":
    main()
