"""The compiled kernels of this folder (its ``*.cpp`` files), built on first use with the machine's C++ compiler.

PyTorch's own CPU code is precompiled for every x86 CPU at once; a few of GPT-1's row-wise and elementwise steps
are cheaper in a loop compiled for this CPU alone (``-march=native``, AVX-512 intrinsics where it has them), fused
into one pass. Those loops live in C++ sources beside the Python kernels, and :func:`library` compiles them once
through PyTorch's JIT extension builder (``torch.utils.cpp_extension.load``: the compiler named by ``$CXX``, else
``c++``, driven by ninja) into ``$GPT1_KERNEL_CACHE``, else ``~/.cache/gpt1/kernels``: once per source text,
compiler flags, torch and Python version and CPU model and flags (all in the build's name, so a cache shared
between machines never hands one CPU another's instructions). Later processes import the built file directly. A
training run builds it before its first step, as a stage of its progress (``gptcli.model.kernels.prepare``).

Where it cannot be built (no compiler, no ninja, a read-only cache, a platform the flags do not suit), the
kernels that use it return ``None`` and the model computes the reference instead: slower, never wrong.
:func:`unavailable` says why.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import cast

import torch

from gptcli.errors import GPT1Error

SOURCES: tuple[str, ...] = (
    "bindings.cpp",
    "column_sums.cpp",
    "dropout.cpp",
    "fused_attention.cpp",
    "gelu.cpp",
    "loss.cpp",
    "softmax.cpp",
    "transpose.cpp",
)
HEADERS: tuple[str, ...] = ("elementwise.h", "mask_bits.h", "vector.h", "vexp.h")
"""The C++ files of this folder compiled into the one library (with :data:`HEADERS`, the headers they share)."""

DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
"""The dtypes the compiled loops take (``elementwise.h``); others compute the Python kernels or the reference."""

CACHE_ENV = "GPT1_KERNEL_CACHE"
"""Environment variable naming the folder the built library is kept in (default ``~/.cache/gpt1/kernels``)."""

_failure: str | None = None  # why the last build or load failed


ISA_ENV = "GPT1_KERNEL_ISA"
"""Environment variable choosing the instructions the library is built for (:data:`ISAS`; unset or empty:
``native``)."""

ISAS: tuple[str, ...] = ("native", "avx2")
"""``native``: everything this CPU has (``-march=native``). ``avx2``: the same without AVX-512 (x86 only), so that an
AVX-512 machine builds, runs and tests the AVX2 forms the loops take on AVX2-only CPUs
(tests/model/test_native.py builds it so in a subprocess); a separate build, cached under its own name."""


def isa() -> str:
    """``$GPT1_KERNEL_ISA`` (one of :data:`ISAS`), else ``native``; anything else is a one-line :class:`GPT1Error`."""
    value = os.environ.get(ISA_ENV, "") or "native"
    if value not in ISAS:
        raise GPT1Error(f"{ISA_ENV}: expected one of {', '.join(ISAS)}, got {value!r} (unset it to build for this CPU)")
    if value == "avx2" and not _is_x86():
        raise GPT1Error(f"{ISA_ENV}=avx2 needs an x86 CPU, this is {platform.machine()} (unset it)")
    return value


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def flags() -> list[str]:
    """Compiler flags: optimised, OpenMP for ``at::parallel_for`` (PyTorch's intra-op threads), and on x86 this
    CPU's instruction set with 512-bit vectors where it has them (faster than 256-bit ones where measured),
    or without AVX-512 under ``GPT1_KERNEL_ISA=avx2`` (:data:`ISAS`).

    ``-fno-trapping-math``: the loops never read the floating-point exception flags, and without it GCC keeps a
    float comparison (GELU's clamp, bf16's NaN test, dropout's keep test) as a branch wherever the CPU has no masked
    vector instructions, so on AVX2-only CPUs the elementwise loops stayed scalar, slower than PyTorch's own
    (docs/performance.md, "Kernels"). It changes no value (that would take ``-ffast-math``'s other parts)."""
    out = ["-O3", "-fno-trapping-math", "-fopenmp"]
    if _is_x86():
        # -mno-avx512f turns off every AVX-512 extension with it (vector.h then takes its AVX2 forms).
        out += ["-march=native", "-mno-avx512f"] if isa() == "avx2" else ["-march=native", "-mprefer-vector-width=512"]
    return out


def _cpu_identity() -> str:
    """The CPU's model name and feature flags (Linux), else what ``platform`` knows: what ``-march=native``
    compiles for."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    keep = ("model name", "flags", "Features", "CPU part")
    lines = sorted({line.strip() for line in text.splitlines() if line.split(":")[0].strip() in keep})
    return "\n".join(lines)


def build_name() -> str:
    """The library's name: a digest of everything the compiled code depends on (module docstring)."""
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update((Path(__file__).with_name(name)).read_bytes())
    for part in (flags(), torch.__version__, sys.version, _cpu_identity()):
        h.update(repr(part).encode())
    return "gpt1_cpu_kernels_" + h.hexdigest()[:16]


def cache_root() -> Path:
    """``$GPT1_KERNEL_CACHE``, else ``~/.cache/gpt1/kernels``."""
    env = os.environ.get(CACHE_ENV, "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpt1" / "kernels"


@functools.lru_cache(maxsize=1)
def library() -> ModuleType | None:
    """The compiled library (built on the first call of the process if not in the cache); ``None`` where it
    cannot be built or loaded (:func:`unavailable` says why)."""
    global _failure
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        _failure = f"no C++ compiler ({compiler!r} is not on PATH; install one, or name it in $CXX)"
        return None
    name = build_name()
    folder = cache_root() / name
    built = _import_built(folder, name)
    if built is not None:
        return built
    try:
        from torch.utils import cpp_extension

        folder.mkdir(parents=True, exist_ok=True)
        return cpp_extension.load(
            name=name,
            sources=[str(Path(__file__).with_name(s)) for s in SOURCES],
            extra_cflags=flags(),
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            verbose=False,
        )
    except Exception as e:  # any failure to build or load means: compute the reference instead
        lines = [line for line in str(e).strip().splitlines() if line.strip()]
        _failure = f"{type(e).__name__}: {lines[-1] if lines else ''}".strip()
        # A full disk shows as the builder's last words (a compiler's or ninja's) or an OSError: name the folder.
        if getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e):
            _failure = (
                f"the kernel cache {cache_root()} is full (free space there, or set ${CACHE_ENV} to a folder with room)"
            )
        return None


def built() -> ModuleType:
    """:func:`library` for code that runs only after a caller found it built (an autograd Function's passes)."""
    return cast(ModuleType, library())  # the caller's check saw it; the process's cache returns the same module


def library_for(device: torch.device | str, dtype: torch.dtype) -> ModuleType | None:
    """:func:`library` when its loops can compute a tensor of ``dtype`` on ``device`` (the CPU, :data:`DTYPES`),
    else ``None``."""
    if torch.device(device).type != "cpu" or dtype not in DTYPES:
        return None
    return library()


def vector_library_for(device: torch.device | str, dtype: torch.dtype) -> ModuleType | None:
    """:func:`library_for` when the library was built with its vector row loops (AVX-512 or AVX2, ``vector.h``:
    the loss's passes, the attention softmax's backward), else ``None``."""
    lib = library_for(device, dtype)
    return lib if lib is not None and lib.vectorised() else None


def is_built() -> bool:
    """Whether this machine's library is in the cache already (:func:`library` then only loads it)."""
    name = build_name()
    return _built_file(cache_root() / name, name).is_file()


def _built_file(folder: Path, name: str) -> Path:
    """Where PyTorch's builder writes the library ``name`` built in ``folder``."""
    return folder / f"{name}.so"


def _import_built(folder: Path, name: str) -> ModuleType | None:
    """The library already built into ``folder``, imported directly: its name digests everything it was built from,
    so there is nothing to check, and a process skips PyTorch's builder (its imports and a ninja run). A file
    that does not import (a build cut short) is left to the builder, which makes it again."""
    path = _built_file(folder, name)
    if not path.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception:  # any failure: let the builder decide
        return None


def unavailable() -> str | None:
    """Why :func:`library` returned ``None`` (after it was called), else ``None``."""
    return _failure if library() is None else None


__all__ = [
    "CACHE_ENV",
    "DTYPES",
    "HEADERS",
    "ISAS",
    "ISA_ENV",
    "SOURCES",
    "build_name",
    "cache_root",
    "flags",
    "is_built",
    "isa",
    "library",
    "library_for",
    "unavailable",
    "vector_library_for",
]
