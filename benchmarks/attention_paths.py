"""Causal self-attention alone, forward + backward: every path the model can take, per precision and dropout.

The measurements behind the dispatch table of the CPU attention kernel (``gptcli/model/kernels/attention.py``).
One GPT-1 attention (B × 12 heads × T × 64 with B·T = 2,048 tokens by default: the paper's layer at the training
benchmark's 4 × 512, and the shorter sequences of fine-tuning) is run through

- ``sdpa``: ``F.scaled_dot_product_attention(is_causal=True, dropout_p=p)``;
- ``plain``: the paths the model writes out itself — scores = q·kᵀ/√d, causal mask, softmax, dropout, · v —
  in the variants the kernel's table can pick (``gptcli.model.kernels.attention.PATHS``);

for fp32 and bf16 autocast (as training runs them: q, k, v come out of an autocast ``Linear`` in bf16), with
dropout 0 and the paper's 0.1. Variants run round-robin (``_machine.round_robin``); the table gives median
milliseconds and each path's time over SDPA's. Outputs are checked against SDPA without dropout.

    python benchmarks/attention_paths.py                     # 2,048 tokens at T = 64 … 512, 12 heads of 64
    python benchmarks/attention_paths.py --steps 20 --json attention.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from _machine import add_machine_args, cpu_model, round_robin, start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048, help="batch × sequence length (the batch follows the length)")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq-lens", default="64,128,256,512", help="comma-separated sequence lengths")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument(
        "--chunks",
        default="",
        help="also time the chunked path at these block counts (comma-separated, e.g. 2,8; the model's "
        "takes T / gptcli.model.kernels.attention.CHUNK_ROWS)",
    )
    ap.add_argument("--steps", type=int, default=10, help="timed rounds (after one warm-up)")
    add_machine_args(ap)
    args = ap.parse_args()
    start(args)

    import torch

    from gptcli.model.kernels import attention
    from gptcli.model.kernels.attention import PATHS, attention_path

    def causal_attention(q, k, v, p, path):
        """The kernel's function; ``chunked/N`` runs the chunked path with N blocks."""
        if not path.startswith("chunked/"):
            return attention.causal_attention(q, k, v, p, path=path)
        rows = max(1, q.size(-2) // int(path.split("/")[1]))
        return attention.causal_attention(q, k, v, p, path="chunked", block_rows=rows)

    paths = list(PATHS) + [f"chunked/{n}" for n in args.chunks.split(",") if n.strip()]
    from gptcli.runtime import measure_cpu_peak

    peak = {p: measure_cpu_peak(p, n=2048, seconds=2.0) / 1e9 for p in ("fp32", "bf16")}
    print(
        f"{cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"matmul peak fp32 {peak['fp32']:.0f} / bf16 {peak['bf16']:.0f} GFLOP/s, "
        f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(default)')}"
    )
    rows = []
    for t in (int(x) for x in args.seq_lens.split(",")):
        rows += bench_length(args, t, torch, paths, attention_path, causal_attention)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "cpu": cpu_model(),
                    "threads": torch.get_num_threads(),
                    "peak_gflops": peak,
                    "args": vars(args),
                    "rows": rows,
                },
                f,
                indent=1,
            )


def bench_length(args, t: int, torch, paths, attention_path, causal_attention) -> list[dict]:
    """Every (path, precision, dropout, mode) at sequence length ``t``, round-robin; prints and returns the rows."""
    g = torch.Generator().manual_seed(0)
    shape = (max(1, args.tokens // t), args.heads, t, args.head_dim)
    base = [torch.randn(shape, generator=g) for _ in range(3)]
    inputs = {dt: [x.to(dt).requires_grad_() for x in base] for dt in (torch.float32, torch.bfloat16)}
    grad = torch.randn(shape, generator=g)

    def step(path: str, dtype: torch.dtype, p: float, mode: str) -> float:
        q, k, v = inputs[dtype]
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            if mode == "eval":  # forward only, as zero-shot scoring and evaluation run it (no dropout there)
                with torch.no_grad():
                    causal_attention(q, k, v, p, path=path)
                return time.perf_counter() - t0
            y = causal_attention(q, k, v, p, path=path)
        y.backward(grad.to(y.dtype))
        for x in (q, k, v):
            x.grad = None
        return time.perf_counter() - t0

    check(inputs, causal_attention, paths)
    cases = [(dt, p, "train") for dt in (torch.float32, torch.bfloat16) for p in (0.0, 0.1)]
    cases += [(dt, 0.0, "eval") for dt in (torch.float32, torch.bfloat16)]
    times = round_robin(step, [(path, *case) for case in cases for path in paths], args.steps)
    rows = []
    print(
        f"\nB={shape[0]} heads={args.heads} T={t} d={args.head_dim}, median of {args.steps}; train = "
        f"forward+backward, eval = forward under no_grad; '← model' = the path gptcli.model.kernels.attention "
        "picks"
    )
    for dt, p, mode in cases:
        ref = statistics.median(times[("sdpa", dt, p, mode)])
        chosen = attention_path("cpu", dt, p, t)
        for path in paths:
            ms = 1000 * statistics.median(times[(path, dt, p, mode)])
            rows.append(
                {
                    "seq_len": t,
                    "batch": shape[0],
                    "mode": mode,
                    "dtype": str(dt).split(".")[1],
                    "dropout": p,
                    "path": path,
                    "ms": ms,
                    "vs_sdpa": ms / (1000 * ref),
                    "chosen": path == chosen,
                }
            )
            print(
                f"  {mode:5s} {rows[-1]['dtype']:8s} p={p:.1f} {path:18s} {ms:8.1f} ms  "
                f"{ms / (1000 * ref):5.2f}× SDPA{'   ← model' if path == chosen else ''}"
            )
    return rows


def check(inputs, causal_attention, paths) -> None:
    """Every path computes SDPA's attention (no dropout): same output within the precision's tolerance."""
    import torch

    for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        q, k, v = (t.detach() for t in inputs[dt])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dt == torch.bfloat16):
            ref = causal_attention(q, k, v, 0.0, path="sdpa").float()
            for path in paths:
                err = (causal_attention(q, k, v, 0.0, path=path).float() - ref).abs().max().item()
                if err > tol:
                    print(f"WARNING: {path} differs from SDPA by {err:.2e} in {dt} (tolerance {tol})")


if __name__ == "__main__":
    main()
