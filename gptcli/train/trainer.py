"""One optimizer update, the same for pretraining and fine-tuning.

What is the same for every update lives here: one optimizer update from several micro-batches (gradient
accumulation), mixed precision (autocast, and a GradScaler for fp16), global-norm clipping and the learning-rate
schedule. What differs — the model, the data and the loss — is passed in: ``loss_fn(model, micro_batch) -> scalar
loss``. The loop around the updates (sync points, the non-finite policy, checkpoints, signals) is
:mod:`gptcli.train.run.loop`.

Data parallelism is applied from outside: wrap the model in ``DistributedDataParallel`` before handing it over.
:meth:`Trainer.step` then skips the gradient all-reduce on all but the last micro-batch (``model.no_sync()``), and
the caller decides which rank writes (``is_main``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn as nn

from gptcli.model import kernels
from gptcli.system.runtime import Precision, autocast, shared_casts
from gptcli.system.torch_floor import check_torch
from gptcli.train.grad_norm import clip_grad_norm, grad_norm
from gptcli.train.optim import set_lr

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel


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
        keep_grads: bool = False,
    ) -> None:
        # The CLI checks the floor before any command; a library user reaches training through here, and an older
        # torch would otherwise fail at the first update's clipping (torch_floor.py), after the data was prepared.
        check_torch()
        self.model = kernels.apply(model, device)  # the fast CPU paths, where --kernels auto runs on CPU
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.lr_fn = lr_fn
        self.device = device
        self.precision = precision
        self.grad_clip = grad_clip
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range and needs none.
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        # keep_grads: gradients allocated from the start and zeroed in place after each update, never freed, so that
        # backward adds into buffers of their own (CUDA graphs: gptcli.train.compiled). Freed, the default, costs
        # no memory between updates.
        self.keep_grads = keep_grads
        if keep_grads:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)

    def step(self, step: int, micro_batches: Sequence[Any]) -> StepResult:
        """Forward/backward every micro-batch, clip, and apply update number ``step`` (0-based)."""
        self.model.train()
        lr = self.lr_fn(step)
        set_lr(self.optimizer, lr)
        n = len(micro_batches)
        total = torch.zeros((), device=self.device)
        # Each weight cast to bf16/fp16 once per update: by autocast, and by the kernels that cast their own.
        with shared_casts(self.device, self.precision), kernels.shared_weight_casts(self.device):
            for i, mb in enumerate(micro_batches):
                # Under DDP, all-reduce gradients only once, on the last micro-batch.
                sync = i == n - 1 or not hasattr(self.model, "no_sync")
                with contextlib.nullcontext() if sync else cast("DistributedDataParallel", self.model).no_sync():
                    with autocast(self.device, self.precision):
                        loss = self.loss_fn(self.model, mb)
                    self.scaler.scale(loss / n).backward()
                total += loss.detach().float()
        # Nothing here reads a tensor back to the host: on a GPU an update of the paper's model takes about as long
        # as launching its kernels, so a wait per update would idle the device. A non-finite loss is not skipped
        # here (that needs its value on the host); the loop watches for it on the device and stops at its next
        # read (gptcli.train.run.loop.NonFiniteWatch), before any checkpoint is written from the weights after it.
        self.scaler.unscale_(self.optimizer)
        # Accurate and cheap on CPU, PyTorch's fused clip_grad_norm_ elsewhere (grad_norm.py).
        if self.grad_clip and self.grad_clip > 0:
            norm = clip_grad_norm(self.params, self.grad_clip)
        else:
            norm = grad_norm(self.params)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=not self.keep_grads)
        return StepResult(total / n, norm.detach().float(), lr)


def split_micro_batches(batch: torch.Tensor, micro_batch_size: int) -> list[torch.Tensor]:
    """Rows of ``batch`` in chunks of ``micro_batch_size`` (gradient accumulation)."""
    return list(batch.split(micro_batch_size, dim=0))


class Parallel:
    """How the loop sees data parallelism. The default is one process; a DDP implementation
    (``gptcli.train.distributed``) overrides these to wrap the model in DistributedDataParallel, average metrics and
    synchronise ranks."""

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
            model = cast(nn.Module, model.module)  # a wrapper's attribute: the module it wraps
        elif hasattr(model, "_orig_mod"):
            model = cast(nn.Module, model._orig_mod)
        else:
            return model
