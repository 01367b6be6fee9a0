"""Running out of memory: one error for every run, naming the setting that makes each forward pass smaller.

The commonest failure of a training run on a GPU is its memory: the paper's update (64 sequences of 512 tokens) needs
more than many GPUs have, and a fine-tuning batch of long examples can too. PyTorch says so with a traceback and
"CUDA out of memory. Tried to allocate …", which names neither the run's setting nor its value. The fix is nearly
always the same: compute each update in smaller parts (gradient accumulation gives the same update), or score
held-out data in smaller batches. :func:`out_of_memory` is that error as one line that says which flag, to what value,
and whether the run can continue from a checkpoint; the update loop raises it (:mod:`gptcli.train.run.loop`), and
each job supplies the flag and the value (:meth:`gptcli.train.run.loop.Job.smaller`), since only it knows what its
batches hold.

No checkpoint is written after the error: an update cut short may have changed some weights and not others.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gptcli.errors import GPT1Error

# How PyTorch's CPU allocator words a failed allocation: a RuntimeError, not torch.OutOfMemoryError (torch 2.13:
# "DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes"; older: "not enough memory").
_CPU_WORDS = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")


class OutOfMemory(GPT1Error):
    """A run's device (or, on CPU, its host) had no memory for the next allocation."""


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation that failed for want of memory, on any device."""
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(e, RuntimeError) and any(w in str(e) for w in _CPU_WORDS)


def in_use(device: torch.device) -> str:
    """``"; 78.9 of 79.1 GiB in use"`` for a CUDA device, else nothing (the host's figures do not say what to do)."""
    if device.type != "cuda":
        return ""
    try:
        free, total = torch.cuda.mem_get_info(device)
    except RuntimeError:  # the device is in a state that cannot answer; the error says enough without it
        return ""
    return f"; {(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB in use"


def half(n: int, divides: int | None = None) -> int | None:
    """The largest size at most ``n // 2`` (that divides ``divides``, when given); None when ``n`` is 1 already."""
    for size in range(n // 2, 0, -1):
        if divides is None or divides % size == 0:
            return size
    return None


def out_of_memory(device: torch.device, during: str, advice: str, checkpoint: Path | str | None) -> OutOfMemory:
    """The one-line error: what ran out and when (``during``: "in update 7 of 2,000"), then ``advice`` (the job's
    flag and value) and the ``checkpoint`` the run can continue from with it, if there is one."""
    then = f"; then --resume continues from {checkpoint}" if checkpoint is not None else ""
    return OutOfMemory(f"{device} ran out of memory {during}{in_use(device)} ({advice}{then})")


__all__ = ["OutOfMemory", "half", "in_use", "is_out_of_memory", "out_of_memory"]
