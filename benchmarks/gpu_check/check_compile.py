"""``torch.compile`` checks: the compiled loss (graphs, breaks, agreement with eager), CUDA graphs with accumulated
micro-batches, and the chunked loss against the padded head.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from .context import Ctx, Failed
from .models import batches, build, compiled_loss, rel, sync, trainer
from .profiling import dynamo_counts
from .registry import check
from .timing import naming, timed_arms


@check(
    "compile_loss",
    240,
    "torch.compile of lm_loss: graph breaks and recompiles (torch._dynamo), loss and gradient norm against eager",
)
def check_compile_loss(ctx: Ctx) -> str:
    import torch
    import torch._dynamo

    from gptcli.system.runtime import autocast
    from gptcli.train.pretrain import lm_loss

    b, t = ctx.sizes.batch, ctx.sizes.seq
    data = batches(ctx, ctx.sizes.updates, b, t)
    # The preset's widths with fewer blocks: every block is the same code, so breaks and recompiles show in two as
    # in twelve, at a sixth of the compile time (the throughput checks compile all twelve, and count again).
    layers = {"n_layer": ctx.sizes.compile_layers}
    # The training configuration (dropout 0.1) through explain: graph count and every break with its reason.
    model = build(ctx, **layers).train()
    with autocast(ctx.device, ctx.precision):  # type: ignore[arg-type]
        ex = torch._dynamo.explain(lm_loss)(model, data[0])
    ctx.record(
        n_layer=ctx.sizes.compile_layers,
        batch=b,
        seq=t,
        explain={
            "graphs": ex.graph_count,
            "graph_breaks": ex.graph_break_count,
            "break_reasons": [str(r.reason).splitlines()[0][:200] for r in ex.break_reasons],
        },
    )
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()  # what follows counts the compiled training updates alone
    del model
    # Equality needs the same function on both sides: no dropout (compiled dropout draws other masks).
    no_dropout = {**layers, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}
    eager, compiled = (
        trainer(ctx, build(ctx, **no_dropout), loss_fn=fn)
        for fn in (lm_loss, torch.compile(lm_loss, backend=ctx.sizes.compile_backend))
    )
    rows, counts = [], []
    for i, d in enumerate(data):
        e = eager.step(i, [d])
        t0 = time.perf_counter()
        c = compiled.step(i, [d])
        sync(ctx)
        rows.append(
            {
                "loss_eager": float(e.loss),
                "loss_compiled": float(c.loss),
                "grad_norm_eager": float(e.grad_norm),
                "grad_norm_compiled": float(c.grad_norm),
                "compiled_step_s": round(time.perf_counter() - t0, 2),
            }
        )
        counts.append(dynamo_counts())
        ctx.record(updates=rows, dynamo=counts[-1])
    # The first update starts from the same weights: loss and gradient norm must agree to the tolerance. Later
    # ones drift apart as the two sides' rounding differences enter the weights: a figure, within 5× the tolerance.
    tol = {"fp32": 1e-4, "bf16": 1e-2}[ctx.precision]
    first = max(
        rel(rows[0]["loss_compiled"], rows[0]["loss_eager"]),
        rel(rows[0]["grad_norm_compiled"], rows[0]["grad_norm_eager"]),
    )
    later = max(rel(r["loss_compiled"], r["loss_eager"]) for r in rows)
    recompiles = counts[-1]["unique_graphs"] - counts[0]["unique_graphs"]
    ctx.record(
        backend=ctx.sizes.compile_backend,
        precision=ctx.precision,
        first_update_rel_diff=first,
        max_rel_loss_diff=later,
        tolerance=tol,
        recompiles_after_first_update=recompiles,
    )
    breaks = max(ex.graph_break_count, counts[-1]["graph_breaks"])
    if first > tol or later > 5 * tol:
        raise Failed(f"compiled vs eager differ: first update {first:.2e}, losses {later:.2e} (tolerance {tol:g})")
    # On CPU gptcli's own dropout (model/dropout.py, keep_mask: random_ and nonzero) is what breaks the graph; the
    # GPU takes F.dropout, so only there do breaks and recompiles say something about `--compile` in training.
    ctx.need_cuda(
        f"compiled with {ctx.sizes.compile_backend} on CPU, where gptcli's CPU dropout breaks the graph "
        f"{breaks} times; the GPU takes F.dropout and inductor (compiled and eager agreed to {first:.1e})"
    )
    problems = []
    if breaks:
        problems.append(f"{breaks} graph break(s): {ctx.figures['explain']['break_reasons'][:3]}")
    if recompiles:
        problems.append(f"{recompiles} recompile(s) after the first update")
    if problems:
        raise Failed("; ".join(problems))
    return (
        f"{ex.graph_count} graph, no breaks, no recompiles; compiled vs eager {first:.1e} (tolerance {tol:g}); "
        f"first update {rows[0]['compiled_step_s']} s"
    )


@check(
    "cudagraphs_training",
    300,
    'CUDA graphs (torch.compile mode="reduce-overhead") in the training '
    "loop's harder cases: 2 micro-batches per update (accumulated gradients) and DDP (one process), with the "
    "gradients freed between updates (as the Trainer does) and kept and zeroed in place: losses and gradient "
    "norms against the same compiled loss without graphs",
)
def check_cudagraphs_training(ctx: Ctx) -> str:
    """What ``throughput_8x512_cudagraphs`` does not show before a ``--compile-mode`` can be offered. With CUDA graph
    trees a graph's outputs live in memory its next replay overwrites, and where a parameter's ``.grad`` is None
    autograd keeps the backward graph's output itself as the gradient: a second micro-batch's backward then adds
    into memory the graphs own (pytorch/pytorch#169545: "accessing tensor output of CUDAGraphs that has been
    overwritten by a subsequent run", open as of torch 2.11). Kept gradients, zeroed in place instead of freed, give
    autograd a buffer of its own to add into: what ``--compile-mode reduce-overhead`` does (the Trainer's
    ``keep_grads``). DDP's gradient buckets are the other case.
    Same weights, no dropout, 4 updates per arm; an arm that raises is recorded, not fatal."""
    import torch

    from gptcli.train.distributed import DDPParallel, DistInfo

    layers = {"n_layer": ctx.sizes.compile_layers, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}
    b, t = ctx.sizes.batch, ctx.sizes.seq
    halves = [list(d.chunk(2)) for d in batches(ctx, 4, b, t)]  # each update as two accumulated micro-batches
    arms = (("default", None, False), ("graphs", "reduce-overhead", False), ("graphs_kept", "reduce-overhead", True))
    rows: dict[str, Any] = {}
    with _one_process_group(ctx):
        device = torch.device("cuda", torch.cuda.current_device()) if ctx.cuda else ctx.device  # DDP wants an index
        par = DDPParallel(DistInfo(rank=0, local_rank=0, world_size=1), device)
        for case, wrap in (("accumulated", lambda m: m), ("ddp", par.wrap)):
            for arm, mode, kept in arms:
                tr = trainer(ctx, wrap(build(ctx, **layers)), loss_fn=compiled_loss(ctx, mode), keep_grads=kept)
                try:
                    res = [tr.step(i, mbs) for i, mbs in enumerate(halves)]
                    rows[f"{case}_{arm}"] = [{"loss": float(r.loss), "grad_norm": float(r.grad_norm)} for r in res]
                except Exception as e:  # noqa: BLE001 - the known failure is a finding to record, not the end
                    rows[f"{case}_{arm}"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
                ctx.record(updates=rows)
                del tr
                torch._dynamo.reset()
    tol = {"fp32": 1e-4, "bf16": 1e-3}[ctx.precision]
    diffs = {
        f"{case}_{arm}": _worst_rel(rows[f"{case}_{arm}"], rows[f"{case}_default"])
        for case in ("accumulated", "ddp")
        for arm, _, _ in arms[1:]
    }
    ctx.record(max_rel_diff=diffs, tolerance=tol, micro_batches=2, batch=b, seq=t, n_layer=layers["n_layer"])
    for case in ("accumulated", "ddp"):
        if isinstance(rows[f"{case}_default"], dict):
            raise Failed(f"the compiled loss without graphs failed ({case}): {rows[f'{case}_default']['error']}")
    bad = {k: v for k, v in diffs.items() if k.endswith("_kept") and not (v is not None and v <= tol)}
    ctx.need_cuda("CUDA graphs exist on CUDA only (the same compiled loss ran in every arm)")
    note = ", ".join(f"{k} {'raised' if v is None else f'{v:.1e}'}" for k, v in diffs.items())
    if bad:
        raise Failed(f"CUDA graphs with kept gradients change or break the update: {note} (tolerance {tol:g})")
    return f"graphs against none, 4 updates of 2 micro-batches: {note}"


def _worst_rel(rows, reference) -> float | None:
    """The largest relative difference of loss or gradient norm between two arms' updates; None if either raised."""
    if isinstance(rows, dict) or isinstance(reference, dict):
        return None
    return max(max(rel(g["loss"], d["loss"]), rel(g["grad_norm"], d["grad_norm"])) for g, d in zip(rows, reference))


@contextlib.contextmanager
def _one_process_group(ctx: Ctx):
    """A process group of this process alone (NCCL on the GPU, gloo on CPU), for DDP as ``--gpus 1`` builds it."""
    import socket

    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("nccl" if ctx.cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@check(
    "chunked_loss",
    300,
    "a bf16 update of the gpt1 preset with its output layer and loss over blocks of rows "
    "(chunked_nll.CHUNKED_LOSS_DEVICES) against the padded product's whole logits: same loss and gradient norm, "
    "seconds per update and peak memory eager and compiled at 64×512",
)
def check_chunked_loss(ctx: Ctx) -> str:
    """The candidate after the padded head: never writing the 64 × 512 × 40,512 logits (2.65 GB in bf16) nor their
    gradient; ``step_profile`` puts the loss at 6 % of a compiled update's kernels and the three output products at
    15 %. Both arms take the padded, aligned product; no dropout, so both compute one loss."""
    import torch

    from gptcli.model import chunked_nll
    from gptcli.model.kernels import set_kernels
    from gptcli.system.runtime import autocast
    from gptcli.train.pretrain import lm_loss

    if not ctx.cuda:
        set_kernels("reference")  # the dry run: the CPU's own blockwise loss would win over the candidate
    model = build(ctx, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
    first = batches(ctx, 1, *ctx.sizes.throughput[0])[0]
    start = {}
    for name in ("whole", "chunked"):  # the same weights: loss and gradient norm before any update
        with naming(chunked_nll, "CHUNKED_LOSS_DEVICES", ctx.device.type, name == "chunked"):
            model.zero_grad(set_to_none=True)
            with autocast(ctx.device, ctx.precision):  # type: ignore[arg-type]
                loss = lm_loss(model, first)
            ctx.record(**{f"grad_fn_{name}": type(loss.grad_fn).__name__})  # which loss really ran
            loss.backward()
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
            start[name] = (float(loss), float(norm))
    model.zero_grad(set_to_none=True)
    if ctx.figures["grad_fn_chunked"] != "_ChunkedNLLBackward":
        raise Failed(f"the chunked arm's loss came from {ctx.figures['grad_fn_chunked']}, not chunked_nll")
    ctx.record(
        loss_whole=start["whole"][0],
        loss_chunked=start["chunked"][0],
        grad_norm_whole=start["whole"][1],
        grad_norm_chunked=start["chunked"][1],
    )
    diff = max(rel(start["chunked"][0], start["whole"][0]), rel(start["chunked"][1], start["whole"][1]))
    if diff > 1e-2:
        raise Failed(f"the chunked loss differs from the whole logits' by {diff:.1e}: {start}")
    last = len(ctx.sizes.throughput) - 1
    notes = timed_arms(
        ctx, model, chunked_nll, "CHUNKED_LOSS_DEVICES", ("whole", "chunked"), ((last, False), (last, True))
    )
    ctx.need_cuda("what the blocks save is GPU memory traffic and memory (the CPU has its own blockwise loss)")
    b, t = ctx.sizes.throughput[last]
    mem = {n: ctx.figures[f"peak_gib_{n}_{b}x{t}_compile"] for n in ("whole", "chunked")}
    return (
        f"chunked against whole logits, per update: {', '.join(notes)}; peak compiled {mem['whole']:.1f} → "
        f'{mem["chunked"]:.1f} GiB; loss {diff:.1e} (> 1: "cuda" belongs in chunked_nll.CHUNKED_LOSS_DEVICES)'
    )
