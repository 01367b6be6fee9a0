"""glibc's malloc told to keep large freed blocks, for training on CPU.

By default glibc serves every allocation over its mmap threshold with a fresh ``mmap`` and returns it to the kernel
on ``free``, and trims a freed top of the heap. A training step allocates and frees the same gigabytes of
activations every step, so every step page-faults them in again, a large share of a CPU step's time (the
measurements: docs/performance.md).

:func:`keep_freed_memory` raises both thresholds with ``mallopt`` for the rest of the process, so freed memory stays
mapped for the next step. It is what the benchmarks get from ``GLIBC_TUNABLES``, set from inside the process so
that ``gpt1 pretrain`` and ``gpt1 finetune`` get it without an environment variable; the cost, keeping the peak
heap mapped, is one a training process pays at every step anyway. It is left alone where it does not apply or the
user chose otherwise: not glibc, a ``GLIBC_TUNABLES`` that already sets a ``glibc.malloc`` parameter, or
``GPT1_DEFAULT_MALLOC=1``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

OPT_OUT = "GPT1_DEFAULT_MALLOC"
"""Environment variable: ``1`` keeps glibc's default allocator behaviour."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# mallopt takes an int. The largest one as the mmap threshold: only allocations over 2 GB are mapped on their own.
# glibc before 2.35 refuses thresholds over 32 MB (HEAP_MAX_SIZE / 2); there the largest it takes is set instead.
_MMAP_THRESHOLDS = (2**31 - 1, 32 * 2**20)
# -1: trimming off ("Setting M_TRIM_THRESHOLD to -1 disables trimming completely", mallopt(3)).
_NO_TRIM = -1


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 — glibc only: musl has no such symbol
    except (OSError, AttributeError):
        return None
    return libc


def _user_chose() -> bool:
    return os.environ.get(OPT_OUT, "") == "1" or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")


@functools.lru_cache(maxsize=1)
def keep_freed_memory() -> int | None:
    """Raise glibc's mmap and trim thresholds for this process (module docstring), once. Returns the mmap threshold
    set, or None where nothing was changed (not glibc, the user's own setting, or mallopt refused)."""
    if _user_chose():
        return None
    libc = _glibc()
    if libc is None:
        return None
    for threshold in _MMAP_THRESHOLDS:
        if libc.mallopt(_M_MMAP_THRESHOLD, threshold) == 1:
            libc.mallopt(_M_TRIM_THRESHOLD, _NO_TRIM)
            return threshold
    return None


__all__ = ["OPT_OUT", "keep_freed_memory"]
