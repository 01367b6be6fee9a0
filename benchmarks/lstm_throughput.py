"""Training throughput of the LSTM baseline against the Transformer at matched parameter count, same process.

Pairs (each Transformer against the LSTM of about its parameter count, same vocabulary and window):

- ``cpu``: the CPU reproduction's 4 × 192 Transformer (4,096 ids, 128-token windows, 2.59 M parameters) against a
  192-wide, 560-unit LSTM (2.58 M), batch 16 × 128 as experiments/cpu_reproduction.py trains them;
- ``tiny``: the ``tiny`` preset (8,192 ids, 4 × 256, 5.39 M) against ``lstm-tiny`` (256-wide, 768 units, 5.45 M)
  on 512-token windows;
- ``paper`` (slow on a CPU): GPT-1 (116.5 M) against the paper's 2048-unit LSTM with a 2048-wide embedding
  (116.5 M; the ``lstm`` preset's 768-wide embedding has 55.7 M), batch 4 × 512.

One timed step is forward + backward + fused AdamW step in train mode with the paper's dropouts (``lm_loss``, the
loss pretraining uses). Variants run round-robin (Transformer fp32, LSTM fp32, then bf16 if asked) so machine
noise hits all alike; the report gives medians, tokens/s and the LSTM/Transformer ratio, the CPU model and the load
average at start (a loaded machine slows both; the ratio is the figure to read). FLOPs per token are each model's
``flops_per_token`` (6N + attention for the Transformer, 6N for the LSTM).

    python benchmarks/lstm_throughput.py                      # cpu and tiny pairs, fp32
    python benchmarks/lstm_throughput.py --pairs cpu --steps 10 --precisions fp32,bf16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from _machine import add_machine_args, cpu_model, round_robin, start  # benchmarks/_machine.py

# pair -> (Transformer preset + overrides, LSTM preset + overrides, batch, seq_len)
PAIRS = {
    "cpu": (
        ("tiny", dict(vocab_size=4096, n_layer=4, n_embd=192, n_head=4, n_inner=768, n_ctx=128)),
        ("lstm-tiny", dict(vocab_size=4096, n_embd=192, n_hidden=560, n_ctx=128)),
        16,
        128,
    ),
    "tiny": (("tiny", {}), ("lstm-tiny", {}), 4, 512),
    "paper": (("gpt1", {}), ("lstm", dict(n_embd=2048)), 4, 512),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", default="cpu,tiny", help=f"comma-separated: {', '.join(PAIRS)}")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per variant (after one warm-up step)")
    ap.add_argument("--precisions", default="fp32", help="comma-separated: fp32, bf16")
    add_machine_args(ap)
    args = ap.parse_args()
    start(args)

    import torch

    load = os.getloadavg()
    print(
        f"{cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start"
    )
    results = [r for pair in args.pairs.split(",") for r in bench_pair(pair, args)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"cpu": cpu_model(), "threads": torch.get_num_threads(), "load_average": load, "results": results},
                f,
                indent=1,
            )


def bench_pair(pair: str, args: argparse.Namespace) -> list[dict]:
    """Time both architectures of one pair in every precision, round-robin; print and return the rows."""
    import torch

    from gptcli.model.build import arch_of, build_model, preset
    from gptcli.train.optim import make_optimizer
    from gptcli.train.pretrain import lm_loss

    (t_name, t_over), (l_name, l_over), batch_size, seq_len = PAIRS[pair]
    models = {}
    for name, over in ((t_name, t_over), (l_name, l_over)):
        torch.manual_seed(0)
        m = build_model(preset(name, **over)).train()
        models[arch_of(m)] = (m, make_optimizer(m, 1e-4, 0.01))
    vocab = models["transformer"][0].config.vocab_size
    batch = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=torch.Generator().manual_seed(1))

    def step(arch: str, prec: str) -> float:
        m, opt = models[arch]
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if prec == "bf16" else torch.autocast("cpu", enabled=False)
        t0 = time.perf_counter()
        with ctx:
            loss = lm_loss(m, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    variants = [(a, p) for p in args.precisions.split(",") for a in models]
    times: dict[tuple[str, str], list[float]] = round_robin(step, variants, args.steps)
    return _report(pair, models, times, batch_size, seq_len)


def _report(pair: str, models: dict, times: dict, batch_size: int, seq_len: int) -> list[dict]:
    tokens = batch_size * seq_len
    print(
        f"\n{pair}: batch {batch_size}×{seq_len}, "
        + ", ".join(
            f"{a} {m.num_params() / 1e6:.2f}M params {m.flops_per_token(seq_len) / 1e6:.1f} MFLOP/token"
            for a, (m, _) in models.items()
        )
    )
    results = []
    for (arch, prec), ts in times.items():
        med = statistics.median(ts)
        base = statistics.median(times[("transformer", prec)])
        m = models[arch][0]
        results.append(
            {
                "pair": pair,
                "arch": arch,
                "precision": prec,
                "params": m.num_params(),
                "median_s": med,
                "tokens_per_s": tokens / med,
                "vs_transformer": base / med,
            }
        )
        print(f"  {arch:11s} {prec}: {med:7.3f} s/step  {tokens / med:9.1f} tok/s  {base / med:5.2f}× the Transformer")
    return results


if __name__ == "__main__":
    main()
