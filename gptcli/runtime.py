"""Device and numeric-precision resolution, autocast, and the peak-FLOPs figures used for MFU.

The model never sees any of this: the trainer wraps its forward pass in :func:`autocast` and moves batches to
:func:`resolve_device`'s device.

Precision defaults (``--precision auto``):
- CUDA: bf16 autocast where the GPU supports it (Ampere and newer), else fp16 with a GradScaler.
- CPU: bf16 autocast when the CPU has native bf16 dot products (``avx512_bf16``/AMX), else fp32. Measured on the
  2-core Zen 4 (avx512_bf16) dev machine: a training step of a 2-layer d=768 model at 4×512 ran 1.5–1.8× faster
  with bf16 autocast than in fp32 (docs/performance.md). The master weights and optimizer stay fp32 either way.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from typing import Literal

import torch

from gptcli.errors import GPT1Error

Precision = Literal["fp32", "bf16", "fp16"]

# Dense peak FLOP/s per device (no 2:4 sparsity), as published by NVIDIA. Keys are matched as substrings of
# ``torch.cuda.get_device_name()``, most specific first. fp32 figures are TF32 tensor-core peaks, which is what
# fp32 matmuls use once TF32 is enabled (we enable it).
GPU_PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989e12, "fp16": 989e12, "fp32": 494.5e12}),
    ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 378e12}),
    ("H100", {"bf16": 989e12, "fp16": 989e12, "fp32": 494.5e12}),  # SXM
    ("GH200", {"bf16": 989e12, "fp16": 989e12, "fp32": 494.5e12}),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12}),
    ("A10G", {"bf16": 70e12, "fp16": 70e12, "fp32": 35e12}),
    ("L40S", {"bf16": 362e12, "fp16": 362e12, "fp32": 183e12}),
    ("L4", {"bf16": 121e12, "fp16": 121e12, "fp32": 60e12}),
    ("V100", {"bf16": 0.0, "fp16": 125e12, "fp32": 15.7e12}),
    ("RTX 4090", {"bf16": 165e12, "fp16": 165e12, "fp32": 82.6e12}),
    ("RTX 3090", {"bf16": 71e12, "fp16": 71e12, "fp32": 35.6e12}),
]


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` → CUDA when available, else CPU; ``cuda`` without a GPU is a user error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise GPT1Error("--device cuda: no CUDA device is available (use --device cpu or auto)")
        return torch.device(name)
    if name == "cpu":
        return torch.device("cpu")
    raise GPT1Error(f"--device: expected auto, cpu or cuda, got {name!r}")


@functools.lru_cache(maxsize=1)
def cpu_has_bf16() -> bool:
    """Whether the CPU has native bf16 dot products (AVX512-BF16 or AMX), read from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(name: str, device: torch.device) -> Precision:
    """Turn ``auto|fp32|bf16|fp16`` into a concrete precision for ``device``."""
    if name not in ("auto", "fp32", "bf16", "fp16"):
        raise GPT1Error(f"--precision: expected auto, fp32, bf16 or fp16, got {name!r}")
    if device.type == "cuda":
        if name == "auto":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return name  # type: ignore[return-value]
    if name == "fp16":
        raise GPT1Error("--precision fp16 needs a CUDA device (use bf16 or fp32 on CPU)")
    if name == "auto":
        return "bf16" if cpu_has_bf16() else "fp32"
    return name  # type: ignore[return-value]


def autocast(device: torch.device, precision: Precision):
    """The autocast context for a forward pass (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def configure_backends(device: torch.device) -> None:
    """TF32 matmuls/convolutions on CUDA (fp32 inputs, 10-bit mantissa products: ~8× faster on A100/H100)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")


def gpu_peak_flops(device: torch.device, precision: Precision) -> float | None:
    name = torch.cuda.get_device_name(device)
    for key, table in GPU_PEAK_FLOPS:
        if key in name:
            return table.get(precision) or None
    return None


@functools.lru_cache(maxsize=4)
def measure_cpu_peak(precision: str = "fp32", n: int = 1024, seconds: float = 0.5) -> float:
    """Measured matmul FLOP/s of this CPU with the current thread count (median of several square matmuls)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)  # never touch the global RNG: training runs must stay reproducible
    a = torch.randn(n, n, generator=g).to(dtype)
    b = torch.randn(n, n, generator=g).to(dtype)
    torch.mm(a, b)  # warm-up
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    times.sort()
    return 2.0 * n**3 / times[len(times) // 2]


def peak_flops(device: torch.device, precision: Precision, given: float | None = None) -> float | None:
    """Peak FLOP/s for MFU: ``given`` if set, the GPU table on CUDA, a quick matmul measurement on CPU."""
    if given:
        return given
    if device.type == "cuda":
        return gpu_peak_flops(device, precision)
    if os.environ.get("GPT1_CPU_PEAK_FLOPS"):
        return float(os.environ["GPT1_CPU_PEAK_FLOPS"])
    return measure_cpu_peak(precision)
