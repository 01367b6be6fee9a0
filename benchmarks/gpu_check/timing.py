"""Timing updates: two arms of one change round-robin on the same batches, so that a noisy host hits both alike."""

from __future__ import annotations

import contextlib
import time

from .context import Ctx
from .models import batches, compiled_loss, sync, trainer


@contextlib.contextmanager
def naming(module, attr: str, device_type: str, named: bool):
    """``module.<attr>``, a tuple of device types, naming ``device_type`` (``named``) or not inside the block, whatever
    the library's default: a check that times a path against the other sets both arms itself."""
    saved = getattr(module, attr)
    others = tuple(d for d in saved if d != device_type)
    setattr(module, attr, (*others, device_type) if named else others)
    try:
        yield
    finally:
        setattr(module, attr, saved)


def timed_arms(
    ctx: Ctx, model, module, attr: str, arms: tuple[str, str], runs: tuple[tuple[int, bool], ...]
) -> list[str]:
    """An A/B of ``model``'s updates with ``module.<attr>`` not naming this device (``arms[0]``) and naming it
    (``arms[1]``), for each (throughput size, compiled) of ``runs``: figures ``update_s_<arm>_<label>``,
    ``peak_gib_<arm>_<label>`` (on the GPU) and ``<arms[1]>_vs_<arms[0]>_<label>`` (> 1: the named path is
    faster); returns the ``<label> <gain>×`` notes."""
    import torch

    from gptcli.train.pretrain import lm_loss

    off, on = arms
    notes = []
    for size, compiled in runs:
        b, t = ctx.sizes.throughput[size]
        label = f"{b}x{t}_{'compile' if compiled else 'eager'}"
        data = batches(ctx, 2, b, t)
        for name in arms:
            with naming(module, attr, ctx.device.type, name == on):
                if ctx.cuda:
                    torch.cuda.reset_peak_memory_stats()
                tr = trainer(ctx, model, loss_fn=compiled_loss(ctx) if compiled else lm_loss)
                seconds = timed_updates(ctx, tr, data, timed=10)
                peak = torch.cuda.max_memory_allocated() / 2**30 if ctx.cuda else None
                ctx.record(**{f"update_s_{name}_{label}": round(seconds, 5), f"peak_gib_{name}_{label}": peak})
                del tr
        gain = ctx.figures[f"update_s_{off}_{label}"] / ctx.figures[f"update_s_{on}_{label}"]
        ctx.record(**{f"{on}_vs_{off}_{label}": round(gain, 3)})
        notes.append(f"{label} {gain:.2f}×")
    return notes


def timed_updates(ctx: Ctx, tr, data: list, timed: int, warm: int = 3) -> float:
    """Seconds per update over ``timed`` updates after ``warm`` ones (compilation and autotuning among them)."""
    for i in range(warm):
        tr.step(i, [data[i % len(data)]])
    sync(ctx)
    t0 = time.perf_counter()
    for i in range(timed):
        tr.step(warm + i, [data[i % len(data)]])
    sync(ctx)
    return (time.perf_counter() - t0) / timed
