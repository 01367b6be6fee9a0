"""Throughput of `gpt1 eval --task`: examples/s of a fine-tuned classifier on SST-2 dev, RTE dev, Story Cloze val
and a RACE-shaped dev set, ours vs a plain Hugging Face loop, same process, same weights, same encoded examples.

- **ours**: the code ``gptcli.eval.tasks.evaluate_task`` runs between loading the checkpoint and writing the
  results: ``iterate(encoded, batch_size, shuffle=False, shared_extract=...)`` (length-sorted batches, packed with
  no padding and a multiple-choice example's shared context run once: ``--layout packed``, the default) into
  ``gptcli.model.classifier.predict`` (autocast at the chosen precision) on a ``FinetuneModel`` built as
  ``gpt1 finetune`` builds it (``HeadConfig(kind=task.kind, ...)``; random weights: speed does not depend on them).
- **ours-padded**: the same with ``--layout padded`` (dynamic padding, every answer with its own copy of the
  context), the reference the packed layout must equal.
- **today**: what ``gpt1 eval`` ran before the packed layout and its batched shared-prefix attention (commit
  bd50c94's ``--layout padded``, and the code of every release before): the padded batches through ``predict``'s
  loop as it was then, one autocast region per batch (bf16 casts every weight again for each batch). In fp32 it is
  ``ours-padded`` exactly. The evaluation target (``gpt1 eval`` ≥ 1.8× today's examples/s) is ``ours / today``.
- **HF**: ``transformers.OpenAIGPTDoubleHeadsModel`` with the same body and head weights (the correspondence
  tests/model/test_classifier_parity.py pins: for these one-sequence tasks the multiple-choice summary layer is
  swapped for the 2-output ``W_y``, each example one "choice"), driven as a user would write it: the encoded
  examples in dataset order, ``--batch-size`` at a time, right-padded to the batch's longest, ``mc_token_ids`` at
  the extract token, argmax of ``mc_logits``. No attention mask: padding sits after the extract token and
  attention is causal (the double-heads model cannot take a mask with its choice dimension anyway). The model
  also computes its LM logits at every position, as it always does.
- **HF lean** (``--no-hf-lean`` to skip): the strongest Hugging Face baseline, not what the plain loop does: the
  same model's body and multiple-choice head only (``hf.transformer`` → ``hf.multiple_choice_head``, no LM logits)
  on our length-sorted batches. It separates what the model code saves from what batching and skipping the LM
  logits save.

RACE has no real file here: ``race`` is a RACE-shaped set written in RACE's official layout from real English text
(``benchmarks/_race_shaped.py``: passage, question and option lengths from the RACE paper's averages).

Encoding (ftfy + spaCy + BPE, ``encode_examples``) is shared and timed once, outside the comparison. Variants run
round-robin (``--repeats`` passes; the best pass reported). Reported: examples/s, ours/today, ours/padded, ours/HF
at each precision, how often ours and HF predict the same label (same weights → same decisions up to rounding on
near-ties), and the largest difference between ours' and the padded reference's head outputs.

    python benchmarks/eval_throughput.py --presets tiny,gpt1 --tasks storycloze,race --no-hf --json eval.json
    python benchmarks/eval_throughput.py --presets tiny --tasks rte --limit 16 --repeats 1     # a quick check
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from _machine import best_of, machine_header, write_json  # benchmarks/_machine.py (run as `python benchmarks/...`)

SHARED = Path(os.environ.get("GPT1_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data"
SPLITS = {"sst2": "dev", "rte": "dev", "storycloze": "val", "race": "dev"}


def build_models(task, size: str, tok):
    """Our FinetuneModel (built as ``gpt1 finetune`` builds it) and HF's double-heads model with its weights."""
    import transformers

    from gptcli.interop.hf import config_to_hf, state_dict_to_hf
    from gptcli.model.classifier import FinetuneModel
    from gptcli.model.gpt import GPT, preset
    from gptcli.model.heads import HeadConfig, TaskHead

    cfg = preset(size, vocab_size=tok.vocab_size, n_special=3)
    torch.manual_seed(0)
    head_cfg = HeadConfig(
        kind=task.kind,
        n_embd=cfg.n_embd,
        n_labels=max(1, len(task.labels)),
        extract_id=tok.extract_id,
        init_std=cfg.init_std,
    )
    ours = FinetuneModel(GPT(cfg), TaskHead(head_cfg)).eval()
    hf_cfg = transformers.OpenAIGPTConfig(
        **{k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")}
    )
    hf = transformers.OpenAIGPTDoubleHeadsModel(hf_cfg)
    if head_cfg.n_out != 1:  # one "choice" per example, scored by an n-class W_y
        hf.multiple_choice_head.summary = torch.nn.Linear(cfg.n_embd, head_cfg.n_out)
    sd = state_dict_to_hf(ours.gpt.state_dict(), cfg.n_layer)
    sd["multiple_choice_head.summary.weight"] = ours.head.linear.weight
    sd["multiple_choice_head.summary.bias"] = ours.head.linear.bias
    missing, unexpected = hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    return ours, hf.eval()


def ours_predict(model, enc, batch_size: int, precision: str, regression: bool, packed: bool = True) -> list:
    """``gpt1 eval``'s scoring: length-sorted batches into ``predict`` (predictions back in example order)."""
    from gptcli.data.batching import iterate
    from gptcli.model.classifier import predict

    shared = model.head.config.extract_id if packed else None
    batches = iterate(enc, batch_size, shuffle=False, regression=regression, shared_extract=shared)
    preds, outs = predict(model, batches, torch.device("cpu"), precision)
    OUTPUTS[(packed, precision)] = outs
    return preds


OUTPUTS: dict = {}
"""(packed?, precision) → the head outputs of ours' latest pass, to compare the layouts."""


@torch.no_grad()
def today_predict(model, enc, batch_size: int, precision: str, regression: bool) -> list:
    """``gpt1 eval`` before the packed layout (bd50c94 ``--layout padded``): padded batches, and ``predict``'s loop
    as it was, with one autocast region per batch."""
    from gptcli.data.batching import iterate
    from gptcli.system.runtime import autocast

    device = torch.device("cpu")
    model.eval()
    preds = {}
    for batch in iterate(enc, batch_size, shuffle=False, regression=regression):
        b = batch.to(device)
        with autocast(device, precision):
            out, _ = model(b.ids, b.n_seqs, b.packing)
        p = model.head.predict(out).cpu().tolist()
        o = out.float().cpu()
        o = o.unsqueeze(-1) if o.dim() == 1 else o
        for k, idx in enumerate(batch.index.tolist()):
            preds[idx] = (p[k], [round(v, 6) for v in o[k].tolist()])
    return [preds[i][0] for i in sorted(preds)]


@torch.no_grad()
def hf_predict(hf, groups: list[list[list[int]]], precision: str, lean: bool = False) -> list[int]:
    """The plain loop: each group is one batch of examples, each example a list of sequences. ``lean``: the body
    and the classifier head only, without the LM logits the double-heads model always computes."""
    preds: list[int] = []
    for group in groups:
        n_seqs = len(group[0])
        rows = [s for ex in group for s in ex]
        lengths = torch.tensor([len(r) for r in rows])
        ids = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
        for k, r in enumerate(rows):
            ids[k, : len(r)] = torch.tensor(r)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            x, where = ids.view(len(group), n_seqs, -1), (lengths - 1).view(len(group), n_seqs)
            if lean:
                hidden = hf.transformer(x).last_hidden_state
                logits = hf.multiple_choice_head(hidden, where).squeeze(-1).float()
            else:
                logits = hf(input_ids=x, mc_token_ids=where).mc_logits.float()
        # One sequence with an n-class W_y: (B, 1, n) → class; several choices with one score each: (B, S) → choice.
        preds.extend((logits[:, 0] if logits.dim() == 3 else logits).argmax(-1).tolist())
    return preds


def dataset_order(enc, batch_size: int) -> list[list[list[int]]]:
    return [[e.seqs for e in enc[i : i + batch_size]] for i in range(0, len(enc), batch_size)]


def sorted_batches(enc, batch_size: int) -> tuple[list[list[list[int]]], list[int]]:
    """Our batches (``iterate``'s order) as plain lists, and the example index of each position."""
    from gptcli.data.batching import iterate

    groups, order = [], []
    for b in iterate(enc, batch_size, shuffle=False):
        idx = b.index.tolist()
        groups.append([enc[i].seqs for i in idx])
        order.extend(idx)
    return groups, order


def bench(size: str, task_name: str, tok, args: argparse.Namespace) -> dict:
    """Every (implementation, precision) variant on one preset and task, round-robin; print and return a block."""
    from gptcli.data.transforms import encode_examples
    from gptcli.tasks import get_task

    task = get_task(task_name)
    folder = SHARED / "glue" / task.folder if (SHARED / "glue" / task.folder).is_dir() else SHARED / task.folder
    if task_name == "race":
        from _race_shaped import write_race_shaped  # benchmarks/_race_shaped.py

        folder = write_race_shaped(Path(tempfile.mkdtemp(prefix="race-shaped-")), SHARED / "books", args.limit or 500)
    examples = task.read(SPLITS[task_name], folder)[: args.limit]
    ours, hf = build_models(task, size, tok)
    n_ctx = ours.gpt.config.n_ctx
    t0 = time.perf_counter()
    enc = encode_examples(task, examples, tok, n_ctx)
    encode_s = time.perf_counter() - t0
    plain = dataset_order(enc, args.batch_size)
    sorted_groups, order = sorted_batches(enc, args.batch_size)
    regression = task.kind == "regression"

    def run(impl: str, prec: str) -> list:
        if impl in ("ours", "ours-padded"):
            return ours_predict(ours, enc, args.batch_size, prec, regression, packed=impl == "ours")
        if impl == "today":
            return today_predict(ours, enc, args.batch_size, prec, regression)
        if impl == "hf":
            return hf_predict(hf, plain, prec)
        by_position = hf_predict(hf, sorted_groups, prec, lean=True)
        out = [0] * len(enc)
        for pos, i in enumerate(order):
            out[i] = by_position[pos]
        return out

    impls = (
        ["ours", "ours-padded", "today"]
        + ([] if args.no_hf else ["hf"])
        + ([] if args.no_hf_lean or args.no_hf else ["hf-lean"])
    )
    variants = [(i, p) for p in args.precisions.split(",") for i in impls]
    for impl, prec in variants:  # warm-up on two batches
        if impl in ("ours", "ours-padded"):
            ours_predict(ours, enc[: 2 * args.batch_size], args.batch_size, prec, regression, packed=impl == "ours")
        elif impl == "today":
            today_predict(ours, enc[: 2 * args.batch_size], args.batch_size, prec, regression)
        else:
            hf_predict(hf, plain[:2], prec, lean=impl == "hf-lean")
    best, preds = best_of(run, variants, args.repeats)
    return report(size, task_name, enc, encode_s, ours, best, preds, impls, args)


def report(size, task_name, enc, encode_s, ours, best, preds, impls, args) -> dict:
    n = len(enc)
    tokens = sum(len(s) for e in enc for s in e.seqs)
    print(
        f"\n{size} ({ours.gpt.num_params() / 1e6:.1f}M params) on {task_name} {SPLITS[task_name]}: {n} examples, "
        f"{tokens / n:.0f} tokens/example, batch {args.batch_size}; "
        f"encoding (shared, not compared) {n / encode_s:.0f} ex/s"
    )
    # Hugging Face's columns only when it ran (``--no-hf``, ``--no-hf-lean``): no column of nan.
    hf_cols = ("hf" in impls, "hf-lean" in impls)
    print(
        f"  {'precision':<10}{'ours ex/s':>11}{'padded':>8}{'today':>8}{'ours/today':>12}{'ours/padded':>13}"
        + (f"{'HF ex/s':>9}{'ours/HF':>9}" if hf_cols[0] else "")
        + (f"{'HF lean':>9}" if hf_cols[1] else "")
        + (f"{'agree HF':>10}" if hf_cols[0] else "")
        + f"{'= padded':>10}{'max |Δout|':>12}"
    )
    rows = []
    for prec in args.precisions.split(","):
        rate = {i: n / best[(i, prec)] if (i, prec) in best else float("nan") for i in impls + ["hf", "hf-lean"]}
        o, p, t, h = rate["ours"], rate["ours-padded"], rate["today"], rate["hf"]
        same = _agreement(preds[("ours", prec)], preds[("ours-padded", prec)])
        agree = _agreement(preds[("ours", prec)], preds[("hf", prec)]) if "hf" in impls else float("nan")
        diff = max(abs(a - b) for x, y in zip(OUTPUTS[(True, prec)], OUTPUTS[(False, prec)]) for a, b in zip(x, y))
        print(
            f"  {prec:<10}{o:>11.1f}{p:>8.1f}{t:>8.1f}{o / t:>11.2f}×{o / p:>12.2f}×"
            + (f"{h:>9.1f}{o / h:>8.2f}×" if hf_cols[0] else "")
            + (f"{rate['hf-lean']:>9.1f}" if hf_cols[1] else "")
            + (f"{100 * agree:>9.1f}%" if hf_cols[0] else "")
            + f"{100 * same:>9.1f}%{diff:>12.2e}",
            flush=True,
        )
        rows.append(
            {
                "preset": size,
                "task": task_name,
                "precision": prec,
                "examples": n,
                "ours_ex_per_s": o,
                "ours_padded_ex_per_s": p,
                "today_ex_per_s": t,
                "ours_over_today": o / t,
                "ours_over_padded": o / p,
                "agreement_packed_padded": same,
                "max_abs_output_diff": diff,
                "hf_ex_per_s": h,
                "ours_over_hf": o / h,
                "hf_lean_ex_per_s": rate["hf-lean"],
                "agreement_ours_hf": agree,
                "encode_ex_per_s": n / encode_s,
            }
        )
    return {"preset": size, "task": task_name, "rows": rows}


def _agreement(a: list, b: list) -> float:
    return sum(x == y for x, y in zip(a, b)) / max(1, len(a))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="tiny,gpt1", help="model presets: tiny (4×256), gpt1 (the paper's 12×768)")
    ap.add_argument(
        "--tasks",
        default="sst2,rte,storycloze",
        help="comma-separated: sst2, rte (their dev splits), storycloze (val), race (RACE-shaped dev)",
    )
    ap.add_argument("--limit", type=int, default=None, help="only the first N examples of each split")
    ap.add_argument("--batch-size", type=int, default=8, help="examples per forward pass (gpt1 eval's default: 8)")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16 (CPU autocast)")
    ap.add_argument("--repeats", type=int, default=1, help="timed passes per variant (the best is reported)")
    ap.add_argument("--no-hf-lean", action="store_true", help="skip HF's body + head alone on our batches")
    ap.add_argument("--no-hf", action="store_true", help="skip Hugging Face altogether (ours, padded and today only)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    ap.add_argument("--peak-seconds", type=float, default=2.0, help="time spent measuring each matmul peak")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    from gptcli.tokenizers.openai import OpenAIBPETokenizer

    header, line = machine_header(args.peak_seconds)
    print(line)
    tok = OpenAIBPETokenizer.from_dir(SHARED / "openai-gpt-bpe")  # both presets: the original 40,478-id BPE
    tok.encode_batch(["load spaCy outside the timing"])
    results = [bench(size, t, tok, args) for size in args.presets.split(",") for t in args.tasks.split(",")]
    write_json(args.json, header, args=vars(args), results=results)


if __name__ == "__main__":
    main()
