"""A failed allocation, recognised on any device, and the one error for a model whose weights alone do not fit.

Training words its own out-of-memory errors (gptcli/train/run/memory.py: the flag and value that make each forward
pass smaller); building or loading a model that is itself too big for the device is a different fact, the same in
every command: no batch setting can help, so the error gives the model's size. It lives here, below the checkpoint
and training rooms, so that loading a checkpoint (eval, generate, zero-shot) and building a new model (pretraining,
``finetune --init none``) say it alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from gptcli.errors import GPT1Error

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)

# Failed allocations that PyTorch raises as a plain RuntimeError, not torch.OutOfMemoryError: its CPU allocator's
# (torch 2.13: "DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes"; older: "not enough
# memory"), and CUDA's own where memory runs out outside PyTorch's caching allocator (a cuBLAS or cuDNN workspace,
# a library's handle).
_RUNTIME_WORDS = (
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
)


class OutOfMemory(GPT1Error):
    """A run's device (or, on CPU, its host) had no memory for the next allocation."""


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation that failed for want of memory, on any device."""
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(e, RuntimeError) and any(w in str(e) for w in _RUNTIME_WORDS)


def in_use(device: torch.device) -> str:
    """``"; 78.9 of 79.1 GiB in use"`` for a CUDA device, else nothing (the host's figures do not say what to do)."""
    if device.type != "cuda":
        return ""
    try:
        free, total = torch.cuda.mem_get_info(device)
    except RuntimeError:  # the device is in a state that cannot answer; the error says enough without it
        return ""
    return f"; {(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB in use"


def size_text(n: int) -> str:
    """Bytes as people read them: ``1.5 GiB``, ``12.0 MiB``."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def model_out_of_memory(device: torch.device, params: int) -> OutOfMemory:
    """The one-line error when building or loading the model itself failed: its weights alone do not fit, so no
    batch setting can help; the model's size says by how much."""
    return OutOfMemory(
        f"{device} has no room for the model itself: its {params:,} parameters take {size_text(4 * params)} as fp32 "
        f"weights{in_use(device)} (a smaller batch cannot help: use a smaller model, e.g. --preset, --n-layer or "
        "--n-embd, or a machine with more memory)"
    )


@contextlib.contextmanager
def weights_fit(device: Any, params: Callable[[], int]) -> Iterator[None]:
    """Run a block that allocates a model's weights on ``device``; a failed allocation in it becomes
    :func:`model_out_of_memory` (``params``: the model's parameter count, asked only then)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - re-raised as it is unless an allocation failed
        if not is_out_of_memory(e):
            raise
        raise model_out_of_memory(torch.device(device), params()) from e


def move_model(model: ModuleT, device: Any) -> ModuleT:
    """``model.to(device)``; a model whose weights alone do not fit there is :func:`model_out_of_memory`."""
    with weights_fit(device, lambda: sum(p.numel() for p in model.parameters())):
        return model.to(device)
