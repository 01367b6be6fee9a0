"""Device and numeric-precision resolution, autocast, and the peak-FLOPs figures used for MFU.

The model never sees any of this: the trainer wraps its forward pass in :func:`autocast` and moves batches to
:func:`resolve_device`'s device.

Precision defaults (``--precision auto``):
- CUDA: bf16 autocast where the GPU supports it (Ampere and newer), else fp16 with a GradScaler.
- CPU: bf16 autocast when the CPU has native bf16 dot products (``avx512_bf16``/AMX), else fp32: there a training
  step runs markedly faster in bf16 (the measurement: docs/performance.md, "CPU precision default"). The master
  weights and optimizer stay fp32 either way.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections.abc import Iterator
from typing import Literal

import torch

from gptcli.errors import GPT1Error
from gptcli.system.allocator import keep_freed_memory

Precision = Literal["fp32", "bf16", "fp16"]


def _peaks(bf16: float, fp32: float, fp16: float | None = None) -> dict[str, float]:
    """A device's dense peaks in TFLOP/s → FLOP/s (fp16 as bf16 unless given; 0: no such tensor cores)."""
    return {"bf16": bf16 * 1e12, "fp16": (bf16 if fp16 is None else fp16) * 1e12, "fp32": fp32 * 1e12}


# Dense peak FLOP/s (no 2:4 sparsity) as NVIDIA publishes them, keyed by the exact ``torch.cuda.get_device_name()``
# string: a substring match gave an "H100 NVL" the SXM's peak and an "L40" the L4's. fp32 figures are TF32
# tensor-core peaks, which fp32 matmuls use once TF32 is enabled (we enable it). A GPU not listed shows no MFU
# (``--peak-flops`` gives one), rather than a made-up one.
_HOPPER_SXM = _peaks(989.4, 494.7)
_A100 = _peaks(312, 156)
GPU_PEAK_FLOPS: dict[str, dict[str, float]] = {
    "NVIDIA H100 80GB HBM3": _HOPPER_SXM,
    "NVIDIA H100": _HOPPER_SXM,
    "NVIDIA H100 PCIe": _peaks(756, 378),
    "NVIDIA H100 NVL": _peaks(835.5, 417.5),
    "NVIDIA H800": _HOPPER_SXM,
    "NVIDIA H200": _HOPPER_SXM,
    "NVIDIA H200 NVL": _peaks(835.5, 417.5),
    "NVIDIA GH200 480GB": _HOPPER_SXM,
    "NVIDIA GH200 144G HBM3e": _HOPPER_SXM,
    "NVIDIA B200": _peaks(2250, 1100),
    "NVIDIA A100-SXM4-40GB": _A100,
    "NVIDIA A100-SXM4-80GB": _A100,
    "NVIDIA A100-PCIE-40GB": _A100,
    "NVIDIA A100 80GB PCIe": _A100,
    "NVIDIA A800-SXM4-80GB": _A100,
    "NVIDIA A10G": _peaks(70, 35),
    "NVIDIA A10": _peaks(125, 62.5),
    "NVIDIA L40S": _peaks(362, 183),
    "NVIDIA L40": _peaks(181, 90.5),
    "NVIDIA L4": _peaks(121, 60),
    "NVIDIA RTX A6000": _peaks(154.8, 77.4),
    "NVIDIA GeForce RTX 4090": _peaks(165.2, 82.6),
    "NVIDIA GeForce RTX 3090": _peaks(71, 35.6),
    "Tesla V100-SXM2-16GB": _peaks(0, 15.7, fp16=125),
    "Tesla V100-SXM2-32GB": _peaks(0, 15.7, fp16=125),
    "Tesla V100-PCIE-16GB": _peaks(0, 14, fp16=112),
    "Tesla V100-PCIE-32GB": _peaks(0, 14, fp16=112),
    "Tesla T4": _peaks(0, 8.1, fp16=65),
}


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
def cpu_flags() -> str:
    """/proc/cpuinfo's text, read once (empty where there is none): every CPU-flag probe reads it here, so a test
    stands for another CPU by replacing this one function."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def cpu_has_bf16() -> bool:
    """Whether the CPU has native bf16 dot products (AVX512-BF16 or AMX), read from /proc/cpuinfo."""
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(name: str, device: torch.device) -> Precision:
    """Turn ``auto|fp32|bf16|fp16`` into a concrete precision for ``device``."""
    if name not in ("auto", "fp32", "bf16", "fp16"):
        raise GPT1Error(f"--precision: expected auto, fp32, bf16 or fp16, got {name!r}")
    if device.type == "cuda":
        if name == "auto":
            return "bf16" if cuda_has_bf16(device) else "fp16"
        return name  # type: ignore[return-value]
    if name == "fp16":
        raise GPT1Error("--precision fp16 needs a CUDA device (use bf16 or fp32 on CPU)")
    if name == "auto":
        return "bf16" if cpu_has_bf16() else "fp32"
    return name  # type: ignore[return-value]


def precision_warning(precision: str, device: torch.device) -> str | None:
    """What a run asking for bf16 on a CPU without native bf16 dot products should know (None otherwise): there
    oneDNN emulates the bf16 products, far slower than fp32 (docs/performance.md), so a run that looks hung is in
    fact crawling. ``auto`` never picks it."""
    if device.type != "cpu" or precision != "bf16" or cpu_has_bf16():
        return None
    return (
        "--precision bf16 on a CPU without native bf16 dot products (no avx512_bf16 or amx_bf16 flag): its "
        "matrix products are emulated, far slower than fp32 (use --precision fp32, or auto, which picks it here)"
    )


def cuda_has_bf16(device: torch.device | None = None) -> bool:
    """Whether the GPU computes bf16 natively (Ampere and newer). ``torch.cuda.is_bf16_supported()`` alone also
    says yes where bf16 is only emulated on older GPUs, far slower than their fp16 tensor cores."""
    with torch.cuda.device(device) if device is not None and device.index is not None else contextlib.nullcontext():
        try:
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch < 2.4: no emulation flag; native bf16 is compute capability 8.0 and newer
            return torch.cuda.get_device_capability()[0] >= 8


def autocast(device: torch.device, precision: Precision):
    """The autocast context for a forward pass (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def product_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a matrix product with ``t`` runs in here: autocast's where autocast is on for ``t``'s device, else
    ``t``'s own (what code that casts its operands itself, and then turns autocast off, must cast them to)."""
    device = t.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else t.dtype


def shared_casts(device: torch.device, precision: Precision):
    """A disabled autocast region around all the micro-batches of one update (a no-op for fp32).

    Autocast keeps the low-precision copy of each weight it casts until its outermost region ends. With one region per
    micro-batch, every weight would be cast once per micro-batch; inside this region the copies live until the
    update's last backward pass, so each weight is cast once per update (the weights change only at the optimizer
    step, after it)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, enabled=False)


def configure_backends(device: torch.device) -> None:
    """TF32 matmuls/convolutions on CUDA (fp32 inputs, 10-bit mantissa products, several times faster); on CPU,
    glibc's malloc keeps the freed activations of one step for the next (gptcli/system/allocator.py)."""
    if device.type == "cpu":
        keep_freed_memory()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")


def prepare_device(name: str, precision: str, given: torch.device | None = None) -> tuple[torch.device, Precision]:
    """The device a run computes on (``given``: a job's worker's own, ``cuda:LOCAL_RANK``, which a bare "cuda" would
    not name; else ``name`` resolved) and its concrete precision, with the backends configured for it."""
    device = given if given is not None else resolve_device(name)
    resolved = resolve_precision(precision, device)
    configure_backends(device)
    return device, resolved


def gpu_peak_flops(device: torch.device, precision: Precision) -> float | None:
    """The GPU's dense peak for ``precision`` from :data:`GPU_PEAK_FLOPS`; None for a GPU not listed (or a
    precision it has no tensor cores for): MFU is then not shown."""
    return peak_for_gpu_name(torch.cuda.get_device_name(device), precision)


def peak_for_gpu_name(name: str, precision: Precision) -> float | None:
    """:data:`GPU_PEAK_FLOPS` by the exact device name (surrounding spaces ignored)."""
    return GPU_PEAK_FLOPS.get(name.strip(), {}).get(precision) or None


@functools.lru_cache(maxsize=4)
def measure_cpu_peak(precision: str = "fp32", n: int = 1024, seconds: float = 0.5) -> float:
    """Measured matmul FLOP/s of this CPU with the current thread count (median of several square matmuls of
    side ``n``, for about ``seconds``; in float32 the faster of MKL's and oneDNN's).

    Where oneDNN emulates bf16 products (no ``avx512_bf16``/AMX), a full-size product would take minutes, so the side
    shrinks to what fits the time asked (:func:`_affordable_side`): such a peak only has to show how slow the
    precision is here."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)  # never touch the global RNG: training runs must stay reproducible
    n = _affordable_side(dtype, n, seconds, g)
    a = torch.randn(n, n, generator=g).to(dtype)
    b = torch.randn(n, n, generator=g).to(dtype)
    if dtype == torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return 2.0 * n**3 / _median_time(lambda: torch.mm(a, b), seconds)
    # float32 has two libraries: MKL (torch.mm) and oneDNN (a linear layer on oneDNN's own layout); on some CPUs
    # oneDNN's is far above MKL's (gptcli/model/kernels/onednn.py), so the peak is the faster one's.
    am, bm = a.to_mkldnn(), b.to_mkldnn()
    fastest = min(
        _median_time(lambda: torch.mm(a, b), seconds / 2),
        _median_time(lambda: torch.nn.functional.linear(am, bm), seconds / 2),
    )
    return 2.0 * n**3 / fastest


def _median_time(product, seconds: float) -> float:
    """The median time of ``product()`` over about ``seconds`` (at least three timings, after a warm-up)."""
    product()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        product()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


# The probe's side: a product small enough to time quickly even where bf16 is emulated.
_PROBE_SIDE = 256


def _affordable_side(dtype: torch.dtype, n: int, seconds: float, g: torch.Generator) -> int:
    """``n``, unless one ``n``-sided product would take longer than all of ``seconds`` at the rate a small probe
    product runs: then the largest multiple of 64 (at least the probe's side) whose product takes a quarter of it,
    so that the warm-up and three timed products fit. A native BLAS never comes near that bound."""
    if n <= _PROBE_SIDE:
        return n
    a = torch.randn(_PROBE_SIDE, _PROBE_SIDE, generator=g).to(dtype)
    torch.mm(a, a)  # warm-up: the first product pays for thread start and packing buffers
    t0 = time.perf_counter()
    torch.mm(a, a)
    rate = 2.0 * _PROBE_SIDE**3 / max(time.perf_counter() - t0, 1e-9)
    if 2.0 * n**3 / rate <= seconds:
        return n
    side = int((rate * seconds / 4 / 2.0) ** (1 / 3)) // 64 * 64
    return max(_PROBE_SIDE, min(n, side))


def _env_flops(name: str) -> float:
    """The FLOP/s in environment variable ``name``, refused in one line unless a positive finite number."""
    text = os.environ[name]
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise GPT1Error(f"{name}={text!r} is not a number of FLOP/s (set it to e.g. 1e12, or unset it to measure)")
    return value


def peak_flops(device: torch.device, precision: Precision, given: float | None = None) -> float | None:
    """Peak FLOP/s for MFU: ``given`` if set, the GPU table on CUDA, a quick matmul measurement on CPU."""
    if given:
        return given
    if device.type == "cuda":
        return gpu_peak_flops(device, precision)
    if os.environ.get("GPT1_CPU_PEAK_FLOPS"):
        return _env_flops("GPT1_CPU_PEAK_FLOPS")
    return measure_cpu_peak(precision)


# --- The kernels mode: how the model is computed (``--kernels``), chosen here so that configs of every layer can
# default to it without importing the kernels (gptcli/model/kernels/ applies them; ``kernels`` re-exports these).

MODES: tuple[str, ...] = ("auto", "reference")
"""``auto``: the kernels of gptcli/model/kernels/ on CPU, the reference elsewhere. ``reference``: plain PyTorch."""

ENV = "GPT1_KERNELS"
"""Environment variable read when no mode was set by :func:`set_kernels` (empty or unset: ``auto``)."""

_chosen: str | None = None  # set by set_kernels(); None: follow the environment


def check_mode(mode: str, source: str = "--kernels") -> str:
    """``mode`` if it is one of :data:`MODES`, else a one-line :class:`GPT1Error` naming ``source``."""
    if mode not in MODES:
        raise GPT1Error(f"{source}: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


def set_kernels(mode: str | None) -> None:
    """Choose the mode for this process (``None``: back to the environment's), until it is chosen again. A run
    uses :func:`use_kernels` instead, which gives the previous mode back."""
    global _chosen
    _chosen = None if mode is None else check_mode(mode)


@contextlib.contextmanager
def use_kernels(chosen: str | None) -> Iterator[str]:
    """``with use_kernels(config.kernels):`` the block computes in ``chosen`` (``None``: the mode in force), and
    the mode before it (:func:`set_kernels`'s choice, or none: the environment's) is back when the block exits,
    returning or raising. Every library run that computes with the model (``pretrain()``, ``finetune()``,
    ``evaluate_tasks()``, ``zeroshot()``, ``run_curve()``, ``corpus_perplexity()``, ``quickstart()``, each step of a
    ``Generation``) runs inside one. Yields the mode in force inside. An unknown mode is refused before anything
    changes."""
    global _chosen
    before = _chosen
    if chosen is not None:
        set_kernels(chosen)
    try:
        yield mode()
    finally:
        _chosen = before


def _environment() -> str:
    """``$GPT1_KERNELS`` as set (unchecked), else ``auto``."""
    return os.environ.get(ENV, "") or "auto"


def default_mode() -> str:
    """``$GPT1_KERNELS``, else ``auto``: the mode in force when no :func:`set_kernels` chose one (on the command
    line the variable is the default of ``--kernels``, under ``--config``: gptcli/commands/options.py)."""
    return check_mode(_environment(), source=ENV)


def mode() -> str:
    """The mode in force: the one :func:`set_kernels` (or the :func:`use_kernels` block around the caller) chose,
    else :func:`default_mode`."""
    return _chosen if _chosen is not None else default_mode()


def config_default() -> str:
    """The default of every config's ``kernels`` field: the mode in force when the config is made (the one
    :func:`set_kernels` chose, else ``$GPT1_KERNELS``, else ``auto``). Unchecked here, so that a misspelt variable
    cannot break ``gpt1 --help``: the run refuses it when it starts, naming ``--kernels``."""
    return _chosen if _chosen is not None else _environment()


def kernels_enabled(device: torch.device | str) -> bool:
    """Whether the CPU kernels (gptcli/model/kernels/) compute for tensors on ``device``: in ``auto`` mode, on CPU."""
    kind = torch.device(device).type if isinstance(device, str) else device.type
    return kind == "cpu" and mode() == "auto"
