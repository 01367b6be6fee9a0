"""The CPU flags that choose between the kernels' forms, read from /proc/cpuinfo once, never timed.

AMX (``amx_bf16``) makes bf16 products several times the fp32 peak, so some kernels take other forms there; on
AMD CPUs whose AVX-512 FMA units are full width, oneDNN's float32 products outrun MKL's (``onednn.py``). The kernels ask
:func:`amx` and :func:`onednn_fp32`, which tests can force either way.
"""

from __future__ import annotations

import functools

from gptcli.system import runtime


def cpu_has_amx() -> bool:
    """Whether the CPU multiplies bf16 matrices on AMX tiles (``amx_bf16``)."""
    return "amx_bf16" in runtime.cpu_flags()


def cpu_has_full_width_avx512() -> bool:
    """Whether the CPU is an AMD one of family 1Ah or later (``cpu family : 26``) with AVX-512, whose 512-bit FMA
    units are full width (family 19h's take each instruction twice). Asked for every linear
    layer's product: the text is parsed once."""
    return _full_width_avx512(runtime.cpu_flags())


@functools.lru_cache(maxsize=2)
def _full_width_avx512(cpuinfo: str) -> bool:
    if "AuthenticAMD" not in cpuinfo or "avx512f" not in cpuinfo:
        return False
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu family":
            return value.strip().isdigit() and int(value.strip()) >= 0x1A
    return False


_amx_forced: bool | None = None  # set by force_amx() (tests); None: the CPU's own flags


def amx() -> bool:
    """Whether the kernels take their AMX forms: the CPU's ``amx_bf16`` flag (``cpu.py``'s ``cpu_has_amx``, read
    once), never a timing. The AMX forms are plain PyTorch too and compute the same function, only in another
    order of products, so :func:`force_amx` lets tests run either form on any CPU."""
    if _amx_forced is not None:
        return _amx_forced
    return cpu_has_amx()


def force_amx(value: bool | None) -> None:
    """Take the AMX forms (``True``), the others (``False``), or follow the CPU again (``None``): for tests."""
    global _amx_forced
    _amx_forced = value


_onednn_forced: bool | None = None  # set by force_onednn_fp32() (tests, benchmarks); None: the CPU's own flags


def onednn_fp32() -> bool:
    """Whether the float32 products of the linear layers and the tied output layer run on oneDNN rather than MKL
    (``onednn.py``): an AMD CPU with full-width AVX-512 (``cpu.py``'s ``cpu_has_full_width_avx512``, read once), never a
    timing. Both compute float32 products, in other orders of sums, so :func:`force_onednn_fp32` lets tests and
    benchmarks run either on any CPU."""
    if _onednn_forced is not None:
        return _onednn_forced
    return cpu_has_full_width_avx512()


def force_onednn_fp32(value: bool | None) -> None:
    """Run the float32 products on oneDNN (``True``), on MKL (``False``), or follow the CPU again (``None``)."""
    global _onednn_forced
    _onednn_forced = value


__all__ = ["amx", "cpu_has_amx", "cpu_has_full_width_avx512", "force_amx", "force_onednn_fp32", "onednn_fp32"]
