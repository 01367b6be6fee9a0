"""What every throughput benchmark sets up and prints first: the allocator setting and the machine.

``use_large_allocator_thresholds`` re-executes the script once with glibc's mmap/trim thresholds raised, so that
the large activation buffers are reused instead of being mapped and unmapped every step (measured in
docs/performance.md); ``cpu_model`` names the processor the figures belong to.
"""

from __future__ import annotations

import os
import subprocess
import sys

TUNABLES = "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=68719476736"


def use_large_allocator_thresholds(default_malloc: bool) -> None:
    """Re-run this process with ``GLIBC_TUNABLES`` set (unless ``default_malloc`` or it is set already)."""
    if not default_malloc and os.environ.get("GLIBC_TUNABLES") != TUNABLES:
        os.environ["GLIBC_TUNABLES"] = TUNABLES
        os.execv(sys.executable, [sys.executable, *sys.argv])


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return "unknown CPU"


def round_robin(step, variants: list, steps: int) -> dict:
    """Seconds of ``step(*variant)`` per variant: one warm-up each, then ``steps`` rounds that time every variant in
    turn, so that a change in the machine's load falls on all of them alike (the ratios are what is compared)."""
    times: dict = {v: [] for v in variants}
    for v in variants:  # warm-up
        step(*v)
    for _ in range(steps):
        for v in variants:
            times[v].append(step(*v))
    return times


def describe_machine(peak_n: int = 2048, peak_seconds: float = 2.0) -> dict:
    """Print (and return) what the figures belong to: CPU model, torch version, thread count and the measured fp32
    and bf16 matmul peaks (``gptcli.runtime.measure_cpu_peak``, square ``peak_n`` matmuls) with those threads."""
    import torch

    from gptcli.runtime import measure_cpu_peak

    info = {"cpu": cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "(default)"),
            "peak_flops": {p: measure_cpu_peak(p, n=peak_n, seconds=peak_seconds) for p in ("fp32", "bf16")}}
    peak = info["peak_flops"]
    print(f"{info['cpu']}, torch {info['torch']}, {info['threads']} threads, GLIBC_TUNABLES={info['glibc_tunables']}")
    print(f"measured matmul peak: fp32 {peak['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peak['bf16'] / 1e9:.0f} GFLOP/s")
    return info
