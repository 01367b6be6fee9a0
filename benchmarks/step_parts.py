"""The parts of a training step gpt1's CPU kernels (gptcli/model/kernels/) compute, each against PyTorch's stock op,
same run.

At GPT-1's training shapes (4 × 512 tokens, 12 heads, 40,478-token vocabulary), forward + backward:

- ``dropout``: ``gptcli.model.kernels.dropout.dropout`` vs ``F.dropout`` on one layer's attention probabilities (the 5/8
  of 4 × 12 × 512² the chunked attention computes) and on a residual branch (4 × 512 × 768);
- ``mask``: the dropout mask alone — ``keep_mask`` vs ``bernoulli_`` (what ``F.dropout`` draws);
- ``loss``: the next-token loss on 2,048 × 40,478 logits — ``gptcli.model.kernels.losses`` (``ours``: the compiled
  rows of ``loss.cpp`` where the library is built with AVX-512 or AVX2; ``blocks``: its row blocks of PyTorch ops, what
  computes elsewhere) vs ``F.cross_entropy`` of the fp32 logits (what it replaced, and what HF computes);
- ``head``: the tied output product and the loss as training takes them, with the embedding padded to a multiple of
  64 rows (``gptcli.model.kernels.tied.training_logits``) vs the plain product (the loss: the kernel's, both).

fp32 and bf16 (autocast for the head; bf16 tensors for the rest, as autocast produces them). Variants run
round-robin (``_machine.round_robin``); the report gives median milliseconds and ours / stock.

    python benchmarks/step_parts.py --steps 7 --json parts.json
    python benchmarks/step_parts.py --precisions fp32      # a CPU without avx512_bf16/AMX: bf16 is emulated there
"""

from __future__ import annotations

import argparse
import statistics
import time

from _machine import add_machine_args, machine_header, round_robin, start, write_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=7, help="timed rounds (after one warm-up)")
    ap.add_argument(
        "--precisions",
        default="fp32,bf16",
        help="comma-separated: fp32, bf16 (a CPU without native bf16 emulates its products: fp32 only)",
    )
    add_machine_args(ap)
    args = ap.parse_args()
    start(args)

    info, line = machine_header()
    print(line)
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not precisions or set(precisions) - {"fp32", "bf16"}:
        raise SystemExit(f"error: --precisions takes fp32 and/or bf16, got {args.precisions!r}")
    cases = _cases(precisions)
    variants = [(part, prec, impl) for part, prec in cases for impl in cases[(part, prec)]]
    times = round_robin(lambda part, prec, impl: _timed(cases[(part, prec)][impl]), variants, args.steps)
    rows = []
    for (part, prec), impls in cases.items():
        stock = statistics.median(times[(part, prec, "stock")]) * 1e3
        for impl in impls:
            ms = statistics.median(times[(part, prec, impl)]) * 1e3
            rows.append({"part": part, "precision": prec, "impl": impl, "ms": ms, "vs_stock": ms / stock})
            print(f"  {part:15s} {prec}  {impl:14s} {ms:8.1f} ms  {ms / stock:5.2f}× stock")
    write_json(args.json, info, rows=rows, args=vars(args))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cases(precisions: list[str]) -> dict:
    """{(part, precision): {impl: zero-argument callable}}; ``stock`` is PyTorch's own op."""
    import torch
    import torch.nn.functional as F

    from gptcli.model.gpt import GPT, preset
    from gptcli.model.kernels import apply, set_kernels
    from gptcli.model.kernels import dropout as gd

    set_kernels("auto")  # "ours" is the kernels' (the model's loss, with the kernels applied, is the blocked one)

    g = torch.Generator().manual_seed(0)
    probs_n, resid_shape = 4 * 12 * 512 * 512 * 5 // 8, (4, 512, 768)
    model = apply(GPT(preset("gpt1")), "cpu")
    next_token_nll = model.next_token_nll
    h = torch.randn(2048, 768, generator=g)
    cases: dict = {}

    def fwd_bwd(fn, x):
        def run():
            x.grad = None
            fn(x).float().sum().backward()

        return run

    for prec, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        if prec not in precisions:
            continue
        for part, shape in (("dropout probs", (probs_n,)), ("dropout resid", resid_shape)):
            x = torch.randn(shape, generator=g).to(dtype).requires_grad_()
            cases[(part, prec)] = {
                "stock": fwd_bwd(lambda t: F.dropout(t, 0.1, True), x),
                "ours": fwd_bwd(lambda t: gd.dropout(t, 0.1), x),
            }
        logits = torch.randn(2048, model.config.total_vocab, generator=g).to(dtype).requires_grad_()
        targets = torch.randint(0, model.config.total_vocab, (2048,), generator=g)
        ours = fwd_bwd(lambda t, y=targets: next_token_nll(t, y), logits)
        cases[("loss", prec)] = {
            "stock": fwd_bwd(lambda t, y=targets: F.cross_entropy(t.float(), y), logits),
            "blocks": _without_compiled_loss(ours),
            "ours": ours,
        }
        cases[("head", prec)] = {
            "stock": _head(model, h, prec, padded=False),
            "ours": _head(model, h, prec, padded=True),
        }
    cases[("mask", "-")] = {
        "stock": lambda: torch.empty(probs_n).bernoulli_(0.9),
        "ours": lambda: gd.keep_mask((probs_n,), 0.1),
    }
    return cases


def _without_compiled_loss(run):
    """``run`` with the loss kernel's row blocks of PyTorch ops instead of its compiled rows."""
    from gptcli.model.kernels import losses

    def blocks():
        compiled, losses._compiled = losses._compiled, lambda logits: None
        try:
            run()
        finally:
            losses._compiled = compiled

    return blocks


def _head(model, h, prec: str, padded: bool):
    """Forward + backward of the tied output layer and the loss at 2,048 positions, through the padded product or the
    plain one."""
    import torch
    import torch.nn.functional as F

    from gptcli.model.kernels.tied import training_logits

    next_token_nll = model.tied.nll  # the kernels' loss (the model was applied)
    x = h.clone().requires_grad_()
    w = model.tok_emb.weight
    targets = torch.randint(0, model.config.total_vocab, (h.size(0),), generator=torch.Generator().manual_seed(2))

    def run():
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=prec == "bf16"):
                if padded:
                    logits = training_logits(x, w)
                    assert logits is not None, "the padded product does not pay at these shapes"
                    loss = next_token_nll(logits, targets, classes=w.size(0))
                else:
                    loss = next_token_nll(F.linear(x, w), targets)
            loss.backward()
        finally:
            model.zero_grad(set_to_none=True)
            x.grad = None

    return run


if __name__ == "__main__":
    main()
