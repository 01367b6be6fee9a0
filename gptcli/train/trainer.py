"""The training-loop core shared by pretraining and fine-tuning.

What is the same for every stage lives here: one optimizer update from several micro-batches (gradient
accumulation), mixed precision (autocast, and a GradScaler for fp16), global-norm clipping, the learning-rate
schedule, the non-finite-loss guard, cadences, and clean stopping on SIGINT/SIGTERM. What differs — the model, the
data and the loss — is passed in: ``loss_fn(model, micro_batch) -> scalar loss``.

Data parallelism is applied from outside: wrap the model in ``DistributedDataParallel`` before handing it over.
:meth:`Trainer.step` then skips the gradient all-reduce on all but the last micro-batch (``model.no_sync()``), and
the caller decides which rank writes (``is_main``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from gptcli.errors import GPT1Error
from gptcli.train.optim import set_lr
from gptcli.runtime import Precision, autocast, shared_casts


class NonFiniteLossError(GPT1Error):
    """The loss (or the weights) became NaN or infinite; the message names the newest checkpoint saved before the
    divergence, or says there is none."""


@dataclass
class StepResult:
    """What one update leaves behind, as 0-dim fp32 tensors on the training device: reading them waits for the
    device, so the loop reads them only on the updates it logs (:meth:`read`), never on every update."""

    loss: torch.Tensor
    """Mean loss over the micro-batches of this update (this rank's)."""
    grad_norm: torch.Tensor
    """Global gradient norm before clipping (inf/NaN when the loss or the gradients were not finite)."""
    lr: float

    def read(self) -> tuple[float, float]:
        """(loss, grad_norm) as Python floats, in one transfer from the device."""
        loss, norm = torch.stack([self.loss, self.grad_norm]).tolist()
        return loss, norm


class Trainer:
    """One optimizer update per :meth:`step` call over a list of micro-batches."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[nn.Module, Any], torch.Tensor],
        lr_fn: Callable[[int], float],
        *,
        device: torch.device,
        precision: Precision = "fp32",
        grad_clip: float | None = 1.0,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.lr_fn = lr_fn
        self.device = device
        self.precision = precision
        self.grad_clip = grad_clip
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range and needs none.
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.params = [p for g in optimizer.param_groups for p in g["params"]]

    def step(self, step: int, micro_batches: Sequence[Any]) -> StepResult:
        """Forward/backward every micro-batch, clip, and apply update number ``step`` (0-based)."""
        self.model.train()
        lr = self.lr_fn(step)
        set_lr(self.optimizer, lr)
        n = len(micro_batches)
        total = torch.zeros((), device=self.device)
        with shared_casts(self.device, self.precision):  # each weight cast to bf16/fp16 once per update
            for i, mb in enumerate(micro_batches):
                # Under DDP, all-reduce gradients only once, on the last micro-batch.
                sync = i == n - 1 or not hasattr(self.model, "no_sync")
                with contextlib.nullcontext() if sync else self.model.no_sync():
                    with autocast(self.device, self.precision):
                        loss = self.loss_fn(self.model, mb)
                    self.scaler.scale(loss / n).backward()
                total += loss.detach().float()
        # Nothing here reads a tensor back to the host: on a GPU an update of the paper's model takes about as long
        # as launching its kernels, so a wait per update would idle the device. A non-finite loss is not skipped
        # here (that needs its value on the host); the loop watches for it on the device and stops at its next
        # read (:class:`NonFiniteWatch`), before any checkpoint is written from the weights that followed.
        self.scaler.unscale_(self.optimizer)
        if self.grad_clip and self.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in self.params if p.grad is not None]))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(total / n, norm.detach().float(), lr)


class NonFiniteWatch:
    """The first update whose loss was not finite, tracked on the device between two reads.

    :meth:`observe` costs two small device ops and no wait; :meth:`first` reads the record back (one transfer)
    and is called on logging updates and before anything is saved, so a divergence is caught at the next such
    update at the latest and never written into a checkpoint."""

    def __init__(self, device: torch.device) -> None:
        self.update = torch.full((), -1, dtype=torch.int64, device=device)
        """1-based number of the first non-finite update, or -1."""
        self.loss = torch.zeros((), device=device)
        """That update's loss."""

    def observe(self, update: int, loss: torch.Tensor) -> None:
        new = ~torch.isfinite(loss) & (self.update < 0)
        self.update = torch.where(new, update, self.update)
        self.loss = torch.where(new, loss, self.loss)

    def first(self) -> tuple[int, float] | None:
        """(update, loss) of the first non-finite loss seen, or None."""
        update, loss = torch.stack([self.update.double(), self.loss.double()]).tolist()
        return (int(update), loss) if update >= 0 else None


def split_micro_batches(batch: torch.Tensor, micro_batch_size: int) -> list[torch.Tensor]:
    """Rows of ``batch`` in chunks of ``micro_batch_size`` (gradient accumulation)."""
    return list(batch.split(micro_batch_size, dim=0))


def every(step: int, interval: int | None) -> bool:
    """True on steps ``interval, 2·interval, …`` (``step`` counts completed updates)."""
    return bool(interval) and interval > 0 and step % interval == 0


class GracefulStop:
    """Turns the first SIGINT/SIGTERM into a flag the loop checks between updates (so it can checkpoint and
    exit cleanly); a second signal interrupts at once unless ``escalate=False`` (DDP workers, which receive one
    Ctrl-C twice — from the terminal and from the launcher — and must still checkpoint). Handlers are restored
    on exit."""

    def __init__(self, signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM), escalate: bool = True) -> None:
        self.signals = signals
        self.escalate = escalate
        self.requested: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        if self.requested is not None:
            if self.escalate:
                raise KeyboardInterrupt
            return
        self.requested = signum

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()

    @property
    def name(self) -> str:
        return signal.Signals(self.requested).name if self.requested else ""


class Parallel:
    """How the loop sees data parallelism. The default is one process; a DDP implementation (``gptcli.train.distributed``)
    overrides these to wrap the model in DistributedDataParallel, average metrics and synchronise ranks."""

    rank: int = 0
    world_size: int = 1
    device: torch.device | None = None
    """The device this process of a job computes on (``cuda:LOCAL_RANK``); None outside a job: the run's own."""

    @property
    def is_main(self) -> bool:
        """Only this rank writes logs, metrics, configs and checkpoints."""
        return self.rank == 0

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def mean(self, value: float) -> float:
        """Average of ``value`` over ranks (losses for logging, validation losses)."""
        return value

    def barrier(self) -> None:
        pass

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any rank (e.g. a stop signal seen by one rank)."""
        return flag

    def max(self, values: Sequence[float]) -> list[float]:
        """Element-wise maxima of ``values`` over ranks (one process: as given)."""
        return list(values)

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums of ``values`` over ranks, several figures in one collective (one process: as given)."""
        return list(values)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order, on every rank (e.g. each rank's share of the dev predictions)."""
        return [obj]


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside DDP / torch.compile wrappers."""
    while True:
        if hasattr(model, "module"):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model
