"""Training throughput and MFU: our GPT vs ``transformers.OpenAIGPTLMHeadModel``, same process, interleaved.

For each model size (``gpt1`` at batch 4×512 and ``tiny``) both implementations get the same weights, the same
batch and the same optimizer (fused AdamW), in train mode with the paper's dropouts; one timed "step" is
forward + backward + optimizer step. Variants run round-robin so machine noise hits all alike: ours (``--kernels
auto``: the CPU kernels of ``gptcli/model/kernels/``); its ablation ``ours-reference``, the same model and
optimizer under ``--kernels reference`` (plain PyTorch: SDPA, ``F.dropout``, ``F.cross_entropy``, the unpadded
output product; the switch, ``gptcli.model.kernels.set_kernels``); and HF — each in fp32 and bf16. Each
timed step follows ``--settle`` (default 1) untimed steps of the same variant, as steps follow one another in a
training run (``_machine.round_robin``), and each precision's variants form their own round-robin, fp32's first.
The report gives medians, ratios against HF in the same precision (same round-robin) and against HF fp32 (same
process, minutes earlier), and MFU against the matmul peak of the step's precision measured by this script (FLOPs
per token = 6N + 12·L·d·T, ``GPT.flops_per_token``).

glibc's malloc returns freed memory to the OS every step here and re-faults it (docs/performance.md); unless
``--default-malloc`` is given, the script re-executes itself with ``GLIBC_TUNABLES`` raising the mmap and trim
thresholds, which applies to both implementations alike.

    python benchmarks/train_throughput.py --steps 5            # both sizes, fp32 and bf16
    python benchmarks/train_throughput.py --sizes tiny --steps 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

from _machine import (
    add_machine_args,
    machine_header,
    round_robin,
    start,
)  # benchmarks/_machine.py (run as `python benchmarks/train_throughput.py`)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="gpt1,tiny", help="comma-separated presets (gpt1, tiny)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per variant (after one warm-up step)")
    ap.add_argument(
        "--settle",
        type=int,
        default=1,
        help="untimed steps of the same variant before each timed one (_machine.round_robin)",
    )
    ap.add_argument("--batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per sequence")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    ap.add_argument("--no-hf", action="store_true", help="only our model")
    ap.add_argument("--no-ablations", action="store_true", help="skip the ablation ours-reference")
    add_machine_args(ap)
    args = ap.parse_args()
    start(args)

    info, line = machine_header()
    print(line)
    peak = info["peak_flops"]
    results = [r for size in args.sizes.split(",") for r in bench_size(size, args, peak)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**info, "peak": peak, "results": results, "args": vars(args)}, f, indent=1)


def bench_size(size: str, args: argparse.Namespace, peak: dict[str, float]) -> list[dict]:
    """Time every (implementation, precision) variant of one preset, round-robin; print and return the rows."""
    import torch

    from gptcli.interop.hf import config_to_hf, state_dict_to_hf
    from gptcli.model.gpt import GPT, preset
    from gptcli.model.kernels import apply, set_kernels

    cfg = preset(size)
    torch.manual_seed(0)
    ours = apply(GPT(cfg).train(), "cpu")  # the kernels where the mode is auto (the ablation switches it off)
    models = {"ours": ours}
    if not args.no_ablations:
        # The same model and optimizer state; only the kernel mode differs.
        models["ours-reference"] = ours
    if not args.no_hf:
        import transformers

        hf_cfg = transformers.OpenAIGPTConfig(
            **{k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")}
        )
        hf = transformers.OpenAIGPTLMHeadModel(hf_cfg).train()
        hf.load_state_dict(state_dict_to_hf(ours.state_dict(), cfg.n_layer), strict=False)
        models["hf"] = hf
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-5, weight_decay=0.01, fused=True) for k, m in models.items()}
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1), generator=g)
    x, y = batch[:, :-1], batch[:, 1:]

    def step(name: str, prec: str) -> float:
        m, opt = models[name], opts[name]
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if prec == "bf16" else torch.autocast("cpu", enabled=False)
        with ablation(name):
            t0 = time.perf_counter()
            with ctx:
                loss = m(input_ids=x, labels=x).loss if name == "hf" else m.lm_loss(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return time.perf_counter() - t0

    @contextlib.contextmanager
    def ablation(name: str):
        set_kernels("reference" if name == "ours-reference" else "auto")
        try:
            yield
        finally:
            set_kernels(None)

    # Each precision is its own round-robin: the variants compared directly (same precision) alternate, and a bf16
    # step never follows a fp32 one, whose twice-as-large buffers leave the heap reshaped for it.
    times: dict[tuple[str, str], list[float]] = {}
    for prec in args.precisions.split(","):
        times.update(round_robin(step, [(n, prec) for n in models], args.steps, args.settle))
    tokens = args.batch * args.seq_len
    fpt = ours.flops_per_token(args.seq_len)
    base = statistics.median(times[("hf", "fp32")]) if ("hf", "fp32") in times else None
    print(
        f"\n{size}: {ours.num_params() / 1e6:.1f}M params, batch {args.batch}×{args.seq_len}, "
        f"{fpt / 1e6:.0f} MFLOP/token, {args.steps} steps"
    )
    results = []
    for (name, prec), ts in times.items():
        med = statistics.median(ts)
        tps = tokens / med
        mfu = tps * fpt / peak[prec]
        ratio = base / med if base else float("nan")
        same = statistics.median(times[("hf", prec)]) / med if ("hf", prec) in times else float("nan")
        results.append(
            {
                "size": size,
                "impl": name,
                "precision": prec,
                "median_s": med,
                "steps_s": ts,
                "tokens_per_s": tps,
                "mfu": mfu,
                "vs_hf_fp32": ratio,
                "vs_hf_same_precision": same,
            }
        )
        print(
            f"  {name:10s} {prec}: {med:7.3f} s/step  {tps:8.1f} tok/s  MFU {100 * mfu:5.1f}% of the {prec} peak  "
            f"{ratio:.2f}× HF fp32  {same:.2f}× HF {prec}"
        )
    return results


if __name__ == "__main__":
    main()
