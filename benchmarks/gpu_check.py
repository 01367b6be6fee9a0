"""One-shot GPU check of data-parallel pretraining: run this once on a CUDA machine and keep its output.

1. **Flash attention**: SDPA with only the flash backend enabled runs the ``gpt1`` preset's attention shapes in bf16
   (forward + backward, causal, with dropout), i.e. training can use the flash kernel.
2. **Throughput**: ``gpt1 pretrain --gpus 1`` with the ``gpt1`` preset (12×768, 512 context, 40,478-id vocabulary),
   bf16 autocast, ``--compile``, the paper's global batch 64×512; tokens/s and MFU as logged in ``metrics.jsonl``
   (median over the logged intervals after the compile warm-up; MFU against the GPU's dense bf16 peak from
   ``gptcli.runtime.GPU_PEAK_FLOPS``). The ratio against a plain single process with the same settings, measured
   in the same run, shows the cost of the launcher/DDP path.
3. **Equivalence**: ``--gpus 1`` (launcher, NCCL process group, DistributedDataParallel) against a plain process,
   fp32 (TF32 matmuls), no dropout, no compile: per-update losses must agree to ``--tol`` (relative).

The corpus is synthetic (uniform random ids, a placeholder 40,478-entry vocabulary): throughput does not depend on
the text. Nothing is downloaded.

    python benchmarks/gpu_check.py                       # not yet run on a GPU: expect minutes (mostly compiling)
    python benchmarks/gpu_check.py --steps 60 --json gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 40478


def make_corpus(directory: Path, tokens: int) -> Path:
    """A prepared corpus of random ids with a placeholder OpenAI-BPE tokenizer of the paper's vocabulary size."""
    import numpy as np

    from gptcli.data.shards import shard_name, token_dtype, write_shard
    from gptcli.tokenizers.openai import OpenAIBPETokenizer

    tok = OpenAIBPETokenizer({f"t{i}</w>": i for i in range(VOCAB)}, [])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(directory / "tokenizer")
    dtype = token_dtype(tok.total_vocab)
    rng = np.random.default_rng(0)
    entries = []
    for split, n in (("train", tokens), ("val", 64 * 513)):
        entry = write_shard(directory / shard_name(split, 0), [rng.integers(0, VOCAB, n)], dtype)
        entries.append({**entry, "split": split})
    manifest = {"format": 1, "vocab_size": tok.vocab_size, "tokenizer": {"kind": tok.kind}, "shards": entries}
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return directory


def check_flash() -> dict:
    """Whether SDPA's flash kernel alone handles the gpt1 attention shapes in bf16 (forward and backward)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(8, 12, 512, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
            y.float().sum().backward()
        torch.cuda.synchronize()
        return {"flash_attention": True}
    except RuntimeError as e:
        return {"flash_attention": False, "flash_error": str(e).splitlines()[0]}


def run_pretrain(args: list[str], timeout: int) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gptcli", "pretrain", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, time.perf_counter() - t0, proc.stderr


def records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in x]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="updates of the throughput runs (first 2 logs skipped)")
    ap.add_argument("--micro-batch-size", type=int, default=32, help="sequences per forward/backward (of 64)")
    ap.add_argument("--equiv-steps", type=int, default=8, help="updates of the equivalence runs")
    ap.add_argument("--tol", type=float, default=2e-3, help="relative loss tolerance of the equivalence check")
    ap.add_argument("--timeout", type=int, default=400, help="seconds per pretraining run")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device is available")
    info = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count()}
    info.update(check_flash())
    print(json.dumps(info))
    result: dict = {"env": info}

    with tempfile.TemporaryDirectory(prefix="gpt1-gpucheck-") as tmp:
        tmpd = Path(tmp)
        data = make_corpus(tmpd / "corpus", (args.steps + 4) * 64 * 512 + 512)
        common = ["--data", str(data), "--preset", "gpt1", "--seq-len", "512", "--batch-size", "64",
                  "--micro-batch-size", str(args.micro_batch_size), "--eval-every", "0", "--eval-batches", "1",
                  "--save-every", "0", "--keep-last", "1", "--no-verify", "--quiet"]

        # Throughput: plain process first, then --gpus 1 (same settings), bf16 + compile.
        fast = [*common, "--max-steps", str(args.steps), "--warmup-steps", "10", "--log-every", "5",
                "--precision", "bf16", "--compile"]
        for name, extra in (("single", []), ("gpus1", ["--gpus", "1"])):
            out = tmpd / f"tp-{name}"
            rc, wall, err = run_pretrain([*fast, "--out", str(out), *extra], args.timeout)
            if rc != 0:
                sys.exit(f"gpu_check: {name} throughput run failed (rc {rc}):\n{err[-4000:]}")
            recs = records(out)[2:]  # the first intervals include compilation
            tps = statistics.median(r["tokens_per_s"] for r in recs)
            mfu = statistics.median(r["mfu"] for r in recs if r["mfu"] is not None) if recs[0]["mfu"] else None
            result[f"throughput_{name}"] = {"tokens_per_s": tps, "mfu": mfu, "wall_s": round(wall, 1)}
            print(f"{name:7s} bf16+compile gpt1 64×512: {tps:,.0f} tokens/s, MFU "
                  f"{'n/a' if mfu is None else f'{100 * mfu:.1f}%'} (wall {wall:.0f} s incl. start-up and compile)")
        ratio = result["throughput_gpus1"]["tokens_per_s"] / result["throughput_single"]["tokens_per_s"]
        result["throughput_ratio_gpus1_vs_single"] = ratio
        print(f"--gpus 1 / single process tokens/s: {ratio:.3f}")

        # Equivalence: fp32, no dropout, no compile.
        exact = [*common, "--max-steps", str(args.equiv_steps), "--warmup-steps", "2", "--log-every", "1",
                 "--precision", "fp32", "--no-compile", "--dropout", "0"]
        losses = {}
        for name, extra in (("single", []), ("gpus1", ["--gpus", "1"])):
            out = tmpd / f"eq-{name}"
            rc, _, err = run_pretrain([*exact, "--out", str(out), *extra], args.timeout)
            if rc != 0:
                sys.exit(f"gpu_check: {name} equivalence run failed (rc {rc}):\n{err[-4000:]}")
            losses[name] = {r["step"]: r["loss"] for r in records(out)}
        worst = max(abs(losses["gpus1"][s] - losses["single"][s]) / abs(losses["single"][s]) for s in losses["single"])
        ok = sorted(losses["single"]) == sorted(losses["gpus1"]) and worst <= args.tol
        result["equivalence"] = {"steps": args.equiv_steps, "max_rel_diff": worst, "tol": args.tol, "ok": ok,
                                 "single": losses["single"], "gpus1": losses["gpus1"]}
        print(f"equivalence --gpus 1 vs single, fp32, {args.equiv_steps} updates: max relative loss difference "
              f"{worst:.2e} ({'OK' if ok else 'FAILED'}, tolerance {args.tol:g})")

    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    if not ok or not info.get("flash_attention"):
        sys.exit(1)


if __name__ == "__main__":
    main()
