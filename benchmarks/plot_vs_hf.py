"""One picture of the pipeline against Hugging Face: ours / HF per stage and precision, from the benchmarks' JSON.

Reads the ``--json`` outputs of train_throughput.py, generate_throughput.py, zeroshot_throughput.py and
eval_throughput.py (all from one machine: docs/performance.md) and draws one horizontal bar per
comparison at the paper's size (``gpt1``), fp32 and bf16 side by side, with a line at 1× (parity).

    python benchmarks/plot_vs_hf.py docs/performance --out docs/performance/vs_hf.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows(folder: Path) -> list[tuple[str, str, float]]:
    """(label, precision, ours / HF) for every gpt1-size comparison in the folder's JSON files."""
    out: list[tuple[str, str, float]] = []
    train = json.loads((folder / "zen4_pretrain.json").read_text())
    for r in train["results"]:
        if r["size"] == "gpt1" and r["impl"] == "ours":
            out.append(("pretraining step, 4×512 (vs HF, same precision)", r["precision"], r["vs_hf_same_precision"]))
    gen = json.loads((folder / "zen4_generate.json").read_text())
    for r in gen["results"]:
        label = f"generate, {'greedy' if r['mode'] == 'greedy' else 'top-k/top-p'}, batch {r['batch']}"
        out.append((label, r["precision"], r["ours_vs_hf"]))
    zs = json.loads((folder / "zen4_zeroshot.json").read_text())
    for block in zs["results"]:
        for r in block["rows"]:
            if r["preset"] == "gpt1":
                out.append(("zero-shot SST-2 (vs a plain HF loop)", r["precision"], r["ours_over_hf"]))
    ev = json.loads((folder / "zen4_eval.json").read_text())
    for block in ev["results"]:
        for r in block["rows"]:
            if r["preset"] == "gpt1":
                out.append((f"eval {r['task'].upper()} (vs a plain HF loop)", r["precision"], r["ours_over_hf"]))
                if r.get("hf_lean_ex_per_s"):
                    lean = r["ours_ex_per_s"] / r["hf_lean_ex_per_s"]
                    out.append((f"eval {r['task'].upper()} (vs HF body + head alone)", r["precision"], lean))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "folder",
        type=Path,
        help="folder with zen4_pretrain.json, zen4_generate.json, zen4_zeroshot.json, zen4_eval.json",
    )
    ap.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rows(args.folder)
    labels = list(dict.fromkeys(label for label, _, _ in data))
    value = {(label, prec): v for label, prec, v in data}
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(labels) + 1.2))
    for k, (prec, color) in enumerate((("fp32", "#4c72b0"), ("bf16", "#dd8452"))):
        ys = [i + (0.2 if k == 0 else -0.2) for i in range(len(labels))]
        xs = [value.get((label, prec), 0.0) for label in labels]
        ax.barh(ys, xs, height=0.38, color=color, label=prec)
        for y, x in zip(ys, xs):
            ax.text(x, y, f" {x:.2f}×", va="center", fontsize=7)
    ax.axvline(1.0, color="black", lw=0.8, ls=":")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ours / Hugging Face (higher is faster; log scale; dotted line = parity)")
    ax.set_title("gpt1 (116.5 M) against Hugging Face transformers, same weights, one 2-core CPU", fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
