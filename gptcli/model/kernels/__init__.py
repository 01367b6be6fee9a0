"""The fast CPU kernels, opt-out behind one switch: they never run unless ``auto`` picks them on CPU.

The model (``gpt.py``, ``activation.py``, ``attention.py``, ``dropout.py``, ``losses.py``, ``tied.py``) is written in plain PyTorch,
as nanoGPT's ``model.py``: ``F.scaled_dot_product_attention``, ``F.dropout``, ``F.cross_entropy``, ``F.linear``.
Each of those files asks :func:`enabled` — the one dispatch point — before a computation that has a faster CPU
form here, and imports the kernel only when the answer is yes. Each kernel computes the reference's function
(tests/model/test_kernels.py and the per-kernel tests compare them); what differs is speed, floating-point rounding
and, for dropout, which units a given seed drops (the law is the same):

- ``attention.py``: causal attention written out over blocks of queries, with a hand-written backward
  (reference: ``F.scaled_dot_product_attention(..., is_causal=True)``);
- ``dropout.py``: dropout masks drawn from random bytes (reference: ``F.dropout``);
- ``losses.py``: the next-token cross-entropy over blocks of rows, with its own backward (reference:
  ``F.cross_entropy`` of the fp32 logits);
- ``tied.py``: the tied output product against an embedding padded to an aligned row count (reference:
  ``F.linear`` against the embedding);
- ``gelu.py``: the tanh-GELU as compiled loops (reference: ``F.gelu(x, approximate="tanh")``);
- ``tied_lookup.py``: the token lookup's gradient added into the tied output layer's in place (reference:
  ``F.embedding``, whose vocabulary-sized gradient autograd adds to the output layer's);
- ``linear.py``: on an AMX CPU under bf16 autocast, a linear layer's weight gradient from a dense transposed operand
  and its bias gradient as float32 column sums (reference: ``nn.Linear``, ``F.linear`` under autocast);
- ``onednn.py``: on an AMD Zen 5, the float32 products of the linear layers and the tied output layer by oneDNN
  instead of MKL, which runs them at half this CPU's speed (reference: ``F.linear`` and autograd's ``mm``).

``gelu.py`` and, where they can, ``dropout.py``, ``losses.py`` and ``attention.py``'s backward run C++ loops
(``*.cpp`` here) that ``native.py`` compiles for the machine on first use; where no compiler can build them (or, for
the loss and the softmax's backward, the CPU has neither AVX-512 nor AVX2), those kernels fall back to Python and the reference.

The switch is the process's mode (:func:`mode`): the one :func:`set_kernels` chose from code, else the environment
variable ``GPT1_KERNELS``, else ``auto``; and ``--kernels auto|reference`` on every command that runs the model, the
``kernels`` field of its config. A config made without that field takes the mode in force when it is made
(:func:`config_default`), so ``GPT1_KERNELS`` and :func:`set_kernels` reach library runs too. Every library entry
point that runs the model computes in its config's mode inside :func:`use_kernels`, which gives the caller's mode
back when the run returns or raises: a run never changes the mode of the code that called it. ``auto`` runs the
kernels on CPU and the reference everywhere else (on CUDA the reference already is PyTorch's fused kernels);
``reference`` runs plain PyTorch everywhere and never imports a module of this folder. Why each kernel is faster,
and by how much, is in docs/performance.md.

This package is the only place in gptcli that may use private ``torch._*`` functions (tests/test_architecture.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from gptcli.errors import GPT1Error
from gptcli.progress import SILENT, Progress, staged
from gptcli.system.runtime import cpu_has_amx, cpu_has_full_width_avx512

MODES: tuple[str, ...] = ("auto", "reference")
"""``auto``: the kernels of this folder on CPU, the reference elsewhere. ``reference``: plain PyTorch everywhere."""

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


_amx_forced: bool | None = None  # set by force_amx() (tests); None: the CPU's own flags


def amx() -> bool:
    """Whether the kernels take their AMX forms: the CPU's ``amx_bf16`` flag (``gptcli.system.runtime.cpu_has_amx``, read
    once), never a timing. The AMX forms are plain PyTorch too and compute the same function, only in another
    order of products, so :func:`force_amx` lets tests run either form on any CPU."""
    return cpu_has_amx() if _amx_forced is None else _amx_forced


def force_amx(value: bool | None) -> None:
    """Take the AMX forms (``True``), the others (``False``), or follow the CPU again (``None``): for tests."""
    global _amx_forced
    _amx_forced = value


_onednn_forced: bool | None = None  # set by force_onednn_fp32() (tests, benchmarks); None: the CPU's own flags


def onednn_fp32() -> bool:
    """Whether the float32 products of the linear layers and the tied output layer run on oneDNN rather than MKL
    (``onednn.py``): an AMD Zen 5 or later (``gptcli.system.runtime.cpu_has_full_width_avx512``, read once), never a
    timing. Both compute float32 products, in other orders of sums, so :func:`force_onednn_fp32` lets tests and
    benchmarks run either on any CPU."""
    return cpu_has_full_width_avx512() if _onednn_forced is None else _onednn_forced


def force_onednn_fp32(value: bool | None) -> None:
    """Run the float32 products on oneDNN (``True``), on MKL (``False``), or follow the CPU again (``None``)."""
    global _onednn_forced
    _onednn_forced = value


def enabled(device: torch.device | str) -> bool:
    """Whether the kernels of this folder compute for tensors on ``device``: in ``auto`` mode on CPU only."""
    kind = torch.device(device).type if isinstance(device, str) else device.type
    return kind == "cpu" and mode() == "auto"


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
            f"compiled CPU kernels unavailable: {native.unavailable()} (the Python kernels run instead, "
            "slower; install a C++ compiler to build them)",
            level="warn",
        )


__all__ = [
    "ENV",
    "MODES",
    "amx",
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
