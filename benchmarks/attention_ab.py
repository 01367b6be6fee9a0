"""The CPU kernels' changes to attention and the linear layers, each against what it replaced, same run (``--change``):

- ``layout`` (bf16): operands dense per block (``_DenseBlockedAttention``, what runs) against the strided layout it
  replaced (``_BlockedAttention`` over (B·H, T, d) copies, what fp32 still takes). oneDNN's bf16 batched products
  copy any operand that is not one dense matrix per batch row: a block's slice of the queries, a prefix of the keys
  or values, an output slice accumulated into. The strided route paid those copies on every product, forward and
  backward, plus a transpose copy of the output, zero-filled gradients and a concatenation of the three input
  gradients; the dense route lays each block's operands out once and writes the output and the input gradient in
  the fused projection's own layout.
- ``fused`` (fp32): the fused path (``_FusedAttention``, ``fused_attention.cpp``: per block of 64 queries the scores,
  softmax, dropout and product with v in one compiled call while the block is in cache, computed again in the
  backward pass from q, k and each row's log-sum-exp) against the written-out blocks it replaced in fp32
  (``_BlockedAttention``, which keeps every block's probabilities and their dropped-out copy for the backward pass;
  ``kernels.attention.FUSED_DTYPES`` emptied).
- ``softmax`` (``--precision`` bf16 or fp32): the compiled softmax forward (``softmax.cpp``: softmax, causal mask
  and dropout in one pass per row) against ``torch.softmax`` over scores carrying the additive mask, then
  ``Mask.apply`` (``kernels.attention.COMPILED_SOFTMAX`` off).
- ``linear`` (bf16, an AMX CPU): the linear layers' weight gradient from a dense transposed copy of the narrower
  operand (``kernels/linear.py``, ``transpose.cpp``) against autocast's ``F.linear``, whose weight gradient reads a
  transposed view (``kernels.linear.MIN_POSITIONS`` raised past every batch).
- ``grid`` (``--precision`` bf16 or fp32): a packed row's attention grid (``packed.py`` ``_ToGrid``/``_FromGrid``)
  gathered as whole token rows, the grid a permuted view the kernels read in place, against the per-head gather
  into a contiguous grid it replaced (``_heads_grid`` here).
- ``casts`` (bf16, an AMX CPU): the AMX forms' weight copies made once per update (``kernels/casts.py``, the
  trainer's ``kernels.shared_weight_casts`` region) against once per micro-batch (the region a no-op). Its part is
  the ``step`` (an update of ``--micro-batches`` micro-batches through the trainer, and the time spent casting);
  its ``finetune`` updates are one micro-batch each, where both variants cast once (a control).
- ``lookup`` (``--precision`` fp32 or bf16): the token lookup's gradient added in place into the tied
  output layer's (``kernels/tied_lookup.py``) against autograd's vocabulary-sized one added to it
  (``tied_lookup.applies`` false). Its ``layer`` part is the tied pair alone: the lookup of ``--batch`` ×
  ``--seq-len`` tokens straight into the output layer and the loss, forward + backward, at GPT-1's vocabulary.
- ``onednn`` (fp32): the float32 products of the linear layers and the tied output layer by oneDNN
  (``kernels/onednn.py``, what an AMD Zen 5 takes) against MKL's (``kernels.force_onednn_fp32``), on any CPU. Parts:
  ``linears`` (a block's four), the tied pair (as ``lookup``'s), the step and the fine-tuning updates.
- ``pad`` (bf16, a CPU without AMX): the tied output layer's bf16 training product against the embedding padded
  to ``PAD_ROWS_TO`` rows at any number of positions (``kernels/tied.py`` ``padding_is_faster``; its cast copy is
  made anyway) against the plain 40,478-row (40,481 in fine-tuning) product it replaced below ``PAD_MIN_POSITIONS``
  and in fine-tuning's auxiliary loss. Parts: the tied pair (as ``lookup``'s; ``--batch 2 --seq-len 507`` puts it
  under ``PAD_MIN_POSITIONS``, where the plain product ran before) and the fine-tuning updates.
- ``bias`` (bf16 on an AMX CPU, or fp32): the linear layers' bias gradient as float32 column sums
  (``column_sums.cpp``) against PyTorch's sum over the positions (``g.sum(0)``: autocast's bf16 one, or autograd's
  float32 one) it replaced. Parts as ``linear``'s (in ``--precision``), and ``sums``: the four bias gradients of a
  block alone (``--batch`` × ``--seq-len`` positions, GPT-1's widths).

Parts, each a round-robin of the two variants (``_machine.round_robin``, one settling step before each timed one):

- ``layer``: one GPT-1 attention layer from its fused projection (``--batch`` × ``--seq-len``, 12 heads of 64, the
  paper's attention dropout 0.1), forward + backward, q·kᵀ to the projection's gradient (``fused`` also times
  ``--short-batch`` × 128-token rows, fine-tuning's lengths, and the forward alone without dropout, evaluation's);
  for ``linear``, a block's four linear layers at GPT-1's shapes, forward + backward, from float32 inputs under
  bf16 autocast, as the model runs them; for ``grid``, one attention layer of a packed row of 16 sequences of
  40-250 tokens (fine-tuning's lengths), forward + backward through ``segment_attention``;
- ``step``: a whole pretraining step of the ``gpt1`` preset (forward, backward, fused AdamW) (``--no-step`` skips
  it: minutes on 2 cores); for ``casts``, an update of ``--micro-batches`` micro-batches by ``Trainer.step``;
- ``finetune``: whole fine-tuning updates as ``gpt1 finetune`` runs them by default (packed rows, the paper's batch
  of 32, ``--finetune-size``), on real RTE random batches (``finetune_throughput.py``'s builders, which need
  ``$GPT1_SHARED``) (``--no-finetune`` skips it).

The report gives medians and before / after. Both variants compute the same function (tests/model/
test_attention.py); the script checks the layer's outputs once before timing (equal bits for ``layout``, within
the precision's rounding for ``softmax``).

    python benchmarks/attention_ab.py --change layout --steps 9 --json layout.json
    python benchmarks/attention_ab.py --change softmax --precision fp32 --no-finetune
    python benchmarks/attention_ab.py --change fused --precision fp32
    python benchmarks/attention_ab.py --change linear --steps 9
    python benchmarks/attention_ab.py --change casts --steps 5 --micro-batches 4
    python benchmarks/attention_ab.py --change grid --no-step
    python benchmarks/attention_ab.py --change lookup --precision fp32 --finetune-shape storycloze
    python benchmarks/attention_ab.py --change bias --steps 9 --no-finetune
    python benchmarks/attention_ab.py --change onednn --precision fp32 --steps 5 --finetune-shape storycloze
    python benchmarks/attention_ab.py --change pad --batch 2 --seq-len 507 --no-step --finetune-micro-batch 16
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

from _machine import add_machine_args, machine_header, round_robin, start, write_json

VARIANTS = {
    "layout": ("strided", "dense"),
    "softmax": ("pytorch", "compiled"),
    "fused": ("chunked", "fused"),
    "linear": ("autocast", "dense"),
    "casts": ("each", "shared"),
    "grid": ("heads", "rows"),
    "lookup": ("dense", "linked"),
    "bias": ("bf16-sum", "columns"),
    "onednn": ("mkl", "onednn"),
    "pad": ("plain", "padded"),
}
"""Per change: (before, after)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--change", choices=sorted(VARIANTS), default="layout", help="which change to time")
    ap.add_argument(
        "--precision", choices=("bf16", "fp32"), default="bf16", help="(layout: bf16 only; fused: fp32 only)"
    )
    ap.add_argument("--steps", type=int, default=15, help="timed rounds per part (after one warm-up)")
    ap.add_argument("--batch", type=int, default=4, help="sequences")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per sequence")
    ap.add_argument("--short-batch", type=int, default=16, help="(fused) rows of 128 tokens in the short layer part")
    ap.add_argument("--no-step", action="store_true", help="skip the whole pretraining step")
    ap.add_argument("--micro-batches", type=int, default=4, help="(casts) micro-batches per pretraining update")
    ap.add_argument("--no-finetune", action="store_true", help="skip the fine-tuning updates")
    ap.add_argument("--finetune-size", default="gpt1", help="model preset of the fine-tuning part: gpt1 or tiny")
    ap.add_argument("--finetune-batches", type=int, default=2, help="batches of 32 timed per round")
    ap.add_argument(
        "--finetune-shape", default="rte", choices=("rte", "storycloze"), help="the fine-tuning part's task"
    )
    ap.add_argument(
        "--finetune-micro-batch",
        type=int,
        default=0,
        help="examples per micro-batch of the fine-tuning part (0: the whole batch of 32)",
    )
    add_machine_args(ap)
    args = ap.parse_args()
    if args.change == "layout" and args.precision != "bf16":
        ap.error("--change layout compares bf16 layouts (fp32 takes the strided one): --precision bf16")
    if args.change == "fused" and args.precision != "fp32":
        ap.error("--change fused compares fp32 paths (bf16 keeps the written-out one): --precision fp32")
    if args.change == "linear" and args.precision != "bf16":
        ap.error("--change linear compares bf16 weight gradients (fp32 keeps F.linear): --precision bf16")
    if args.change == "casts" and args.precision != "bf16":
        ap.error("--change casts compares bf16 weight copies (fp32 casts nothing): --precision bf16")
    if args.change == "pad" and args.precision != "bf16":
        ap.error("--change pad compares bf16 output products (fp32 keeps its bound): --precision bf16")
    if args.change == "onednn" and args.precision != "fp32":
        ap.error("--change onednn compares float32 products (bf16 is oneDNN's either way): --precision fp32")
    start(args)
    info, line = machine_header()
    print(line)
    parts = {
        "linear": _linears,
        "bias": lambda args: _bias_sums(args) + _linears(args),
        "casts": lambda args: [],
        "grid": _packed_layer,
        "lookup": _tied_pair,
        "onednn": lambda args: _linears(args) + _tied_pair(args),
        "pad": _tied_pair,
    }
    rows = parts.get(args.change, _layer)(args)
    if args.change == "fused":
        rows += _layer(args, seq_len=128, batch=args.short_batch)
        rows += _layer(args, backward=False)
    if not args.no_step:
        rows += _update(args) if args.change == "casts" else _step(args)
    if not args.no_finetune:
        rows += _finetune(args)
    write_json(args.json, info, rows=rows, args=vars(args))


def _strided(qkv, n_head: int, dropout: float):
    """The former bf16 route: split views, one (B·H, T, d) copy each, _BlockedAttention, the output transposed."""
    import torch

    from gptcli.model.kernels import attention as kernel

    B, T, C3 = qkv.shape
    C, hd = C3 // 3, C3 // 3 // n_head
    q, k, v = (x.view(B, T, n_head, hd).transpose(1, 2).reshape(B * n_head, T, hd) for x in qkv.split(C, dim=2))
    blocks = max(1, T // kernel.CHUNK_ROWS) if kernel.attention_path("cpu", q.dtype, dropout, T) == "chunked" else 1
    bounds = tuple(T * i // blocks for i in range(blocks + 1))
    with torch.autocast("cpu", enabled=False):
        y = kernel._BlockedAttention.apply(q, k, v, kernel._causal_bias(T, q.device, q.dtype), dropout, bounds)
    return y.view(B, n_head, T, hd).transpose(1, 2).contiguous().view(B, T, C)


@contextlib.contextmanager
def variant(change: str, name: str):
    """The model computing as ``name`` of ``change`` (module docstring) inside the block."""
    import torch

    import gptcli.model.packed as packed
    from gptcli.model import kernels
    from gptcli.model.kernels import attention as kernel
    from gptcli.model.kernels import cpu, layers, linear, tied, tied_lookup

    grids = packed._ToGrid, packed._FromGrid
    if name == "heads":
        packed._ToGrid, packed._FromGrid = _heads_grid()
    saved = layers.WrittenOutAttention.fused, kernel.STRIDED_DTYPES, kernel.COMPILED_SOFTMAX, kernel.FUSED_DTYPES
    positions, shared_weight_casts = linear.MIN_POSITIONS, kernels.shared_weight_casts
    links, sums, dnn = tied_lookup.applies, linear.column_sums, cpu._onednn_forced
    pads = tied.padding_is_faster
    if name in ("mkl", "onednn"):
        kernels.force_onednn_fp32(name == "onednn")
    elif name == "plain":  # the rule before: no bf16 autocast padding without AMX (under PAD_MIN_POSITIONS and in
        # fine-tuning's per-token loss)
        tied.padding_is_faster = lambda h, w, training=False: (
            pads(h, w, training) and (kernels.amx() or not torch.is_autocast_enabled("cpu"))
        )
    elif name == "bf16-sum":
        linear.column_sums = lambda g: g.sum(0)
    elif name == "dense":
        tied_lookup.applies = lambda weight: False
    elif name == "each":
        kernels.shared_weight_casts = lambda device: contextlib.nullcontext()
    elif name == "autocast":
        linear.MIN_POSITIONS = 1 << 62
    elif name == "chunked":
        kernel.FUSED_DTYPES = ()
    elif name == "strided":
        layers.WrittenOutAttention.fused = lambda self, qkv, n_head, dropout=0.0: _strided(qkv, n_head, dropout)
        kernel.STRIDED_DTYPES = (*kernel.STRIDED_DTYPES, torch.bfloat16)  # packed rows' grid (fine-tuning)
    elif name == "pytorch":
        kernel.COMPILED_SOFTMAX = False
    try:
        yield
    finally:
        layers.WrittenOutAttention.fused, kernel.STRIDED_DTYPES, kernel.COMPILED_SOFTMAX, kernel.FUSED_DTYPES = saved
        linear.MIN_POSITIONS, kernels.shared_weight_casts = positions, shared_weight_casts
        packed._ToGrid, packed._FromGrid = grids
        tied_lookup.applies, linear.column_sums = links, sums
        kernels.force_onednn_fp32(dnn)
        tied.padding_is_faster = pads


def _heads_grid():
    """The grid's former gathers (before the whole-row ones of ``packed.py``): q, k and v gathered per head into a
    contiguous (3, G, H, W, hd) grid by advanced indexing, and back per head; same arguments as the new ones."""
    import torch

    class HeadsToGrid(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cells, back):
            W, H = cells.size(1), x.size(2)
            ctx.save_for_backward(back // W, back % W)
            which = torch.arange(3).view(-1, 1, 1, 1)
            return x[cells.view(1, cells.size(0), 1, -1), which, torch.arange(H).view(1, 1, H, 1)]

        @staticmethod
        def backward(ctx, grad):
            group, slot = ctx.saved_tensors
            parts, heads = torch.arange(3).view(1, 3, 1), torch.arange(grad.size(2)).view(1, 1, -1)
            return grad[parts, group.view(-1, 1, 1), heads, slot.view(-1, 1, 1)], None, None

    class HeadsFromGrid(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y, back):
            W = y.size(2)
            ctx.save_for_backward(back // W, back % W)
            ctx.shape = y.shape
            return y[back // W, :, back % W]

        @staticmethod
        def backward(ctx, grad):
            group, slot = ctx.saved_tensors
            out = grad.new_zeros(ctx.shape)
            out[group, :, slot] = grad
            return out, None

    return HeadsToGrid, HeadsFromGrid


def _packed_layer(args) -> list[dict]:
    """One attention layer of a packed row (16 sequences of 40-250 tokens, seeded), forward + backward with the
    paper's attention dropout, through ``packed.segment_attention``; outputs checked equal without dropout."""
    import torch

    from gptcli.model.packed import Packing, segment_attention

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(40, 251, (16,), generator=g).tolist()
    N = sum(lengths)
    qkv = torch.randn(1, N, 3 * 768, generator=g).to(_dtype(args))
    upstream = torch.randn(1, N, 768, generator=g).to(_dtype(args))

    def run(_: int = 0, p: float = 0.1):
        x = qkv.detach().requires_grad_()
        y = segment_attention(x, 12, p, Packing.of([[0] * n for n in lengths]))
        y.backward(upstream)
        return y, x.grad

    outs = {}
    for name in VARIANTS[args.change]:
        with variant(args.change, name):
            outs[name] = run(p=0.0)
    (y0, g0), (y1, g1) = outs.values()
    if not (torch.equal(y0, y1) and torch.equal(g0, g1)):
        raise SystemExit("error: the two grids' outputs differ (run tests/model/test_packed.py)")
    print(
        f"\none attention layer of a packed row, {args.precision}, {N} tokens in 16 sequences of "
        f"{min(lengths)}-{max(lengths)}, 12 heads, dropout 0.1, forward + backward (equal without dropout)"
    )
    return _report(args, "packed", _timed_rounds(args, run))


def _bias_sums(args) -> list[dict]:
    """A block's four bias gradients alone, from ``--precision`` output gradients of ``--batch`` × ``--seq-len``
    positions at GPT-1's widths, as ``_AmxLinear``'s and ``_Fp32Linear``'s backward take them
    (``kernels.linear.column_sums``)."""
    import torch

    from gptcli.model.kernels import linear

    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(args.batch * args.seq_len, n, generator=g).to(_dtype(args)) for n in (2304, 768, 3072, 768)]

    def run(_: int) -> None:
        for x in grads:
            linear.column_sums(x)

    print(
        f"\na block's four bias gradients (widths 2,304, 768, 3,072, 768), {args.batch * args.seq_len} positions, "
        f"{args.precision}"
    )
    return _report(args, "sums", _timed_rounds(args, run))


def _tied_pair(args) -> list[dict]:
    """GPT-1's token lookup straight into its tied output layer and the training loss (``lm_nll``), forward +
    backward, ``--batch`` × ``--seq-len`` tokens; the embedding's gradient checked equal within fp32 rounding."""
    import torch

    import gptcli.model.gpt as gpt
    from gptcli.model.kernels import apply

    torch.manual_seed(0)
    model = apply(gpt.GPT(gpt.preset("gpt1")).train(), "cpu")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq_len + 1), generator=g)
    weight = model.tok_emb.weight

    def run(_: int = 0):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model.lm_nll(model.embed_tokens(ids[:, :-1]), ids[:, 1:])
        loss.backward()
        grad, weight.grad = weight.grad, None
        return grad

    grads = {}
    for name in VARIANTS[args.change]:
        with variant(args.change, name):
            grads[name] = run()
    before, after = VARIANTS[args.change]
    rel = ((grads[after] - grads[before]).norm() / grads[before].norm()).item()
    print(
        f"\nthe tied pair, {args.precision}: lookup of {args.batch}×{args.seq_len} tokens, output layer and loss, "
        f"forward + backward; the embedding's gradient within {rel:.1e} (relative)"
    )
    return _report(args, "tied", _timed_rounds(args, run))


def _dtype(args):
    import torch

    return torch.bfloat16 if args.precision == "bf16" else torch.float32


def _report(args, part: str, times: dict) -> list[dict]:
    before, after = VARIANTS[args.change]
    base = statistics.median(times[after])
    rows = []
    for name in (before, after):
        ms = statistics.median(times[name]) * 1e3
        rows.append(
            {
                "change": args.change,
                "precision": args.precision,
                "part": part,
                "variant": name,
                "ms": ms,
                "steps_s": times[name],
                "vs_after": ms / (base * 1e3),
            }
        )
        print(f"  {part:6s} {name:9s} {ms:9.1f} ms  {ms / (base * 1e3):5.3f}× {after}")
    return rows


def _timed_rounds(args, run, items: int = 1) -> dict:
    """Seconds per round of each variant: ``run(i)`` for every item ``i``, round-robin item by item."""

    def timed(name: str, i: int) -> float:
        with variant(args.change, name):
            t0 = time.perf_counter()
            run(i)
            return time.perf_counter() - t0

    names = VARIANTS[args.change]
    times = round_robin(timed, [(n, i) for i in range(items) for n in names], args.steps, settle=1)
    return {n: [sum(times[(n, i)][r] for i in range(items)) for r in range(args.steps)] for n in names}


def _layer(args, seq_len: int | None = None, batch: int | None = None, backward: bool = True) -> list[dict]:
    """One attention layer forward + backward with dropout 0.1 (training), or (``backward=False``) its forward
    without dropout under no_grad (evaluation)."""
    import torch

    from gptcli.model.attention import SDPAttention
    from gptcli.model.kernels.layers import WrittenOutAttention

    attention = WrittenOutAttention(SDPAttention())  # the model's attention with the kernels applied
    seq_len, batch = seq_len or args.seq_len, batch or args.batch
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(batch, seq_len, 3 * 768, generator=g).to(_dtype(args))
    upstream = torch.randn(batch, seq_len, 768, generator=g).to(_dtype(args))

    def run(_: int = 0, p: float = 0.1):
        if not backward:
            with torch.no_grad():
                return attention.fused(qkv, 12, 0.0), None
        x = qkv.detach().requires_grad_()
        y = attention.fused(x, 12, p)
        y.backward(upstream)
        return y, x.grad

    outs = {}
    for name in VARIANTS[args.change]:
        torch.manual_seed(1)
        with variant(args.change, name):
            # The fused path draws another mask than the written-out blocks (same law): it is checked without.
            outs[name] = run(p=0.0 if args.change == "fused" else 0.1)
    (y0, g0), (y1, g1) = outs.values()
    if args.change == "layout" and not torch.equal(y0, y1):
        raise SystemExit("error: the two layouts' outputs differ (run tests/model/test_attention.py)")
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    part = "layer" if backward else "eval"
    if seq_len != args.seq_len:
        part += f"@{seq_len}"
    checked = " (checked without dropout)" if args.change == "fused" and backward else ""
    grads = f", gradients within {rel(g1, g0):.1e}" if backward else ""
    print(
        f"\none attention layer, {args.precision}, {batch}×{seq_len}, 12 heads, "
        f"{'dropout 0.1, forward + backward' if backward else 'no dropout, forward only'}: outputs within "
        f"{rel(y1, y0):.1e}{grads} (relative){checked}"
    )
    return _report(args, part, _timed_rounds(args, run))


def _linears(args) -> list[dict]:
    import torch

    import gptcli.model.gpt as gpt
    from gptcli.model.kernels import apply

    torch.manual_seed(0)
    config = gpt.preset("gpt1")
    block = apply(gpt.Block(config).train(), "cpu")
    layers = [block.attn.qkv, block.attn.proj, block.mlp.fc, block.mlp.proj]
    xs = [torch.randn(args.batch, args.seq_len, m.in_features, requires_grad=True) for m in layers]
    gs = [torch.randn(args.batch, args.seq_len, m.out_features, dtype=_dtype(args)) for m in layers]
    bf16 = args.precision == "bf16"

    def run(_: int) -> None:
        for m, x, g in zip(layers, xs, gs):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                y = m(x)
            y.backward(g)
        block.zero_grad(set_to_none=True)

    print(
        f"\na block's four linear layers, {'bf16 autocast' if bf16 else 'fp32'}, {args.batch}×{args.seq_len}, "
        "forward + backward"
    )
    return _report(args, "linears", _timed_rounds(args, run))


def _step(args) -> list[dict]:
    import torch

    import gptcli.model.gpt as gpt
    from gptcli.model.kernels import apply

    torch.manual_seed(0)
    model = apply(gpt.GPT(gpt.preset("gpt1")).train(), "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01, fused=True)
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, model.config.vocab_size, (args.batch, args.seq_len + 1), generator=g)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def run(_: int) -> None:
        with autocast:
            loss = model.lm_loss(batch[:, :-1], batch[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    print(f"\ngpt1 {args.precision} pretraining step, {args.batch}×{args.seq_len}, fused AdamW, {args.steps} steps")
    return _report(args, "step", _timed_rounds(args, run))


def _update(args) -> list[dict]:
    """A gpt1 pretraining update of ``--micro-batches`` micro-batches through ``Trainer.step`` (as ``gpt1
    pretrain --micro-batch-size`` accumulates), fused AdamW, gradient clipping."""
    import torch

    import gptcli.model.gpt as gpt
    from gptcli.model.kernels import apply
    from gptcli.train.optim import make_optimizer
    from gptcli.train.trainer import Trainer

    torch.manual_seed(0)
    model = apply(gpt.GPT(gpt.preset("gpt1")).train(), "cpu")
    trainer = Trainer(
        model,
        make_optimizer(model, lr=1e-5),
        lambda m, b: m.lm_loss(b[:, :-1], b[:, 1:]),
        lambda s: 1e-5,
        device=torch.device("cpu"),
        precision=args.precision,
        grad_clip=1.0,
    )
    g = torch.Generator().manual_seed(1)
    batches = list(
        torch.randint(0, model.config.vocab_size, (args.micro_batches, args.batch, args.seq_len + 1), generator=g)
    )
    print(
        f"\ngpt1 {args.precision} pretraining update, {args.micro_batches} micro-batches of "
        f"{args.batch}×{args.seq_len}, {args.steps} rounds"
    )
    with _timed_casts() as casts:
        rows = _report(args, "pretrain", _timed_rounds(args, lambda _: trainer.step(1, batches).read()))
    for row in rows:  # the casts themselves: what the change removes, free of the update's own spread
        spent = casts[row["variant"]][1:]  # after the warm-up
        row["casts_ms"] = statistics.median(spent) * 1e3
        print(f"  casts  {row['variant']:9s} {row['casts_ms']:9.1f} ms per update (the AMX forms' weight casts)")
    return rows


@contextlib.contextmanager
def _timed_casts():
    """Seconds spent in the AMX forms' weight casts (``kernels.linear._bf16``, ``kernels.tied._padded_copy``) per
    ``Trainer.step``, listed by the ``casts`` variant it ran under."""
    from gptcli.model import kernels
    from gptcli.model.kernels import linear, tied
    from gptcli.train.trainer import Trainer

    spent: dict[str, list[float]] = {"each": [], "shared": []}
    saved = linear._bf16, tied._padded_copy, Trainer.step

    def timed(make):
        def cast(*args):
            t0 = time.perf_counter()
            out = make(*args)
            spent[current][-1] += time.perf_counter() - t0
            return out

        return cast

    def step(self, *args, **kwargs):
        nonlocal current
        current = "shared" if kernels.shared_weight_casts is saved_region else "each"
        spent[current].append(0.0)
        return saved[2](self, *args, **kwargs)

    current, saved_region = "shared", kernels.shared_weight_casts
    linear._bf16, tied._padded_copy, Trainer.step = timed(saved[0]), timed(saved[1]), step
    try:
        yield spent
    finally:
        linear._bf16, tied._padded_copy, Trainer.step = saved


def _finetune(args) -> list[dict]:
    import os
    from pathlib import Path

    import torch
    from finetune_throughput import LM_WEIGHT, build_models, real_batches

    from gptcli.tokenizers.openai import OpenAIBPETokenizer
    from gptcli.train.finetune_loss import TaskLoss
    from gptcli.train.optim import make_optimizer
    from gptcli.train.trainer import Trainer

    shared = Path(os.environ.get("GPT1_SHARED", Path(__file__).resolve().parents[2] / "shared"))
    tok = OpenAIBPETokenizer.from_dir(shared / "data" / "openai-gpt-bpe")
    opts = argparse.Namespace(
        batch=32,
        batches=args.finetune_batches,
        micro_batch=args.finetune_micro_batch or None,
        n_ctx=512,
        size=args.finetune_size,
    )
    task, _, packed, _ = real_batches(args.finetune_shape, "random", opts, tok)
    model = build_models(task, opts, tok)[0]
    trainer = Trainer(
        model,
        make_optimizer(model, lr=6.25e-5),
        TaskLoss(LM_WEIGHT),
        lambda s: 6.25e-5,
        device=torch.device("cpu"),
        precision=args.precision,
        grad_clip=1.0,
    )
    micro = f", micro-batches of {args.finetune_micro_batch}" if args.finetune_micro_batch else ""
    print(
        f"\n{args.finetune_size} {args.precision} fine-tuning updates, {args.finetune_shape} random batches of 32"
        f"{micro}, packed, {len(packed)} batches × {args.steps} rounds"
    )
    return _report(args, "update", _timed_rounds(args, lambda i: trainer.step(1, packed[i]).read(), len(packed)))


if __name__ == "__main__":
    main()
