"""What every throughput benchmark sets up and prints first: the allocator setting and the machine.

``use_large_allocator_thresholds`` re-executes the script once with glibc's mmap/trim thresholds raised, so that
the large activation buffers are reused instead of being mapped and unmapped every step (measured in
docs/performance.md); ``add_machine_args`` and ``start`` give every benchmark the same ``--threads``,
``--default-malloc`` and ``--json`` and apply them; ``cpu_model`` names the processor the figures belong to.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

TUNABLES = "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=68719476736"


def use_large_allocator_thresholds(default_malloc: bool) -> None:
    """Re-run this process with ``GLIBC_TUNABLES`` set (unless ``default_malloc`` or it is set already)."""
    if not default_malloc and os.environ.get("GLIBC_TUNABLES") != TUNABLES:
        os.environ["GLIBC_TUNABLES"] = TUNABLES
        os.execv(sys.executable, [sys.executable, *sys.argv])


def add_machine_args(ap: argparse.ArgumentParser) -> None:
    """The options every CPU benchmark takes: ``--threads``, ``--default-malloc`` and ``--json`` (see :func:`start`)."""
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    ap.add_argument("--default-malloc", action="store_true", help="do not set GLIBC_TUNABLES")
    ap.add_argument("--json", help="also write the results to this JSON file")


def start(args: argparse.Namespace) -> None:
    """Apply :func:`add_machine_args`' options: the allocator setting (may re-execute the script), then the threads."""
    use_large_allocator_thresholds(args.default_malloc)
    import torch

    torch.set_num_threads(args.threads or os.cpu_count() or 1)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return "unknown CPU"


def round_robin(step, variants: list, steps: int, settle: int = 0) -> dict:
    """Seconds of ``step(*variant)`` per variant: one warm-up each, then ``steps`` rounds that time every variant in
    turn, so that a change in the machine's load falls on all of them alike (the ratios are what is compared).

    ``settle`` untimed steps of the same variant precede each timed one. A training run repeats one model's step;
    alternating models instead makes each step re-fault the memory the other models' steps freed and reshaped (a
    GPT-1 bf16 step: 5.3 s right after another model's, 5.0 s after its own), so the first step after a switch
    measures the allocator rather than the model."""
    times: dict = {v: [] for v in variants}
    for v in variants:  # warm-up
        step(*v)
    for _ in range(steps):
        for v in variants:
            for _ in range(settle):
                step(*v)
            times[v].append(step(*v))
    return times


def best_of(run, variants: list, repeats: int) -> tuple[dict, dict]:
    """``repeats`` round-robin passes of ``run(*variant)`` over ``variants``: each variant's best time (the pass the
    machine disturbed least) and its last result (predictions, to check agreement)."""
    best = {v: float("inf") for v in variants}
    results: dict = {}
    for _ in range(repeats):
        for v in variants:
            t0 = time.perf_counter()
            results[v] = run(*v)
            best[v] = min(best[v], time.perf_counter() - t0)
    return best, results


def machine_header(peak_seconds: float = 2.0, peak_n: int = 2048) -> tuple[dict, str]:
    """What the figures belong to, as a dict (for ``--json``) and one printable line: the CPU model, the core and
    torch thread counts, the fp32 and bf16 matmul peaks measured now (``gptcli.system.runtime.measure_cpu_peak``
    with the current thread count), the load average and the allocator setting. Call it after
    ``torch.set_num_threads``."""
    import torch

    from gptcli.system.runtime import measure_cpu_peak

    peak = {p: measure_cpu_peak(p, n=peak_n, seconds=peak_seconds) for p in ("fp32", "bf16")}
    info = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "peak_flops": peak,
        "load_average": os.getloadavg()[0],
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
    }
    line = (
        f"{info['cpu']}; {info['cores']} cores, {info['threads']} torch threads, torch {info['torch']}; "
        f"measured matmul peak fp32 {peak['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peak['bf16'] / 1e9:.0f} GFLOP/s; "
        f"load average {info['load_average']:.2f}; GLIBC_TUNABLES={info['glibc_tunables'] or '(default)'}"
    )
    return info, line


def write_json(path: str | None, header: dict, **results) -> None:
    """``--json PATH``: the machine header and the results in one file (nothing when ``path`` is empty)."""
    if path:
        import json

        with open(path, "w", encoding="utf-8") as f:
            json.dump({"machine": header, **results}, f, indent=1, default=str)
