"""Throughput: tokens/s, MFU and peak memory of the ``gpt1`` preset at 8, 32 and 64 × 512, eager, compiled and
under CUDA graphs; and where a compiled update spends its GPU time.
"""

from __future__ import annotations

import math
import time

from .context import Ctx, Failed
from .models import batches, build, compiled_loss, sync, trainer
from .profiling import cuda_kernels, dynamo_counts, kernel_groups, profile_step
from .registry import check


def throughput(ctx: Ctx, size: int, compiled: bool, mode: str | None = None) -> str:
    """tokens/s, MFU and peak memory of the run's preset (dropout as in training) at one of the sizes; compiled in
    torch.compile's ``mode`` where given."""
    import torch

    from gptcli.system.runtime import gpu_peak_flops
    from gptcli.train.compiled import keeps_grads
    from gptcli.train.pretrain import lm_loss

    b, t = ctx.sizes.throughput[size]
    s = ctx.sizes
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    # On CPU gptcli's own dropout breaks the compiled graph at every use (compile_loss says so), which would make
    # the dry run's trace minutes long: the dry run measures nothing, so it runs without dropout.
    model = build(ctx, **({} if ctx.cuda else {"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}))
    loss_fn = compiled_loss(ctx, mode) if compiled else lm_loss
    tr = trainer(ctx, model, loss_fn=loss_fn, keep_grads=keeps_grads(compiled, mode or "default"))
    data = batches(ctx, 4, b, t)
    ctx.record(
        batch=b,
        seq=t,
        precision=ctx.precision,
        compiled=compiled,
        backend=s.throughput_backend if compiled else None,
        mode=mode if compiled and ctx.cuda else None,
        scope="one process, no DDP: a data-parallel run adds DDP's gradient buckets (about one more fp32 copy "
        "of the gradients, 0.47 GB for gpt1) and the all-reduce",
    )
    t0 = time.perf_counter()
    for i in range(s.warm_steps):  # compilation, autotuning and the allocator's first growth
        tr.step(i, [data[i % 4]])
    sync(ctx)
    ctx.record(warmup_s=round(time.perf_counter() - t0, 2), warmup_steps=s.warm_steps)
    t0 = time.perf_counter()
    for i in range(s.timed_steps):
        res = tr.step(s.warm_steps + i, [data[i % 4]])
    sync(ctx)
    dt = time.perf_counter() - t0
    tps = s.timed_steps * b * t / dt
    peak = gpu_peak_flops(ctx.device, ctx.precision) if ctx.cuda else None  # type: ignore[arg-type]
    mfu = tps * model.flops_per_token(t) / peak if peak else None
    mem = torch.cuda.max_memory_allocated() / 2**30 if ctx.cuda else None
    ctx.record(
        tokens_per_s=round(tps, 1),
        step_ms=round(1000 * dt / s.timed_steps, 2),
        mfu=mfu,
        peak_flops=peak,
        max_memory_allocated_gib=mem,
        timed_steps=s.timed_steps,
        last_loss=float(res.loss),
        **({"dynamo": dynamo_counts()} if compiled else {}),
    )
    if not math.isfinite(float(res.loss)):
        raise Failed(f"loss became {float(res.loss)}")
    ctx.need_cuda("tokens/s, MFU and GPU memory only mean something on the GPU (the loop ran)")
    return f"{tps:,.0f} tokens/s, MFU {'n/a' if mfu is None else f'{100 * mfu:.1f}%'}, peak {mem:.1f} GiB"


def register_throughput_checks(size: int, label: str) -> None:
    """Register the throughput checks of one size (an index into ``Sizes.throughput``): eager, compiled, and at
    8 × 512 and 64 × 512 also in the other ``--compile-mode`` values."""
    for compiled in (False, True):
        check(
            f"throughput_{label}_{'compile' if compiled else 'eager'}",
            240 if compiled else 90,
            f"gpt1 preset bf16 at {label.replace('x', '×')} per GPU, {'--compile' if compiled else 'eager'}: "
            "tokens/s, MFU, torch.cuda.max_memory_allocated",
        )(lambda ctx, _s=size, _c=compiled: throughput(ctx, _s, _c))
    if label in ("8x512", "64x512"):
        # The other --compile-mode values, as gpt1 runs them (gradients kept for the graphs). An update of 4,096
        # tokens is bound by the host launching its kernels on a fast GPU: CUDA graphs (reduce-overhead) replay a
        # step's kernels without launching each; max-autotune adds a search for the matrix products' kernels.
        for name, mode, budget, what in (
            ("cudagraphs", "reduce-overhead", 240, "CUDA graphs"),
            ("autotune", "max-autotune", 480, "CUDA graphs and autotuned matrix products"),
        ):
            check(
                f"throughput_{label}_{name}",
                budget,
                f"gpt1 preset bf16 at {label.replace('x', '×')} per GPU, --compile --compile-mode {mode} ({what}): "
                "tokens/s, MFU, torch.cuda.max_memory_allocated",
            )(lambda ctx, _s=size, _m=mode: throughput(ctx, _s, True, mode=_m))


@check(
    "step_profile",
    240,
    "where a compiled gpt1 bf16 update at 64×512 spends its GPU time: kernels by kind "
    "(matmul, attention, loss, optimizer, fused elementwise, copies) against the update's wall time",
)
def check_step_profile(ctx: Ctx) -> str:
    model = build(ctx, **({} if ctx.cuda else {"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}))
    tr = trainer(ctx, model, loss_fn=compiled_loss(ctx))
    b, t = ctx.sizes.throughput[-1]
    data = batches(ctx, 2, b, t)
    for i in range(ctx.sizes.warm_steps):  # compilation and autotuning stay out of the trace
        tr.step(i, [data[i % 2]])
    sync(ctx)
    t0 = time.perf_counter()
    for i in range(3):
        tr.step(ctx.sizes.warm_steps + i, [data[i % 2]])
    sync(ctx)
    step_ms = 1000 * (time.perf_counter() - t0) / 3
    prof = profile_step(ctx, lambda: tr.step(ctx.sizes.warm_steps + 3, [data[0]]))
    kernels = cuda_kernels(prof, top=10_000)
    kernel_ms = sum(k["ms"] for k in kernels)
    groups = kernel_groups(kernels)
    ctx.record(
        batch=b,
        seq=t,
        step_ms=round(step_ms, 2),
        kernel_ms=round(kernel_ms, 2),
        gpu_busy=round(kernel_ms / step_ms, 3) if step_ms else None,
        groups=groups,
        top_kernels=kernels[:30],
    )
    ctx.need_cuda("the GPU's kernels are what this check reads (the compiled CPU step ran)")
    shares = ", ".join(f"{g} {100 * v['ms'] / kernel_ms:.0f}%" for g, v in list(groups.items())[:4])
    return f"{kernel_ms:.1f} ms of kernels in a {step_ms:.1f} ms update; {shares}"


for _size, _label in enumerate(("8x512", "32x512", "64x512")):  # indices into Sizes.throughput
    register_throughput_checks(_size, _label)
