"""The training loss under ``torch.compile``, as ``--compile`` and ``--compile-mode`` ask.

The Trainer takes any ``loss_fn(model, batch)``; compiling it compiles the model's forward and backward with it.
The modes other than ``default`` replay the compiled kernels as CUDA graphs, whose outputs live in memory the next
replay overwrites: a gradient that autograd kept as such an output (it does where ``.grad`` is None) would be
overwritten under gradient accumulation (pytorch/pytorch#169545), so those modes keep gradients allocated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gptcli.errors import GPT1Error

# The modes that capture CUDA graphs (torch._inductor.list_mode_options: "triton.cudagraphs").
GRAPHED_MODES = ("reduce-overhead", "max-autotune")


def check_compile_mode(compile: bool, mode: str) -> None:
    """Refuse a mode other than ``default`` without ``--compile``: nothing would be compiled in it."""
    if mode != "default" and not compile:
        raise GPT1Error(
            f"--compile-mode {mode} takes effect only with --compile (add --compile, or pass --compile-mode default)"
        )


def compile_loss(loss_fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    """``loss_fn`` compiled in ``mode``; ``default`` is the plain ``torch.compile(loss_fn)`` call, unchanged."""
    if mode == "default":
        return torch.compile(loss_fn)
    return torch.compile(loss_fn, mode=mode)


def keeps_grads(compile: bool, mode: str) -> bool:
    """Whether the Trainer must keep gradients allocated and zero them in place (CUDA graphs), not free them."""
    return compile and mode in GRAPHED_MODES
