"""Fine-tuning throughput: our fine-tuning update vs ``transformers.OpenAIGPTDoubleHeadsModel``, same process.

One timed "update" is what ``gpt1 finetune`` does per batch: forward, task loss + λ·LM loss (λ = 0.5, paper §3.2),
backward, global-norm clipping at 1.0 and a fused-AdamW step, in train mode with the paper's dropouts. Ours runs
through the fine-tuner's own pieces (``FinetuneModel``, ``TaskLoss``, ``make_optimizer``, ``Trainer``); Hugging
Face's ``OpenAIGPTDoubleHeadsModel`` gets the same weights and the same ``Trainer`` with a loss function that
calls it the way its documentation does (``mc_loss + λ·loss``, LM labels -100 on padding).

Two shapes, built from real data in ``$GPT1_SHARED/data`` with the original BPE (no pretrained weights needed:
speed does not depend on the values):

- RTE (entailment): one sequence per example ``<s> premise $ hypothesis <e>``, 2 classes. HF's double-heads model
  has a 1-output multiple-choice head; for this shape its summary layer is swapped for a 2-output ``W_y`` and each
  example is one "choice" holding 2 logits, so both models compute the same thing.
- Story Cloze (multiple choice): two sequences per example, one per ending; softmax over the 2 endings.
- RACE (multiple choice, ``race``, not in the default ``--shapes``): four answers behind a long passage and a
  question. RACE has no real file here: a RACE-shaped set is written in RACE's official layout from real English
  text (``benchmarks/_race_shaped.py``, the RACE paper's average lengths).

Batches are the fine-tuner's own, drawn with a fixed seed in each order of ``--batchings`` (default both):
``random`` (the paper's i.i.d. batches, the fine-tuner's default) and ``length`` (length-bucketed, ``--batching
length``), ``--batch`` examples (default 32, the paper's), split into micro-batches of ``--micro-batch`` examples with
gradient accumulation as ``gpt1 finetune --micro-batch-size`` does — the same split on every side (at the paper's
size Hugging Face's full-vocabulary logits of a whole batch of 32 do not fit a 24 GB machine). Three variants run
the same examples: ours **packed** (the default layout: every micro-batch's sequences end to end, no padding
computed by the linear layers, ``gptcli/model/packed.py``), ours **padded** (the reference layout) and HF (padded,
as its API takes them), and for multiple-choice shapes ours **shared** (``--layout shared``: each example's common
prefix once, every answer attending to it; the same losses, the answers sharing the prefix's dropout masks), each
at every precision, round-robin batch by batch so that noise on a shared machine hits
all alike, each timed update after ``--settle`` untimed ones of the same variant (default 1: the first update after
another variant's re-faults the memory that one freed and reshaped, and would time the allocator); each batch is
timed ``--repeats`` times. Printed with each order: the fraction of the positions each side
computes that are padding — HF and ours-padded in every layer; ours packed in none of the linear layers, only in the
attention grid (its share of grid cells is printed). Reported: examples/s from each batch's best time (the least
disturbed by other processes) and from its median, and the ratio ours/HF at each precision. ``--profile`` prints a
torch.profiler table of one update each (``--profile-shapes``: also its matrix products by operand shapes, each
with its GFLOP/s). ``--variants`` times fewer of them (ours is always timed): every variant's
model and batches stay in the one process, and for RACE-shaped batches all four exceed 24 GB.

    python benchmarks/finetune_throughput.py                          # tiny body (4×256), both shapes and orders
    python benchmarks/finetune_throughput.py --size gpt1 --micro-batch 16 --batches 2 --repeats 1   # the paper's
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from _machine import (
    cpu_model,
    use_large_allocator_thresholds,
)  # benchmarks/_machine.py (run as `python benchmarks/finetune_throughput.py`)

LM_WEIGHT = 0.5
VARIANTS = ("ours", "ours-shared", "ours-padded", "hf")
"""What can be timed: ours packed, ours shared (multiple choice only), ours padded, Hugging Face."""
SHAPES = {
    "rte": ("rte", "glue/RTE", "dev"),
    "storycloze": ("storycloze", "storycloze", "val"),
    "race": ("race", "RACE", "dev"),
}
RACE_QUESTIONS = 400
"""Questions of the RACE-shaped set written for ``race`` (enough for several batches of 32 in either order)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="tiny", help="model preset: tiny (4×256, default) or gpt1 (the paper's 12×768)")
    ap.add_argument(
        "--shapes", default="rte,storycloze", help="comma-separated: rte, storycloze, race (RACE-shaped, see above)"
    )
    ap.add_argument("--batch", type=int, default=32, help="examples per update (paper: 32)")
    ap.add_argument(
        "--batchings",
        default="random,length",
        help="comma-separated batch orders: random (the paper's), length (length-bucketed)",
    )
    ap.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="examples per forward/backward, accumulated up to --batch (default: the whole batch)",
    )
    ap.add_argument("--batches", type=int, default=4, help="timed updates per variant per repeat")
    ap.add_argument("--repeats", type=int, default=3, help="passes over the batches; the median is reported")
    ap.add_argument(
        "--settle",
        type=int,
        default=1,
        help="untimed updates of the same variant before each timed one (the first update after another "
        "variant's re-faults the memory that one freed: it times the allocator, not the update)",
    )
    ap.add_argument("--n-ctx", type=int, default=512, help="context length (longer inputs are truncated)")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16 (CPU autocast)")
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated, of " + ", ".join(VARIANTS) + " (ours is always timed: every ratio is to "
        "it or to HF). Fewer variants, less memory: RACE-shaped batches with all of them "
        "exceed 24 GB",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    ap.add_argument("--profile", action="store_true", help="also print a torch.profiler table of one update each")
    ap.add_argument("--profile-rows", type=int, default=12, help="(--profile) operations listed per table")
    ap.add_argument(
        "--profile-shapes",
        action="store_true",
        help="(--profile) also list the matrix products by their operands' shapes (the slow shapes)",
    )
    ap.add_argument("--default-malloc", action="store_true", help="do not set GLIBC_TUNABLES")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        ap.error(f"--variants: unknown {', '.join(sorted(unknown))} (choose from {', '.join(VARIANTS)})")

    use_large_allocator_thresholds(args.default_malloc)

    import torch

    from gptcli.system.runtime import measure_cpu_peak

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    print(
        f"{cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(default)')}, load average {os.getloadavg()[0]:.2f}"
    )
    peak = {p: measure_cpu_peak(p, n=2048, seconds=2.0) for p in ("fp32", "bf16")}
    print(f"measured matmul peak: fp32 {peak['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peak['bf16'] / 1e9:.0f} GFLOP/s")
    results = [
        r
        for shape in args.shapes.split(",")
        for batching in args.batchings.split(",")
        for r in bench_shape(shape, batching, args)
    ]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "cpu": cpu_model(),
                    "peak": peak,
                    "threads": torch.get_num_threads(),
                    "args": vars(args),
                    "load_average_end": os.getloadavg(),
                    "results": results,
                },
                f,
                indent=1,
            )


def real_batches(shape: str, batching: str, args: argparse.Namespace, tok) -> tuple[object, list, list, list | None]:
    """The task and ``args.batches`` training batches of it as the fine-tuner draws them in order ``batching``
    (fixed seed), each as its list of micro-batches: padded, packed and (multiple choice only, else None)
    shared-prefix layouts of the same examples."""
    from gptcli.data.batching import collate, collate_packed, collate_shared, train_batches
    from gptcli.data.transforms import encode_examples
    from gptcli.tasks.registry import get_task

    name, sub, split = SHAPES[shape]
    shared = Path(os.environ.get("GPT1_SHARED", Path(__file__).resolve().parents[2] / "shared"))
    task = get_task(name)
    folder = shared / "data" / sub
    if shape == "race":
        from _race_shaped import write_race_shaped  # benchmarks/_race_shaped.py

        folder = write_race_shaped(
            Path(tempfile.mkdtemp(prefix="race-shaped-")), shared / "data" / "books", RACE_QUESTIONS
        )
    examples = task.read(split, folder)
    enc = encode_examples(task, examples, tok, args.n_ctx)
    order = train_batches([e.length for e in enc], args.batch, batching, random.Random(0))
    order = [idx for idx in order if len(idx) == args.batch][: args.batches]
    micro = args.micro_batch or args.batch
    parts = [[idx[j : j + micro] for j in range(0, len(idx), micro)] for idx in order]
    padded = [[collate([enc[i] for i in mb]) for mb in p] for p in parts]
    packed = [[collate_packed([enc[i] for i in mb], tok.extract_id) for mb in p] for p in parts]
    prefixed = None
    if task.kind == "multiple_choice":
        prefixed = [[collate_shared([enc[i] for i in mb], tok.extract_id) for mb in p] for p in parts]
    return task, padded, packed, prefixed


def build_models(task, args: argparse.Namespace, tok):
    """Our FinetuneModel and HF's double-heads model with the same body, head and LM weights."""
    import torch
    import transformers

    from gptcli.interop.hf import config_to_hf, state_dict_to_hf
    from gptcli.model.classifier import FinetuneModel
    from gptcli.model.gpt import GPT, preset
    from gptcli.model.heads import HeadConfig, TaskHead

    cfg = preset(args.size, vocab_size=tok.vocab_size, n_special=3)
    torch.manual_seed(0)
    head_cfg = HeadConfig(
        kind=task.kind, n_embd=cfg.n_embd, n_labels=max(1, len(task.labels)), extract_id=tok.extract_id
    )
    ours = FinetuneModel(GPT(cfg), TaskHead(head_cfg))
    hf_cfg = transformers.OpenAIGPTConfig(
        **{k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")},
        summary_first_dropout=head_cfg.pdrop,
    )
    hf = transformers.OpenAIGPTDoubleHeadsModel(hf_cfg)
    sd = state_dict_to_hf(ours.gpt.state_dict(), cfg.n_layer)
    if head_cfg.n_out != 1:  # entailment: each example is one "choice" scored by an n-class W_y
        hf.multiple_choice_head.summary = torch.nn.Linear(cfg.n_embd, head_cfg.n_out)
    sd["multiple_choice_head.summary.weight"] = ours.head.linear.weight
    sd["multiple_choice_head.summary.bias"] = ours.head.linear.bias
    missing, unexpected = hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    return ours, hf


def hf_loss(model, batch):
    """HF's fine-tuning loss as documented for the double-heads model: ``mc_loss + λ·lm_loss``."""
    import torch

    n = batch.ids.size(0) // batch.n_seqs
    ids = batch.ids.view(n, batch.n_seqs, -1)
    labels = ids.masked_fill(batch.mask.view_as(ids) == 0, -100)
    extract = (ids == model.config.extract_id).to(torch.int8).argmax(-1)
    out = model(input_ids=ids, mc_token_ids=extract, labels=labels, mc_labels=batch.labels)
    return out.mc_loss + LM_WEIGHT * out.loss


def bench_shape(shape: str, batching: str, args: argparse.Namespace) -> list[dict]:
    """Time every (implementation, precision) variant on one task shape and batch order, round-robin; print and
    return the rows."""
    import torch

    from gptcli.tokenizers.openai import OpenAIBPETokenizer
    from gptcli.train.finetune_job import TaskLoss
    from gptcli.train.optim import make_optimizer
    from gptcli.train.trainer import Trainer

    shared = Path(os.environ.get("GPT1_SHARED", Path(__file__).resolve().parents[2] / "shared"))
    tok = OpenAIBPETokenizer.from_dir(shared / "data" / "openai-gpt-bpe")
    task, batches, packed, prefixed = real_batches(shape, batching, args, tok)
    ours, hf = build_models(task, args, tok)
    hf.config.extract_id = tok.extract_id
    cpu = torch.device("cpu")
    precisions = args.precisions.split(",")
    trainers, inputs = {}, {"ours": packed, "ours-padded": batches, "hf": batches, "ours-shared": prefixed}
    chosen = {"ours", *args.variants.split(",")} - ({"ours-shared"} if prefixed is None else set())
    models = {
        "ours": (ours, TaskLoss),
        "ours-shared": (ours, TaskLoss),
        "ours-padded": (ours, TaskLoss),
        "hf": (hf, lambda _: hf_loss),
    }
    variants = [(name, models[name][0], models[name][1](LM_WEIGHT)) for name in VARIANTS if name in chosen]
    for name, m, loss in variants:
        opt = make_optimizer(m, lr=6.25e-5)
        for prec in precisions:  # one trainer per precision, sharing the model and optimizer
            trainers[(name, prec)] = Trainer(m, opt, loss, lambda s: 6.25e-5, device=cpu, precision=prec, grad_clip=1.0)
    for key, tr in trainers.items():  # warm-up
        tr.step(0, inputs[key[0]][0])
    # times[key][i]: seconds of batch i in each repeat. Under contention from other processes a batch's best time
    # is the least disturbed one, so "best" (sum over batches of each batch's minimum) is the headline figure;
    # the median is printed beside it.
    times: dict[tuple[str, str], list[list[float]]] = {k: [[] for _ in batches] for k in trainers}
    for _ in range(args.repeats):
        for i in range(len(batches)):
            for key, tr in trainers.items():
                for _ in range(args.settle):
                    tr.step(1, inputs[key[0]][i]).read()
                t0 = time.perf_counter()
                tr.step(1, inputs[key[0]][i]).read()  # the read: the update is done when the clock stops
                times[key][i].append(time.perf_counter() - t0)
    n_ex = len(batches) * args.batch
    rate = {
        k: {"best": n_ex / sum(min(t) for t in ts), "median": n_ex / sum(statistics.median(t) for t in ts)}
        for k, ts in times.items()
    }
    pads, grid_pads, seqs, length = pad_fractions(batches, packed)
    micro = f", micro-batches of {args.micro_batch}" if args.micro_batch else ""
    print(
        f"\n{shape} ({task.kind}, {batches[0][0].n_seqs} sequence(s)/example), {args.size} "
        f"{ours.gpt.num_params() / 1e6:.1f}M params: {len(batches)} {batching} batches × {args.batch} examples{micro}, "
        f"{seqs} sequences, padded length {length:.0f}; pad positions computed: HF and ours-padded {100 * pads:.0f}%, "
        f"ours (packed) 0% in the linear layers, {100 * grid_pads:.0f}% of the attention grid; {args.repeats} repeats"
    )
    results = []
    if "ours-shared" in chosen:
        rows = sum(mb.packing.tokens for b in prefixed for mb in b) / sum(mb.packing.tokens for b in packed for mb in b)
        print(
            f"  ours-shared (--layout shared): each example's common prefix once, {100 * rows:.0f}% of the packed "
            f"row's tokens"
        )
    for prec in precisions:
        results.append(
            report_precision(
                prec,
                {k[0]: v for k, v in rate.items() if k[1] == prec},
                {k[0]: v for k, v in times.items() if k[1] == prec},
            )
        )
        results[-1].update(
            {
                "shape": shape,
                "batching": batching,
                "batch": args.batch,
                "micro_batch": args.micro_batch,
                "size": args.size,
                "pad_fraction_hf": pads,
                "pad_fraction_ours_linear": 0.0,
                "pad_fraction_ours_attention_grid": grid_pads,
            }
        )
        if "ours-shared" in chosen:
            results[-1]["shared_row_token_fraction"] = rows
    if args.profile:
        profile(trainers, {k: v[0] for k, v in inputs.items() if v is not None}, args.profile_rows, args.profile_shapes)
    return results


def report_precision(prec: str, rate: dict, times: dict) -> dict:
    """Print one precision's line(s) for the variants that ran and return its JSON row (ours against HF when HF
    ran; shared against packed, and HF, when it ran)."""
    o, p, h, sh = (rate.get(k) for k in ("ours", "ours-padded", "hf", "ours-shared"))
    line = f"  {prec}: ours {o['best']:7.2f} ex/s"
    row = {"precision": prec, "ours_ex_per_s": o, "ours_times": times["ours"]}
    if p is not None:
        line += f"   ours-padded {p['best']:7.2f}"
        row["ours_padded_ex_per_s"] = p
    if h is not None:
        line += f"   HF {h['best']:7.2f}   ours/HF {o['best'] / h['best']:.2f}×"
        row.update(
            {
                "hf_ex_per_s": h,
                "hf_times": times["hf"],
                "ratio_best": o["best"] / h["best"],
                "ratio_median": o["median"] / h["median"],
            }
        )
        if p is not None:
            line += f"  padded/HF {p['best'] / h['best']:.2f}×"
            row["ratio_padded_best"] = p["best"] / h["best"]
        line += f"   (medians: ours/HF {o['median'] / h['median']:.2f}×)"
    print(line)
    if sh is not None:
        line = f"        ours-shared {sh['best']:7.2f} ex/s   shared/packed {sh['best'] / o['best']:.2f}×"
        row.update(
            {
                "ours_shared_ex_per_s": sh,
                "ours_shared_times": times["ours-shared"],
                "ratio_shared_packed_best": sh["best"] / o["best"],
                "ratio_shared_packed_median": sh["median"] / o["median"],
            }
        )
        if h is not None:
            line += f"  shared/HF {sh['best'] / h['best']:.2f}×"
            row["ratio_shared_hf_best"] = sh["best"] / h["best"]
        line += f"   (medians: shared/packed {sh['median'] / o['median']:.2f}×)"
        print(line)
    return row


def pad_fractions(padded: list, packed: list) -> tuple[float, float, int, float]:
    """(pad share of the padded layout's positions, pad share of the packed layout's attention grid cells,
    sequences, mean padded length), over every micro-batch."""
    cells = sum(len(mb.packing.lengths) * max(mb.packing.lengths) for b in packed for mb in b)
    real = sum(mb.packing.tokens for b in packed for mb in b)
    positions = sum(mb.ids.numel() for b in padded for mb in b)
    seqs = sum(mb.ids.size(0) for b in padded for mb in b)
    return 1 - real / positions, 1 - real / cells, seqs, positions / seqs


PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def profile(trainers: dict, first: dict, rows: int = 12, shapes: bool = False) -> None:
    """A torch.profiler table of one update of each variant (``rows`` operations by self time); with ``shapes``, its
    matrix products by operand shapes too, each with its GFLOP/s — where a product of an odd shape runs slow."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for key, tr in trainers.items():
        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as prof:
            tr.step(1, first[key[0]])
        print(f"\n--- profile: {key[0]} {key[1]} ---")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))
        if shapes:
            by_shape = [e for e in prof.key_averages(group_by_input_shape=True) if e.key in PRODUCTS]
            for e in sorted(by_shape, key=lambda e: -e.self_cpu_time_total)[:rows]:
                ms = e.self_cpu_time_total / 1e3
                rate = f"{_product_flops(e.key, e.input_shapes) * e.count / ms / 1e6:6.0f} GFLOP/s" if ms else ""
                print(f"  {e.key:14s} ×{e.count:<3d} {ms:8.1f} ms {rate}  {e.input_shapes}")


def _product_flops(op: str, shapes: list) -> float:
    """Multiply-adds × 2 of one call of product ``op`` whose recorded operand shapes are ``shapes`` (mm: [a, b] ×
    [b, c]; addmm and baddbmm: the added input first; bmm and baddbmm: batched)."""
    dims = [s for s in (shapes[1:] if op in ("aten::addmm", "aten::baddbmm") else shapes) if len(s) >= 2][:2]
    if len(dims) < 2:
        return 0.0
    (*batch, m, k), (_, n) = dims[0], dims[1][-2:]
    return 2.0 * m * k * n * (batch[0] if batch else 1)


if __name__ == "__main__":
    main()
