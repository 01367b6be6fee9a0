"""Time budgets: how many pretraining updates fit into the minutes a pipeline was given.

The quickstart (``--minutes``) and ``experiments/cpu_reproduction.py`` (``--budget-minutes``) both size their
pretraining run the same way: time one update of the model here, then divide the seconds left for pretraining by
it. They measure rather than guess because an update's cost varies widely from one CPU or GPU to another, and a
fixed number of updates would either waste the budget or overrun it. A
:class:`Deadline` keeps one budget across a pipeline's stages: each gets what the earlier ones left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from gptcli.system.runtime import Precision, configure_backends

clock: Callable[[], float] = time.monotonic
"""What budgets are kept by, in seconds: a seam, so that a test can make a machine look slow."""


@dataclass
class Deadline:
    """A budget of ``seconds`` counted on :data:`clock` from when it was made."""

    seconds: float
    start: float = field(default_factory=lambda: clock())

    def left(self) -> float:
        """Seconds of the budget still left (negative once it is spent)."""
        return self.seconds - (clock() - self.start)


def time_update(
    model_config: Any,
    seq_len: int,
    batch_size: int,
    device: torch.device,
    precision: str,
    steps: int = 3,
    warmup: int = 2,
) -> float:
    """Seconds per pretraining update of a ``model_config`` model here: the median of ``steps`` timed updates
    after ``warmup`` untimed ones, which pay for allocations and kernel selection. Random weights and tokens: an
    update's cost does not depend on their values. The backends are set up first as the run will set them
    (:func:`configure_backends`): without glibc's allocator setting updates time much slower than the run then
    goes, and the budget would be planned too small."""
    from gptcli.model.build import build_model
    from gptcli.train.optim import make_optimizer
    from gptcli.train.pretrain import lm_loss
    from gptcli.train.trainer import Trainer

    configure_backends(device)
    g = torch.Generator().manual_seed(0)
    model = build_model(model_config).to(device)  # either architecture (gptcli.model.build)
    opt = make_optimizer(model, 1e-4, 0.01)
    # Callers pass a precision already resolved (fp32, bf16 or fp16), never "auto".
    resolved = cast(Precision, precision)
    trainer = Trainer(model, opt, lm_loss, lambda s: 1e-4, device=device, precision=resolved, grad_clip=1.0)
    batch = torch.randint(0, model_config.vocab_size, (batch_size, seq_len + 1), generator=g).to(device)
    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        trainer.step(i, [batch])
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    timed = sorted(times[warmup:])
    return timed[len(timed) // 2]


def updates_that_fit(
    seconds: float, step_s: float, *, minimum: int, maximum: int | None = None, slowdown: float = 1.0
) -> int:
    """Updates of ``step_s`` seconds that fit into ``seconds``, at least ``minimum`` (a run too short to leave the
    warmup teaches nothing) and at most ``maximum``. ``slowdown``: how much slower an update inside the run is than
    the timed one (data loading, logging)."""
    n = int(seconds / (slowdown * step_s))
    return max(minimum, n if maximum is None else min(n, maximum))


def updates_per_epoch(train_tokens: int, batch_size: int, seq_len: int) -> int:
    """Updates in one pass over ``train_tokens`` tokens (at least 1)."""
    return max(1, train_tokens // (batch_size * seq_len))


def epochs(updates: int, batch_size: int, seq_len: int, train_tokens: int) -> float:
    """Passes over the training tokens that ``updates`` updates of ``batch_size`` × ``seq_len`` tokens make."""
    return updates * batch_size * seq_len / max(1, train_tokens)


def seconds_for_tokens(tokens: float, step_s: float, batch_size: int, seq_len: int) -> float:
    """Seconds that ``tokens`` training tokens' worth of updates cost at ``step_s`` seconds per update."""
    return tokens * step_s / (batch_size * seq_len)


__all__ = ["Deadline", "clock", "epochs", "seconds_for_tokens", "time_update", "updates_per_epoch", "updates_that_fit"]
