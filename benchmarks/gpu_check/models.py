"""Building a model, its trainer and batches for a check, the way ``gpt1`` builds them, and the loss compiled as
``--compile`` compiles it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .context import Ctx


def build(ctx: Ctx, preset: str | None = None, vocab: int | None = None, **overrides: Any):
    """A freshly initialised model of ``preset`` (default: the run's) on the device, seeded."""
    import torch

    from gptcli.model.build import build_model
    from gptcli.model.build import preset as make_preset

    name = preset or ctx.sizes.preset
    if ctx.sizes.n_layer and not name.startswith("lstm"):
        overrides.setdefault("n_layer", ctx.sizes.n_layer)
    torch.manual_seed(0)
    cfg = make_preset(name, vocab_size=vocab or ctx.sizes.vocab, **overrides)
    return build_model(cfg).to(ctx.device)


def trainer(
    ctx: Ctx, model, precision: str | None = None, loss_fn: Callable | None = None, *, keep_grads: bool = False
):
    """A Trainer as pretraining builds it: fused AdamW (make_optimizer), lm_loss, clipping 1.0, constant lr;
    ``keep_grads`` as ``--compile-mode`` sets it for CUDA graphs (gptcli.train.compiled.keeps_grads)."""
    from gptcli.train.optim import make_optimizer
    from gptcli.train.pretrain import lm_loss
    from gptcli.train.trainer import Trainer

    opt = make_optimizer(model, 2.5e-4)
    return Trainer(
        model,
        opt,
        loss_fn or lm_loss,
        lambda s: 2.5e-4,
        device=ctx.device,
        precision=precision or ctx.precision,
        grad_clip=1.0,
        keep_grads=keep_grads,
    )


def batches(ctx: Ctx, n: int, b: int, t: int, vocab: int | None = None, seed: int = 0) -> list:
    """``n`` batches of ``b`` windows of ``t + 1`` ids on the device. Random ids: kernels, dtypes and speed do not
    depend on the text (the checks whose numbers do depend on it use the real-text corpus)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab or ctx.sizes.vocab, (b, t + 1), generator=g).to(ctx.device) for _ in range(n)]


def sync(ctx: Ctx) -> None:
    import torch

    if ctx.cuda:
        torch.cuda.synchronize()


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compiled_loss(ctx: Ctx, mode: str | None = None) -> Callable:
    """``lm_loss`` compiled as ``--compile`` does (inductor on the GPU), in ``mode`` where given (on the GPU only:
    torch.compile takes a mode with inductor alone)."""
    import torch

    from gptcli.train.pretrain import lm_loss

    if mode and ctx.cuda:
        return torch.compile(lm_loss, mode=mode)
    return torch.compile(lm_loss, backend=ctx.sizes.throughput_backend)
