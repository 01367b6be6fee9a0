"""Optimizer parameter groups and learning-rate schedules shared by pretraining and fine-tuning.

Paper (reference §3): Adam β=(0.9, 0.999), ε=1e-8, decoupled weight decay 0.01 on weights only — not biases,
not LayerNorm gains. ``decay="released"`` reproduces the released code instead, which decays every tensor with
more than one dimension (embeddings included) — the same set for this architecture, named separately so the
choice stays explicit if a model grows other parameters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import torch
import torch.nn as nn

from gptcli.progress import SILENT, Progress


def param_groups(
    named_params: Iterable[tuple[str, nn.Parameter]],
    weight_decay: float,
    decay: Literal["paper", "released"] = "paper",
) -> list[dict]:
    """Split parameters into a decayed group (weight matrices, embeddings) and a non-decayed one.

    "paper": no decay for biases and LayerNorm parameters (matched by name); "released": decay iff ``ndim > 1``.
    """
    decayed: list[nn.Parameter] = []
    plain: list[nn.Parameter] = []
    for name, p in named_params:
        if not p.requires_grad:
            continue
        if decay == "released":
            is_decayed = p.ndim > 1
        else:
            leaf = name.rsplit(".", 1)[-1]
            is_ln = ".ln_" in f".{name}" or "layernorm" in name.lower() or name.startswith("ln")
            is_decayed = leaf != "bias" and not is_ln and p.ndim > 1
        (decayed if is_decayed else plain).append(p)
    groups = [{"params": decayed, "weight_decay": weight_decay}]
    if plain:
        groups.append({"params": plain, "weight_decay": 0.0})
    return groups


def make_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    decay: Literal["paper", "released"] = "paper",
    fused: bool | None = None,
    report: Progress = SILENT,
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`. ``fused`` defaults to True where supported (CUDA, and CPU in
    torch ≥ 2.4, where it is several times faster than the for-each implementation for GPT-1 sizes: one kernel
    per update instead of several per tensor). Where the fused kernel is refused, the for-each one computes the same
    update more slowly, and ``report`` hears it once (a warning naming why)."""
    groups = param_groups(model.named_parameters(), weight_decay, decay)
    if fused is None:
        fused = True
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)
    except (RuntimeError, TypeError) as e:  # fused unsupported for this device/dtype/torch
        if fused:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            report.note(
                f"the fused AdamW kernel is not available here ({reason}); using the slower for-each "
                f"AdamW (same update)",
                level="warn",
            )
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def lr_at(
    step: int,
    total_steps: int,
    max_lr: float,
    warmup_steps: int,
    shape: Literal["cosine", "linear", "constant"] = "cosine",
) -> float:
    """Learning rate for update ``step`` (0-based): linear warmup from 0 over ``warmup_steps`` (update 0 runs at
    ``max_lr / warmup_steps``, the last warm-up update at ``max_lr``: none is spent at rate 0), then ``shape`` decay
    towards 0 at ``total_steps`` (cosine for pretraining, linear for fine-tuning)."""
    if warmup_steps > 0 and step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if shape == "constant":
        return max_lr
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if shape == "linear":
        return max_lr * (1.0 - progress)
    return max_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_linear(x: float, warmup: float = 0.002) -> float:
    """The released code's fine-tuning schedule (openai/finetune-transformer-lm ``opt.py``), transcribed: the
    learning-rate multiplier at ``x = t / t_total``, where ``t`` counts the updates already done (the first update
    has ``x = 0`` and so runs at learning rate 0)::

        s = tf.cast(x <= warmup, tf.float32)
        return (s*(x/warmup) + (1-s))*(1-x)

    Warm-up and decay overlap: the ramp ``x / warmup`` is itself multiplied by ``1 - x``, and the decay runs over the
    whole run, not from the end of the warm-up. (The BERT port's ``x/warmup if x < warmup else 1 - x`` differs by
    that factor and at ``x = warmup``.) ``warmup = 0``, which the released code divides by, means no warm-up."""
    if warmup > 0 and x <= warmup:
        return (x / warmup) * (1.0 - x)
    return 1.0 - x


def released_lr(step: int, total_steps: int, max_lr: float, warmup: float) -> float:
    """Learning rate for update ``step`` (0-based) under the released ``warmup_linear`` with ``warmup`` a fraction of
    ``total_steps`` (the released code's ``lr * schedule(t / n_updates_total)``)."""
    return max_lr * warmup_linear(step / max(1, total_steps), warmup)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr
