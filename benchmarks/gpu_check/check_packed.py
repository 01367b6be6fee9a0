"""Fine-tuning layouts on the device: packed rows against padded (and the jagged path), and the padded output layer
against the plain one.
"""

from __future__ import annotations

from .context import Ctx, Failed
from .models import batches, build, rel, trainer
from .registry import check
from .timing import naming, timed_arms, timed_updates


@check(
    "packed_finetune",
    180,
    "a fine-tuning update on RTE-like ragged sequences, packed (the default layout) "
    "against padded: same loss, speed of each; on CUDA also the packed row's attention as jagged nested tensors "
    "(packed.JAGGED_DEVICES) against the grid: same loss, speed of each",
)
def check_packed_finetune(ctx: Ctx) -> str:
    import random

    import torch

    from gptcli.data.batching import collate, collate_packed
    from gptcli.data.transforms import Encoded
    from gptcli.model import packed as packing
    from gptcli.model.classifier import FinetuneModel
    from gptcli.model.heads import HeadConfig, TaskHead
    from gptcli.train.finetune_job import TaskLoss

    body = build(ctx, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)  # no dropout: the two layouts must agree
    body.add_special_tokens(3)
    extract = body.config.total_vocab - 1
    model = FinetuneModel(
        body,
        TaskHead(HeadConfig(kind="entailment", n_embd=body.config.n_embd, n_labels=2, extract_id=extract, pdrop=0.0)),
    ).to(ctx.device)
    rng = random.Random(0)
    n, top = (32, ctx.sizes.seq) if ctx.cuda else (8, ctx.sizes.seq)
    # RTE's random batches: lengths spread from a few dozen tokens to the context (61% of positions padding).
    enc = [
        Encoded(
            [[rng.randrange(ctx.sizes.vocab) for _ in range(rng.randint(top // 8, top - 1))] + [extract]],
            label=i % 2,
            index=i,
        )
        for i in range(n)
    ]
    padded, packed = collate(enc).to(ctx.device), collate_packed(enc, extract).to(ctx.device)
    ctx.record(sequences=n, real_fraction=round(packed.packing.tokens / padded.ids.numel(), 3))
    # (name, batch, the packed row's attention as jagged nested tensors): the jagged path only where CUDA runs it.
    variants = [("padded", padded, False), ("packed", packed, False)]
    nested = _nested_causal(ctx)
    ctx.record(nested_causal_sdpa=nested)
    if ctx.cuda and nested.startswith("runs"):
        variants.append(("packed_jagged", packed, True))
    losses = {}
    for name, b, jagged in variants:  # the same weights: compare before any update
        with naming(packing, "JAGGED_DEVICES", ctx.device.type, jagged), torch.no_grad():
            losses[name] = float(TaskLoss(0.5)(model, b))
        ctx.record(**{f"loss_{name}": losses[name]})
        if rel(losses[name], losses["padded"]) > 1e-4:
            raise Failed(f"{name} loss {losses[name]} differs from padded {losses['padded']}")
    notes = []
    # fp32 (TF32 on CUDA), whose keys have no suffix; bf16 autocast too where CUDA runs it (fine-tuning's
    # `--precision auto` there). The fp32 keys keep their names; the bf16 ones end in _bf16.
    for precision in ("fp32", "bf16") if ctx.cuda else ("fp32",):
        tr = trainer(ctx, model, precision=precision, loss_fn=TaskLoss(0.5))
        end = "" if precision == "fp32" else f"_{precision}"
        times = {}
        for name, b, jagged in variants:
            with naming(packing, "JAGGED_DEVICES", ctx.device.type, jagged):
                times[name] = timed_updates(ctx, tr, [b], timed=8, warm=2)
        ctx.record(
            **{f"update_s_{name}{end}": round(t, 4) for name, t in times.items()},
            **{f"speedup{end}": round(times["padded"] / times["packed"], 2)},
        )
        note = f"{precision}: packed {times['padded'] / times['packed']:.2f}× padded"
        if "packed_jagged" in times:  # > 1: the jagged path is the faster, and packed.JAGGED_DEVICES should name it
            ctx.record(**{f"jagged_vs_grid{end}": round(times["packed"] / times["packed_jagged"], 3)})
            note += f", jagged attention {times['packed'] / times['packed_jagged']:.2f}× the grid's"
        notes.append(note)
    return f"{'; '.join(notes)} per update (losses equal), real tokens {packed.packing.tokens / padded.ids.numel():.0%}"


def _nested_causal(ctx: Ctx) -> str:
    """Whether the packed rows' jagged attention (``packed._jagged_attention``: causal SDPA over jagged nested
    tensors, the candidate variable-length path on CUDA) runs here and equals attention per sequence (on CPU
    PyTorch has no causal kernel for it)."""
    import torch
    import torch.nn.functional as F

    from gptcli.model.packed import Packing, _jagged_attention

    lengths = [37, 5, 120]
    x = torch.randn(sum(lengths), 3, 4, 64, device=ctx.device)  # each token's q, k, v: 4 heads of 64
    try:
        dtype = torch.bfloat16 if ctx.cuda else torch.float32
        with torch.autocast(ctx.device.type, dtype=dtype, enabled=ctx.cuda):
            got = _jagged_attention(x, 0.0, Packing.of([[0] * n for n in lengths])).float()
            want = torch.cat(
                [
                    F.scaled_dot_product_attention(*s.permute(1, 2, 0, 3), is_causal=True).transpose(0, 1).float()
                    for s in x.split(lengths)
                ]
            )
        return f"runs, max difference {float((got - want).abs().max()):.1e}"
    except Exception as e:  # noqa: BLE001 - the answer is what went wrong
        return f"does not run: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


@check(
    "padded_head",
    240,
    "a bf16 update of the gpt1 preset with its output product against the embedding padded "
    "to aligned rows (tied.PADDED_HEAD_DEVICES) against the plain product: same loss, seconds per update "
    "eager at 8×512 and 64×512, compiled at 64×512",
)
def check_padded_head(ctx: Ctx) -> str:
    import torch

    from gptcli.model import tied
    from gptcli.system.runtime import autocast
    from gptcli.train.pretrain import lm_loss

    model = build(ctx, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)  # no dropout: both give one loss
    losses = {}
    first = batches(ctx, 1, *ctx.sizes.throughput[0])[0]
    for name in ("plain", "padded"):  # the same weights: the losses before any update
        with (
            naming(tied, "PADDED_HEAD_DEVICES", ctx.device.type, name == "padded"),
            torch.no_grad(),
            autocast(ctx.device, ctx.precision),
        ):  # type: ignore[arg-type]
            losses[name] = float(lm_loss(model, first))
    ctx.record(loss_plain=losses["plain"], loss_padded=losses["padded"])
    if rel(losses["padded"], losses["plain"]) > 1e-3:
        raise Failed(f"padded head's loss {losses['padded']} differs from the plain {losses['plain']}")
    last = len(ctx.sizes.throughput) - 1
    notes = timed_arms(
        ctx, model, tied, "PADDED_HEAD_DEVICES", ("plain", "padded"), ((0, False), (last, False), (last, True))
    )
    ctx.need_cuda("the products' alignment is what this measures, on the GPU (the CPU's padding is kernels/tied.py's)")
    return (
        f'padded head against plain, per update: {", ".join(notes)} (> 1: "cuda" belongs in tied.PADDED_HEAD_DEVICES)'
    )
