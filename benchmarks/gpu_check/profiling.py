"""torch.profiler over one update: the ops and CUDA kernels that ran, grouped by kind, and dynamo's graph counts."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .context import Ctx
from .models import sync


def profile_step(ctx: Ctx, step: Callable[[], Any]):
    """A torch.profiler trace of one call of ``step`` (CPU ops, and CUDA kernels on the GPU)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.cuda else [])
    with profile(activities=activities) as prof:
        step()
        sync(ctx)
    return prof


def op_names(prof) -> dict[str, int]:
    """Names of every profiled event (CPU ops and device kernels) with their counts."""
    out: dict[str, int] = {}
    for e in prof.key_averages():
        out[e.key] = out.get(e.key, 0) + int(e.count)
    return out


def device_time_us(e) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total", "device_time_total", "cuda_time_total"):
        v = getattr(e, attr, None)
        if v:
            return float(v)
    return 0.0


def cuda_kernels(prof, top: int = 12) -> list[dict[str, Any]]:
    """The device kernels that took the most time, name shortened, with milliseconds and calls."""
    from torch.autograd import DeviceType

    # A record_function range (the optimizer's "Optimizer.step#AdamW.step") is listed on the device too, over the
    # kernels it holds: a user annotation, not a kernel, so not counted twice.
    rows = [
        (device_time_us(e), e.key, int(e.count))
        for e in prof.key_averages()
        if getattr(e, "device_type", None) == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]
    rows.sort(reverse=True)
    return [{"kernel": k[:160], "ms": round(us / 1000, 3), "calls": c} for us, k, c in rows[:top]]


def matching(names: dict[str, int], pattern: str) -> dict[str, int]:
    rx = re.compile(pattern, re.IGNORECASE)
    return {k[:160]: v for k, v in names.items() if rx.search(k)}


def dynamo_counts() -> dict[str, Any]:
    from torch._dynamo.utils import counters

    breaks = counters.get("graph_break", {})
    return {
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(breaks.values())),
        "break_reasons": [str(r).splitlines()[0][:200] for r in breaks],
    }


KERNEL_GROUPS = [  # first match wins: cuDNN's attention kernels are wgmma kernels too
    ("attention", r"sdpa|flash|fmha|attention|attn"),
    ("optimizer", r"adam|multi_tensor_apply"),
    ("loss", r"log_?softmax|nll_loss|cross_entropy"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|wgmma|cublas|matmul"),
    ("copy", r"memcpy|memset|copy_kernel|CatArrayBatched"),
    ("fused elementwise and norms (triton)", r"^triton_"),
]


def kernel_groups(kernels: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """GPU milliseconds and calls per kind of kernel (KERNEL_GROUPS, by name; "other" for the rest)."""
    out: dict[str, dict[str, float]] = {}
    for k in kernels:
        group = next((g for g, rx in KERNEL_GROUPS if re.search(rx, k["kernel"], re.IGNORECASE)), "other")
        row = out.setdefault(group, {"ms": 0.0, "calls": 0})
        row["ms"] = round(row["ms"] + k["ms"], 3)
        row["calls"] += k["calls"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms"]))
