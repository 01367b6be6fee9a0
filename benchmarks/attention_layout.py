"""bf16 attention's operand layout on CPU: dense per block (``_DenseBlockedAttention``, what runs) against the strided
layout it replaced (``_BlockedAttention`` over (B·H, T, d) copies, what fp32 still takes), same run.

oneDNN's bf16 batched products copy any operand that is not one dense matrix per batch row: a block's slice of the
queries, a prefix of the keys or values, an output slice accumulated into. The strided route paid those copies on
every product, forward and backward, plus a transpose copy of the output, zero-filled gradients and a
concatenation of the three input gradients; the dense route lays each block's operands out once and writes the
output and the input gradient in the fused projection's own layout (gptcli/model/kernels/attention.py).

- ``layer``: one GPT-1 attention layer from its fused projection (``--batch`` × ``--seq-len``, 12 heads of 64,
  the paper's attention dropout 0.1), forward + backward, q·kᵀ to the projection's gradient;
- ``step``: a whole bf16 pretraining step of the ``gpt1`` preset (forward, backward, fused AdamW) with the model's
  attention taking one route or the other (``--no-step`` skips it: minutes on 2 cores);
- ``finetune``: whole bf16 fine-tuning updates as ``gpt1 finetune`` runs them by default (packed rows, the paper's
  batch of 32, ``--finetune-size``), on real RTE random batches (``finetune_throughput.py``'s builders, which need
  ``$GPT1_SHARED``), the strided layout restored by adding bf16 to ``kernels.attention.STRIDED_DTYPES``
  (``--no-finetune`` skips it).

Variants run round-robin (``_machine.round_robin``, one settling step before each timed one); the report gives
medians and strided / dense. Both routes compute the same function (tests/model/test_attention.py), which the
script checks once before timing.

    python benchmarks/attention_layout.py --steps 15 --json layout.json
"""

from __future__ import annotations

import argparse
import statistics
import time

from _machine import add_machine_args, machine_header, round_robin, start, write_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=15, help="timed rounds per part (after one warm-up)")
    ap.add_argument("--batch", type=int, default=4, help="sequences")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per sequence")
    ap.add_argument("--no-step", action="store_true", help="skip the whole pretraining step")
    ap.add_argument("--no-finetune", action="store_true", help="skip the fine-tuning updates")
    ap.add_argument("--finetune-size", default="gpt1", help="model preset of the fine-tuning part: gpt1 or tiny")
    ap.add_argument("--finetune-batches", type=int, default=2, help="RTE batches of 32 timed per round")
    add_machine_args(ap)
    args = ap.parse_args()
    start(args)
    info, line = machine_header()
    print(line)
    rows = _layer(args)
    if not args.no_step:
        rows += _step(args)
    if not args.no_finetune:
        rows += _finetune(args)
    write_json(args.json, info, rows=rows, args=vars(args))


def _strided(qkv, n_head: int, dropout: float):
    """The former bf16 route: split views, one (B·H, T, d) copy each, _BlockedAttention, the output transposed."""
    import torch

    from gptcli.model.kernels import attention as kernel

    B, T, C3 = qkv.shape
    C, hd = C3 // 3, C3 // 3 // n_head
    q, k, v = (x.view(B, T, n_head, hd).transpose(1, 2).reshape(B * n_head, T, hd) for x in qkv.split(C, dim=2))
    blocks = max(1, T // kernel.CHUNK_ROWS) if kernel.attention_path("cpu", q.dtype, dropout, T) == "chunked" else 1
    bounds = tuple(T * i // blocks for i in range(blocks + 1))
    with torch.autocast("cpu", enabled=False):
        y = kernel._BlockedAttention.apply(q, k, v, kernel._causal_bias(T, q.device, q.dtype), dropout, bounds)
    return y.view(B, n_head, T, hd).transpose(1, 2).contiguous().view(B, T, C)


def _routes():
    from gptcli.model.attention import causal_self_attention

    return {"strided": _strided, "dense": causal_self_attention}


def _report(part: str, times: dict, names: list[str]) -> list[dict]:
    dense = statistics.median(times["dense"])
    rows = []
    for name in names:
        ms = statistics.median(times[name]) * 1e3
        rows.append({"part": part, "route": name, "ms": ms, "steps_s": times[name], "vs_dense": ms / (dense * 1e3)})
        print(f"  {part:6s} {name:8s} {ms:9.1f} ms  {ms / (dense * 1e3):5.3f}× dense")
    return rows


def _layer(args) -> list[dict]:
    import torch

    routes = _routes()
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(args.batch, args.seq_len, 3 * 768, generator=g).to(torch.bfloat16)
    upstream = torch.randn(args.batch, args.seq_len, 768, generator=g).to(torch.bfloat16)

    def run(name: str):
        x = qkv.detach().requires_grad_()
        y = routes[name](x, 12, 0.1)
        y.backward(upstream)
        return y, x.grad

    torch.manual_seed(1)
    ref = run("strided")
    torch.manual_seed(1)
    got = run("dense")
    if not torch.equal(ref[0], got[0]):
        raise SystemExit("error: the two routes' outputs differ (run tests/model/test_attention.py)")
    rel = ((got[1].float() - ref[1].float()).norm() / ref[1].float().norm()).item()
    print(f"\none attention layer, bf16, {args.batch}×{args.seq_len}, 12 heads, dropout 0.1: outputs equal, "
          f"gradients within {rel:.1e} (relative, bf16 rounding)")

    def timed(name: str) -> float:
        t0 = time.perf_counter()
        run(name)
        return time.perf_counter() - t0

    times = round_robin(timed, [(n,) for n in routes], args.steps, settle=1)
    return _report("layer", {n: times[(n,)] for n in routes}, list(routes))


def _step(args) -> list[dict]:
    import torch

    import gptcli.model.gpt as gpt

    routes = _routes()
    torch.manual_seed(0)
    model = gpt.GPT(gpt.preset("gpt1")).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01, fused=True)
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, model.config.vocab_size, (args.batch, args.seq_len + 1), generator=g)
    real = gpt.causal_self_attention

    def timed(name: str) -> float:
        gpt.causal_self_attention = routes[name]
        try:
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model.lm_loss(batch[:, :-1], batch[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return time.perf_counter() - t0
        finally:
            gpt.causal_self_attention = real

    print(f"\ngpt1 bf16 pretraining step, {args.batch}×{args.seq_len}, fused AdamW, {args.steps} steps")
    times = round_robin(timed, [(n,) for n in routes], args.steps, settle=1)
    return _report("step", {n: times[(n,)] for n in routes}, list(routes))


def _finetune(args) -> list[dict]:
    import os
    from pathlib import Path

    import torch

    from finetune_throughput import LM_WEIGHT, build_models, real_batches
    from gptcli.model.kernels import attention as kernel
    from gptcli.tokenizers.openai import OpenAIBPETokenizer
    from gptcli.train.finetune_loss import TaskLoss
    from gptcli.train.optim import make_optimizer
    from gptcli.train.trainer import Trainer

    shared = Path(os.environ.get("GPT1_SHARED", Path(__file__).resolve().parents[2] / "shared"))
    tok = OpenAIBPETokenizer.from_dir(shared / "data" / "openai-gpt-bpe")
    opts = argparse.Namespace(batch=32, batches=args.finetune_batches, micro_batch=None, n_ctx=512,
                              size=args.finetune_size)
    task, _, packed, _ = real_batches("rte", "random", opts, tok)
    model = build_models(task, opts, tok)[0]
    trainer = Trainer(model, make_optimizer(model, lr=6.25e-5), TaskLoss(LM_WEIGHT), lambda s: 6.25e-5,
                      device=torch.device("cpu"), precision="bf16", grad_clip=1.0)
    dense = kernel.STRIDED_DTYPES

    def timed(name: str, i: int) -> float:
        kernel.STRIDED_DTYPES = dense if name == "dense" else (*dense, torch.bfloat16)
        try:
            t0 = time.perf_counter()
            trainer.step(1, packed[i]).read()
            return time.perf_counter() - t0
        finally:
            kernel.STRIDED_DTYPES = dense

    print(f"\n{args.finetune_size} bf16 fine-tuning updates, RTE random batches of 32, packed, {args.steps} rounds")
    variants = [(n, i) for i in range(len(packed)) for n in ("strided", "dense")]
    times = round_robin(timed, variants, args.steps, settle=1)
    per_round = {n: [sum(times[(n, i)][r] for i in range(len(packed))) for r in range(args.steps)]
                 for n in ("strided", "dense")}
    return _report("update", per_round, ["strided", "dense"])


if __name__ == "__main__":
    main()
