"""The fast CPU kernels, applied to a built model by one call: ``kernels.apply(model, device)``.

The model (gptcli/model/) is plain PyTorch, as nanoGPT's ``model.py``, and imports nothing from here. It exposes
small seams (its dropout, linear and GELU layers, each attention layer's ``attention``, the tied layer's ``tied``);
:func:`apply` swaps them for this folder's forms (``layers.py``), which compute the reference's function faster on
CPU. What each kernel replaces, its measured gain and its tests: README.md here.

The mode (:func:`mode`): ``auto`` (the kernels on CPU, the reference elsewhere) or ``reference`` (plain PyTorch, no
kernel module imported); chosen by :func:`set_kernels`, else ``$GPT1_KERNELS``, else ``auto``, and per run by the
``kernels`` field of its config inside :func:`use_kernels`. Where runs build or load a model they call
:func:`apply`, which does nothing outside ``auto`` on CPU; an applied layer asks :func:`enabled` at each call, so
it computes the reference inside ``use_kernels("reference")`` or on another device. Why one call from outside: the
model stays readable, and the fast paths stay opt-in and testable against it one by one.

This package is the only place in gptcli that may use private ``torch._*`` functions (tests/test_architecture.py).
"""

from __future__ import annotations

import contextlib
from typing import TypeVar

import torch
import torch.nn as nn

from gptcli.progress import SILENT, Progress, staged
from gptcli.system.runtime import (
    ENV,
    MODES,
    check_mode,
    config_default,
    default_mode,
    mode,
    set_kernels,
    use_kernels,
)
from gptcli.system.runtime import kernels_enabled as enabled

ModelT = TypeVar("ModelT", bound=nn.Module)


def amx() -> bool:
    """Whether the kernels take their AMX forms (``cpu.amx``)."""
    from gptcli.model.kernels import cpu

    return cpu.amx()


def force_amx(value: bool | None) -> None:
    """Take the AMX forms (``True``), the others (``False``), or follow the CPU again (``None``): for tests."""
    from gptcli.model.kernels import cpu

    cpu.force_amx(value)


def onednn_fp32() -> bool:
    """Whether the float32 products run on oneDNN rather than MKL (``cpu.onednn_fp32``)."""
    from gptcli.model.kernels import cpu

    return cpu.onednn_fp32()


def force_onednn_fp32(value: bool | None) -> None:
    """Run the float32 products on oneDNN (``True``), on MKL (``False``), or follow the CPU again (``None``)."""
    from gptcli.model.kernels import cpu

    cpu.force_onednn_fp32(value)


def apply(model: ModelT, device: torch.device | str) -> ModelT:
    """``model`` with its seams replaced in place by the kernels' forms (``layers.py``) where :func:`enabled` says
    so for ``device`` (``auto``, on CPU); untouched, and no kernel module imported, elsewhere. Call it once a model
    is built or loaded for a run, before it computes (and before ``torch.compile``). Applying twice changes nothing;
    the parameters and the state dict are the model's own."""
    if enabled(device):
        from gptcli.model.kernels import layers

        if layers.holds_gpt1_model(model):  # another library's model (a benchmark's reference) keeps its own layers
            layers.install(model)
    return model


def shared_weight_casts(device: torch.device | str) -> contextlib.AbstractContextManager:
    """Around the micro-batches of one update (``gptcli.train.trainer.Trainer.step``): the kernels that cast a
    weight to bf16 themselves (the AMX forms, and on any CPU the tied output layer's linked product) cast it once
    for all of them, as autocast's own cache does for the rest (``casts.py``). A no-op where no such kernel runs."""
    if not enabled(device):
        return contextlib.nullcontext()
    from gptcli.model.kernels import casts

    return casts.shared_copies()


def prepare(device: torch.device | str, progress: Progress = SILENT) -> None:
    """Before a run's first step: build the compiled kernels (``native.py``) if the run will use them and they
    are not built for this machine yet — a stage of its own rather than a silent pause in the first step — and
    warn when they cannot be built (the Python kernels then run, slower). Nothing at all under ``reference`` or
    off the CPU."""
    if not enabled(device):
        return
    from gptcli.model.kernels import native

    if native.is_built():
        native.library()
    else:
        with staged(progress, "compile the CPU kernels for this machine (once)"):
            native.library()
    if native.unavailable() is not None:
        progress.note(
            f"compiled CPU kernels unavailable: {native.unavailable()}; the Python kernels run instead, slower",
            level="warn",
        )


__all__ = [
    "ENV",
    "MODES",
    "amx",
    "apply",
    "check_mode",
    "config_default",
    "default_mode",
    "enabled",
    "force_amx",
    "force_onednn_fp32",
    "mode",
    "onednn_fp32",
    "prepare",
    "set_kernels",
    "shared_weight_casts",
    "use_kernels",
]
